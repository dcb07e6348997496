"""The lean paths (``glm5_lsp.model.lean``) against the general forward they stand in for, and the
seam around them: inference weights built once and public, the path chosen by the generator."""

from __future__ import annotations

import logging

import pytest
import torch
from tiny import fed_in_chunks, tiny_model

from glm5_lsp import pyparse
from glm5_lsp.model import AttentionPolicy, GenerationConfig, Generator, KVCache, Role, cached_forward, lean
from glm5_lsp.model import scripted as script
from glm5_lsp.model.glm5 import AbsorbedWeights, FusedWeights, Projection

TOL = 1e-5


@pytest.fixture(autouse=True)
def _no_native_step(monkeypatch):
    """These tests pin the Python and scripted paths; the C step has its own (test_model_native.py)."""
    monkeypatch.setenv("GLM5_NATIVE", "0")


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 512, (1, n), generator=torch.Generator().manual_seed(seed))


def _model(**overrides):
    return tiny_model(**overrides).prepare_inference()


def _lean_calls(monkeypatch) -> list[tuple[str, str, int, bool]]:
    """Record every call of the lean paths, Python (``lean``) and scripted (``scripted``), as
    ``(module, function, tokens, last_only)``."""
    calls = []
    for module, where in ((lean, "python"), (script, "script")):
        for name in ("decode_one", "prefill_dense"):
            real = getattr(module, name)

            def counted(first, ids, step, *args, real=real, where=where, name=name, **kwargs):
                calls.append((where, name, ids.shape[1], kwargs.get("last_only", True)))
                return real(first, ids, step, *args, **kwargs)

            monkeypatch.setattr(module, name, counted)
    return calls


def _lean_step(model, token, cache, *, policy=None, dense=False, strict=True):
    """One token by ``decode.decode_one`` (asserting it applies, unless not ``strict``: then as the
    generator would, by the general path): logits and each layer's key set."""
    step = model.prepare_step(token, cache=cache, policy=policy, dense=dense)
    if not lean.applies(model, token, step):
        assert not strict, "the lean step does not apply"
        return _key_sets_of(model.forward_step(token, step, return_selections=True))
    picked: list = []
    logits = lean.decode_one(model, token, step, picked)
    return logits, [None if idx is None else sorted(idx.tolist()) for idx in picked]


def _general_step(model, token, cache, *, policy=None, dense=False, strict=True):
    return _key_sets_of(model(token, cache=cache, policy=policy, dense=dense, return_selections=True))


def _key_sets_of(result):
    logits, per_layer = result
    return logits, _key_sets(per_layer)


def _decode_both(model, prompt: int, steps: int, *, policy=None, roles=None, dense=False, strict=True):
    """Prefill ``prompt`` tokens into two caches, then decode ``steps`` more into each: one cache by the
    lean step, one by the general path. Returns both logit lists, both key-set lists and both caches."""
    ids = _ids(prompt + steps, seed=prompt)
    out = {}
    for lean_on in (True, False):
        cache = KVCache(model.config)
        logits, picks = [], []
        with torch.no_grad():
            model(ids[:, :prompt], cache=cache, roles=roles, policy=policy, dense=dense)
            for t in range(prompt, prompt + steps):
                one = _lean_step if lean_on else _general_step
                step_logits, sets = one(model, ids[:, t : t + 1], cache, policy=policy, dense=dense, strict=strict)
                logits.append(step_logits)
                picks.append(sets)
        out[lean_on] = (logits, picks, cache)
    return out[True], out[False]


