"""The editor's two hot forward calls on the CPU, in as few operations as the layers allow: one new
token (the decoding step) and a short prompt whose every query sees all its keys (its prefill).

A decoding step on a small model is bound by per-operation overhead, not arithmetic: the general
``forward`` spends most of a step in module calls, views and bookkeeping sized for many tokens.
:func:`decode_one` computes the same thing for the case the editor runs thousands of times (batch 1,
one token, fp32 on the CPU, inference, no forced error-context keys) straight from the layers'
weights:

- the projections that read the same input are fused (``MLAttention._fused_weights``) and RoPE
  rotates every rotary slice of a layer in one call;
- RMSNorm takes its scale from one vector norm (a Python float) instead of a composite kernel;
- attention is the absorbed form over the selected latents (2-D products on contiguous weights);
- the MoE router's choice is read once as Python floats and the chosen experts run one by one.

It writes the same cache entries and selects the same keys as ``forward`` (the indexer's scores,
bias rule and top-k are computed by the same operations), so decoding may switch between the two
paths at any token; ``tests/test_model_decode.py`` checks logits and selected sets against it.

:func:`prefill_dense` is the same idea for several tokens of one sequence when no query has more
causal keys than the top-k budget (the editor's prompts are mostly shorter than the embedded
model's 128), or attention is dense: the selection is then every key, so the indexer's scores,
the policy's biases and its forced keys change nothing and are skipped; the indexer's keys are still
cached for the steps that follow. Only the last position's logits are computed. On the embedded
model it is about 1.2x as fast as the general path on a 100-token prompt and 1.5x on a 10-token one
(``python benchmarks/runtime.py --part prompts``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from glm5_lsp.model.attention import apply_rope

if TYPE_CHECKING:
    from glm5_lsp.model.cache import KVCache
    from glm5_lsp.model.glm5 import GlmMoeDsaForCausalLM, Step


BATCHED_EXPERTS_MAX_TOKENS = 64  # up to here the experts run as one padded batch (measured: faster for 10
# and 50 tokens, slower for 100, where the per-expert loop's small operations weigh less)
PREFILL_MAX_TOKENS = 512  # longer prompts take the general path, which bounds its score matrices


def _lean_ok(model: GlmMoeDsaForCausalLM, input_ids: torch.Tensor, cache: KVCache | None, step: Step) -> bool:
    weight = model.lm_head.weight
    return (
        model.lean_decode
        and cache is not None
        and input_ids.shape[0] == 1
        and step.stage is None
        and not step.reference
        and weight.dtype == torch.float32
        and weight.device.type == "cpu"
        and not model.config.attention_bias
        and not torch.is_grad_enabled()
    )


def applies(model: GlmMoeDsaForCausalLM, input_ids: torch.Tensor, cache: KVCache | None, step: Step) -> bool:
    """Whether :func:`decode_one` may run this ``forward`` call (it falls back to the general path otherwise)."""
    return input_ids.shape == (1, 1) and step.forced_keys is None and _lean_ok(model, input_ids, cache, step)


def applies_dense(model: GlmMoeDsaForCausalLM, input_ids: torch.Tensor, cache: KVCache | None, step: Step) -> bool:
    """Whether :func:`prefill_dense` may run this ``forward`` call: several tokens of one sequence
    whose every query attends to all its causal keys (dense attention, or no more keys than the
    top-k budget, so the selection is every key and the policy's biases and forced keys change
    nothing)."""
    t = input_ids.shape[-1]
    return (
        1 < t <= PREFILL_MAX_TOKENS
        and (step.dense or step.start + t <= step.topk)
        and _lean_ok(model, input_ids, cache, step)
    )


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of one row: the scale as a Python float from one norm (``F.rms_norm``'s composite
    kernel takes about 1.6x as long on one row)."""
    norm = float(torch.linalg.vector_norm(x))
    return torch.mul(x, weight).mul_(1.0 / math.sqrt(norm * norm / x.shape[-1] + eps))


