"""Parity with transformers' GlmMoeDsaForCausalLM (the test oracle) on tiny random checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from glm5_lsp.model import load_model, save_model

transformers = pytest.importorskip("transformers")
from tiny import TINY

CASES = {
    "topk-covers-sequence": {"index_topk": 64},
    "topk-smaller-than-sequence": {"index_topk": 8},
    "shared-indexer-layers": {"index_topk": 8, "indexer_types": ["full", "shared", "full"]},
    "mlp-layer-types": {"index_topk": 8, "mlp_layer_types": ["sparse", "dense", "sparse"], "first_k_dense_replace": 0},
}


def reference_checkpoint(folder: Path, **overrides) -> transformers.GlmMoeDsaForCausalLM:
    torch.manual_seed(0)
    cfg = transformers.GlmMoeDsaConfig(**{**TINY, **overrides})
    ref = transformers.GlmMoeDsaForCausalLM(cfg).eval()
    for name, buf in ref.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buf.normal_(0.0, 0.1)
    ref.save_pretrained(folder)
    return ref


def reference_topk(ref, ids: torch.Tensor) -> list[torch.Tensor]:
    """The top-k indices each full indexer layer of the reference chose ([B, T, k] per layer)."""
    chosen: list[torch.Tensor] = []
    hooks = [
        layer.self_attn.indexer.register_forward_hook(lambda _m, _a, out: chosen.append(out.long()))
        for layer in ref.model.layers
        if layer.self_attn.indexer is not None
    ]
    with torch.no_grad():
        ref(ids)
    for h in hooks:
        h.remove()
    return chosen


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_reference(tmp_path: Path, case: str) -> None:
    ref = reference_checkpoint(tmp_path, **CASES[case])
    ours = load_model(tmp_path)
    ids = torch.randint(0, TINY["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = ref(ids).logits
        fast, selections = ours(ids, return_selections=True)
        reference_path = ours(ids, reference=True)
    assert fast.shape == (2, 40, TINY["vocab_size"])
    assert (fast - expected).abs().max().item() < 1e-4
    assert (reference_path - expected).abs().max().item() < 1e-4
    # The same selected sets as the reference, layer by layer, where the indexer actually selects.
    topk = CASES[case]["index_topk"]
    if topk < ids.shape[1]:
        full_layers = [i for i, layer in enumerate(ours.model.layers) if layer.self_attn.indexer is not None]
        for layer_idx, theirs in zip(full_layers, reference_topk(ref, ids)):
            for sel in selections[layer_idx]:
                if sel.idx is None:
                    continue
                for b in range(ids.shape[0]):
                    for row in range(sel.q1 - sel.q0):
                        t = sel.q0 + row
                        mine = set(sel.idx[b, row][sel.valid[b, row]].tolist())
                        want = {j for j in theirs[b, t].tolist() if j <= t}
                        assert mine == want, f"layer {layer_idx} query {t}"


def test_fused_expert_checkpoint_matches(tmp_path: Path) -> None:
    ref = reference_checkpoint(tmp_path / "hf", index_topk=8)
    per_expert = load_model(tmp_path / "hf")
    save_model(per_expert, tmp_path / "fused", fused_experts=True)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "fused" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.layers.1.mlp.experts.gate_up_proj" in keys
    assert not any(".experts.0." in k for k in keys)
    fused = load_model(tmp_path / "fused")
    ids = torch.randint(0, TINY["vocab_size"], (1, 33), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (fused(ids) - ref(ids).logits).abs().max().item() < 1e-4


def test_sharded_checkpoint_round_trip(tmp_path: Path) -> None:
    reference_checkpoint(tmp_path / "hf", index_topk=8)
    model = load_model(tmp_path / "hf")
    files = save_model(model, tmp_path / "sharded", max_shard_bytes=140_000, fused_experts=False)
    assert len(files) > 1 and (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert all(f.stat().st_size <= 140_000 + 10_000 for f in files)  # tensor bytes plus a small header
    again = load_model(tmp_path / "sharded")
    ids = torch.randint(0, TINY["vocab_size"], (1, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(again(ids), model(ids))
