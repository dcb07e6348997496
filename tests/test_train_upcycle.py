"""Sparse upcycling (``glm5_lsp.train.upcycle``): more routed experts, the same function to start with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny import tiny_model

from glm5_lsp.model import GenerationConfig, Generator, load_model
from glm5_lsp.model.config import GlmMoeDsaConfig
from glm5_lsp.train.upcycle import main, upcycle


def _ids(n: int = 40) -> torch.Tensor:
    return torch.randint(0, 512, (2, n), generator=torch.Generator().manual_seed(3))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to fp32 rounding: an expert's rows split between it and its copy are multiplied in other
    blocks (bit for bit on some CPUs, 1.2e-7 apart on an AMD EPYC)."""
    return a.shape == b.shape and float((a - b).abs().max()) <= 1e-5


def _computes_the_same(model, bigger) -> None:
    """The same logits (sparse and dense attention), and the runtime's decoding, cached and step by
    step, writes the same tokens."""
    with torch.no_grad():
        assert _same(model(_ids()), bigger(_ids()))
        assert _same(model(_ids(), dense=True), bigger(_ids(), dense=True))
    config = GenerationConfig(max_new_tokens=8, stop_at_eos=False)
    prompt = _ids(12)[0].tolist()
    assert (Generator(model.prepare_inference(), _NoText()).generate(prompt, config).token_ids
            == Generator(bigger.prepare_inference(), _NoText()).generate(prompt, config).token_ids)


@pytest.mark.parametrize("factor", [2, 3])
def test_the_upcycled_model_computes_what_the_original_did(factor: int) -> None:
    model = tiny_model(n_group=1, topk_group=1)
    bigger = upcycle(model, factor).eval()
    assert bigger.config.n_routed_experts == 8 * factor
    _computes_the_same(model, bigger)


def test_the_copies_differ_and_the_router_can_bring_them_in() -> None:
    model = tiny_model(n_group=1, topk_group=1)
    bigger = upcycle(model, 2, noise=0.05)
    layer = next(layer for layer in bigger.model.layers if hasattr(layer.mlp, "experts"))
    experts, gate = layer.mlp.experts, layer.mlp.gate
    assert not torch.equal(experts.down_proj[:8], experts.down_proj[8:])  # room to part ways
    assert torch.equal(gate.weight[:8], gate.weight[8:])
    x = torch.randn(64, bigger.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert int(gate(x)[0].max()) < 8  # the originals only ...
        gate.e_score_correction_bias[8:] = gate.e_score_correction_bias[:8] + 0.5  # the balancer's doing
        assert int(gate(x)[0].min()) >= 8  # ... until the copies' bias rises


def test_a_token_takes_its_experts_from_one_group_and_the_copies_compute_what_the_originals_do() -> None:
    model = tiny_model(n_group=1, topk_group=1)
    bigger = upcycle(model, 2, noise=0.0).eval()  # exact copies
    assert (bigger.config.n_group, bigger.config.topk_group) == (2, 1)
    gates = [layer.mlp.gate for layer in bigger.model.layers if hasattr(layer.mlp, "gate")]
    originals = [gate.e_score_correction_bias[:8].clone() for gate in gates]
    x = torch.randn(200, bigger.config.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for gate, bias in zip(gates, originals):  # the copies' group above the originals' all along
            gate.e_score_correction_bias[8:] = bias + 0.5
            assert int(gate(x)[0].min()) >= 8
        assert _same(model(_ids()), bigger(_ids()))  # the same two experts, copied
        chosen = []
        for gate, bias in zip(gates, originals):  # the balancer's doing: some copies above their originals
            gate.e_score_correction_bias[8:] = bias + torch.linspace(-0.03, 0.03, 8)
            chosen.append(gate(x)[0])
    picks = torch.cat(chosen)
    assert ((picks < 8).all(-1) | (picks >= 8).all(-1)).all()  # never an expert with its own copy
    assert (picks >= 8).any() and (picks < 8).any()  # both groups take tokens


def test_a_zero_factor_is_refused() -> None:
    with pytest.raises(ValueError, match="factor"):
        upcycle(tiny_model(n_group=1, topk_group=1), 0)


def test_a_grouped_model_is_upcycled_into_groups_of_copies_computing_what_it_did() -> None:
    model = tiny_model()  # 8 experts in 2 groups of 4, a token's experts from one group
    bigger = upcycle(model, 2, noise=0.0).eval()
    assert (bigger.config.n_routed_experts, bigger.config.n_group, bigger.config.topk_group) == (16, 4, 1)
    _computes_the_same(model, bigger)
    gates = [layer.mlp.gate for layer in bigger.model.layers if hasattr(layer.mlp, "gate")]
    x = torch.randn(200, bigger.config.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for gate in gates:
            assert int(gate(x)[0].max()) < 8  # the originals' groups only, to start with
            bias = gate.e_score_correction_bias[:8].clone()
            gate.e_score_correction_bias[8:] = bias + torch.linspace(-0.03, 0.03, 8)  # the balancer's doing
            picks = gate(x)[0]
            group = picks // 4
            assert (group == group[:, :1]).all()  # one group a token, as before
            assert (picks >= 8).any() and (picks < 8).any()
            # copy k of group g is group 2k + g: an expert e's copy is e + 8, never in e's group
            assert not ((picks[:, :1] % 8 == picks[:, 1:] % 8) & (picks[:, :1] != picks[:, 1:])).any()


def test_a_model_folder_is_upcycled_into_one_training_can_continue_from(tmp_path: Path) -> None:
    from glm5_lsp.model import save_model

    source = tmp_path / "model"
    save_model(tiny_model(n_group=1, topk_group=1), source)
    (source / "tokenizer.json").write_text("{}", encoding="utf-8")
    (source / "metrics.json").write_text(json.dumps({"continued": {"position": {"epoch": 1}}}), encoding="utf-8")
    (source / "gate").mkdir()
    target = tmp_path / "upcycled"
    assert main([str(source), str(target)]) == 0
    assert GlmMoeDsaConfig.from_pretrained(target).n_routed_experts == 16
    assert (target / "tokenizer.json").is_file() and json.loads((target / "metrics.json").read_text())["continued"]
    assert not (target / "gate").exists()  # trained for the other weights
    assert load_model(target).config.n_routed_experts == 16
    assert main([str(source), str(target)]) == 1  # never over another model


class _NoText:
    eos_token_id = None

    def decode(self, ids):
        return ""