def _swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _route(router, h: torch.Tensor) -> tuple[list[int], list[float]]:
    """The MoE router for one token: chosen experts and their weights (as ``Router.forward`` decides)."""
    if router.n_group > 1:
        idx, weights = router(h)
        return idx[0].tolist(), weights[0].tolist()
    scores = torch.sigmoid(F.linear(h, router.weight))
    choice = (scores + router.e_score_correction_bias)[0].tolist()
    chosen = sorted(range(len(choice)), key=choice.__getitem__, reverse=True)[: router.top_k]
    values = scores[0].tolist()
    weights = [values[e] for e in chosen]
    if router.norm_topk_prob:
        total = sum(weights) + 1e-20
        weights = [w / total for w in weights]
    return chosen, [w * router.scaling for w in weights]


def _fused_parts(attn, x: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """The hidden state's fused projection split into the q latent, the kv latent, the rope key and
    (with an indexer) its key and head weights; and the q latent's fused weights."""
    indexer = attn.indexer
    w_x, w_q = attn._fused_weights()
    sizes = [attn.q_a_proj.out_features, attn.kv_rank, attn.rope_dim]
    if indexer is not None:
        sizes += [indexer.head_dim, indexer.n_heads]
    return F.linear(x, w_x).split(sizes, dim=-1), w_q


def _attention(attn, x: torch.Tensor, step: Step, cache: KVCache, selected: torch.Tensor | None):
    """One layer's attention for the newest token: ``(output [1, H], the keys it selected or None)``.
    A "shared" layer (no indexer) attends to ``selected``, the previous full layer's keys."""
    pos = step.start
    kend = pos + 1
    heads, nope, rope = attn.n_heads, attn.nope_dim, attn.rope_dim
    indexer = attn.indexer
    parts, w_q = _fused_parts(attn, x)
    qs = F.linear(_rms(parts[0], attn.q_a_layernorm.weight, attn.q_a_layernorm.eps), w_q)[0]
    q = qs[: heads * attn.q_dim].view(heads, attn.q_dim)
    rows = [q[:, nope:], parts[2]]
    if indexer is not None:
        iq = qs[heads * attn.q_dim :].view(indexer.n_heads, indexer.head_dim)
        ik = F.layer_norm(parts[3], (indexer.head_dim,), indexer.k_norm.weight, indexer.k_norm.bias, indexer.k_norm.eps)
        rows += [iq[:, :rope], ik[:, :rope]]
    rot = apply_rope(torch.cat(rows).view(1, 1, -1, rope), step.cos, step.sin)[0, 0]  # every rotary slice at once

    latents = cache.latents[attn.layer_idx][0]
    latents[pos, : attn.kv_rank] = _rms(parts[1][0], attn.kv_a_layernorm.weight, attn.kv_a_layernorm.eps)
    latents[pos, attn.kv_rank :] = rot[heads]
    if indexer is not None:
        keys = cache.index_keys[attn.layer_idx][0]
        keys[pos, :rope] = rot[-1]
        keys[pos, rope:] = ik[0, rope:]
        selected = None
        if not step.dense and kend > step.topk:
            query = torch.cat([rot[heads + 1 : heads + 1 + indexer.n_heads], iq[:, rope:]], dim=-1)
            per_head = torch.mm(query, keys[:kend].t()).mul_(indexer.scale).relu_()  # [Hi, Tk]
            scores = torch.mv(per_head.t(), parts[4][0] * indexer.n_heads**-0.5)
            if step.key_bias is not None:
                std = scores.std(correction=0)
                scores = scores + step.key_bias[0, :kend] * torch.where(std > 0, std, torch.ones_like(std))
            selected = scores.topk(step.topk, sorted=False)[1]

    w_uk, w_uv_t = attn._absorbed_weights()
    q_lat = torch.bmm(q[:, :nope].unsqueeze(1), w_uk).view(heads, attn.kv_rank)
    q_cat = torch.cat([q_lat, rot[:heads]], dim=-1)
    keys_used = latents[:kend] if selected is None else latents.index_select(0, selected)
    probs = torch.softmax(torch.mm(q_cat, keys_used.t()).mul_(attn.scale), dim=-1)
    o_lat = torch.mm(probs, keys_used[:, : attn.kv_rank])
    out = torch.bmm(o_lat.unsqueeze(1), w_uv_t).view(1, heads * attn.v_dim)
    return F.linear(out, attn.o_proj.weight), selected


def _mlp(mlp, h: torch.Tensor) -> torch.Tensor:
    if not hasattr(mlp, "experts"):  # dense
        return _swiglu_mlp(mlp, h)
    chosen, weights = _route(mlp.gate, h)
    experts = mlp.experts
    out = None
    for expert, weight in zip(chosen, weights):
        y = F.linear(_swiglu(F.linear(h, experts.gate_up_proj[expert])), experts.down_proj[expert]) * weight
        out = y if out is None else out + y
    y = _swiglu_mlp(mlp.shared_experts, h)
    return y if out is None else out + y


def _swiglu_mlp(mlp, h: torch.Tensor) -> torch.Tensor:
    """``MLP.forward`` without the module calls."""
    gate = F.silu(F.linear(h, mlp.gate_proj.weight))
    return F.linear(gate * F.linear(h, mlp.up_proj.weight), mlp.down_proj.weight)


def _rms_rows(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _attention_dense(attn, x: torch.Tensor, step: Step, cache: KVCache) -> torch.Tensor:
    """One layer's attention for ``T`` new tokens ``x [T, D]``, each over every causal key: ``[T, D]``.
    Writes the new latents and indexer keys to ``cache``; the indexer's queries are not needed."""
    t = x.shape[0]
    pos = step.start
    kend = pos + t
    heads, nope, rope = attn.n_heads, attn.nope_dim, attn.rope_dim
    indexer = attn.indexer
    parts, _ = _fused_parts(attn, x)
    q_resid = _rms_rows(parts[0], attn.q_a_layernorm.weight, attn.q_a_layernorm.eps)
    q = F.linear(q_resid, attn.q_b_proj.weight).view(t, heads, attn.q_dim)
    rows = [q[:, :, nope:], parts[2].unsqueeze(1)]
    if indexer is not None:
        ik = F.layer_norm(parts[3], (indexer.head_dim,), indexer.k_norm.weight, indexer.k_norm.bias, indexer.k_norm.eps)
        rows.append(ik[:, None, :rope])
    rot = apply_rope(torch.cat(rows, dim=1).unsqueeze(0), step.cos, step.sin)[0]  # [T, H + 1 (+1), R]

    latents = cache.latents[attn.layer_idx][0]
    latents[pos:kend, : attn.kv_rank] = _rms_rows(parts[1], attn.kv_a_layernorm.weight, attn.kv_a_layernorm.eps)
    latents[pos:kend, attn.kv_rank :] = rot[:, heads]
    if indexer is not None:
        keys = cache.index_keys[attn.layer_idx][0]
        keys[pos:kend, :rope] = rot[:, heads + 1]
        keys[pos:kend, rope:] = ik[:, rope:]

    w_uk, w_uv_t = attn._absorbed_weights()
    q_lat = torch.bmm(q[:, :, :nope].transpose(0, 1), w_uk)  # [H, T, L]
    q_cat = torch.cat([q_lat, rot[:, :heads].transpose(0, 1)], dim=-1)  # [H, T, L + R]
    keys_all = latents[:kend]
    scores = torch.matmul(q_cat, keys_all.t()).mul_(attn.scale)  # [H, T, Tk]
    scores.masked_fill_(_future(pos, t, scores.device), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    o_lat = torch.matmul(probs, keys_all[:, : attn.kv_rank])  # [H, T, L]
    out = torch.bmm(o_lat, w_uv_t).transpose(0, 1).reshape(t, heads * attn.v_dim)
    return F.linear(out, attn.o_proj.weight)


def _future(start: int, t: int, device: torch.device) -> torch.Tensor:
    """``[T, start + T]`` bool: key ``j`` lies after query ``start + i`` (masked out)."""
    return torch.arange(start + t, device=device)[None, :] > torch.arange(start, start + t, device=device)[:, None]


def _mlp_rows(mlp, h: torch.Tensor) -> torch.Tensor:
    if not hasattr(mlp, "experts"):  # dense
        return _swiglu_mlp(mlp, h)
    idx, weights = mlp.gate(h)
    if h.shape[0] <= BATCHED_EXPERTS_MAX_TOKENS:
        routed = _experts_batched(mlp.experts, h, idx, weights)
    else:
        routed = mlp.experts(h, idx, weights)
    return routed + _swiglu_mlp(mlp.shared_experts, h)


def _experts_batched(experts, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``Experts.forward`` for a short prompt's tokens in a fixed number of operations: each expert's
    tokens gathered into one padded batch ``[E, C, H]`` (C: the busiest expert's count; padding rows
    read a zero row and are dropped), two batched products, one scatter back. A short prompt's
    tokens spread over most experts, and the per-expert loop's dozens of small operations cost more
    than the padded rows' arithmetic."""
    n, hidden = x.shape
    n_experts = experts.gate_up_proj.shape[0]
    flat = idx.reshape(-1)
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=n_experts)
    capacity = int(counts.max())
    starts = torch.cumsum(counts, 0) - counts
    expert = flat[order]  # the assignments grouped by expert
    slot = torch.arange(flat.numel()) - starts[expert]  # each assignment's row in its expert's batch
    rows = torch.full((n_experts, capacity), n, dtype=torch.long)  # n: the zero row
    rows[expert, slot] = order // idx.shape[1]
    scale = torch.zeros(n_experts, capacity, 1, dtype=x.dtype)
    scale[expert, slot, 0] = weights.reshape(-1)[order].to(x.dtype)
    padded = torch.cat([x, x.new_zeros(1, hidden)])[rows]  # [E, C, H]
    gate, up = torch.bmm(padded, experts.gate_up_proj.transpose(1, 2)).chunk(2, dim=-1)
    y = torch.bmm(F.silu(gate) * up, experts.down_proj.transpose(1, 2)) * scale  # [E, C, H]
    out = x.new_zeros(n + 1, hidden)
    out.index_add_(0, rows.view(-1), y.view(-1, hidden))
    return out[:n]


def prefill_dense(model: GlmMoeDsaForCausalLM, input_ids: torch.Tensor, cache: KVCache, step: Step,
                  role_ids: torch.Tensor) -> torch.Tensor:
    """The last position's logits ``[1, 1, V]`` for ``input_ids [1, T]`` appended to ``cache`` (which
    must have room), every query attending to all its causal keys (see :func:`applies_dense`)."""
    x = F.embedding(input_ids[0], model.model.embed_tokens.weight)  # [T, H]
    for layer in model.model.layers:
        norm = layer.input_layernorm
        x = x + _attention_dense(layer.self_attn, _rms_rows(x, norm.weight, norm.eps), step, cache)
        norm = layer.post_attention_layernorm
        x = x + _mlp_rows(layer.mlp, _rms_rows(x, norm.weight, norm.eps))
    cache.commit(input_ids, role_ids)
    norm = model.model.norm
    return F.linear(_rms(x[-1:], norm.weight, norm.eps), model.lm_head.weight).view(1, 1, -1)


def decode_one(model: GlmMoeDsaForCausalLM, input_ids: torch.Tensor, cache: KVCache, step: Step,
               role_ids: torch.Tensor, selections: list | None = None) -> torch.Tensor:
    """Logits ``[1, 1, V]`` for ``input_ids [1, 1]`` appended to ``cache`` (which must have room).

    ``selections``: if a list, each layer's selected key positions (``[K]`` or None for all keys) are appended.
    """
    x = F.embedding(input_ids[0], model.model.embed_tokens.weight)  # [1, H]
    selected = None
    for layer in model.model.layers:
        attn = layer.self_attn
        norm = layer.input_layernorm
        out, selected = _attention(attn, _rms(x, norm.weight, norm.eps), step, cache, selected)
        if selections is not None:
            selections.append(selected)
        x = x + out
        norm = layer.post_attention_layernorm
        x = x + _mlp(layer.mlp, _rms(x, norm.weight, norm.eps))
    cache.commit(input_ids, role_ids)
    norm = model.model.norm
    return F.linear(_rms(x, norm.weight, norm.eps), model.lm_head.weight).view(1, 1, -1)
