"""The model in C (``glm5_lsp/native.c`` via ``model/native.py``) against the lean Python paths it
stands in for: a decoding step's and a prompt's prefill's logits and cache rows to rounding, the
generator's greedy text, the prefill started on the C worker (``Generator.prefetch``), where it
applies and where the scripted path runs instead."""

from __future__ import annotations

import shutil
import sysconfig
import time

import pytest
import torch
from tiny import fed_in_chunks, tiny_model

from glm5_lsp.model import (
    AttentionConfig,
    AttentionPolicy,
    GenerationConfig,
    Generator,
    KVCache,
    Role,
    cached_forward,
    generate,
    native,
)
from glm5_lsp.model.stats import StatsProbe

TOL = 1e-4

needs_native = pytest.mark.skipif(native._native is None, reason="the C step was not built (no compiler)")


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 512, (1, n), generator=torch.Generator().manual_seed(seed))


def _model(**overrides):
    return tiny_model(**overrides).prepare_inference()


class _Tok:
    """A tokenizer for generations whose text no test reads."""

    eos_token_id = None

    def decode(self, ids):
        return ""


def test_the_c_step_is_built_where_a_compiler_is() -> None:
    cc = (sysconfig.get_config_var("CC") or "").split()
    if not cc or shutil.which(cc[0]) is None:
        pytest.skip("no C compiler: the install goes on without the C step")
    assert native._native is not None, "pip install -e . should have built glm5_lsp/_native (setup.py)"
    assert native.available()


def _with_and_without_c(model, ids: torch.Tensor, chunks: list[int], roles: torch.Tensor | None = None,
                        **kwargs) -> dict[bool, tuple[list[torch.Tensor], KVCache]]:
    """``ids`` fed in ``chunks`` through ``cached_forward`` with the C call (True) and without it:
    each call's logits and the cache."""
    return {c_step: fed_in_chunks(model, ids, chunks, roles, native_step=c_step, **kwargs) for c_step in (True, False)}


def _taken(monkeypatch, tokens: bool = False) -> list:
    """Count the C path's calls: their positions (with ``tokens``, ``(position, tokens)``)."""
    calls: list = []
    real = native.NativeStep.forward

    def counted(self, ids, step, every_row=False):
        calls.append((step.start, ids.shape[1]) if tokens else step.start)
        return real(self, ids, step, every_row)

    monkeypatch.setattr(native.NativeStep, "forward", counted)
    return calls


@needs_native
@pytest.mark.parametrize(
    ("prompt", "steps", "dense", "overrides"),
    [
        (7, 8, False, {}),  # grouped routing (2 groups, 1 kept), scaled weights, a dense first layer
        (5, 6, False, {"indexer_types": ["full", "shared", "full"]}),
        (6, 6, False, {"n_group": 1, "topk_group": 1, "norm_topk_prob": False, "first_k_dense_replace": 0}),
        (30, 4, True, {}),  # dense attention, past the top-k
        (4, 5, False, {"n_shared_experts": 0, "num_experts_per_tok": 3}),
    ],
)
def test_the_c_step_gives_the_lean_steps_logits_and_cache(prompt, steps, dense, overrides, monkeypatch) -> None:
    model = _model(index_topk=16, **overrides)
    ids = _ids(prompt + steps, seed=prompt + steps)
    calls = _taken(monkeypatch)
    out = {}
    for c_step in (True, False):
        cache = KVCache(model.config)
        logits = []
        with torch.no_grad():
            cached_forward(model, ids[:, :prompt], cache, dense=dense, last_only=True, native_step=False)
            for t in range(prompt, prompt + steps):
                logits.append(cached_forward(model, ids[:, t : t + 1], cache, dense=dense, scripted=False,
                                             native_step=c_step))
        out[c_step] = (logits, cache)
    assert calls == list(range(prompt, prompt + steps))  # every step in C, on that side only
    (got, cache), (want, want_cache) = out[True], out[False]
    for a, b in zip(got, want):
        assert a.shape == b.shape == (1, 1, model.config.vocab_size)
        assert (a - b).abs().max().item() < TOL
    n = prompt + steps
    for layer in range(model.config.num_hidden_layers):
        assert (cache.latents[layer][:, :n] - want_cache.latents[layer][:, :n]).abs().max().item() < 1e-5
        if cache.index_keys[layer] is not None:
            assert (cache.index_keys[layer][:, :n] - want_cache.index_keys[layer][:, :n]).abs().max().item() < 1e-5
    assert torch.equal(cache.token_ids[:, :n], want_cache.token_ids[:, :n])
    assert cache.length == want_cache.length == n