def _key_sets(per_layer):
    sets = []
    for layer in per_layer:
        if layer is None:
            sets.append(None)
            continue
        (sel,) = layer
        sets.append(None if sel.idx is None else sorted(sel.idx[sel.valid].tolist()))
    return sets


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # grouped routing (n_group 2), a dense first layer
        {"n_group": 1, "topk_group": 1, "norm_topk_prob": False},
        {"indexer_types": ["full", "shared", "full"]},
        {"first_k_dense_replace": 0, "routed_scaling_factor": 1.0},
    ],
)
def test_lean_step_gives_the_general_paths_logits_keys_and_cache(overrides) -> None:
    model = _model(index_topk=12, **overrides)
    (lean_logits, lean_picks, lean_cache), (gen_logits, gen_picks, gen_cache) = _decode_both(model, 30, 8)
    for a, b in zip(lean_logits, gen_logits):
        assert (a - b).abs().max().item() < TOL
    assert lean_picks == gen_picks
    assert any(s is not None for per_layer in lean_picks for s in per_layer)  # top-k really selected
    for layer in range(model.config.num_hidden_layers):
        assert (lean_cache.latents[layer][:, :38] - gen_cache.latents[layer][:, :38]).abs().max().item() < TOL
        if lean_cache.index_keys[layer] is not None:
            assert (lean_cache.index_keys[layer][:, :38] - gen_cache.index_keys[layer][:, :38]).abs().max().item() < TOL
    assert torch.equal(lean_cache.token_ids[:, :38], gen_cache.token_ids[:, :38])


def test_lean_step_keeps_the_policys_biased_selection_and_dense_mode() -> None:
    model = _model(index_topk=12)
    roles = torch.full((1, 30), int(Role.CODE), dtype=torch.long)
    roles[0, 2:9] = int(Role.API_DOC)
    roles[0, 20:26] = int(Role.CURRENT_BLOCK)
    policy = AttentionPolicy.from_config()
    lean_run, general_run = _decode_both(model, 30, 6, policy=policy, roles=roles)
    for a, b in zip(lean_run[0], general_run[0]):
        assert (a - b).abs().max().item() < TOL
    assert lean_run[1] == general_run[1]
    # The bias moved the selection: the API-doc keys are picked more often than without the policy.
    plain_run, _ = _decode_both(model, 30, 6)
    def doc_hits(picks):
        return sum(k in range(2, 9) for per_layer in picks for s in per_layer if s for k in s)
    assert doc_hits(lean_run[1]) > doc_hits(plain_run[1])
    dense_lean, dense_general = _decode_both(model, 30, 4, dense=True)
    for a, b in zip(dense_lean[0], dense_general[0]):
        assert (a - b).abs().max().item() < TOL
    assert all(p is None for per_layer in dense_lean[1] for p in per_layer)


def test_lean_step_stands_aside_where_it_does_not_apply() -> None:
    model = _model(index_topk=12)
    cache = KVCache(model.config)
    roles = torch.full((1, 20), int(Role.CODE), dtype=torch.long)
    roles[0, 5] = int(Role.ERROR_CONTEXT)
    policy = AttentionPolicy.from_config()
    token = _ids(1)
    with torch.no_grad():
        model(_ids(20), cache=cache, roles=roles, policy=policy)
        step = model.prepare_step(token, cache=cache, policy=policy)
        assert step.forced_keys is not None and not lean.applies(model, token, step)  # forced error context
        step = model.prepare_step(token, cache=cache)
        assert lean.applies(model, token, step)
        assert not lean.applies(model, _ids(2), step)  # two tokens
        assert not lean.applies(model, token, model.prepare_step(token))  # no cache
        assert not lean.applies(tiny_model(index_topk=12), token, step)  # not prepared for inference
    assert not lean.applies(model, token, step)  # gradients on: training


