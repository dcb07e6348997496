"""The editor's two hot forward calls on the CPU, in as few operations as the layers allow: one new
token (the decoding step) and a short prompt whose every query sees all its keys (its prefill).

A decoding step on a small model is bound by per-operation overhead, not arithmetic: the general
``forward`` spends most of a step in module calls, views and bookkeeping sized for many tokens.
:func:`decode_one` computes the same thing for the case the editor runs thousands of times (batch 1,
one token, fp32 on the CPU, inference, no forced error-context keys) from the layers' inference
weights and functional forms, built once by ``GlmMoeDsaForCausalLM.prepare_inference``:

- the projections that read the same input are one product each (``MLAttention.fused``) and RoPE
  rotates every rotary slice of a layer in one call;
- RMSNorm takes its scale from one vector norm (``RMSNorm.one_row``) instead of a composite kernel;
- attention is the absorbed form over the selected latents (2-D products on ``MLAttention.absorbed``);
- the MoE router's choice is read once as Python floats (``Router.route_one``) and the chosen experts
  run one by one (``Experts.one``).

It writes the same cache entries and selects the same keys as ``forward`` (the indexer's scores,
bias rule and top-k are computed by the same operations), so decoding may switch between the two
paths at any token; ``tests/test_model_decode.py`` checks logits and selected sets against it.

:func:`prefill_dense` is the same idea for several tokens of one sequence when no query has more
causal keys than the top-k budget (the editor's prompts are mostly shorter than the embedded
model's 128), or attention is dense: the selection is then every key, so the indexer's scores,
the policy's biases and its forced keys change nothing and are skipped; the indexer's keys are still
cached for the steps that follow. A prompt's prefill computes only the last position's logits. On
the embedded model it is about 1.2x as fast as the general path on a 100-token prompt and 1.5x on a
10-token one (``python benchmarks/runtime.py --part prompts``). A draft's verification (the
generator feeds ``[token, *proposed]`` and reads every position's logits) is the same call with
``last_only=False``: every row's logits, and every row's statistics when a probe records them. On
the embedded model, 64-token prompts and drafts of 2-8 tokens, it is 1.35x as fast as the general
path, and 1.81x with the statistics' probe (``--part verify``; the general path computes the
probe's attention and router records a second time).

``scripted.py`` compiles both functions, operation for operation, with TorchScript, and the
generator runs that compiled form (on the embedded model a decoding step 1.38x and a 64-token
prefill 1.25x as fast; the same logits bit for bit); the functions here stay the reference it
mirrors and the path taken where scripting fails.

Which path a call takes is the generator's choice (``generate.cached_forward``: :func:`applies`,
:func:`applies_dense`); ``forward`` itself is always the general path. With a ``step.probe`` both
paths record the per-step statistics of ``stats.py`` (the last row, or every row of a call that
returns every row's logits), from the tensors they compute anyway where they can.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from glm5_lsp.model.attention import apply_rope

if TYPE_CHECKING:
    from glm5_lsp.model.glm5 import GlmMoeDsaForCausalLM, MLAttention, Step
    from glm5_lsp.model.stats import StatsProbe


BATCHED_EXPERTS_MAX_TOKENS = 64  # up to here the experts run as one padded batch (measured: faster for 10
# and 50 tokens, slower for 100, where the per-expert loop's small operations weigh less)
PREFILL_MAX_TOKENS = 512  # longer prompts take the general path, which bounds its score matrices


def lean_ok(model: GlmMoeDsaForCausalLM, input_ids: torch.Tensor, step: Step) -> bool:
    """What every lean path (and the C one, ``native.py``) needs: one sequence, fp32 on the CPU,
    inference with the prepared weights, no training stage or reference kernels."""
    weight = model.lm_head.weight
    return (
        step.cache is not None
        and input_ids.shape[0] == 1
        and step.stage is None
        and not step.reference
        and weight.dtype == torch.float32
        and weight.device.type == "cpu"
        and not model.config.attention_bias
        and not torch.is_grad_enabled()
        and model.prepared
    )


def applies(model: GlmMoeDsaForCausalLM, input_ids: torch.Tensor, step: Step) -> bool:
    """Whether :func:`decode_one` computes this call (``step`` from ``model.prepare_step``) as the
    general path would: one token of one sequence, no forced error-context keys."""
    return input_ids.shape == (1, 1) and step.forced_keys is None and lean_ok(model, input_ids, step)


def applies_dense(model: GlmMoeDsaForCausalLM, input_ids: torch.Tensor, step: Step) -> bool:
    """Whether :func:`prefill_dense` computes this call's logits (the last position's, or every
    position's) as the general path would: several tokens of one sequence whose every query attends
    to all its causal keys (dense attention, or no more keys than the top-k budget, so the selection
    is every key and the policy's biases and forced keys change nothing)."""
    t = input_ids.shape[-1]
    return (
        1 < t <= PREFILL_MAX_TOKENS
        and (step.dense or step.start + t <= step.topk)
        and lean_ok(model, input_ids, step)
    )


def _attention(attn: MLAttention, x: torch.Tensor, step: Step, selected: torch.Tensor | None,
               probe: StatsProbe | None):
    """One layer's attention for the newest token: ``(output [1, H], the keys it selected or None)``.
    A "shared" layer (no indexer) attends to ``selected``, the previous full layer's keys."""
    pos = step.start
    kend = pos + 1
    cache = step.cache
    heads, nope, rope = attn.n_heads, attn.nope_dim, attn.rope_dim
    indexer = attn.indexer
    fused = attn.fused
    parts = fused.hidden(x)
    qs = F.linear(attn.q_a_layernorm.one_row(parts.q_latent), fused.w_q)[0]
    q = qs[: fused.q_rows].view(heads, attn.q_dim)
    rows = [q[:, nope:], parts.rope_key]
    if indexer is not None:
        iq = qs[fused.q_rows :].view(indexer.n_heads, indexer.head_dim)
        norm = indexer.k_norm
        ik = F.layer_norm(parts.index_key, (indexer.head_dim,), norm.weight, norm.bias, norm.eps)
        rows += [iq[:, :rope], ik[:, :rope]]
    rot = apply_rope(torch.cat(rows).view(1, 1, -1, rope), step.cos, step.sin)[0, 0]  # every rotary slice at once

    latents = cache.latents[attn.layer_idx][0]
    latents[pos, : attn.kv_rank] = attn.kv_a_layernorm.one_row(parts.kv_latent[0])
    latents[pos, attn.kv_rank :] = rot[heads]
    if indexer is not None:
        keys = cache.index_keys[attn.layer_idx][0]
        keys[pos, :rope] = rot[-1]
        keys[pos, rope:] = ik[0, rope:]
        selected = None
        query_rope = rot[heads + 1 : heads + 1 + indexer.n_heads]
        if probe is not None:  # scored at the end of the generation, with every step's query
            probe.index_query(attn.layer_idx, query_rope, iq[:, rope:], parts.index_weights[0],
                              indexer.n_heads**-0.5, indexer.scale)
        if not step.dense and kend > step.topk:
            query = torch.cat([query_rope, iq[:, rope:]], dim=-1)
            per_head = torch.mm(query, keys[:kend].t()).mul_(indexer.scale).relu_()  # [Hi, Tk]
            scores = torch.mv(per_head.t(), parts.index_weights[0] * indexer.n_heads**-0.5)
            if step.key_bias is not None:
                std = scores.std(correction=0)
                scores = scores + step.key_bias[0, :kend] * torch.where(std > 0, std, torch.ones_like(std))
            selected = scores.topk(step.topk, sorted=False)[1]

    absorbed = attn.absorbed
    q_lat = torch.bmm(q[:, :nope].unsqueeze(1), absorbed.w_uk).view(heads, attn.kv_rank)
    q_cat = torch.cat([q_lat, rot[:heads]], dim=-1)
    keys_used = latents[:kend] if selected is None else latents.index_select(0, selected)
    probs = torch.softmax(torch.mm(q_cat, keys_used.t()).mul_(attn.scale), dim=-1)
    if probe is not None:
        roles = probe.key_roles(kend)
        probe.attention(probs, roles if selected is None else roles.index_select(0, selected))
    o_lat = torch.mm(probs, keys_used[:, : attn.kv_rank])
    out = torch.bmm(o_lat.unsqueeze(1), absorbed.w_uv_t).view(1, heads * attn.v_dim)
    return F.linear(out, attn.o_proj.weight), selected


def _mlp(mlp, h: torch.Tensor, probe: StatsProbe | None) -> torch.Tensor:
    """One token through the layer's MLP or MoE (``h [1, H]``)."""
    if not hasattr(mlp, "experts"):  # dense
        return mlp.swiglu(h)
    chosen, weights, scores = mlp.gate.route_one(h)
    routed = mlp.experts.one(h, chosen, weights)
    shared = mlp.shared_experts.swiglu(h)
    if probe is not None:
        probe.router(scores, max(weights, default=0.0), routed, shared)
    return shared if routed is None else routed + shared


def _attention_dense(attn: MLAttention, x: torch.Tensor, step: Step, probe: StatsProbe | None,
                     every: bool = False) -> torch.Tensor:
    """One layer's attention for ``T`` new tokens ``x [T, D]``, each over every causal key: ``[T, D]``.
    Writes the new latents and indexer keys to the cache; the indexer's queries are not needed (but
    where ``probe`` records the statistics: of the last row, or with ``every`` of every row)."""
    t = x.shape[0]
    pos = step.start
    kend = pos + t
    cache = step.cache
    heads, nope, rope = attn.n_heads, attn.nope_dim, attn.rope_dim
    indexer = attn.indexer
    fused = attn.fused
    parts = fused.hidden(x)
    q_resid = attn.q_a_layernorm.rows(parts.q_latent)
    index_rows = indexer is not None and probe is not None and every  # every row's indexer query is recorded
    qs = F.linear(q_resid, fused.w_q if index_rows else attn.q_b_proj.weight)
    q = qs[:, : fused.q_rows].view(t, heads, attn.q_dim)
    rows = [q[:, :, nope:], parts.rope_key.unsqueeze(1)]
    if indexer is not None:
        norm = indexer.k_norm
        ik = F.layer_norm(parts.index_key, (indexer.head_dim,), norm.weight, norm.bias, norm.eps)
        rows.append(ik[:, None, :rope])
        if index_rows:  # the indexer's queries come out of the same product and rotation
            iq = qs[:, fused.q_rows :].view(t, indexer.n_heads, indexer.head_dim)
            rows.append(iq[:, :, :rope])
    rot = apply_rope(torch.cat(rows, dim=1).unsqueeze(0), step.cos, step.sin)[0]  # [T, H + 1 (+1 +Hi), R]

    latents = cache.latents[attn.layer_idx][0]
    latents[pos:kend, : attn.kv_rank] = attn.kv_a_layernorm.rows(parts.kv_latent)
    latents[pos:kend, attn.kv_rank :] = rot[:, heads]
    if indexer is not None:
        keys = cache.index_keys[attn.layer_idx][0]
        keys[pos:kend, :rope] = rot[:, heads + 1]
        keys[pos:kend, rope:] = ik[:, rope:]
        if index_rows:  # scored at the end of the generation, as a decoding step's
            probe.index_query(attn.layer_idx, rot[:, heads + 2 :].contiguous(), iq[:, :, rope:], parts.index_weights,
                              indexer.n_heads**-0.5, indexer.scale)
        elif probe is not None:  # the last query (scored at the end of the generation)
            iq, iw = indexer.queries(x[None, -1:], q_resid[None, -1:], step.cos[-1:], step.sin[-1:])
            probe.index_query(attn.layer_idx, iq[0, 0, :, :rope].contiguous(), iq[0, 0, :, rope:], iw[0, 0], 1.0,
                              indexer.scale)

    absorbed = attn.absorbed
    q_lat = torch.bmm(q[:, :, :nope].transpose(0, 1), absorbed.w_uk)  # [H, T, L]
    q_cat = torch.cat([q_lat, rot[:, :heads].transpose(0, 1)], dim=-1)  # [H, T, L + R]
    keys_all = latents[:kend]
    scores = torch.matmul(q_cat, keys_all.t()).mul_(attn.scale)  # [H, T, Tk]
    scores.masked_fill_(_future(pos, t, scores.device), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if probe is not None:
        probe.attention(probs.transpose(0, 1) if every else probs[:, -1], probe.key_roles(kend))
    o_lat = torch.matmul(probs, keys_all[:, : attn.kv_rank])  # [H, T, L]
    out = torch.bmm(o_lat, absorbed.w_uv_t).transpose(0, 1).reshape(t, heads * attn.v_dim)
    return F.linear(out, attn.o_proj.weight)


def _future(start: int, t: int, device: torch.device) -> torch.Tensor:
    """``[T, start + T]`` bool: key ``j`` lies after query ``start + i`` (masked out)."""
    return torch.arange(start + t, device=device)[None, :] > torch.arange(start, start + t, device=device)[:, None]


def _mlp_rows(mlp, h: torch.Tensor, probe: StatsProbe | None, every: bool = False) -> torch.Tensor:
    """A short prompt's tokens ``h [T, H]`` through the layer's MLP or MoE (``probe``: the router's
    statistics of the last row, or with ``every`` of every row)."""
    if not hasattr(mlp, "experts"):  # dense
        return mlp.swiglu(h)
    scores = mlp.gate.scores(h)
    idx, weights = mlp.gate.choose(scores)
    if h.shape[0] <= BATCHED_EXPERTS_MAX_TOKENS:
        routed = mlp.experts.padded(h, idx, weights)
    else:
        routed = mlp.experts(h, idx, weights)
    shared = mlp.shared_experts.swiglu(h)
    if probe is not None and every:
        probe.router(scores, weights.max(-1).values, routed, shared)
    elif probe is not None:
        probe.router(scores[-1:], float(weights[-1].max()), routed[-1:], shared[-1:])
    return routed + shared


def prefill_dense(model: GlmMoeDsaForCausalLM, input_ids: torch.Tensor, step: Step,
                  last_only: bool = True) -> torch.Tensor:
    """Logits for ``input_ids [1, T]`` appended to ``step.cache`` (which must have room), every query
    attending to all its causal keys (see :func:`applies_dense`): the last position's ``[1, 1, V]``,
    or without ``last_only`` every position's ``[1, T, V]`` (a draft's verification; ``step.probe``
    then records every row, as the general path does)."""
    probe = step.probe
    every = not last_only
    if probe is not None:
        probe.begin(step, input_ids.shape[1], last_only=last_only, lean=last_only)
    x = F.embedding(input_ids[0], model.model.embed_tokens.weight)  # [T, H]
    for layer in model.model.layers:
        x = x + _attention_dense(layer.self_attn, layer.input_layernorm.rows(x), step, probe, every)
        x = x + _mlp_rows(layer.mlp, layer.post_attention_layernorm.rows(x), probe, every)
    step.cache.commit(input_ids, step.role_ids)
    if probe is not None:
        probe.hidden(x if every else x[-1:])
        probe.end()
    if every:
        return F.linear(model.model.norm.rows(x), model.lm_head.weight).unsqueeze(0)
    return F.linear(model.model.norm.one_row(x[-1:]), model.lm_head.weight).view(1, 1, -1)


def decode_one(model: GlmMoeDsaForCausalLM, input_ids: torch.Tensor, step: Step,
               selections: list | None = None) -> torch.Tensor:
    """Logits ``[1, 1, V]`` for ``input_ids [1, 1]`` appended to ``step.cache`` (which must have room).

    ``selections``: if a list, each layer's selected key positions (``[K]`` or None for all keys) are appended.
    """
    probe = step.probe
    if probe is not None:
        probe.begin(step, 1, last_only=True, lean=True)
    x = F.embedding(input_ids[0], model.model.embed_tokens.weight)  # [1, H]
    selected = None
    for layer in model.model.layers:
        out, selected = _attention(layer.self_attn, layer.input_layernorm.one_row(x), step, selected, probe)
        if selections is not None:
            selections.append(selected)
        x = x + out
        x = x + _mlp(layer.mlp, layer.post_attention_layernorm.one_row(x), probe)
    step.cache.commit(input_ids, step.role_ids)
    if probe is not None:
        probe.hidden(x)
        probe.end()
    return F.linear(model.model.norm.one_row(x), model.lm_head.weight).view(1, 1, -1)