@needs_native
def test_with_a_probe_or_a_long_prompt_past_the_top_k_torch_runs(monkeypatch) -> None:
    model = _model(index_topk=8)
    ids = _ids(12, seed=3)
    calls = _taken(monkeypatch)
    cache = KVCache(model.config)
    with torch.no_grad():
        cached_forward(model, ids[:, :6], cache, last_only=True)  # within the top-k: in C
        cached_forward(model, ids[:, 6:7], cache)  # its 7 keys fit the top-k of 8: in C
        cached_forward(model, ids[:, 7:8], cache, probe=StatsProbe(scaling=2.5))  # scripted
        cached_forward(model, ids[:, 8:9], cache)  # the 9th key: the indexer selects, in C
    assert calls == [0, 6, 8]
    assert cache.length == 9
    long = _ids(8 + native.SELECTING_MAX_ROWS + 1, seed=4)
    with torch.no_grad():  # a prompt with more rows past the top-k than C scores quicker than torch
        cached_forward(model, long, KVCache(model.config), last_only=True)
        cached_forward(model, long[:, :-1], KVCache(model.config), last_only=True)
    assert calls == [0, 6, 8, 0]


@needs_native
@pytest.mark.parametrize(
    ("chunks", "overrides", "policy"),
    [
        ([6, 1, 1, 4, 1, 5, 1, 1], {}, None),  # steps and verifications past the top-k of 8
        ([6, 1, 1, 4, 1, 5, 1, 1], {"indexer_types": ["full", "shared", "full"]}, None),  # a shared layer reuses
        ([7, 13, 1, 6, 1], {}, "biased"),  # the policy's key bias (its top-k: 16), the second call crossing it
        ([30, 1, 3], {"num_hidden_layers": 2, "first_k_dense_replace": 0}, None),  # a prefill past it
        ([60, 60, 20, 5, 1], {}, None),  # several rows' keys scored in blocks of 128 (native.c's KEY_BLOCK)
        ([12, 9, 1, 6, 1, 1], {}, "error"),  # error-context keys forced in, an error-context row attending to all
        ([12, 9, 1, 6, 1], {"indexer_types": ["full", "shared", "full"]}, "error"),
    ],
)
def test_past_the_top_k_the_c_call_selects_the_keys_the_scripted_path_does(chunks, overrides, policy,
                                                                           monkeypatch) -> None:
    """Past DSA's top-k each row attends to the indexer's choice (with the policy's key bias, and the
    error context's forced keys besides): the C call gives the scripted path's logits for every row
    and the same cache rows."""
    model = _model(index_topk=8, **overrides)
    total = sum(chunks)
    ids = _ids(total, seed=len(chunks) + total)
    roles = torch.full((1, total), int(Role.CODE), dtype=torch.long)
    roles[0, 2:6] = int(Role.API_DOC)
    roles[0, 15:19] = int(Role.CURRENT_BLOCK)
    if policy == "error":
        roles[0, [1, 4, 22]] = int(Role.ERROR_CONTEXT)  # 22: a row of the fourth call
    policy = {None: None, "biased": AttentionPolicy.from_config(AttentionConfig(error_context=0.0)),
              "error": AttentionPolicy.from_config()}[policy]
    calls = _taken(monkeypatch, tokens=True)
    out = _with_and_without_c(model, ids, chunks, roles=roles, policy=policy)
    starts = [sum(chunks[:i]) for i in range(len(chunks))]
    assert calls == list(zip(starts, chunks))  # every call in C, on that side only
    (got, cache), (want, want_cache) = out[True], out[False]
    for a, b in zip(got, want):
        assert a.shape == b.shape
        assert (a - b).abs().max().item() < TOL
    for layer in range(model.config.num_hidden_layers):
        assert (cache.latents[layer][:, :total] - want_cache.latents[layer][:, :total]).abs().max().item() < 1e-5