def test_error_context_within_the_budget_keeps_the_lean_step() -> None:
    """While every query keeps all its keys, forced error-context keys change nothing: ``_step`` leaves
    them out, the one-token step stays lean, and its logits equal the general path's."""
    model = _model(index_topk=12)
    roles = torch.full((1, 8), int(Role.CODE), dtype=torch.long)
    roles[0, 3] = int(Role.ERROR_CONTEXT)
    policy = AttentionPolicy.from_config()
    budget = policy.topk(model.config.index_topk)
    lean_run, general_run = _decode_both(model, 8, budget - 8 + 3, policy=policy, roles=roles, strict=False)
    for a, b in zip(lean_run[0], general_run[0]):
        assert (a - b).abs().max().item() < TOL
    cache = KVCache(model.config)
    with torch.no_grad():
        model(_ids(8), cache=cache, roles=roles, policy=policy)
        step = model.prepare_step(_ids(1), cache=cache, policy=policy)
        assert step.forced_keys is None and step.key_bias is None and lean.applies(model, _ids(1), step)
        model(_ids(budget - 8), cache=cache, policy=policy)  # now the next token has more keys than the budget
        step = model.prepare_step(_ids(1), cache=cache, policy=policy)
        assert step.forced_keys is not None and not lean.applies(model, _ids(1), step)


def _prefill_both(model, chunks: list[int], *, policy=None, roles=None, dense=False, monkeypatch=None,
                  scripted=True):
    """Prefill ``sum(chunks)`` tokens in pieces (``last_only``, as the generator does), into one cache
    through ``cached_forward`` with the lean paths (``scripted`` or not) and one without; then two
    decoding steps. Returns, per side, the logits of every piece and step and the cache (and, with
    ``monkeypatch``, the lean paths' calls: ``_lean_calls``)."""
    total = sum(chunks)
    ids = _ids(total + 2, seed=total)
    calls = _lean_calls(monkeypatch) if monkeypatch is not None else []
    out = {}
    for lean_on in (True, False):
        logits, cache = fed_in_chunks(model, ids, chunks, roles, policy=policy, dense=dense, last_only=True,
                                      lean=lean_on, scripted=scripted)
        steps, _ = fed_in_chunks(model, ids[:, total:], [1, 1], cache=cache, policy=policy, dense=dense,
                                 lean=lean_on, scripted=scripted)
        out[lean_on] = (logits + steps, cache)
    return out[True], out[False], calls


@pytest.mark.parametrize(
    ("chunks", "dense", "overrides"),
    [
        ([11], False, {}),  # a whole prompt within the top-k budget
        ([5, 6], False, {}),  # a cached prefix, then the rest of the prompt
        ([30], True, {}),  # dense mode, longer than the budget
        ([lean.BATCHED_EXPERTS_MAX_TOKENS + 12], True, {}),  # the experts run one by one
        ([9, 3], False, {"indexer_types": ["full", "shared", "full"]}),
        ([12], False, {"n_group": 1, "topk_group": 1, "norm_topk_prob": False, "first_k_dense_replace": 0}),
    ],
)
@pytest.mark.parametrize("scripted", [True, False])
def test_dense_prefill_gives_the_general_paths_logits_and_cache(chunks, dense, overrides, scripted,
                                                                monkeypatch) -> None:
    model = _model(index_topk=12, **overrides)
    (lean_logits, lean_cache), (gen_logits, gen_cache), calls = _prefill_both(
        model, chunks, dense=dense, monkeypatch=monkeypatch, scripted=scripted)
    where = "script" if scripted else "python"
    # every piece took the lean prefill, then each step the lean step (and only on the lean side)
    assert calls == [(where, "prefill_dense", n, True) for n in chunks] + [(where, "decode_one", 1, True)] * 2
    for a, b in zip(lean_logits, gen_logits):
        assert a.shape == b.shape
        assert (a - b).abs().max().item() < TOL
    n = sum(chunks) + 2
    for layer in range(model.config.num_hidden_layers):
        assert (lean_cache.latents[layer][:, :n] - gen_cache.latents[layer][:, :n]).abs().max().item() < TOL
        if lean_cache.index_keys[layer] is not None:
            assert (lean_cache.index_keys[layer][:, :n] - gen_cache.index_keys[layer][:, :n]).abs().max().item() < TOL
    assert torch.equal(lean_cache.token_ids[:, :n], gen_cache.token_ids[:, :n])


