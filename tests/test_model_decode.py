"""The lean one-token step (``glm5_lsp.model.decode``) against the general forward it stands in for."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_model

from glm5_lsp.model import AttentionPolicy, KVCache, Role
from glm5_lsp.model import decode as lean

TOL = 1e-5


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 512, (1, n), generator=torch.Generator().manual_seed(seed))


def _decode_both(model, prompt: int, steps: int, *, policy=None, roles=None, dense=False):
    """Prefill ``prompt`` tokens into two caches, then decode ``steps`` more into each: one cache by the
    lean step, one by the general path. Returns both logit lists, both selection lists and both caches."""
    ids = _ids(prompt + steps, seed=prompt)
    out = {}
    for lean_on in (True, False):
        model.lean_decode = lean_on
        cache = KVCache(model.config)
        logits, picks = [], []
        with torch.no_grad():
            model(ids[:, :prompt], cache=cache, roles=roles, policy=policy, dense=dense)
            for t in range(prompt, prompt + steps):
                step_logits, sels = model(ids[:, t : t + 1], cache=cache, policy=policy, dense=dense, return_selections=True)
                logits.append(step_logits)
                picks.append(sels)
        out[lean_on] = (logits, picks, cache)
    model.lean_decode = True
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
    model = tiny_model(index_topk=12, **overrides)
    (lean_logits, lean_picks, lean_cache), (gen_logits, gen_picks, gen_cache) = _decode_both(model, 30, 8)
    for a, b in zip(lean_logits, gen_logits):
        assert (a - b).abs().max().item() < TOL
    for a, b in zip(lean_picks, gen_picks):
        assert _key_sets(a) == _key_sets(b)
    assert any(s is not None for per_layer in lean_picks for s in _key_sets(per_layer))  # top-k really selected
    for layer in range(model.config.num_hidden_layers):
        assert (lean_cache.latents[layer][:, :38] - gen_cache.latents[layer][:, :38]).abs().max().item() < TOL
        if lean_cache.index_keys[layer] is not None:
            assert (lean_cache.index_keys[layer][:, :38] - gen_cache.index_keys[layer][:, :38]).abs().max().item() < TOL
    assert torch.equal(lean_cache.token_ids[:, :38], gen_cache.token_ids[:, :38])


def test_lean_step_keeps_the_policys_biased_selection_and_dense_mode() -> None:
    model = tiny_model(index_topk=12)
    roles = torch.full((1, 30), int(Role.CODE), dtype=torch.long)
    roles[0, 2:9] = int(Role.API_DOC)
    roles[0, 20:26] = int(Role.CURRENT_BLOCK)
    policy = AttentionPolicy.from_config()
    lean_run, general_run = _decode_both(model, 30, 6, policy=policy, roles=roles)
    for a, b in zip(lean_run[0], general_run[0]):
        assert (a - b).abs().max().item() < TOL
    assert [_key_sets(p) for p in lean_run[1]] == [_key_sets(p) for p in general_run[1]]
    # The bias moved the selection: the API-doc keys are picked more often than without the policy.
    plain_run, _ = _decode_both(model, 30, 6)
    def doc_hits(picks):
        return sum(k in range(2, 9) for per_layer in picks for s in _key_sets(per_layer) if s for k in s)
    assert doc_hits(lean_run[1]) > doc_hits(plain_run[1])
    dense_lean, dense_general = _decode_both(model, 30, 4, dense=True)
    for a, b in zip(dense_lean[0], dense_general[0]):
        assert (a - b).abs().max().item() < TOL
    assert all(p is None for per_layer in dense_lean[1] for p in per_layer)


def test_lean_step_stands_aside_where_it_does_not_apply() -> None:
    model = tiny_model(index_topk=12)
    cache = KVCache(model.config)
    roles = torch.full((1, 20), int(Role.CODE), dtype=torch.long)
    roles[0, 5] = int(Role.ERROR_CONTEXT)
    policy = AttentionPolicy.from_config()
    token = _ids(1)
    with torch.no_grad():
        model(_ids(20), cache=cache, roles=roles, policy=policy)
        step = model._step(1, 1, cache, torch.zeros(1, 1, dtype=torch.long), policy, False, False)
        assert step.forced_keys is not None and not lean.applies(model, token, cache, step)  # forced error context
        step = model._step(1, 1, cache, torch.zeros(1, 1, dtype=torch.long), None, False, False)
        assert lean.applies(model, token, cache, step)
        assert not lean.applies(model, _ids(2), cache, step)  # two tokens
    assert not lean.applies(model, token, cache, step)  # gradients on: training
    model.lean_decode = False
    with torch.no_grad():
        assert not lean.applies(model, token, cache, step)


def test_error_context_within_the_budget_keeps_the_lean_step() -> None:
    """While every query keeps all its keys, forced error-context keys change nothing: ``_step`` leaves
    them out, the one-token step stays lean, and its logits equal the general path's."""
    model = tiny_model(index_topk=12)
    roles = torch.full((1, 8), int(Role.CODE), dtype=torch.long)
    roles[0, 3] = int(Role.ERROR_CONTEXT)
    policy = AttentionPolicy.from_config()
    budget = policy.topk(model.config.index_topk)
    lean_run, general_run = _decode_both(model, 8, budget - 8 + 3, policy=policy, roles=roles)
    for a, b in zip(lean_run[0], general_run[0]):
        assert (a - b).abs().max().item() < TOL
    cache = KVCache(model.config)
    with torch.no_grad():
        model(_ids(8), cache=cache, roles=roles, policy=policy)
        step = model._step(1, 1, cache, _code(1, 1), policy, False, False)
        assert step.forced_keys is None and step.key_bias is None and lean.applies(model, _ids(1), cache, step)
        model(_ids(budget - 8), cache=cache, policy=policy)  # now the next token has more keys than the budget
        step = model._step(1, 1, cache, _code(1, 1), policy, False, False)
        assert step.forced_keys is not None and not lean.applies(model, _ids(1), cache, step)