@needs_native
def test_the_generators_greedy_text_is_the_same_with_the_c_step(monkeypatch) -> None:
    model = _model(index_topk=64)

    config = GenerationConfig(max_new_tokens=12, stop_at_eos=False)
    calls = _taken(monkeypatch)
    for seed in range(4):
        prompt = _ids(9 + seed, seed=seed)[0].tolist()
        with_c = Generator(model, _Tok()).generate(prompt, config).token_ids
        assert calls, "the generator did not take the C step"
        calls.clear()
        without = Generator(model, _Tok(), native=False).generate(prompt, config).token_ids
        assert not calls
        assert with_c == without


@needs_native
def test_weights_changed_in_place_are_read_and_new_inference_weights_rebuild_it() -> None:
    model = _model(index_topk=32)
    ids = _ids(6, seed=5)

    def last(c_step: bool) -> torch.Tensor:
        cache = KVCache(model.config)
        with torch.no_grad():
            cached_forward(model, ids[:, :5], cache, last_only=True)
            return cached_forward(model, ids[:, 5:], cache, scripted=False, native_step=c_step)

    first = native.get(model)
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)  # in place: the same addresses
    assert native.get(model) is first
    assert (last(True) - last(False)).abs().max().item() < TOL
    with torch.no_grad():
        model.model.layers[0].self_attn.q_a_proj.weight.mul_(0.5)
    model.prepare_inference()  # new fused weights: a new C model over them
    assert native.get(model) is not first
    assert (last(True) - last(False)).abs().max().item() < TOL


@needs_native
def test_turned_off_or_given_a_token_out_of_range(monkeypatch) -> None:
    model = _model()
    step_of = native.get(model)
    assert step_of is not None
    cache = KVCache(model.config)
    with torch.no_grad():
        cached_forward(model, _ids(4), cache, last_only=True)
        step = model.prepare_step(torch.tensor([[600]]), cache=cache)
        with pytest.raises(ValueError, match="out of range"):
            step_of.forward(torch.tensor([[600]]), step)
    assert cache.length == 4  # nothing committed
    monkeypatch.setenv("GLM5_NATIVE", "0")
    assert native.get(model) is None


@needs_native
def test_two_threads_decoding_on_one_model_each_get_their_own_text() -> None:
    """The C model's cache addresses and scratch are shared: two generators on one model in two
    threads must each get the text they get alone."""
    import threading

    model = _model(index_topk=64)

    config = GenerationConfig(max_new_tokens=24, stop_at_eos=False)
    prompts = [_ids(8, seed=s)[0].tolist() for s in (11, 12)]
    alone = [Generator(model, _Tok()).generate(p, config).token_ids for p in prompts]
    got: dict[int, list[list[int]]] = {0: [], 1: []}

    def run(i: int) -> None:
        gen = Generator(model, _Tok())
        for _ in range(15):
            got[i].append(gen.generate(prompts[i], config).token_ids)
            gen.reset()

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in (0, 1):
        assert got[i] == [alone[i]] * 15