@pytest.mark.parametrize(
    ("prompt", "draft", "dense", "overrides"),
    [
        (9, 3, False, {}),  # up to DECODE_MAX_TOKENS: the general path's fused projections
        (5, 7, False, {}),  # more: its plain projections
        (30, 5, True, {}),  # dense mode, past the budget
        (6, 4, False, {"indexer_types": ["full", "shared", "full"]}),
        (6, 6, False, {"n_group": 1, "topk_group": 1, "norm_topk_prob": False, "first_k_dense_replace": 0}),
    ],
)
@pytest.mark.parametrize("scripted", [True, False])
def test_a_drafts_verification_takes_the_dense_prefill_with_every_rows_logits(prompt, draft, dense, overrides,
                                                                               scripted, monkeypatch) -> None:
    """A call that needs every position's logits (``last_only`` off: the generator's verification of a
    draft) takes ``prefill_dense`` where every query keeps all its keys, and gives the general path's
    logits ``[1, T, V]``, cache entries and following steps."""
    model = _model(index_topk=12, **overrides)
    ids = _ids(prompt + draft + 1, seed=prompt + draft)
    calls = _lean_calls(monkeypatch)
    out = {}
    for lean_on in (True, False):
        cache = KVCache(model.config)
        with torch.no_grad():
            cached_forward(model, ids[:, :prompt], cache, dense=dense, last_only=True, lean=lean_on, scripted=scripted)
            rows = cached_forward(model, ids[:, prompt : prompt + draft], cache, dense=dense, lean=lean_on,
                                  scripted=scripted)
            after = cached_forward(model, ids[:, -1:], cache, dense=dense, lean=lean_on, scripted=scripted)
        out[lean_on] = (rows, after, cache)
    where = "script" if scripted else "python"
    # the prompt's last position, every row of the draft, then a step: on the lean side only
    assert calls == [(where, "prefill_dense", prompt, True), (where, "prefill_dense", draft, False),
                     (where, "decode_one", 1, True)]
    (rows, after, cache), (want_rows, want_after, want_cache) = out[True], out[False]
    assert rows.shape == want_rows.shape == (1, draft, model.config.vocab_size)
    assert (rows - want_rows).abs().max().item() < TOL
    assert (after - want_after).abs().max().item() < TOL
    n = prompt + draft + 1
    for layer in range(model.config.num_hidden_layers):
        assert (cache.latents[layer][:, :n] - want_cache.latents[layer][:, :n]).abs().max().item() < TOL
        if cache.index_keys[layer] is not None:
            assert (cache.index_keys[layer][:, :n] - want_cache.index_keys[layer][:, :n]).abs().max().item() < TOL
    assert torch.equal(cache.token_ids[:, :n], want_cache.token_ids[:, :n])


@pytest.mark.parametrize("scripted", [True, False])
def test_the_generators_draft_verification_is_lean_and_keeps_its_text(scripted, monkeypatch) -> None:
    model = _model(index_topk=24)
    prompt = _ids(10, seed=4)[0].tolist()

    class _Tok:
        eos_token_id = None

        def decode(self, ids):
            return ""

    config = GenerationConfig(max_new_tokens=10, stop_at_eos=False)
    truth = Generator(model, _Tok()).generate(prompt, config).token_ids

    def drafter(out):  # the true continuation, wrong from its third token on
        rest = truth[len(out) : len(out) + 4]
        return rest[:2] + [(t + 1) % 512 for t in rest[2:]]

    calls = _lean_calls(monkeypatch)
    drafted = Generator(model, _Tok(), scripted=scripted).generate(prompt, config, drafter=drafter)
    verified = [n for where, name, n, last_only in calls if name == "prefill_dense" and not last_only]
    assert {where for where, *_ in calls} == {"script" if scripted else "python"}
    assert drafted.drafted_tokens > drafted.accepted_tokens > 0
    assert verified and sum(verified) == drafted.drafted_tokens + len(verified)  # every verification: lean
    before = len(calls)
    general = Generator(model, _Tok(), lean=False).generate(prompt, config, drafter=drafter)
    assert len(calls) == before
    assert drafted.token_ids == general.token_ids == truth
    assert drafted.drafted_tokens == general.drafted_tokens and drafted.accepted_tokens == general.accepted_tokens


