"""Training loop pieces on a tiny random model: stage plan and LR schedule, the KL warm-up (the
indexer's agreement with dense attention rises, nothing else moves), expert balancing, the recall
metric's faithfulness to the runtime, and one end-to-end ``glm5-lsp train`` run (slow).

End-to-end data: this package's own source as the "standard library" and the fixture
site-packages ``tests/data/train/site``.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from glm5_lsp.model import GlmMoeDsaForCausalLM
from glm5_lsp.model.glm5 import MLAttention
from glm5_lsp.train.data import Batches
from glm5_lsp.train.metrics import dense_attention_probs, indexer_recall, perplexity
from glm5_lsp.train.pipeline import model_config
from glm5_lsp.train.presets import PRESETS, get_preset
from glm5_lsp.train.runlog import RunLog, read_log
from glm5_lsp.train.schedule import StageShares, lr_at, plan_stages
from glm5_lsp.train.trainer import ExpertBalancer, OptimConfig, Trainer, next_token_loss, train_forward

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "train"


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _tiny_model(init: float = 0.02, vocab: int = 256) -> GlmMoeDsaForCausalLM:
    config = model_config(PRESETS["tiny"], vocab, eos_id=0)
    config.initializer_range = init
    model = GlmMoeDsaForCausalLM(config)
    model.init_weights(0)
    return model


def _rows(n: int, length: int, vocab: int = 256, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(4, vocab, size=(n, length + 1)).astype(np.int32)


def test_plan_splits_budget_by_shares_and_step_time() -> None:
    plan = plan_stages(
        100.0, {"dense": 0.5, "indexer_warmup": 0.25, "sparse": 1.0}, StageShares(0.8, 0.05, 0.15)
    )
    assert plan.steps == {"dense": 160, "indexer_warmup": 20, "sparse": 15}
    assert plan_stages(0.01, {"dense": 1.0, "indexer_warmup": 1.0, "sparse": 1.0}).steps["sparse"] == 1
    with pytest.raises(ValueError, match="sum to 1"):
        StageShares(0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match="positive"):
        plan_stages(0.0, {"dense": 1.0, "indexer_warmup": 1.0, "sparse": 1.0})


def test_lr_warms_up_then_decays_to_floor() -> None:
    lrs = [lr_at(s, 100, 1.0, 10, 0.1) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(lrs[9:]))
    assert lr_at(100, 100, 1.0, 10, 0.1) == pytest.approx(0.1)


def test_recall_probes_reproduce_the_layer_output() -> None:
    """``dense_attention_probs`` recomputes what the runtime's layer does: same output through V and o_proj."""
    model = _tiny_model(init=0.2)
    ids = torch.from_numpy(_rows(1, 40)[:, :-1]).long()
    seen = []

    def hook(attn: MLAttention, args, output) -> None:
        x, step, _ = args
        probs, _ = dense_attention_probs(attn, x, step)
        c_kv, k_rope = attn.kv_a_proj_with_mqa(x).split([attn.kv_rank, attn.rope_dim], dim=-1)
        from glm5_lsp.model.attention import apply_rope

        latents = torch.cat([attn.kv_a_layernorm(c_kv), apply_rope(k_rope, step.cos, step.sin)], dim=-1)
        _, v = attn._expand(latents)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        seen.append(float((attn.o_proj(out) - output[0]).abs().max()))

    hooks = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, MLAttention)]
    with torch.no_grad():
        model(ids, dense=True, reference=True)
    for h in hooks:
        h.remove()
    assert len(seen) == 2 and max(seen) < 1e-5


def test_recall_is_one_when_topk_covers_the_sequence() -> None:
    model = _tiny_model(init=0.2)
    assert indexer_recall(model, _rows(1, 40), topk=8)["mean"] < 1.0
    with pytest.raises(ValueError, match="never exceed"):
        indexer_recall(model, _rows(1, 12), topk=16)


@pytest.mark.parametrize("length", [40, 160])  # the latent path, and the expanded SDPA path (>= 128 queries)
def test_fast_dense_stage_matches_forward_train(length: int) -> None:
    """``train_forward(.., "dense")`` is the same function as ``forward_train(.., "dense")``: logits and gradients."""
    model = _tiny_model(init=0.1)
    ids = torch.from_numpy(_rows(2, length)).long()
    grads = []
    for fast in (True, False):
        if fast:
            logits, kl = train_forward(model, ids[:, :-1], "dense")
        else:
            out = model.forward_train(ids[:, :-1], "dense")
            logits, kl = out.logits, out.indexer_kl
        next_token_loss(logits, ids).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        model.zero_grad(set_to_none=True)
        assert float(kl) == 0.0
    fast, ref = grads
    assert fast.keys() == ref.keys() and fast
    assert all(torch.allclose(fast[n], ref[n], atol=1e-5, rtol=1e-4) for n in ref)