@needs_native
@pytest.mark.parametrize(
    ("chunks", "dense", "overrides"),
    [
        ([11], False, {}),  # grouped routing, a dense first layer; the whole prompt within the top-k
        ([5, 6], False, {}),  # a cached prefix, then the rest
        ([30], True, {}),  # dense attention, past the top-k
        ([9, 3], False, {"indexer_types": ["full", "shared", "full"]}),
        ([7], False, {"n_group": 1, "topk_group": 1, "norm_topk_prob": False, "first_k_dense_replace": 0}),
        ([6, 1, 5], False, {"n_shared_experts": 0, "num_experts_per_tok": 3}),
    ],
)
def test_a_prompts_prefill_in_c_gives_the_lean_prefills_logits_and_cache(chunks, dense, overrides,
                                                                          monkeypatch) -> None:
    model = _model(index_topk=32, **overrides)
    total = sum(chunks)
    ids = _ids(total + 2, seed=total)
    calls = _taken(monkeypatch, tokens=True)
    out = _with_and_without_c(model, ids, [*chunks, 1, 1], dense=dense, last_only=True, scripted=False)
    starts = [sum(chunks[:i]) for i in range(len(chunks))]
    assert calls == list(zip(starts, chunks)) + [(total, 1), (total + 1, 1)]
    (got, cache), (want, want_cache) = out[True], out[False]
    for a, b in zip(got, want):
        assert a.shape == b.shape == (1, 1, model.config.vocab_size)
        assert (a - b).abs().max().item() < TOL
    n = total + 2
    for layer in range(model.config.num_hidden_layers):
        assert (cache.latents[layer][:, :n] - want_cache.latents[layer][:, :n]).abs().max().item() < 1e-5
        if cache.index_keys[layer] is not None:
            assert (cache.index_keys[layer][:, :n] - want_cache.index_keys[layer][:, :n]).abs().max().item() < 1e-5
    assert torch.equal(cache.token_ids[:, :n], want_cache.token_ids[:, :n])


@needs_native
@pytest.mark.parametrize(("dense", "overrides"), [(False, {}), (True, {}), (False, {"indexer_types": ["full", "shared", "full"]})])
def test_a_drafts_verification_in_c_gives_every_rows_logits_and_cache(dense, overrides, monkeypatch) -> None:
    """A draft's verification reads every row's logits: the C call writes them all, as the scripted
    path computes them, and the same cache rows."""
    model = _model(index_topk=32, **overrides)
    ids = _ids(14, seed=2)
    calls = _taken(monkeypatch, tokens=True)
    out = {}
    for c_step in (True, False):
        cache = KVCache(model.config)
        with torch.no_grad():
            cached_forward(model, ids[:, :8], cache, dense=dense, last_only=True, native_step=c_step)
            rows = cached_forward(model, ids[:, 8:12], cache, dense=dense, native_step=c_step)  # every row's logits
            last = cached_forward(model, ids[:, 12:13], cache, dense=dense, native_step=c_step)
        out[c_step] = (rows, last, cache)
    assert calls == [(0, 8), (8, 4), (12, 1)]
    (rows, last, cache), (want_rows, want_last, want_cache) = out[True], out[False]
    assert rows.shape == want_rows.shape == (1, 4, model.config.vocab_size) and cache.length == 13
    assert (rows - want_rows).abs().max().item() < TOL
    assert (last - want_last).abs().max().item() < TOL
    for layer in range(model.config.num_hidden_layers):
        assert (cache.latents[layer][:, :13] - want_cache.latents[layer][:, :13]).abs().max().item() < 1e-5


@needs_native
def test_the_transposed_weights_follow_an_in_place_change(monkeypatch) -> None:
    """A prefill reads copies of the weights (in panels): changed in place, they are made again."""
    model = _model(index_topk=32)
    ids = _ids(9, seed=8)

    def prefill(c_step: bool) -> torch.Tensor:
        cache = KVCache(model.config)
        with torch.no_grad():
            return cached_forward(model, ids, cache, last_only=True, scripted=False, native_step=c_step)

    assert (prefill(True) - prefill(False)).abs().max().item() < TOL
    with torch.no_grad():
        model.model.layers[1].mlp.experts.down_proj.mul_(3.0)
        model.model.layers[0].mlp.down_proj.weight.mul_(0.5)
    assert (prefill(True) - prefill(False)).abs().max().item() < TOL