def _python_and_scripted(model, prompt: int, steps: int, *, policy=None, roles=None, dense=False, every=False):
    """Prefill ``prompt`` tokens (``every``: all rows' logits) and decode ``steps`` more, into one cache by
    ``lean``'s Python paths and one by the scripted ones. Returns both logit lists, key-set lists,
    caches, and whether any step's selection was biased by the policy."""
    ids = _ids(prompt + steps, seed=prompt + steps)
    fast = script.get(model)
    assert fast is not None
    out, biased = {}, False
    for scripted in (False, True):
        cache = KVCache(model.config)
        logits, picks = [], []
        with torch.no_grad():
            step = model.prepare_step(ids[:, :prompt], cache=cache, roles=roles, policy=policy, dense=dense)
            assert lean.applies_dense(model, ids[:, :prompt], step)
            if scripted:
                logits.append(script.prefill_dense(fast, ids[:, :prompt], step, last_only=not every))
            else:
                logits.append(lean.prefill_dense(model, ids[:, :prompt], step, last_only=not every))
            for t in range(prompt, prompt + steps):
                token = ids[:, t : t + 1]
                step = model.prepare_step(token, cache=cache, policy=policy, dense=dense)
                assert lean.applies(model, token, step)
                biased |= step.key_bias is not None
                picked: list = []
                if scripted:
                    logits.append(script.decode_one(fast, token, step, picked))
                else:
                    logits.append(lean.decode_one(model, token, step, picked))
                picks.append([None if idx is None else sorted(idx.tolist()) for idx in picked])
        out[scripted] = (logits, picks, cache)
    return out[False], out[True], biased


@pytest.mark.parametrize(
    ("overrides", "prompt", "policy", "dense", "every"),
    [
        ({}, 10, False, False, False),  # grouped routing (n_group 2), a dense first layer; steps select past 12
        ({}, 10, True, False, True),  # the policy's biased selection; a prefill of every row
        ({"n_group": 1, "topk_group": 1, "norm_topk_prob": False}, 12, False, False, False),
        ({"indexer_types": ["full", "shared", "full"]}, 9, False, False, True),  # a shared layer
        ({"first_k_dense_replace": 0, "routed_scaling_factor": 1.0}, 8, False, False, False),
        ({}, lean.BATCHED_EXPERTS_MAX_TOKENS + 6, False, True, False),  # dense mode; experts one by one
        ({}, lean.BATCHED_EXPERTS_MAX_TOKENS + 6, False, True, True),
    ],
)
def test_the_scripted_paths_compute_what_the_python_lean_paths_do(overrides, prompt, policy, dense, every) -> None:
    """``scripted.py`` mirrors ``lean.py`` operation by operation: the same logits, selected keys and
    cache entries (in practice bit for bit), in every branch."""
    model = _model(index_topk=12, **overrides)
    roles = None
    if policy:
        roles = torch.full((1, prompt), int(Role.CODE), dtype=torch.long)
        roles[0, 1:4] = int(Role.API_DOC)
        roles[0, 6:8] = int(Role.CURRENT_BLOCK)
    (py_logits, py_picks, py_cache), (sc_logits, sc_picks, sc_cache), biased = _python_and_scripted(
        model, prompt, 8, policy=AttentionPolicy.from_config() if policy else None, roles=roles, dense=dense,
        every=every)
    assert py_logits[0].shape == sc_logits[0].shape == (1, prompt if every else 1, model.config.vocab_size)
    for a, b in zip(py_logits, sc_logits):
        assert (a - b).abs().max().item() < TOL
    assert py_picks == sc_picks
    if not dense:
        assert any(s is not None for per_layer in sc_picks for s in per_layer)  # top-k really selected
    assert biased == policy
    n = prompt + 8
    for layer in range(model.config.num_hidden_layers):
        assert (py_cache.latents[layer][:, :n] - sc_cache.latents[layer][:, :n]).abs().max().item() < TOL
        if py_cache.index_keys[layer] is not None:
            assert (py_cache.index_keys[layer][:, :n] - sc_cache.index_keys[layer][:, :n]).abs().max().item() < TOL
    assert torch.equal(py_cache.token_ids[:, :n], sc_cache.token_ids[:, :n])


