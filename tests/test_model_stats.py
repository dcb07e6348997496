"""The runtime's per-step statistics for the gate (``glm5_lsp.model.stats``): the lean paths and the
general forward give the same numbers, one entry per step as a logits processor sees the steps, each
statistic as documented (checked against an independent computation from the modules' outputs)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tiny import tiny_model

from glm5_lsp.model import (
    LAYER_STATS,
    STEP_STATS,
    AttentionPolicy,
    GenerationConfig,
    Generator,
    KVCache,
    Role,
    cached_forward,
)
from glm5_lsp.model.stats import StatsProbe

TOL = 1e-4


class _Tok:
    eos_token_id = None

    def decode(self, ids):
        return "".join(chr(97 + i % 26) for i in ids)


def _ids(n: int, seed: int = 0) -> list[int]:
    return torch.randint(1, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _roles(n: int) -> list[int]:
    roles = [int(Role.CODE)] * n
    for i in range(1, min(n, 6)):
        roles[i] = int(Role.API_DOC)
    for i in range(n // 2, n // 2 + 4):
        roles[i] = int(Role.CURRENT_BLOCK)
    roles[n - 3] = int(Role.ERROR_CONTEXT)
    return roles


def _close(a, b) -> float:
    """The largest difference between two statistics (nested lists of the same shape)."""
    if isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b)
        return max((_close(x, y) for x, y in zip(a, b)), default=0.0)
    return abs(a - b)


def _layers(model) -> dict[str, int]:
    config = model.config
    full = sum(kind == "full" for kind in config.indexer_types)
    moe = sum(kind == "sparse" for kind in config.mlp_layer_types)
    every = config.num_hidden_layers
    return {"dsa_concentration": full, "dsa_mass_error_context": every, "dsa_mass_current_block": every,
            "dsa_mass_api_doc": every, "moe_router_entropy": moe, "moe_top_weight": moe, "moe_shared_share": moe}


def test_the_names_are_the_gates() -> None:
    from glm5_lsp.gate import stats as gate_stats

    assert LAYER_STATS == gate_stats.LAYER_STATS
    assert STEP_STATS == gate_stats.STEP_STATS


@pytest.mark.parametrize(
    ("prompt", "topk", "overrides", "policy", "draft"),
    [
        (10, 24, {}, False, False),  # lean prefill; steps keep every key, then select (past 24 keys)
        (40, 24, {}, True, False),  # general prefill (more keys than the budget), biased and forced keys
        (12, 20, {"indexer_types": ["full", "shared", "full"]}, False, False),  # a shared layer
        (12, 20, {"n_group": 1, "topk_group": 1, "norm_topk_prob": False, "first_k_dense_replace": 0}, True, False),
        (14, 20, {}, False, True),  # drafts verified in one forward call (general path, several rows)
    ],
)
def test_lean_and_general_paths_give_the_same_statistics(prompt, topk, overrides, policy, draft) -> None:
    model = tiny_model(index_topk=topk, **overrides)
    ids, roles = _ids(prompt, seed=prompt), _roles(prompt)
    config = GenerationConfig(max_new_tokens=16, stop_at_eos=False, step_stats=True)
    drafter = None
    if draft:  # the true continuation, wrong from its third token on
        truth = Generator(model, _Tok()).generate(ids, config, roles=roles).token_ids

        def drafter(out):
            rest = truth[len(out):len(out) + 4]
            return rest[:2] + [(t + 1) % 512 for t in rest[2:]]

    runs = {}
    for lean, scripted in ((True, True), (True, False), (False, False)):
        generator = Generator(model, _Tok(), policy=AttentionPolicy.from_config() if policy else None, lean=lean,
                              scripted=scripted)
        runs[lean, scripted] = generator.generate(ids, config, roles=roles, drafter=drafter)
    fast, python, general = runs[True, True], runs[True, False], runs[False, False]
    assert fast.token_ids == python.token_ids == general.token_ids
    for name in LAYER_STATS:  # the scripted lean paths feed the probe what the Python ones do
        assert _close(fast.stats.per_layer[name], python.stats.per_layer[name]) < 1e-6, name
    assert _close(fast.stats.per_step["hidden_norm"], python.stats.per_step["hidden_norm"]) < 1e-6
    if draft:
        assert fast.drafted_tokens > fast.accepted_tokens > 0  # some proposals kept, some not
    counts = _layers(model)
    for name in LAYER_STATS:
        rows = fast.stats.per_layer[name]
        assert len(rows) == 16 and all(len(r) == counts[name] for r in rows), name
        assert _close(rows, general.stats.per_layer[name]) < TOL, name
        assert all(math.isfinite(v) for r in rows for v in r), name
    assert len(fast.stats.per_step["hidden_norm"]) == 16
    assert _close(fast.stats.per_step["hidden_norm"], general.stats.per_step["hidden_norm"]) < TOL
    concentration = fast.stats.per_layer["dsa_concentration"]
    if topk > 16 and not overrides.get("indexer_types"):
        assert min(min(r) for r in concentration) < 1.0  # past 16 keys the share is a real figure


@pytest.mark.parametrize(
    ("overrides", "policy"),
    [
        ({}, False),
        ({"indexer_types": ["full", "shared", "full"]}, True),
        ({"n_group": 1, "topk_group": 1, "norm_topk_prob": False, "first_k_dense_replace": 0}, False),
    ],
)
@pytest.mark.parametrize("scripted", [True, False])
def test_a_verification_on_the_lean_prefill_records_every_row_as_the_general_path(overrides, policy, scripted,
                                                                                    monkeypatch) -> None:
    """A draft's verification (several tokens, every row's logits) that keeps every key takes the lean
    prefill (scripted or not), which records each of its rows as the general path does: the
    statistics of every row."""
    from glm5_lsp.model import lean as lean_paths
    from glm5_lsp.model import scripted as script

    model = tiny_model(index_topk=40, **overrides).prepare_inference()
    ids, roles = torch.tensor([_ids(28, seed=6)]), torch.tensor([_roles(28)])
    attention = AttentionPolicy.from_config() if policy else None
    verified = []
    for module in (lean_paths, script):
        def counted(first, ids, step, last_only=True, real=module.prefill_dense, module=module):
            if not last_only:
                verified.append((module.__name__, ids.shape[1]))
            return real(first, ids, step, last_only=last_only)

        monkeypatch.setattr(module, "prefill_dense", counted)
    out = {}
    for lean in (True, False):
        cache, probe = KVCache(model.config), StatsProbe(scaling=model.config.routed_scaling_factor)
        with torch.no_grad():
            cached_forward(model, ids[:, :20], cache, roles=roles[:, :20], policy=attention, last_only=True,
                           lean=lean, scripted=scripted, probe=probe)
            cached_forward(model, ids[:, 20:], cache, roles=roles[:, 20:], policy=attention, lean=lean,
                           scripted=scripted, probe=probe)
        assert probe.blocks[1].rows == 8
        out[lean] = probe.finish([(0, 0)] + [(1, r) for r in range(8)])
    assert verified == [((script if scripted else lean_paths).__name__, 8)]  # the lean side's verification only
    for name in LAYER_STATS:
        assert _close(out[True].per_layer[name], out[False].per_layer[name]) < TOL, name
    assert _close(out[True].per_step["hidden_norm"], out[False].per_step["hidden_norm"]) < TOL
    assert min(min(r) for r in out[True].per_layer["dsa_concentration"]) < 1.0  # past 16 keys: real figures
    assert max(r[-1] for r in out[True].per_layer["dsa_mass_error_context"]) > 0.0  # a role in the draft seen


def test_dense_mode_statistics_agree_on_both_paths() -> None:
    model = tiny_model(index_topk=8).prepare_inference()
    ids = torch.tensor([_ids(20, seed=3)])
    out = {}
    for lean in (True, False):
        cache, probe = KVCache(model.config), StatsProbe()
        used = []
        with torch.no_grad():
            cached_forward(model, ids[:, :12], cache, dense=True, last_only=True, lean=lean, probe=probe)
            used.append((len(probe.blocks) - 1, 0))
            for t in range(12, 20):
                cached_forward(model, ids[:, t : t + 1], cache, dense=True, lean=lean, probe=probe)
                used.append((len(probe.blocks) - 1, 0))
        out[lean] = probe.finish(used)
    for name in LAYER_STATS:
        assert _close(out[True].per_layer[name], out[False].per_layer[name]) < TOL, name


def test_a_step_verified_in_a_draft_has_the_statistics_of_a_decoding_step() -> None:
    """Greedy text is the same with and without drafts; so is each step's statistics, whether its
    logits came from a one-token step or from a row of a draft's verification."""
    model = tiny_model(index_topk=20)
    ids = _ids(14, seed=5)
    config = GenerationConfig(max_new_tokens=12, stop_at_eos=False, step_stats=True)
    plain = Generator(model, _Tok()).generate(ids, config)
    truth = plain.token_ids

    def drafter(out):  # proposes the true continuation, wrong from its third token on
        rest = truth[len(out):len(out) + 4]
        return rest[:2] + [(t + 1) % 512 for t in rest[2:]]

    drafted = Generator(model, _Tok()).generate(ids, config, drafter=drafter)
    assert drafted.token_ids == truth and drafted.accepted_tokens > 0 and drafted.forward_calls < plain.forward_calls
    for name in LAYER_STATS:
        assert _close(drafted.stats.per_layer[name], plain.stats.per_layer[name]) < TOL, name
    assert _close(drafted.stats.per_step["hidden_norm"], plain.stats.per_step["hidden_norm"]) < TOL