@needs_native
def test_a_prefetched_prompt_generates_the_same_text_with_one_token_left_to_prefill() -> None:
    model = _model(index_topk=64)
    config = GenerationConfig(max_new_tokens=10, stop_at_eos=False)
    for seed in range(3):
        prompt = _ids(20 + seed, seed=seed)[0].tolist()
        want = Generator(model, _Tok(), native=False).generate(prompt, config)
        gen = Generator(model, _Tok())
        assert gen.prefetch(prompt)
        assert gen._pending is not None
        got = gen.generate(prompt, config)
        assert got.token_ids == want.token_ids
        assert got.cached_tokens == len(prompt) - 1  # the prefetch held all but the last token
        assert not gen.prefetch(prompt[:-3] + prompt[-3:])  # held already: nothing started
        other = _ids(15, seed=40 + seed)[0].tolist()
        assert gen.prefetch(other)
        again = gen.generate(prompt, config)  # a different prompt after all: settled, then cut back
        assert again.token_ids == want.token_ids


@needs_native
def test_a_prefetch_is_finished_before_another_generator_on_the_model_runs() -> None:
    model = _model(index_topk=64)
    config = GenerationConfig(max_new_tokens=12, stop_at_eos=False)
    first, second = _ids(24, seed=1)[0].tolist(), _ids(18, seed=2)[0].tolist()
    alone = [Generator(model, _Tok(), native=False).generate(p, config).token_ids for p in (first, second)]
    a, b = Generator(model, _Tok()), Generator(model, _Tok())
    assert a.prefetch(first)
    assert b.generate(second, config).token_ids == alone[1]  # its C calls wait for the worker first
    assert a.generate(first, config).token_ids == alone[0]
    a.prefetch(second)
    a.reset()  # settles, then empties the cache
    assert a.cache.length == 0 and a._pending is None


def test_without_the_c_path_a_prefetch_starts_nothing(monkeypatch) -> None:
    monkeypatch.setenv("GLM5_NATIVE", "0")
    model = _model(index_topk=64)
    gen = Generator(model, _Tok())
    prompt = _ids(12, seed=3)[0].tolist()
    assert not gen.prefetch(prompt)
    assert gen.generate(prompt, GenerationConfig(max_new_tokens=4, stop_at_eos=False)).token_ids


@needs_native
def test_drafts_with_the_step_on_the_worker_keep_the_greedy_text(idle_core, monkeypatch) -> None:
    """With a drafter, each step runs on the C worker while the drafter works out its proposal; a
    proposal is verified by a second call over its tokens. The text is the one without drafts."""
    model = _model(index_topk=64)
    prompt = _ids(10, seed=4)[0].tolist()
    config = GenerationConfig(max_new_tokens=12, stop_at_eos=False)
    truth = Generator(model, _Tok(), native=False).generate(prompt, config).token_ids
    asked: list[int] = []

    def drafter(out):  # the true continuation, wrong from its third token on; as slow as a memory's
        asked.append(len(out))
        time.sleep(0.001)
        rest = truth[len(out) : len(out) + 4]
        return rest[:2] + [(t + 1) % 512 for t in rest[2:]]

    started = []  # per call handed to the worker: whether it was a verification (every row)
    real = native.NativeStep.start
    monkeypatch.setattr(native.NativeStep, "start",
                        lambda self, ids, step, *rest: started.append(bool(rest and rest[0])) or real(self, ids, step, *rest))
    monkeypatch.setattr(Generator, "_goes_on", lambda *args: False)  # (looking past a proposal: its own test)
    got = Generator(model, _Tok()).generate(prompt, config, drafter=drafter)
    assert got.token_ids == truth
    assert got.drafted_tokens > got.accepted_tokens > 0
    assert started == [False] * len(asked) and asked  # every step beside its drafter
    without_c = Generator(model, _Tok(), native=False).generate(prompt, config, drafter=drafter)
    assert without_c.token_ids == truth and without_c.accepted_tokens == got.accepted_tokens
    started.clear()
    asked.clear()
    quick = Generator(model, _Tok()).generate(prompt, config, drafter=lambda out: asked.append(len(out)) or [])
    assert quick.token_ids == truth
    assert started == [False] and len(asked) > 1  # a drafter that answers at once: the steps run before it