class _NoText:
    eos_token_id = None

    def decode(self, ids):
        return ""


def test_a_failed_script_leaves_the_python_lean_paths_with_one_log_line(monkeypatch, caplog) -> None:
    model = _model(index_topk=12)
    config = GenerationConfig(max_new_tokens=6, stop_at_eos=False)
    want = Generator(model, _NoText(), scripted=False).generate(_ids(9)[0].tolist(), config)

    def refuse(*args, **kwargs):
        raise RuntimeError("no TorchScript here")

    model = _model(index_topk=12)  # the same weights, never scripted
    monkeypatch.setattr(torch.jit, "script", refuse)
    calls = _lean_calls(monkeypatch)
    with caplog.at_level(logging.WARNING, logger=script.__name__):
        generator = Generator(model, _NoText())
        got = [generator.generate(_ids(9)[0].tolist(), config) for _ in range(2)]
        got.append(Generator(model, _NoText()).generate(_ids(9)[0].tolist(), config))
    lines = [r for r in caplog.records if r.name == script.__name__]
    assert len(lines) == 1 and "no TorchScript here" in lines[0].getMessage()
    assert calls and {where for where, *_ in calls} == {"python"}
    assert all(out.token_ids == want.token_ids for out in got)


def test_torchscript_reads_the_methods_source_while_no_parse_of_ours_runs(monkeypatch) -> None:
    # torch.jit.script parses the methods' source with ast.parse; a parse on another thread at the
    # same time can fail it on CPython 3.11 (glm5_lsp.pyparse), leaving the slower Python paths
    held: list[bool] = []

    def script_(module):
        held.append(pyparse._LOCK._is_owned())
        raise RuntimeError("not scripted in this test")

    monkeypatch.setattr(torch.jit, "script", script_)
    assert script.get(_model(index_topk=12)) is None
    assert held == [True]

def test_the_script_is_rebuilt_when_the_inference_weights_are() -> None:
    """Built once per set of inference weights: weights changed in place are read as they are (like
    the Python path reads them); the generator's ``prepare_inference`` after an attention weight
    changed brings a new script, whose logits are the new weights'."""
    model = _model(index_topk=12)
    generator = Generator(model, _NoText())
    first = script.get(model)
    assert first is not None and script.get(model) is first
    ids = _ids(10)
    config = GenerationConfig(max_new_tokens=3, stop_at_eos=False)
    generator.generate(ids[0].tolist(), config)
    assert script.get(model) is first
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)  # not an attention weight: read in place, no rebuild
        model.model.layers[1].mlp.experts.down_proj.mul_(0.5)
        generator.reset()  # (the cached keys were computed with the old weights)
        logits, _ = generator.prefill(ids[0].tolist())
        assert script.get(model) is first
        assert (logits - model(ids, reference=True)[0, -1]).abs().max().item() < 1e-4
        model.model.layers[0].self_attn.q_a_proj.weight.mul_(1.5)
    assert not model.inference_current()
    generator.reset()
    with torch.no_grad():
        logits, _ = generator.prefill(ids[0].tolist())  # rebuilds the inference weights, then the script
        rebuilt = script.get(model)
        assert rebuilt is not None and rebuilt is not first
        assert (logits - model(ids, reference=True)[0, -1]).abs().max().item() < 1e-4
        token = _ids(1, seed=3)
        step = cached_forward(model, token, generator.cache)
        full = model(torch.cat([ids, token], dim=1), reference=True)[:, -1:]
        assert (step - full).abs().max().item() < 1e-4


