"""``lean.py``'s two paths compiled by TorchScript: the same operations, run by its interpreter.

On the embedded model a lean decoding step is a few hundred small tensor operations, and most of its
time is Python and the dispatcher between them, not arithmetic. :class:`LeanScript` writes
:func:`lean.decode_one` and :func:`lean.prefill_dense` once more as pure-tensor methods of a
``torch.jit.script``-ed module holding the layers' inference weights (references to the model's
tensors, never copies), in the same order of the same operations, so its logits match the Python
path's to rounding: the one-row RMSNorm scaled by a Python float, RoPE over every rotary slice at
once, the indexer's scores, bias rule and top-k, the absorbed attention, the router's choice read as
floats and chosen as ``Router.route_one`` chooses (the first of equal scores first), the padded or
per-expert routed experts. It writes the same cache entries and, when asked, returns the tensors
the statistics' probe records, which :func:`decode_one` / :func:`prefill_dense` hand to the probe
in the order the Python path does.

:func:`get` builds the module once per set of inference weights (``prepare_inference`` makes new
ones; weights changed in place are read as they are, like the Python path reads them) and returns
None, with one log line, if scripting fails: the generator then takes the Python path.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from glm5_lsp import pyparse
from glm5_lsp.model import lean
from glm5_lsp.model.attention import rope_cos_sin
from glm5_lsp.model.kv_cache import KVCache

if TYPE_CHECKING:
    from glm5_lsp.model.glm5 import GlmMoeDsaForCausalLM, Step
    from glm5_lsp.model.stats import StatsProbe

log = logging.getLogger(__name__)

_NONE = torch.zeros(0)  # stands in for a weight a layer does not have
_NO_KEYS = torch.zeros(1, 0, 0)  # and for the indexer keys' cache of a shared layer


def _t(x: torch.Tensor | None) -> torch.Tensor:
    """A weight as the script holds it: the same storage, without autograd (or the placeholder)."""
    return _NONE if x is None else x.detach()


class LeanScript(torch.nn.Module):
    """The inference weights of every layer, listed per layer (a placeholder where a layer has no such
    weight), and the two lean paths over them. Scripted by :func:`get`."""

    def __init__(self, model: GlmMoeDsaForCausalLM) -> None:
        super().__init__()
        layers = list(model.model.layers)
        first = layers[0].self_attn
        self.heads = first.n_heads
        self.nope = first.nope_dim
        self.rope = first.rope_dim
        self.q_dim = first.q_dim
        self.kv_rank = first.kv_rank
        self.v_dim = first.v_dim
        self.q_rows = first.fused.q_rows
        self.attn_scale = float(first.scale)
        self.batched_max = lean.BATCHED_EXPERTS_MAX_TOKENS
        self.n_layers = len(layers)
        self.x_sizes: list[list[int]] = [list(layer.self_attn.fused.x_sizes) for layer in layers]
        self.w_x: list[torch.Tensor] = [layer.self_attn.fused.w_x.detach() for layer in layers]
        self.w_q: list[torch.Tensor] = [layer.self_attn.fused.w_q.detach() for layer in layers]
        self.q_b: list[torch.Tensor] = [_t(layer.self_attn.q_b_proj.weight) for layer in layers]
        self.q_norm: list[torch.Tensor] = [_t(layer.self_attn.q_a_layernorm.weight) for layer in layers]
        self.q_eps: list[float] = [float(layer.self_attn.q_a_layernorm.eps) for layer in layers]
        self.kv_norm: list[torch.Tensor] = [_t(layer.self_attn.kv_a_layernorm.weight) for layer in layers]
        self.kv_eps: list[float] = [float(layer.self_attn.kv_a_layernorm.eps) for layer in layers]
        self.w_uk: list[torch.Tensor] = [layer.self_attn.absorbed.w_uk for layer in layers]
        self.w_uv_t: list[torch.Tensor] = [layer.self_attn.absorbed.w_uv_t for layer in layers]
        self.o_proj: list[torch.Tensor] = [_t(layer.self_attn.o_proj.weight) for layer in layers]
        self.in_norm: list[torch.Tensor] = [_t(layer.input_layernorm.weight) for layer in layers]
        self.in_eps: list[float] = [float(layer.input_layernorm.eps) for layer in layers]
        self.post_norm: list[torch.Tensor] = [_t(layer.post_attention_layernorm.weight) for layer in layers]
        self.post_eps: list[float] = [float(layer.post_attention_layernorm.eps) for layer in layers]
        # the indexer (full layers; a shared layer attends to the previous full layer's keys)
        indexers = [layer.self_attn.indexer for layer in layers]
        self.has_index: list[bool] = [idx is not None for idx in indexers]
        some = next((idx for idx in indexers if idx is not None), None)
        self.i_heads = some.n_heads if some is not None else 0
        self.i_dim = some.head_dim if some is not None else 0
        self.i_scale = float(some.scale) if some is not None else 1.0
        self.i_wq: list[torch.Tensor] = [_t(idx.wq_b.weight if idx is not None else None) for idx in indexers]
        self.i_wp: list[torch.Tensor] = [_t(idx.weights_proj.weight if idx is not None else None) for idx in indexers]
        self.ik_w: list[torch.Tensor] = [_t(idx.k_norm.weight if idx is not None else None) for idx in indexers]
        self.ik_b: list[torch.Tensor] = [_t(idx.k_norm.bias if idx is not None else None) for idx in indexers]
        self.ik_eps: list[float] = [float(idx.k_norm.eps) if idx is not None else 0.0 for idx in indexers]
        # the MLP (dense layers) or the MoE
        mlps = [layer.mlp for layer in layers]
        self.is_moe: list[bool] = [hasattr(mlp, "experts") for mlp in mlps]
        dense = [None if moe else mlp for mlp, moe in zip(mlps, self.is_moe)]
        moes = [mlp if moe else None for mlp, moe in zip(mlps, self.is_moe)]
        shared = [mlp.shared_experts if mlp is not None else m for mlp, m in zip(moes, dense)]
        # the dense MLP's three products, or the shared experts'
        self.gate_w: list[torch.Tensor] = [_t(m.gate_proj.weight) for m in shared]
        self.up_w: list[torch.Tensor] = [_t(m.up_proj.weight) for m in shared]
        self.down_w: list[torch.Tensor] = [_t(m.down_proj.weight) for m in shared]
        self.router_w: list[torch.Tensor] = [_t(m.gate.weight if m is not None else None) for m in moes]
        self.router_bias: list[torch.Tensor] = [_t(m.gate.e_score_correction_bias if m is not None else None)
                                                for m in moes]
        self.gate_up: list[torch.Tensor] = [_t(m.experts.gate_up_proj if m is not None else None) for m in moes]
        self.down: list[torch.Tensor] = [_t(m.experts.down_proj if m is not None else None) for m in moes]
        router = next((m.gate for m in moes if m is not None), None)
        self.top_k = router.top_k if router is not None else 0
        self.n_experts = router.n_experts if router is not None else 0
        self.n_group = router.n_group if router is not None else 1
        self.topk_group = router.topk_group if router is not None else 1
        self.norm_topk_prob = bool(router.norm_topk_prob) if router is not None else False
        self.scaling = float(router.scaling) if router is not None else 1.0
        self.embed = model.model.embed_tokens.weight.detach()
        self.norm_w = model.model.norm.weight.detach()
        self.norm_eps = float(model.model.norm.eps)
        self.lm_head = model.lm_head.weight.detach()

    # ---- pieces shared by both paths ------------------------------------------------------------

    def _one_row(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        """``RMSNorm.one_row``."""
        norm = float(torch.linalg.vector_norm(x))
        return torch.mul(x, w).mul_(1.0 / math.sqrt(norm * norm / x.shape[-1] + eps))

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``attention.apply_rope`` for ``x [1, T, N, R]``, ``cos/sin [T, R/2]``."""
        cos = cos.view(1, cos.shape[0], 1, cos.shape[-1])
        sin = sin.view(1, sin.shape[0], 1, sin.shape[-1])
        x1 = x[:, :, :, 0::2]
        x2 = x[:, :, :, 1::2]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def _swiglu(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """``MLP.swiglu``: the dense MLP, or the shared experts of an MoE layer."""
        gate = F.silu(F.linear(x, self.gate_w[i]))
        return F.linear(gate * F.linear(x, self.up_w[i]), self.down_w[i])

    def _expert(self, x: torch.Tensor, i: int, expert: int) -> torch.Tensor:
        """One routed expert on ``x`` (``swiglu`` of the fused gate/up product)."""
        gate_up = F.linear(x, self.gate_up[i][expert])
        half = gate_up.shape[-1] // 2
        return F.linear(F.silu(gate_up[..., :half]) * gate_up[..., half:], self.down[i][expert])

    def _choose(self, scores: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``Router.choose``."""
        choice = scores + self.router_bias[i]
        if self.n_group > 1:
            per_group = self.n_experts // self.n_group
            grouped = choice.view(-1, self.n_group, per_group)
            group_scores = grouped.topk(min(2, per_group), dim=-1)[0].sum(-1)
            keep = torch.zeros_like(group_scores, dtype=torch.bool)
            keep.scatter_(1, group_scores.topk(self.topk_group, dim=-1, sorted=False)[1], True)
            choice = choice.masked_fill(~keep.repeat_interleave(per_group, dim=1), float("-inf"))
        idx = choice.topk(self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, idx)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return idx, weights * self.scaling

    # ---- one token (lean.decode_one) ------------------------------------------------------------

    def _attention(self, i: int, x: torch.Tensor, pos: int, cos: torch.Tensor, sin: torch.Tensor,
                   latents: torch.Tensor, keys: torch.Tensor, topk: int, dense: bool, key_bias: torch.Tensor | None,
                   roles: torch.Tensor | None, selected: torch.Tensor | None, record: bool,
                   rec: list[list[torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``lean._attention``; the probe's records appended to ``rec`` (index query, then attention)."""
        kend = pos + 1
        heads, nope, rope = self.heads, self.nope, self.rope
        parts = F.linear(x, self.w_x[i]).split(self.x_sizes[i], dim=-1)
        qs = F.linear(self._one_row(parts[0], self.q_norm[i], self.q_eps[i]), self.w_q[i])[0]
        q = qs[: self.q_rows].view(heads, self.q_dim)
        full = self.has_index[i]
        iq = qs  # (bound below where the layer has an indexer)
        ik = qs
        if full:
            iq = qs[self.q_rows :].view(self.i_heads, self.i_dim)
            ik = F.layer_norm(parts[3], [self.i_dim], self.ik_w[i], self.ik_b[i], self.ik_eps[i])
            rows = torch.cat([q[:, nope:], parts[2], iq[:, :rope], ik[:, :rope]])
        else:
            rows = torch.cat([q[:, nope:], parts[2]])
        rot = self._rope(rows.view(1, 1, -1, rope), cos, sin)[0, 0]  # every rotary slice at once

        latents[pos, : self.kv_rank] = self._one_row(parts[1][0], self.kv_norm[i], self.kv_eps[i])
        latents[pos, self.kv_rank :] = rot[heads]
        if full:
            keys[pos, :rope] = rot[-1]
            keys[pos, rope:] = ik[0, rope:]
            chosen: torch.Tensor | None = None  # a full layer selects afresh
            query_rope = rot[heads + 1 : heads + 1 + self.i_heads]
            if record:
                rec.append([query_rope, iq[:, rope:], parts[4][0]])
            if not dense and kend > topk:
                query = torch.cat([query_rope, iq[:, rope:]], dim=-1)
                per_head = torch.mm(query, keys[:kend].t()).mul_(self.i_scale).relu_()  # [Hi, Tk]
                scores = torch.mv(per_head.t(), parts[4][0] * self.i_heads ** -0.5)
                if key_bias is not None:
                    std = scores.std(correction=0)
                    scores = scores + key_bias[0, :kend] * torch.where(std > 0, std, torch.ones_like(std))
                chosen = scores.topk(topk, sorted=False)[1]
            selected = chosen

        q_lat = torch.bmm(q[:, :nope].unsqueeze(1), self.w_uk[i]).view(heads, self.kv_rank)
        q_cat = torch.cat([q_lat, rot[:heads]], dim=-1)
        if selected is None:
            keys_used = latents[:kend]
        else:
            keys_used = latents.index_select(0, selected)
        probs = torch.softmax(torch.mm(q_cat, keys_used.t()).mul_(self.attn_scale), dim=-1)
        if record and roles is not None:
            rec.append([probs, roles if selected is None else roles.index_select(0, selected)])
        o_lat = torch.mm(probs, keys_used[:, : self.kv_rank])
        out = torch.bmm(o_lat.unsqueeze(1), self.w_uv_t[i]).view(1, heads * self.v_dim)
        return F.linear(out, self.o_proj[i]), selected

    def _route_one(self, h: torch.Tensor, i: int) -> tuple[list[int], list[float], torch.Tensor]:
        """``Router.route_one``: the chosen experts, their weights as floats, the scores ``[1, E]``."""
        scores = F.linear(h, self.router_w[i]).sigmoid()
        choice = torch.jit.annotate(list[float], (scores + self.router_bias[i])[0].tolist())
        values = torch.jit.annotate(list[float], scores[0].tolist())
        taken = [False] * len(choice)
        if self.n_group > 1:  # the groups outside the topk_group best (their two best values summed) are out
            size = len(choice) // self.n_group
            group_score = torch.jit.annotate(list[float], [])
            for g in range(self.n_group):
                first, second = -math.inf, -math.inf
                for e in range(g * size, (g + 1) * size):
                    if choice[e] > first:
                        first, second = choice[e], first
                    elif choice[e] > second:
                        second = choice[e]
                group_score.append(first + (second if size > 1 else 0.0))
            out_groups = [True] * self.n_group
            for _ in range(min(self.topk_group, self.n_group)):
                best = -1
                for g in range(self.n_group):
                    if out_groups[g] and (best < 0 or group_score[g] > group_score[best]):
                        best = g
                out_groups[best] = False
            for e in range(len(choice)):
                taken[e] = out_groups[e // size]
        chosen = torch.jit.annotate(list[int], [])
        for _ in range(min(self.top_k, len(choice))):  # as a stable sort, largest first: ties by index
            best = -1
            for e in range(len(choice)):
                if not taken[e] and (best < 0 or choice[e] > choice[best]):
                    best = e
            if best < 0:
                break
            taken[best] = True
            chosen.append(best)
        picked = [values[e] for e in chosen]
        if self.norm_topk_prob:
            total = 0.0
            for w in picked:
                total += w
            total += 1e-20
            picked = [w / total for w in picked]
        return chosen, [w * self.scaling for w in picked], scores

    def _mlp(self, h: torch.Tensor, i: int, record: bool, rec: list[list[torch.Tensor]],
             top: list[float]) -> torch.Tensor:
        """``lean._mlp``; the router's records appended to ``rec`` and ``top``."""
        if not self.is_moe[i]:
            return self._swiglu(h, i)
        chosen, weights, scores = self._route_one(h, i)
        routed: torch.Tensor | None = None
        for j in range(len(chosen)):
            y = self._expert(h, i, chosen[j]) * weights[j]
            routed = y if routed is None else routed + y
        shared = self._swiglu(h, i)
        if routed is None:
            if record:
                rec.append([scores, torch.zeros_like(shared), shared])
                top.append(0.0)
            return shared
        if record:
            rec.append([scores, routed, shared])
            top.append(max(weights))
        return routed + shared

    @torch.jit.export
    def decode_one(self, input_ids: torch.Tensor, pos: int, cos: torch.Tensor, sin: torch.Tensor,
                   latents: list[torch.Tensor], keys: list[torch.Tensor], topk: int, dense: bool,
                   key_bias: torch.Tensor | None, roles: torch.Tensor | None, record: bool, want_selected: bool):
        """``lean.decode_one`` on one sequence's cache rows (``latents[i]``, ``keys[i]``: ``[capacity, W]``):
        the logits ``[1, 1, V]``, the last hidden state ``[1, D]``, each layer's selected keys (with
        ``want_selected``), and with ``record`` the probe's records in order (per full layer the index
        query's three parts, per layer the probabilities and the keys' roles, per MoE layer the scores,
        routed, shared; the top weights)."""
        rec: list[list[torch.Tensor]] = []
        top: list[float] = []
        picks: list[torch.Tensor | None] = []
        x = F.embedding(input_ids[0], self.embed)  # [1, H]
        selected: torch.Tensor | None = None
        for i in range(self.n_layers):
            out, selected = self._attention(i, self._one_row(x, self.in_norm[i], self.in_eps[i]), pos, cos, sin,
                                            latents[i][0], keys[i][0], topk, dense, key_bias, roles, selected, record,
                                            rec)
            if want_selected:
                picks.append(selected)
            x = x + out
            x = x + self._mlp(self._one_row(x, self.post_norm[i], self.post_eps[i]), i, record, rec, top)
        logits = F.linear(self._one_row(x, self.norm_w, self.norm_eps), self.lm_head).view(1, 1, -1)
        return logits, x, picks, rec, top

    # ---- a short prompt (lean.prefill_dense) ----------------------------------------------------

    def _attention_dense(self, i: int, x: torch.Tensor, pos: int, cos: torch.Tensor, sin: torch.Tensor,
                         latents: torch.Tensor, keys: torch.Tensor, roles: torch.Tensor | None, record: bool,
                         every: bool, rec: list[list[torch.Tensor]]) -> torch.Tensor:
        """``lean._attention_dense``."""
        t = x.shape[0]
        kend = pos + t
        heads, nope, rope = self.heads, self.nope, self.rope
        full = self.has_index[i]
        parts = F.linear(x, self.w_x[i]).split(self.x_sizes[i], dim=-1)
        q_resid = F.rms_norm(parts[0], [parts[0].shape[-1]], self.q_norm[i], self.q_eps[i])
        index_rows = full and record and every
        qs = F.linear(q_resid, self.w_q[i] if index_rows else self.q_b[i])
        q = qs[:, : self.q_rows].view(t, heads, self.q_dim)
        iq = qs
        ik = qs
        if full:
            ik = F.layer_norm(parts[3], [self.i_dim], self.ik_w[i], self.ik_b[i], self.ik_eps[i])
            if index_rows:
                iq = qs[:, self.q_rows :].view(t, self.i_heads, self.i_dim)
                rows = torch.cat([q[:, :, nope:], parts[2].unsqueeze(1), ik[:, None, :rope], iq[:, :, :rope]], dim=1)
            else:
                rows = torch.cat([q[:, :, nope:], parts[2].unsqueeze(1), ik[:, None, :rope]], dim=1)
        else:
            rows = torch.cat([q[:, :, nope:], parts[2].unsqueeze(1)], dim=1)
        rot = self._rope(rows.unsqueeze(0), cos, sin)[0]  # [T, H + 1 (+1 +Hi), R]

        latents[pos:kend, : self.kv_rank] = F.rms_norm(parts[1], [self.kv_rank], self.kv_norm[i], self.kv_eps[i])
        latents[pos:kend, self.kv_rank :] = rot[:, heads]
        if full:
            keys[pos:kend, :rope] = rot[:, heads + 1]
            keys[pos:kend, rope:] = ik[:, rope:]
            if index_rows:
                rec.append([rot[:, heads + 2 :].contiguous(), iq[:, :, rope:], parts[4]])
            elif record:  # the last query, as ``Indexer.queries`` makes it
                last = F.linear(q_resid[-1:], self.i_wq[i]).view(1, 1, self.i_heads, self.i_dim)
                last = torch.cat([self._rope(last[:, :, :, :rope], cos[-1:], sin[-1:]), last[:, :, :, rope:]], dim=-1)
                weights = F.linear(x[-1:], self.i_wp[i]).float() * self.i_heads ** -0.5
                rec.append([last[0, 0, :, :rope].contiguous(), last[0, 0, :, rope:], weights[0]])

        q_lat = torch.bmm(q[:, :, :nope].transpose(0, 1), self.w_uk[i])  # [H, T, L]
        q_cat = torch.cat([q_lat, rot[:, :heads].transpose(0, 1)], dim=-1)  # [H, T, L + R]
        keys_all = latents[:kend]
        scores = torch.matmul(q_cat, keys_all.t()).mul_(self.attn_scale)  # [H, T, Tk]
        future = torch.arange(kend)[None, :] > torch.arange(pos, kend)[:, None]
        scores.masked_fill_(future, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if record and roles is not None:
            rec.append([probs.transpose(0, 1) if every else probs[:, -1], roles])
        o_lat = torch.matmul(probs, keys_all[:, : self.kv_rank])  # [H, T, L]
        out = torch.bmm(o_lat, self.w_uv_t[i]).transpose(0, 1).reshape(t, heads * self.v_dim)
        return F.linear(out, self.o_proj[i])

    def _padded(self, x: torch.Tensor, i: int, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``Experts.padded``."""
        n, hidden = x.shape[0], x.shape[1]
        gate_up, down = self.gate_up[i], self.down[i]
        n_experts = gate_up.shape[0]
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=n_experts)
        capacity = int(counts.max())
        starts = torch.cumsum(counts, 0) - counts
        expert = flat[order]
        slot = torch.arange(flat.numel()) - starts[expert]
        rows = torch.full((n_experts, capacity), n, dtype=torch.long)
        rows[expert, slot] = torch.div(order, idx.shape[1], rounding_mode="floor")
        scale = torch.zeros(n_experts, capacity, 1, dtype=x.dtype)
        scale[expert, slot, 0] = weights.reshape(-1)[order].to(x.dtype)
        batch = torch.cat([x, x.new_zeros(1, hidden)])[rows]  # [E, C, H]
        gu = torch.bmm(batch, gate_up.transpose(1, 2))
        half = gu.shape[-1] // 2
        y = torch.bmm(F.silu(gu[..., :half]) * gu[..., half:], down.transpose(1, 2))
        out = x.new_zeros(n + 1, hidden)
        out.index_add_(0, rows.view(-1), (y * scale).view(-1, hidden))
        return out[:n]

    def _experts(self, x: torch.Tensor, i: int, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``Experts.forward`` for several tokens: one product pair per expert that has any."""
        k = idx.shape[1]
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts: list[int] = torch.bincount(flat, minlength=self.gate_up[i].shape[0]).tolist()
        tokens = torch.div(order, k, rounding_mode="floor")
        w = weights.reshape(-1)[order].to(x.dtype)
        out = torch.zeros_like(x)
        pos = 0
        for expert in range(len(counts)):
            count = counts[expert]
            if count == 0:
                continue
            rows = tokens[pos : pos + count]
            y = self._expert(x[rows], i, expert)
            out.index_add_(0, rows, y * w[pos : pos + count, None])
            pos += count
        return out

    def _mlp_rows(self, h: torch.Tensor, i: int, record: bool, every: bool, rec: list[list[torch.Tensor]],
                  top: list[float], top_rows: list[torch.Tensor]) -> torch.Tensor:
        """``lean._mlp_rows``."""
        if not self.is_moe[i]:
            return self._swiglu(h, i)
        scores = F.linear(h, self.router_w[i]).sigmoid()
        idx, weights = self._choose(scores, i)
        if h.shape[0] <= self.batched_max:
            routed = self._padded(h, i, idx, weights)
        else:
            routed = self._experts(h, i, idx, weights)
        shared = self._swiglu(h, i)
        if record and every:
            rec.append([scores, routed, shared])
            top_rows.append(weights.max(-1)[0])
        elif record:
            rec.append([scores[-1:], routed[-1:], shared[-1:]])
            top.append(float(weights[-1].max()))
        return routed + shared

    @torch.jit.export
    def prefill_dense(self, input_ids: torch.Tensor, pos: int, cos: torch.Tensor, sin: torch.Tensor,
                      latents: list[torch.Tensor], keys: list[torch.Tensor], roles: torch.Tensor | None,
                      record: bool, last_only: bool):
        """``lean.prefill_dense``: the logits (the last position's ``[1, 1, V]``, or every position's
        ``[1, T, V]``), the hidden states the probe records, and its records in order (the top weights
        apart: floats for the last row, ``[T]`` for every row)."""
        every = not last_only
        rec: list[list[torch.Tensor]] = []
        top: list[float] = []
        top_rows: list[torch.Tensor] = []
        x = F.embedding(input_ids[0], self.embed)  # [T, H]
        for i in range(self.n_layers):
            h = F.rms_norm(x, [x.shape[-1]], self.in_norm[i], self.in_eps[i])
            x = x + self._attention_dense(i, h, pos, cos, sin, latents[i][0], keys[i][0], roles, record, every, rec)
            h = F.rms_norm(x, [x.shape[-1]], self.post_norm[i], self.post_eps[i])
            x = x + self._mlp_rows(h, i, record, every, rec, top, top_rows)
        if every:
            logits = F.linear(F.rms_norm(x, [x.shape[-1]], self.norm_w, self.norm_eps), self.lm_head).unsqueeze(0)
            return logits, x, rec, top, top_rows
        last = x[-1:]
        logits = F.linear(self._one_row(last, self.norm_w, self.norm_eps), self.lm_head).view(1, 1, -1)
        return logits, last, rec, top, top_rows


class Scripted:
    """One model's scripted :class:`LeanScript` and what the Python side needs to feed the probe."""

    def __init__(self, model: GlmMoeDsaForCausalLM, module: torch.jit.ScriptModule) -> None:
        self.module = module
        layers = list(model.model.layers)
        # per layer: (its index, whether it has an indexer, whether it is an MoE layer)
        self.plan = [(i, layer.self_attn.indexer is not None, hasattr(layer.mlp, "experts"))
                     for i, layer in enumerate(layers)]
        some = next((layer.self_attn.indexer for layer in layers if layer.self_attn.indexer is not None), None)
        self.index_weight_scale = some.n_heads**-0.5 if some is not None else 1.0
        self.index_key_scale = some.scale if some is not None else 1.0

    def feed(self, probe: StatsProbe, rec: list, top: list, hidden: torch.Tensor, weight_scale: float) -> None:
        """Hand ``rec`` and ``top`` (in :class:`LeanScript`'s order) to ``probe`` as the Python path does."""
        r = m = 0
        for layer, full, moe in self.plan:
            if full:
                rope, rest, weights = rec[r]
                probe.index_query(layer, rope, rest, weights, weight_scale, self.index_key_scale)
                r += 1
            probs, roles = rec[r]
            probe.attention(probs, roles)
            r += 1
            if moe:
                scores, routed, shared = rec[r]
                probe.router(scores, top[m], routed, shared)
                r += 1
                m += 1
        probe.hidden(hidden)
        probe.end()


def _inference_weights(model: GlmMoeDsaForCausalLM) -> list:
    """Each attention layer with the inference weights it has now (``prepare_inference`` makes new ones)."""
    return [(layer.self_attn, layer.self_attn.fused, layer.self_attn.absorbed) for layer in model.model.layers]


def _fits(model: GlmMoeDsaForCausalLM) -> bool:
    """Whether the lean paths can run this model at all (``lean.lean_ok``'s fixed part)."""
    weight = model.lm_head.weight
    return (weight.dtype == torch.float32 and weight.device.type == "cpu" and not model.config.attention_bias
            and model.prepared)


def _script(model: GlmMoeDsaForCausalLM) -> Scripted:
    module = LeanScript(model)
    with warnings.catch_warnings(), pyparse.exclusive():  # it parses the methods' source (pyparse)
        warnings.simplefilter("ignore")  # "torch.jit.script is deprecated"; it still runs this fastest here
        fast = Scripted(model, torch.jit.script(module))
    _warm(model, fast)
    return fast


@torch.inference_mode()
def _warm(model: GlmMoeDsaForCausalLM, fast: Scripted) -> None:
    """Run both methods on a scratch cache: TorchScript's executor profiles the first calls and
    optimises the graph at the next (about 130 ms on the first model of a process; the compiled
    methods are shared by later models, whose warm-up then takes a few ms)."""
    config = model.config
    cache = KVCache(config, capacity=8)
    keys = [_NO_KEYS if k is None else k for k in cache.index_keys]
    cos, sin = rope_cos_sin(torch.arange(4), config.qk_rope_head_dim, config.rope_theta)
    ids = torch.zeros(1, 3, dtype=torch.long)
    roles = torch.zeros(4, 3)
    for last_only in (True, False, True):
        fast.module.prefill_dense(ids, 0, cos[:3], sin[:3], cache.latents, keys, roles[:3], True, last_only)
    for record in (True, True, False):
        fast.module.decode_one(ids[:, :1], 3, cos[3:], sin[3:], cache.latents, keys, config.index_topk, False, None,
                               roles, record, False)


def get(model: GlmMoeDsaForCausalLM) -> Scripted | None:
    """The model's scripted lean paths, built on first use after each ``prepare_inference`` (which
    makes new inference weights; weights changed in place are read as they are, and a weight replaced
    by another tensor is read after the next ``prepare_inference``, as ``inference_current``
    requires). None where the lean paths cannot run the model, or where scripting failed (logged once,
    not tried again for this model): the Python lean paths then run."""
    held = model.__dict__.get("_lean_script")  # (in the instance's dict: not a submodule, not in state_dict)
    if held is not None and (held[0] is None or all(attn.fused is f and attn.absorbed is a
                                                    for attn, f, a in held[1])):
        return held[0]
    if not _fits(model):
        return None
    try:
        built = _script(model)
    except Exception as exc:  # noqa: BLE001 - whatever failed, the Python path computes the same
        log.warning("TorchScript of the lean paths failed, the Python lean paths run instead: %s: %s",
                    type(exc).__name__, exc)
        built = None  # and not tried again for this model
    model.__dict__["_lean_script"] = (built, _inference_weights(model))
    return built


def decode_one(fast: Scripted, input_ids: torch.Tensor, step: Step, selections: list | None = None) -> torch.Tensor:
    """:func:`lean.decode_one` by ``fast``'s scripted module (same arguments, same result)."""
    probe = step.probe
    cache = step.cache
    roles = None
    if probe is not None:
        probe.begin(step, 1, last_only=True, lean=True)
        roles = probe.key_roles(step.start + 1)
    keys = [_NO_KEYS if k is None else k for k in cache.index_keys]
    logits, hidden, picks, rec, top = fast.module.decode_one(
        input_ids, step.start, step.cos, step.sin, cache.latents, keys, step.topk, step.dense, step.key_bias,
        roles, probe is not None, selections is not None)
    if selections is not None:
        selections.extend(picks)
    cache.commit(input_ids, step.role_ids)
    if probe is not None:
        fast.feed(probe, rec, top, hidden, fast.index_weight_scale)
    return logits


def prefill_dense(fast: Scripted, input_ids: torch.Tensor, step: Step, last_only: bool = True) -> torch.Tensor:
    """:func:`lean.prefill_dense` by ``fast``'s scripted module (same arguments, same result)."""
    probe = step.probe
    cache = step.cache
    roles = None
    t = input_ids.shape[1]
    if probe is not None:
        probe.begin(step, t, last_only=last_only, lean=last_only)
        roles = probe.key_roles(step.start + t)
    keys = [_NO_KEYS if k is None else k for k in cache.index_keys]
    logits, hidden, rec, top, top_rows = fast.module.prefill_dense(
        input_ids, step.start, step.cos, step.sin, cache.latents, keys, roles, probe is not None, last_only)
    cache.commit(input_ids, step.role_ids)
    if probe is not None:
        fast.feed(probe, rec, top if last_only else top_rows, hidden, 1.0 if last_only else fast.index_weight_scale)
    return logits