def test_one_entry_per_step_as_the_logits_processor_sees_them() -> None:
    model = tiny_model(index_topk=20)
    ids = _ids(10, seed=1)
    for config, kwargs in [
        (GenerationConfig(max_new_tokens=9, stop_at_eos=False, step_stats=True), {}),
        (GenerationConfig(max_new_tokens=9, stop_at_eos=False, step_stats=True, min_token_prob=0.5), {}),
        (GenerationConfig(max_new_tokens=9, stop_at_eos=False, step_stats=True), {"drafter": lambda out: [3, 4]}),
        (GenerationConfig(max_new_tokens=0, step_stats=True), {}),
    ]:
        calls: list[int] = []

        def count(generated, logits, calls=calls):
            calls.append(len(generated))
            return logits

        out = Generator(model, _Tok()).generate(ids, config, logits_processor=count, **kwargs)
        assert out.stats.steps == len(calls)
        assert all(len(out.stats.per_layer[name]) == len(calls) for name in LAYER_STATS)
    cancelled = Generator(model, _Tok()).generate(ids, GenerationConfig(step_stats=True), should_cancel=lambda: True)
    assert cancelled.stats.steps == 0 and cancelled.stats.per_layer["moe_top_weight"] == []


def test_no_statistics_unless_asked(monkeypatch) -> None:
    from glm5_lsp.model import generate

    def refuse(*args, **kwargs):
        raise AssertionError("a probe was made")

    monkeypatch.setattr(generate, "StatsProbe", refuse)
    out = Generator(tiny_model(), _Tok()).generate(_ids(10), GenerationConfig(max_new_tokens=3))
    assert out.stats is None


