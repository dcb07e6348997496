"""Cached decoding and prefix reuse give the logits of a full forward (cached steps through
``cached_forward``, the generator's choice of path, as decoding runs them)."""

from __future__ import annotations

import torch
from tiny import tiny_model

from glm5_lsp.model import AttentionPolicy, GenerationConfig, Generator, KVCache, Role, cached_forward

TOL = 1e-4


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 512, (1, n), generator=torch.Generator().manual_seed(seed))


def test_decode_one_token_at_a_time_matches_full_forward() -> None:
    model = tiny_model(index_topk=8).prepare_inference()
    ids = _ids(48)
    with torch.no_grad():
        full = model(ids)
        cache = KVCache(model.config)
        parts = [cached_forward(model, ids[:, :20], cache)]
        for t in range(20, 48):
            parts.append(cached_forward(model, ids[:, t : t + 1], cache))
    assert cache.length == 48
    assert (torch.cat(parts, dim=1) - full).abs().max().item() < TOL


def test_long_prefill_chunks_agree_with_reference_and_decode() -> None:
    model = tiny_model(index_topk=160).prepare_inference()  # first query chunk keeps every key, later chunks select
    ids = _ids(300, seed=1)
    with torch.no_grad():
        fast = model(ids)
        ref = model(ids, reference=True)
        cache = KVCache(model.config)
        # The torch paths (the C call's own test is test_model_native.py: on this random model a row's
        # 160th and 161st indexer scores are both 0, and C keeps the first of equal keys, torch another).
        head = cached_forward(model, ids[:, :290], cache, native_step=False)
        tail = [cached_forward(model, ids[:, t : t + 1], cache, native_step=False) for t in range(290, 300)]
    assert (fast - ref).abs().max().item() < TOL
    assert (torch.cat([head, *tail], dim=1) - fast).abs().max().item() < TOL


def test_prefix_reuse_computes_only_the_rest(tiny_checkpoint) -> None:
    from glm5_lsp.model import load_model, load_tokenizer

    model = load_model(tiny_checkpoint)
    tok = load_tokenizer(tiny_checkpoint)
    gen = Generator(model, tok)
    first = tok.encode("import os\n\ndef read(path):\n    with open(path) as f:\n        return f.read()\n")
    second = first[:-3] + tok.encode("  # edited line\n")
    gen.generate(first, GenerationConfig(max_new_tokens=4))
    logits, reused = gen.prefill(second)
    assert reused == len(first) - 3
    with torch.no_grad():
        full = model(torch.tensor([second]))[0, -1]
    assert (logits - full).abs().max().item() < TOL
    # The same prompt again reuses all but the last token.
    _, again = gen.prefill(second)
    assert again == len(second) - 1


def test_prefix_reuse_respects_roles() -> None:
    model = tiny_model(index_topk=8)

    class _Tok:
        eos_token_id = None

        def decode(self, ids):
            return ""

    gen = Generator(model, _Tok(), policy=AttentionPolicy.from_config())
    ids = _ids(40, seed=3)[0].tolist()
    roles = [int(Role.CODE)] * 40
    gen.prefill(ids, roles)
    roles2 = list(roles)
    roles2[10] = int(Role.API_DOC)
    logits, reused = gen.prefill(ids, roles2)
    assert reused == 10  # the role change at position 10 invalidates everything after it
    with torch.no_grad():
        full = model(torch.tensor([ids]), roles=torch.tensor([roles2]), policy=gen.policy)[0, -1]
    assert (logits - full).abs().max().item() < TOL


def test_batched_forward_matches_single_rows() -> None:
    model = tiny_model(index_topk=8)
    ids = torch.cat([_ids(30, 4), _ids(30, 5)])
    with torch.no_grad():
        both = model(ids)
        one = model(ids[1:])
    assert (both[1:] - one).abs().max().item() < TOL


def test_decoding_under_the_policy_selects_what_a_full_forward_selects() -> None:
    """The single-token decoding path (no causal mask, the policy's bias added to one row) keeps
    exactly the keys the full forward keeps for that row, and gives its logits."""
    from glm5_lsp.model.glm5 import selection_mask

    model = tiny_model(index_topk=8)
    policy = AttentionPolicy.from_config()
    ids = _ids(40, seed=5)
    roles = torch.full((1, 40), int(Role.CODE))
    roles[0, 4:12] = int(Role.API_DOC)
    roles[0, 20:27] = int(Role.CURRENT_BLOCK)
    with torch.no_grad():
        full, full_sel = model(ids, roles=roles, policy=policy, return_selections=True)
        cache = KVCache(model.config)
        model(ids[:, :30], cache=cache, roles=roles[:, :30], policy=policy)
        for t in range(30, 40):
            logits, sel = model(ids[:, t : t + 1], cache=cache, roles=roles[:, t : t + 1], policy=policy,
                                return_selections=True)
            assert (logits[0, -1] - full[0, t]).abs().max().item() < TOL
            for layer, (one, every) in enumerate(zip(sel, full_sel)):
                got = selection_mask(one, 1, 1, t + 1, t, ids.device)[0, 0]
                want = selection_mask(every, 1, 40, 40, 0, ids.device)[0, t, : t + 1]
                assert torch.equal(got, want), f"layer {layer}, position {t}"
                assert int(got.sum()) == policy.topk(8)  # the budget is spent, not the whole context