@pytest.fixture
def idle_core(monkeypatch):
    """Every hand-over to the C worker counts as finding an idle core: the tests of what runs beside
    the Python hold on a machine busy with other work too (``HANDOFF_SLOW_SECONDS``: its own test)."""
    monkeypatch.setattr(generate, "HANDOFF_SLOW_SECONDS", float("inf"))


@pytest.fixture
def one_thread():
    """torch on one thread, as the server runs it: a core left for the C worker (``spare_core``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@needs_native
def test_the_step_run_ahead_for_the_likeliest_token_keeps_the_processed_greedy_text(one_thread, idle_core,
                                                                                     monkeypatch) -> None:
    """While a slow processor works on a step's logits, the C worker runs the next step for the
    model's likeliest token: kept where the processor chose that token, dropped unread where it chose
    another (every third step here). The text, and what the cache holds after, are the ones without."""
    model = _model(index_topk=64)
    config = GenerationConfig(max_new_tokens=14, stop_at_eos=False)
    calls: list[int] = []

    def contrary(out, logits):  # as slow as the memory and the monitor together; overrules some steps
        calls.append(len(out))
        end = time.perf_counter() + 0.0005
        while time.perf_counter() < end:
            pass
        if len(out) % 3 == 1:
            logits[int(torch.argmax(logits))] = float("-inf")
        return logits

    for seed in range(3):
        prompt = _ids(12 + seed, seed=20 + seed)[0].tolist()
        plain = Generator(model, _Tok())
        plain.guess_ahead = False
        want = plain.generate(prompt, config, logits_processor=contrary)
        gen = Generator(model, _Tok())
        got = gen.generate(prompt, config, logits_processor=contrary)
        assert got.token_ids == want.token_ids
        assert 0 < got.guessed_steps < got.forward_calls == want.forward_calls
        assert want.guessed_steps == 0
        assert gen.cache.length == plain.cache.length == len(prompt) + config.max_new_tokens - 1
        again = gen.generate(prompt + got.token_ids, config, logits_processor=contrary)  # reads the cache
        assert again.token_ids == plain.generate(prompt + want.token_ids, config, logits_processor=contrary).token_ids
    monkeypatch.setattr(generate, "spare_core", lambda: False)  # torch's threads on every core: none run ahead
    assert Generator(model, _Tok()).generate(prompt, config, logits_processor=contrary).guessed_steps == 0


@needs_native
def test_no_step_runs_ahead_for_quick_processors_or_sampling(one_thread, idle_core, monkeypatch) -> None:
    model = _model(index_topk=64)
    prompt = _ids(10, seed=7)[0].tolist()
    started = []
    real = native.NativeStep.start
    monkeypatch.setattr(native.NativeStep, "start",
                        lambda self, ids, step, *rest: started.append(step.start) or real(self, ids, step, *rest))
    quick = Generator(model, _Tok()).generate(prompt, GenerationConfig(max_new_tokens=8, stop_at_eos=False),
                                              logits_processor=lambda out, logits: logits)
    assert quick.guessed_steps <= 1 and len(started) == 1  # one try: the processor hid nothing
    started.clear()
    sampled = Generator(model, _Tok()).generate(
        prompt, GenerationConfig(max_new_tokens=8, stop_at_eos=False, temperature=0.8, seed=1),
        logits_processor=lambda out, logits: logits)
    assert sampled.guessed_steps == 0 and not started


@needs_native
def test_the_transposed_weights_a_prefill_reads_are_made_with_the_generator() -> None:
    """Made when the model loads (about 50 ms for the embedded model), not in the first prefill."""
    model = _model(index_topk=64)
    assert all(copy is None for *_, copy in native.NativeStep(model)._transposed)  # as it is built
    Generator(model, _Tok())
    compiled = native.get(model)
    assert all(copy is not None and version == source._version for _, _, source, version, copy in compiled._transposed)


@needs_native
def test_the_drafter_looks_past_a_proposal_while_the_worker_verifies_it(idle_core, monkeypatch) -> None:
    """A proposal's verification runs on the C worker while the drafter is asked what would follow
    the whole proposal (a memory's estimates are then at hand when it is asked for real). The text is
    the one without drafts, and a drafter failing while it looks ahead leaves the cache right."""
    model = _model(index_topk=64)
    prompt = _ids(10, seed=6)[0].tolist()
    config = GenerationConfig(max_new_tokens=16, stop_at_eos=False)
    truth = Generator(model, _Tok(), native=False).generate(prompt, config).token_ids
    during: list[tuple[int, bool]] = []  # (len(out) asked, a verification running meanwhile)
    verifying: list[bool] = [False]
    real_start, real_finish = native.NativeStep.start, native.Pending.finish

    def start(self, ids, step, every_row=False):
        running = real_start(self, ids, step, every_row)
        verifying[0] = running is not None and every_row
        return running

    def finish(self):
        verifying[0] = False
        return real_finish(self)

    monkeypatch.setattr(native.NativeStep, "start", start)
    monkeypatch.setattr(native.Pending, "finish", finish)

    def drafter(out):  # the true continuation, four tokens at a time
        during.append((len(out), verifying[0]))
        time.sleep(0.001)
        return truth[len(out):len(out) + 4]

    got = Generator(model, _Tok()).generate(prompt, config, drafter=drafter)
    assert got.token_ids == truth and got.accepted_tokens == got.drafted_tokens > 0
    ahead = [n for n, beside in during if beside]
    # past a whole proposal (1 + 4 tokens per round) once a draft was kept whole; not past the first
    # (nothing kept yet), nor past one that fills the budget (nothing follows it)
    assert ahead == [10]

    class Lines:  # one token's text is the line's end
        eos_token_id = None

        def decode(self, ids):
            return "".join("\n" if t == truth[3] else "x" for t in ids)

    during.clear()
    one_line = GenerationConfig(max_new_tokens=16, stop_at_eos=False, stop=("\n",))
    got = Generator(model, Lines()).generate(prompt, one_line, drafter=drafter)
    assert got.token_ids == truth[:4] and got.drafted_tokens > 0  # the proposal from the first token ends the line
    assert not any(beside for _, beside in during)  # nothing to look past: the line ends within it

    gen = Generator(model, _Tok())

    def fails_ahead(out):
        if verifying[0]:
            raise RuntimeError("looking ahead failed")
        time.sleep(0.001)  # (as slow as a memory's: the steps run beside it)
        return truth[len(out):len(out) + 4]

    with pytest.raises(RuntimeError, match="looking ahead failed"):
        gen.generate(prompt, config, drafter=fails_ahead)
    assert not verifying[0]  # the verification was finished (its rows committed) before the error went on
    assert gen.generate(prompt, config).token_ids == truth

    during.clear()

    def wrong_after_two(out):  # kept to its second token only: the next proposal is not looked past
        during.append((len(out), verifying[0]))
        time.sleep(0.001)
        rest = truth[len(out):len(out) + 4]
        return rest[:2] + [(t + 1) % 512 for t in rest[2:]]

    got = Generator(model, _Tok()).generate(prompt, config, drafter=wrong_after_two)
    assert got.token_ids == truth and got.drafted_tokens > got.accepted_tokens > 0
    assert not any(beside for _, beside in during)


@needs_native
def test_a_drafter_that_fails_leaves_the_generator_usable() -> None:
    model = _model(index_topk=64)
    prompt = _ids(10, seed=5)[0].tolist()
    config = GenerationConfig(max_new_tokens=6, stop_at_eos=False)
    gen = Generator(model, _Tok())

    def broken(out):
        raise RuntimeError("drafter failed")

    with pytest.raises(RuntimeError, match="drafter failed"):
        gen.generate(prompt, config, drafter=broken)
    assert gen.generate(prompt, config).token_ids == Generator(model, _Tok(), native=False).generate(
        prompt, config).token_ids


@needs_native
@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork here")
def test_a_child_forked_while_the_worker_runs_does_not_wait_for_it() -> None:
    """The worker thread does not survive a fork: a child forked while it runs must not wait on it."""
    import os

    from glm5_lsp import _native

    model = _model(index_topk=512)
    gen = Generator(model, _Tok())
    assert gen.prefetch(_ids(480, seed=9)[0].tolist())  # a long prefill: still running at the fork
    pid = os.fork()
    if pid == 0:  # the child: only the C module (torch itself is not fork-safe once its threads ran)
        os._exit(0 if _native.forward_wait() is False else 3)
    gen.settle()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child waited for a worker it does not have")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


@needs_native
def test_a_prefetch_that_grew_the_cache_settles_outside_inference_mode() -> None:
    """A prefetch past the cache's first capacity grows it in inference mode; settling it from plain
    code (``reset``) must still write the cache's rows."""
    model = _model(index_topk=512)
    gen = Generator(model, _Tok())
    prompt = _ids(300, seed=10)[0].tolist()  # past the cache's first 256 rows
    assert gen.prefetch(prompt)
    gen.reset()
    assert gen.cache.length == 0 and gen._pending is None
    assert gen.prefetch(prompt)
    gen.settle()
    assert gen.cache.length == len(prompt) - 1


@needs_native
def test_on_a_busy_machine_the_steps_run_in_the_calling_thread(one_thread, monkeypatch) -> None:
    """A hand-over to the C worker that finds no idle core (the woken worker takes the caller's core:
    0.3-1 ms instead of 20 microseconds) ends the running of steps beside the Python for the rest of
    that generation: with both cores busy, steps run ahead made decoding 0.75x as fast. The text is
    the same; the next generation judges the machine again."""
    model = _model(index_topk=64)
    prompt = _ids(12, seed=9)[0].tolist()
    config = GenerationConfig(max_new_tokens=12, stop_at_eos=False)

    def slow(out, logits):  # as slow as the memory and the monitor: worth a step beside it
        end = time.perf_counter() + 0.0005
        while time.perf_counter() < end:
            pass
        return logits

    def drafter(out):
        time.sleep(0.0005)
        return []

    truth = Generator(model, _Tok(), native=False).generate(prompt, config, logits_processor=slow).token_ids
    started: list[int] = []
    real = native.NativeStep.start
    handoff = [1.0]  # seconds each hand-over is said to take

    def start(self, ids, step, *rest):
        running = real(self, ids, step, *rest)
        if running is not None:
            started.append(ids.shape[1])
            running.handoff_seconds = handoff[0]
        return running

    monkeypatch.setattr(native.NativeStep, "start", start)
    gen = Generator(model, _Tok())
    busy = gen.generate(prompt, config, logits_processor=slow, drafter=drafter)
    assert busy.token_ids == truth and busy.crowded
    assert len(started) == 1 and busy.guessed_steps <= 1  # the first hand-over said so; none after it
    started.clear()
    handoff[0] = 1e-5
    idle = gen.generate(prompt, config, logits_processor=slow, drafter=drafter)
    assert idle.token_ids == truth and not idle.crowded
    assert len(started) > config.max_new_tokens // 2 and idle.guessed_steps > 0


def test_the_weights_panels_hold_each_output_where_linear_rows_t_reads_it() -> None:
    """``native.panels``: per matrix, outputs ``r0 .. r0 + 31`` as one contiguous ``[in, 32]`` block at
    ``r0 * in``, the last panel as wide as what is left (here 70 outputs: 32, 32, then 6)."""
    weight = torch.arange(2 * 70 * 5, dtype=torch.float32).reshape(2, 70, 5)  # [experts, out, in]
    flat = native.panels(weight)
    assert flat.shape == (2, 350) and flat.is_contiguous()
    for e in range(2):
        for r in range(70):
            r0 = r // native.PANEL * native.PANEL
            width = min(native.PANEL, 70 - r0)
            for c in range(5):
                assert flat[e, r0 * 5 + c * width + (r - r0)] == weight[e, r, c]
    small = torch.randn(16, 5)  # one panel: the plain transpose
    assert torch.equal(native.panels(small), small.t().contiguous())
