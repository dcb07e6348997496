"""Held-out figures for the model card: perplexity dense vs DSA, and the indexer's recall.

- **Perplexity** runs the inference paths users get: ``model(ids, dense=True)`` (full causal
  attention) and ``model(ids)`` (DSA: each query attends to the indexer's top ``index_topk`` keys).
- **Indexer recall at top-k**: on the dense forward, for each layer, the share of the dense
  attention mass (summed over heads, normalised per query) that falls on the keys the indexer
  selects, averaged over the queries that have more than ``index_topk`` causal keys (the others keep
  every key, so their recall is 1 by construction). "Shared" layers are scored with the selection
  of the full layer they reuse.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np
import torch
import torch.nn.functional as F

from glm5_lsp.model import GlmMoeDsaForCausalLM
from glm5_lsp.model.attention import eager_attention
from glm5_lsp.model.glm5 import MLAttention, causal_allowed, selection_mask


def _autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


@torch.inference_mode()
def perplexity(model: GlmMoeDsaForCausalLM, rows: np.ndarray, dense: bool, batch_size: int = 1) -> float:
    """exp(mean next-token cross-entropy) over ``rows [N, T + 1]`` with dense or DSA attention."""
    if len(rows) == 0:
        raise ValueError("no held-out sequences to evaluate")
    device = next(model.parameters()).device
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(rows), batch_size):
        batch = torch.from_numpy(rows[start : start + batch_size]).long().to(device)
        with _autocast(device):
            logits = model(batch[:, :-1], dense=dense)
        loss = F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum"
        )
        total += float(loss)
        count += batch[:, 1:].numel()
    return math.exp(total / count)


def dense_attention_probs(attn: MLAttention, x: torch.Tensor, step) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's dense causal attention ``[B, H, T, T]`` and its query latent, from its input.

    Uses the layer's own projections (``project``, ``_expand``) and the dense reference kernel;
    ``test_train_loop`` checks the result reproduces the layer's output.
    """
    t = x.shape[1]
    q_resid, q_nope, q_rope, latents, *_ = attn.project(x, step)
    k, v = attn._expand(latents)  # [B, H, T, dq], [B, H, T, dv]
    q = torch.cat([q_nope, q_rope], dim=-1).transpose(1, 2)  # [B, H, T, dq]
    allowed = causal_allowed(0, t, t, x.device)[None, None]
    _, probs = eager_attention(q.float(), k.float(), v.float(), allowed, attn.scale)
    return probs, q_resid


@torch.inference_mode()
def indexer_recall(model: GlmMoeDsaForCausalLM, rows: np.ndarray, topk: int | None = None) -> dict:
    """Mean share of dense attention mass on the indexer's top-k keys, overall and per layer."""
    device = next(model.parameters()).device
    model.eval()
    k = topk if topk is not None else model.config.index_topk
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    state: dict = {"prev": None}

    def hook(attn: MLAttention, args) -> None:
        x, step, _ = args
        bsz, t, _ = x.shape
        x = x.float()
        probs, q_resid = dense_attention_probs(attn, x, step)
        target = probs.sum(1)
        target = target / target.sum(-1, keepdim=True).clamp(min=1e-12)  # [B, T, T]
        if attn.indexer is not None:
            iq, iw = attn.indexer.queries(x, q_resid, step.cos, step.sin)
            keys = attn.indexer.keys(x, step.cos, step.sin)
            select_step = dataclasses.replace(
                step, dense=False, topk=k, key_bias=None, forced_keys=None, forced_rows=None
            )
            state["prev"] = attn.indexer.select(iq, iw, keys, select_step)
        mask = selection_mask(state["prev"], bsz, t, t, 0, x.device)
        recall = (target * mask).sum(-1)  # [B, T]
        rows_that_drop = torch.arange(t, device=x.device) + 1 > k
        if bool(rows_that_drop.any()):
            layer = attn.layer_idx
            sums[layer] = sums.get(layer, 0.0) + float(recall[:, rows_that_drop].sum())
            counts[layer] = counts.get(layer, 0) + int(rows_that_drop.sum()) * bsz

    hooks = [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, MLAttention)]
    try:
        for row in rows:
            state["prev"] = None
            batch = torch.from_numpy(row[None, :-1]).long().to(device)
            model(batch, dense=True)
    finally:
        for h in hooks:
            h.remove()
    if not counts:
        raise ValueError(
            f"sequences of {rows.shape[1] - 1} tokens never exceed top-k {k}: recall is undefined"
        )
    per_layer = {layer: sums[layer] / counts[layer] for layer in sorted(counts)}
    return {"mean": sum(per_layer.values()) / len(per_layer), "per_layer": per_layer, "topk": k}
