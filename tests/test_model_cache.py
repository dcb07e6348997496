"""Cached decoding and prefix reuse give the logits of a full forward."""

from __future__ import annotations

import torch

from glm5_lsp.model import AttentionPolicy, GenerationConfig, Generator, KVCache, Role
from tiny import tiny_model

TOL = 1e-4


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 512, (1, n), generator=torch.Generator().manual_seed(seed))


def test_decode_one_token_at_a_time_matches_full_forward() -> None:
    model = tiny_model(index_topk=8)
    ids = _ids(48)
    with torch.no_grad():
        full = model(ids)
        cache = KVCache(model.config)
        parts = [model(ids[:, :20], cache=cache)]
        for t in range(20, 48):
            parts.append(model(ids[:, t : t + 1], cache=cache))
    assert cache.length == 48
    assert (torch.cat(parts, dim=1) - full).abs().max().item() < TOL


def test_long_prefill_chunks_agree_with_reference_and_decode() -> None:
    model = tiny_model(index_topk=160)  # first query chunk keeps every key, later chunks select
    ids = _ids(300, seed=1)
    with torch.no_grad():
        fast = model(ids)
        ref = model(ids, reference=True)
        cache = KVCache(model.config)
        head = model(ids[:, :290], cache=cache)
        tail = [model(ids[:, t : t + 1], cache=cache) for t in range(290, 300)]
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