def _prefill_both(model, chunks: list[int], *, policy=None, roles=None, dense=False):
    """Prefill ``sum(chunks)`` tokens in pieces (``last_only``, as the generator does), into one cache
    with the lean paths on and one with them off; then two decoding steps. Returns, per side, the
    logits of every piece and step and the cache."""
    total = sum(chunks)
    ids = _ids(total + 2, seed=total)
    out = {}
    for lean_on in (True, False):
        model.lean_decode = lean_on
        cache = KVCache(model.config)
        logits, at = [], 0
        with torch.no_grad():
            for n in chunks:
                part_roles = None if roles is None else roles[:, at : at + n]
                logits.append(model(ids[:, at : at + n], cache=cache, roles=part_roles, policy=policy, dense=dense,
                                    last_only=True))
                at += n
            for t in range(total, total + 2):
                logits.append(model(ids[:, t : t + 1], cache=cache, policy=policy, dense=dense))
        out[lean_on] = (logits, cache)
    model.lean_decode = True
    return out[True], out[False]


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
def test_dense_prefill_gives_the_general_paths_logits_and_cache(chunks, dense, overrides) -> None:
    model = tiny_model(index_topk=12, **overrides)
    (lean_logits, lean_cache), (gen_logits, gen_cache) = _prefill_both(model, chunks, dense=dense)
    for a, b in zip(lean_logits, gen_logits):
        assert a.shape == b.shape
        assert (a - b).abs().max().item() < TOL
    n = sum(chunks) + 2
    for layer in range(model.config.num_hidden_layers):
        assert (lean_cache.latents[layer][:, :n] - gen_cache.latents[layer][:, :n]).abs().max().item() < TOL
        if lean_cache.index_keys[layer] is not None:
            assert (lean_cache.index_keys[layer][:, :n] - gen_cache.index_keys[layer][:, :n]).abs().max().item() < TOL
    assert torch.equal(lean_cache.token_ids[:, :n], gen_cache.token_ids[:, :n])


def _code(batch: int, n: int) -> torch.Tensor:
    return torch.full((batch, n), int(Role.CODE), dtype=torch.long)


def test_dense_prefill_under_the_policy_and_where_it_stands_aside() -> None:
    model = tiny_model(index_topk=12)
    roles = torch.full((1, 16), int(Role.CODE), dtype=torch.long)  # the policy's budget: 16 keys
    roles[0, 1:4] = int(Role.API_DOC)
    roles[0, 6] = int(Role.ERROR_CONTEXT)
    policy = AttentionPolicy.from_config()
    (lean_logits, _), (gen_logits, _) = _prefill_both(model, [10, 6], policy=policy, roles=roles)
    for a, b in zip(lean_logits, gen_logits):
        assert (a - b).abs().max().item() < TOL
    cache = KVCache(model.config)
    with torch.no_grad():
        model(_ids(8), cache=cache)
        assert lean.applies_dense(model, _ids(4), cache, model._step(1, 4, cache, _code(1, 4), policy, False, False))
        sparse = model._step(1, 9, cache, _code(1, 9), policy, False, False)  # 17 keys: more than the budget
        assert sparse.topk == 16 and not lean.applies_dense(model, _ids(9), cache, sparse)
        assert lean.applies_dense(model, _ids(5), cache, model._step(1, 5, cache, _code(1, 5), policy, True, False))
        long = lean.PREFILL_MAX_TOKENS + 1
        assert not lean.applies_dense(model, _ids(long), cache, model._step(1, long, cache, _code(1, long), None, True, False))
        assert not lean.applies_dense(model, _ids(1), cache, model._step(1, 1, cache, _code(1, 1), None, False, False))
        assert not lean.applies_dense(model, torch.cat([_ids(3), _ids(3)]), cache,
                                      model._step(2, 3, cache, _code(2, 3), None, False, False))  # two sequences
        model.lean_decode = False
        assert not lean.applies_dense(model, _ids(4), cache, model._step(1, 4, cache, _code(1, 4), None, False, False))
    model.lean_decode = True


@pytest.mark.parametrize("tokens", [1, 2, 7, 40, 97])
def test_batched_experts_equal_the_per_expert_loop(tokens) -> None:
    model = tiny_model(n_group=1, topk_group=1)
    moe = next(layer.mlp for layer in model.model.layers if hasattr(layer.mlp, "experts"))
    x = torch.randn(tokens, model.config.hidden_size, generator=torch.Generator().manual_seed(tokens))
    with torch.no_grad():
        idx, weights = moe.gate(x)
        expected = moe.experts(x, idx, weights)
        got = lean._experts_batched(moe.experts, x, idx, weights)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() < TOL