def test_statistics_are_one_sequence_at_a_time() -> None:
    model = tiny_model()
    with pytest.raises(ValueError, match="one sequence"):
        model(torch.tensor([_ids(6), _ids(6, seed=1)]), probe=StatsProbe())


def _independent_first_step(model, ids: list[int], roles: list[int], topk: int) -> dict[str, list[float]]:
    """Step 0's statistics (the prompt's last position, every key kept) from the modules' own outputs
    in a plain forward: the dense reference attention, the indexer's and the router's functions."""
    from glm5_lsp.model.glm5 import MoE
    from glm5_lsp.train.metrics import dense_attention_probs

    onehot = torch.tensor([[float(r == role) for role in (Role.ERROR_CONTEXT, Role.CURRENT_BLOCK, Role.API_DOC)]
                           for r in roles])
    got: dict[str, list[float]] = {name: [] for name in (*LAYER_STATS, *STEP_STATS)}

    def attention(attn, args) -> None:
        x, step, _ = args
        probs, q_resid = dense_attention_probs(attn, x, step)  # [1, H, T, T]
        mass = probs[0, :, -1].mean(0) @ onehot
        for k, role in enumerate(("error_context", "current_block", "api_doc")):
            got[f"dsa_mass_{role}"].append(float(mass[k]))
        if attn.indexer is not None:
            iq, iw = attn.indexer.queries(x, q_resid, step.cos, step.sin)
            scores = attn.indexer.scores(iq, iw, attn.indexer.keys(x, step.cos, step.sin))[0, -1]
            p = torch.softmax(scores, -1).sort(descending=True).values
            got["dsa_concentration"].append(float(p[:16].sum() / p[:topk].sum()))

    def router(moe, args) -> None:
        (x,) = args
        h = x[0, -1:]
        scores = moe.gate.scores(h)[0]
        p = scores / scores.sum()
        got["moe_router_entropy"].append(float(-(p * p.log()).sum()))
        idx, weights = moe.gate(h)
        got["moe_top_weight"].append(float(weights.max()) / moe.gate.scaling)
        routed, shared = moe.experts(h, idx, weights).norm(), moe.shared_experts(h).norm()
        got["moe_shared_share"].append(float(shared / (routed + shared)))

    def final(norm, args) -> None:
        got["hidden_norm"].append(float(args[0][0, -1].norm()))

    hooks = [model.model.norm.register_forward_pre_hook(final)]
    for layer in model.model.layers:
        hooks.append(layer.self_attn.register_forward_pre_hook(attention))
        if isinstance(layer.mlp, MoE):
            hooks.append(layer.mlp.register_forward_pre_hook(router))
    try:
        with torch.no_grad():
            model(torch.tensor([ids]), roles=torch.tensor([roles]))
    finally:
        for hook in hooks:
            hook.remove()
    return got