def _code(batch: int, n: int) -> torch.Tensor:
    return torch.full((batch, n), int(Role.CODE), dtype=torch.long)


def test_dense_prefill_under_the_policy_and_where_it_stands_aside() -> None:
    model = _model(index_topk=12)
    roles = torch.full((1, 16), int(Role.CODE), dtype=torch.long)  # the policy's budget: 16 keys
    roles[0, 1:4] = int(Role.API_DOC)
    roles[0, 6] = int(Role.ERROR_CONTEXT)
    policy = AttentionPolicy.from_config()
    (lean_logits, _), (gen_logits, _), _ = _prefill_both(model, [10, 6], policy=policy, roles=roles)
    for a, b in zip(lean_logits, gen_logits):
        assert (a - b).abs().max().item() < TOL
    cache = KVCache(model.config)
    with torch.no_grad():
        model(_ids(8), cache=cache)

        def step(n, policy=None, dense=False, batch=1):
            return model.prepare_step(torch.cat([_ids(n)] * batch), cache=cache if batch == 1 else KVCache(
                model.config, batch), policy=policy, dense=dense)

        assert lean.applies_dense(model, _ids(4), step(4, policy))
        sparse = step(9, policy)  # 17 keys: more than the budget
        assert sparse.topk == 16 and not lean.applies_dense(model, _ids(9), sparse)
        assert lean.applies_dense(model, _ids(5), step(5, policy, dense=True))
        long = lean.PREFILL_MAX_TOKENS + 1
        assert not lean.applies_dense(model, _ids(long), step(long, dense=True))
        assert not lean.applies_dense(model, _ids(1), step(1))
        two = torch.cat([_ids(3), _ids(3)])
        assert not lean.applies_dense(model, two, step(3, batch=2))  # two sequences
        assert not lean.applies_dense(tiny_model(index_topk=12), _ids(4), step(4))  # not prepared


@pytest.mark.parametrize("tokens", [1, 2, 7, 40, 97])
def test_batched_experts_equal_the_per_expert_loop(tokens) -> None:
    model = tiny_model(n_group=1, topk_group=1)
    moe = next(layer.mlp for layer in model.model.layers if hasattr(layer.mlp, "experts"))
    x = torch.randn(tokens, model.config.hidden_size, generator=torch.Generator().manual_seed(tokens))
    with torch.no_grad():
        idx, weights = moe.gate(x)
        expected = moe.experts(x, idx, weights)
        got = moe.experts.padded(x, idx, weights)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() < TOL


@pytest.mark.parametrize("overrides", [{}, {"n_group": 1, "topk_group": 1, "norm_topk_prob": False},
                                       {"n_routed_experts": 16, "n_group": 4, "topk_group": 2}])
def test_one_token_router_chooses_as_the_router_does(overrides) -> None:
    """``Router.route_one`` and the scripted path's ``_route_one`` (Python lists, groups chosen by
    their two best choice values) against the router's tensor choice."""
    model = _model(**overrides)
    fast = script.get(model)
    assert fast is not None
    for i, layer in enumerate(model.model.layers):
        if not hasattr(layer.mlp, "experts"):
            continue
        for seed in range(40):
            h = torch.randn(1, model.config.hidden_size, generator=torch.Generator().manual_seed(seed))
            with torch.no_grad():
                idx, weights = layer.mlp.gate(h)
                chosen, picked, scores = layer.mlp.gate.route_one(h)
                scripted_chosen, scripted_picked, _ = fast.module._route_one(h, i)
            want = dict(zip(idx[0].tolist(), weights[0].tolist()))
            assert dict(zip(chosen, picked)) == pytest.approx(want, abs=1e-6)
            assert dict(zip(scripted_chosen, scripted_picked)) == pytest.approx(want, abs=1e-6)
            assert torch.equal(scores, layer.mlp.gate.scores(h))