def test_micro_batches_give_the_whole_batch_gradient(tmp_path: Path) -> None:
    rows = torch.from_numpy(_rows(4, 24)).long()
    grads = []
    for micro in (None, 1):
        model = _tiny_model(init=0.2)
        trainer = Trainer(
            model,
            Batches(rows.numpy(), 4),
            OptimConfig(),
            torch.device("cpu"),
            RunLog(tmp_path / "log.jsonl"),
            micro_batch=micro,
        )
        lm, kl = trainer._backward(rows, "sparse")
        grads.append(({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, lm, kl))
    (whole, lm_a, kl_a), (parts, lm_b, kl_b) = grads
    assert whole.keys() == parts.keys()
    assert all(torch.allclose(whole[n], parts[n], atol=1e-6, rtol=1e-4) for n in whole)
    assert torch.allclose(lm_a, lm_b, atol=1e-6) and torch.allclose(kl_a, kl_b, atol=1e-6)


def test_kl_warmup_raises_indexer_agreement_and_freezes_the_rest(tmp_path: Path) -> None:
    model = _tiny_model(init=0.3)  # larger weights: peaked attention, so agreement is not trivial
    rows = _rows(16, 64)
    before = indexer_recall(model, rows[:2])["mean"]
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if ".indexer." not in n}
    trainer = Trainer(
        model,
        Batches(rows, 4),
        OptimConfig(indexer_lr=3e-2, warmup_steps=1),
        torch.device("cpu"),
        RunLog(tmp_path / "log.jsonl"),
    )
    result = trainer.run_stage("indexer_warmup", 40)
    after = indexer_recall(model, rows[:2])["mean"]
    kls = [r["indexer_kl"] for r in read_log(tmp_path / "log.jsonl") if r["kind"] == "step"]
    assert result.steps == 40
    assert after > before + 0.05, (before, after)
    assert kls[-1] < 0.7 * kls[0]
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    assert all(p.requires_grad for p in model.parameters())  # restored after the stage


def test_dense_and_sparse_stages_lower_the_loss(tmp_path: Path) -> None:
    model = _tiny_model()
    base = np.tile(np.arange(4, 36, dtype=np.int32), 5)[:65]  # a repeating pattern: learnable in a few steps
    rows = np.stack([np.roll(base, i) for i in range(8)])
    start = perplexity(model, rows, dense=True)
    trainer = Trainer(
        model,
        Batches(rows, 4),
        OptimConfig(lr=1e-2, warmup_steps=2),
        torch.device("cpu"),
        RunLog(tmp_path / "log.jsonl"),
    )
    trainer.run_stage("dense", 30)
    trainer.run_stage("sparse", 5)
    assert perplexity(model, rows, dense=True) < 0.5 * start
    assert math.isfinite(perplexity(model, rows, dense=False))
    assert trainer.tokens_seen == 35 * 4 * 64


def test_expert_balancer_favours_underused_experts() -> None:
    model = _tiny_model()
    balancer = ExpertBalancer(model, rate=0.01)
    router = next(m for m in model.modules() if hasattr(m, "e_score_correction_bias"))
    with torch.no_grad():
        router.weight.zero_()
        router.e_score_correction_bias[0] = 1.0  # expert 0 is chosen for every token
        model(torch.from_numpy(_rows(1, 16)[:, :-1]).long(), dense=True)
    assert balancer.update() > 1.0
    bias = router.e_score_correction_bias
    assert bias[0] == pytest.approx(0.99) and bool((bias[1:] == 0.01).any())
    balancer.close()


@pytest.mark.slow
def test_train_cli_end_to_end(tmp_path: Path) -> None:
    """``glm5-lsp train --preset tiny`` writes a folder that the runtime loads and that runs."""
    from glm5_lsp.cli import main
    from glm5_lsp.model import load_model, load_tokenizer

    out = tmp_path / "model"
    code = main(
        [
            "train",
            "--out",
            str(out),
            "--preset",
            "tiny",
            "--stdlib",
            str(REPO / "glm5_lsp"),
            "--site-dir",
            str(DATA / "site"),
            "--holdout",
            "stdlib:model",
            "--benchmarks",
            str(DATA / "benchmarks"),
            "--steps",
            "20,5,5",
            "--threads",
            "1",
        ]
    )
    assert code == 0
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "corpus_manifest.json",
        "train_log.jsonl",
        "loss_curve.png",
        "metrics.json",
        "MODEL_CARD.md",
    ):
        assert (out / name).is_file(), name
    model = load_model(out)
    tokenizer = load_tokenizer(out)
    assert tokenizer.fim_middle_id == 3 and model.config.eos_token_id == tokenizer.eos_token_id == 0
    ids = torch.tensor([tokenizer.encode("def f(x):\n    return x\n")])
    assert model(ids).shape == (1, ids.shape[1], model.config.vocab_size)
    metrics = json.loads((out / "metrics.json").read_text())
    assert [s["steps"] for s in metrics["stages"]] == [20, 5, 5]
    assert metrics["tokens_seen"] == 30 * get_preset("tiny").batch_size * get_preset("tiny").seq_len
    manifest = json.loads((out / "corpus_manifest.json").read_text())
    assert [r["package"] for r in manifest["heldout"]] == ["stdlib:model"]
    assert "gplpkg" in {r["package"] for r in manifest["refused_licence"]}
    card = (out / "MODEL_CARD.md").read_text()
    assert "CPU stop-gap" in card and "perplexity, DSA" in card
    assert main(["train", "--out", str(out), "--preset", "tiny"]) == 1  # refuses to overwrite silently
    report = tmp_path / "report.json"
    report.write_text(
        json.dumps(
            {
                "benchmark": "humaneval",
                "subset": None,
                "n_samples": 1,
                "temperature": 0.0,
                "repair_rounds": 1,
                "summary": {"problems": 3, "pass@1": 1 / 3},
            }
        )
    )
    assert main(["train", "--out", str(out), "--add-eval", str(report)]) == 0
    assert "| humaneval | 3 | 0.3333 |" in (out / "MODEL_CARD.md").read_text()
    assert json.loads((out / "metrics.json").read_text())["humaneval"]
    report.write_text("{}")
    assert main(["train", "--out", str(out), "--add-eval", str(report)]) == 1