@pytest.mark.parametrize("prompt", [12, 22])  # the lean prefill (<= 16 keys: a share of 1) and over 16 keys
def test_each_statistic_is_what_it_says(prompt) -> None:
    topk = 24
    model = tiny_model(index_topk=topk)
    ids, roles = _ids(prompt, seed=prompt), _roles(prompt)
    out = Generator(model, _Tok()).generate(ids, GenerationConfig(max_new_tokens=6, stop_at_eos=False, step_stats=True),
                                            roles=roles)
    want = _independent_first_step(model, ids, roles, topk)
    for name in LAYER_STATS:
        assert _close(out.stats.per_layer[name][0], want[name]) < TOL, name
    assert abs(out.stats.per_step["hidden_norm"][0] - want["hidden_norm"][0]) < TOL
    concentration = out.stats.per_layer["dsa_concentration"][0]
    assert all(v == pytest.approx(1.0) for v in concentration) if prompt <= 16 else max(concentration) < 1.0
    # later steps: generated keys are code, so the prompt roles' share of the attention shrinks but stays
    masses = out.stats.per_layer["dsa_mass_api_doc"]
    assert all(0.0 < v < 1.0 for r in masses for v in r)
    experts = model.config.n_routed_experts
    assert all(0 < v <= math.log(experts) + 1e-6 for r in out.stats.per_layer["moe_router_entropy"] for v in r)
    assert all(0 < v <= 1 for r in out.stats.per_layer["moe_top_weight"] for v in r)
    assert all(0 <= v <= 1 for r in out.stats.per_layer["moe_shared_share"] for v in r)


def test_a_prompt_of_one_role_puts_all_the_first_steps_mass_there() -> None:
    model = tiny_model(index_topk=24)
    ids = _ids(12, seed=2)
    out = Generator(model, _Tok()).generate(ids, GenerationConfig(max_new_tokens=2, stop_at_eos=False, step_stats=True),
                                            roles=[int(Role.API_DOC)] * 12)
    assert out.stats.per_layer["dsa_mass_api_doc"][0] == pytest.approx([1.0] * model.config.num_hidden_layers)
    assert out.stats.per_layer["dsa_mass_error_context"][0] == [0.0] * model.config.num_hidden_layers
    assert max(out.stats.per_layer["dsa_mass_api_doc"][1]) < 1.0  # step 1 also sees the generated (code) key


def test_the_local_backend_hands_the_statistics_out(tiny_checkpoint: Path) -> None:
    from glm5_lsp.backends.base import CompletionRequest
    from glm5_lsp.backends.local import LocalBackend
    from glm5_lsp.gate.stats import DecodeStats, StepObserver, end_token_ids
    from glm5_lsp.spans import Prompt

    backend = LocalBackend(tiny_checkpoint)
    strings = backend.tokenizer.token_strings()
    observer = StepObserver(strings, end_token_ids(strings))
    prompt = Prompt("def add(a, b):\n    return", "")
    done = backend.complete(CompletionRequest(prompt, max_tokens=6, step_stats=True, logits_processor=observer))
    gate_stats = observer.finish()
    assert done.stats is not None and done.stats.steps == gate_stats.steps > 0
    merged = DecodeStats(per_layer=done.stats.per_layer, per_step=done.stats.per_step)  # the gate's container
    assert set(merged.per_layer) == set(LAYER_STATS) and len(merged.per_step["hidden_norm"]) == gate_stats.steps
    assert backend.complete(CompletionRequest(prompt, max_tokens=3)).stats is None