def test_one_row_rmsnorm_is_the_modules_norm() -> None:
    model = tiny_model()
    norm = model.model.layers[0].input_layernorm
    x = torch.randn(1, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (norm.one_row(x) - norm(x)).abs().max().item() < TOL
        assert torch.equal(norm.rows(x), norm(x))


def test_inference_weights_are_built_once_public_and_guarded(tiny_checkpoint) -> None:
    from glm5_lsp.model import load_model, load_tokenizer

    model = load_model(tiny_checkpoint)
    attn = model.model.layers[0].self_attn
    assert model.prepared and model.inference_current()  # load_model prepared it
    assert isinstance(attn.fused, FusedWeights) and isinstance(attn.absorbed, AbsorbedWeights)
    fused = attn.fused
    cache = KVCache(model.config)
    with torch.no_grad():
        ids = _ids(20)
        model(ids, cache=cache)
        assert attn.fused is fused  # nothing rebuilt by a forward call
        # Weights changed in place (an optimiser step): the general path stops reading the stale
        # fused projections, and its logits are the new weights' (those of a fresh reference forward).
        attn.q_a_proj.weight.mul_(1.5)
        assert not model.inference_current()
        token = _ids(1, seed=9)
        step_logits = model(token, cache=cache)
        full = model(torch.cat([ids, token], dim=1), reference=True)[:, -1:]
        assert (step_logits - full).abs().max().item() < 1e-4
    # The generator rebuilds them before its next generation, and then decodes the new weights.
    gen = Generator(model, load_tokenizer(tiny_checkpoint))
    with torch.no_grad():
        attn.q_a_proj.weight.mul_(0.5)
    assert not model.inference_current()
    out = gen.generate(ids[0].tolist(), GenerationConfig(max_new_tokens=1, stop_at_eos=False))
    assert model.inference_current() and attn.fused is not fused
    with torch.no_grad():
        want = int(model(ids, reference=True)[0, -1].argmax())
    assert out.token_ids == [want]


def test_forward_is_the_general_path_and_the_generator_chooses_the_lean_one(monkeypatch) -> None:
    model = _model(index_topk=12)
    calls = _lean_calls(monkeypatch)
    cache = KVCache(model.config)
    with torch.no_grad():
        model(_ids(8), cache=cache, last_only=True)
        model(_ids(1), cache=cache)
    assert calls == []

    class _Tok:
        eos_token_id = None

        def decode(self, ids):
            return ""

    plain = Generator(model, _Tok()).generate(_ids(8)[0].tolist(), GenerationConfig(max_new_tokens=5))
    assert calls == [("script", "prefill_dense", 8, True)] + [("script", "decode_one", 1, True)] * 4
    calls.clear()
    python = Generator(model, _Tok(), scripted=False).generate(_ids(8)[0].tolist(), GenerationConfig(max_new_tokens=5))
    assert calls == [("python", "prefill_dense", 8, True)] + [("python", "decode_one", 1, True)] * 4
    calls.clear()
    general = Generator(model, _Tok(), lean=False).generate(_ids(8)[0].tolist(), GenerationConfig(max_new_tokens=5))
    assert calls == [] and general.token_ids == python.token_ids == plain.token_ids


def test_projections_are_named() -> None:
    model = _model()
    attn = model.model.layers[0].self_attn
    x = torch.randn(1, 3, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        step = model.prepare_step(_ids(3))
        plain, fused = attn.project(x, step), attn.project_fused(x, step)
    assert isinstance(plain, Projection) and isinstance(fused, Projection)
    assert plain.index_queries is None and fused.index_queries is not None
    for name in ("q_resid", "q_nope", "q_rope", "latents", "index_keys"):
        assert (getattr(plain, name) - getattr(fused, name)).abs().max().item() < TOL
