"""GLM-5 (``glm_moe_dsa``) in PyTorch, top to bottom in the order data flows.

    tokens -> embed -> N x [RMSNorm -> MLA attention with DSA -> + -> RMSNorm -> MLP or MoE -> +]
           -> RMSNorm -> lm_head -> logits

- **MLA**: queries through a low-rank latent (``q_a_proj`` -> ``q_a_layernorm`` -> ``q_b_proj``);
  keys/values through one compressed latent per token (``kv_a_proj_with_mqa`` -> ``kv_a_layernorm``,
  expanded per head by ``kv_b_proj``), plus a shared rotary key. The cache stores only the latent.
- **DSA**: a lightning indexer scores every earlier key with a few ReLU heads weighted per query and
  each query keeps its top-k; "shared" layers reuse the previous full layer's selection. The
  attention policy (``policy.py``) biases that choice and forces error-context tokens in.
- **MoE**: sigmoid router with a selection bias, grouped top-k, normalised and scaled weights,
  routed experts stored fused (``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``) plus shared experts.

Parameter names match Hugging Face's ``GlmMoeDsaForCausalLM``, so its checkpoints load as they are.
Inference attends only to the selected keys (``attention.latent_attention_gathered``); the dense
reference (``reference=True``) masks a full score matrix instead and exists to check the fast path.
One new token of one sequence on the CPU (decoding) goes through ``decode.decode_one``, the same
arithmetic in far fewer operations.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from glm5_lsp.model import decode
from glm5_lsp.model.attention import (
    apply_rope,
    causal_sdpa,
    eager_attention,
    latent_attention_dense,
    latent_attention_gathered,
    rope_cos_sin,
)
from glm5_lsp.model.cache import KVCache
from glm5_lsp.model.config import GlmMoeDsaConfig
from glm5_lsp.model.policy import AttentionPolicy, Role, roles_tensor

QUERY_CHUNK = 128  # at most this many queries have their keys selected together
INDEXER_CHUNK_FLOATS = 2**21  # and their per-head indexer scores stay under this many floats (8 MiB)
FFN_CHUNK = 2048  # tokens whose MLP/MoE activations are computed at once during a long prefill
DECODE_MAX_TOKENS = 4  # forward calls this short take the fused decoding path
GATHER_CHUNK = 16  # queries whose selected latents are gathered at once (16: fastest of 8-64 at 4k, 2 threads)
EXPAND_MIN_QUERIES = 128  # at least this many dense queries: expand per-head K/V and use fused SDPA
TRAIN_STAGES = ("dense", "indexer_warmup", "sparse")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


@dataclass
class Selection:
    """The keys one chunk of queries (new-token rows ``q0 .. q1 - 1``) attends to.

    ``idx is None``: every row attends to all its causal keys. Otherwise ``idx [B, Tq, K]`` names
    the keys (positions; -1 where a row has fewer than K) and ``dense_rows [B, Tq]`` marks rows that
    attend to all causal keys anyway (error-context queries under the policy).
    """

    q0: int
    q1: int
    kend: int  # keys 0 .. kend - 1 exist for this chunk
    idx: torch.Tensor | None = None
    dense_rows: torch.Tensor | None = None
    all_valid: bool = False  # every entry of ``idx`` names a key (no -1): the mask can be skipped

    @property
    def valid(self) -> torch.Tensor:
        assert self.idx is not None
        return self.idx >= 0


@dataclass
class Step:
    """What every layer needs to know about this forward call."""

    start: int  # position of the first new token (tokens before it are cached)
    cos: torch.Tensor  # [T, R/2]
    sin: torch.Tensor
    cache: KVCache | None
    topk: int  # keys each query keeps (after the policy's budget rule)
    dense: bool  # ignore the indexer: full causal attention
    reference: bool  # dense masked reference kernels instead of gather
    stage: str | None = None  # a training stage, or None for inference
    key_bias: torch.Tensor | None = None  # [B, start + T] policy bias units per key
    forced_keys: torch.Tensor | None = None  # [B, start + T] bool
    forced_rows: torch.Tensor | None = None  # [B, T] bool

    @property
    def needs_selection(self) -> bool:
        return not self.dense


def causal_allowed(start: int, tq: int, tk: int, device: torch.device) -> torch.Tensor:
    """``[Tq, Tk]`` bool: query ``start + i`` may see key ``j <= start + i``."""
    qpos = torch.arange(start, start + tq, device=device)
    return torch.arange(tk, device=device)[None, :] <= qpos[:, None]


class Indexer(nn.Module):
    """DSA's lightning indexer: cheap ReLU scores per (query, key), summed over weighted heads."""

    def __init__(self, config: GlmMoeDsaConfig) -> None:
        super().__init__()
        self.n_heads = config.index_n_heads
        self.head_dim = config.index_head_dim
        self.rope_dim = config.qk_rope_head_dim
        self.wq_b = nn.Linear(config.q_lora_rank, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(config.hidden_size, self.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(config.hidden_size, self.n_heads, bias=False)
        self.scale = self.head_dim**-0.5

    def _rope_first(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rot, rest = x.split([self.rope_dim, self.head_dim - self.rope_dim], dim=-1)
        return torch.cat([apply_rope(rot, cos, sin), rest], dim=-1)

    def keys(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """One shared key per token: ``[B, T, H] -> [B, T, D]``."""
        return self._rope_first(self.k_norm(self.wk(x)), cos, sin)

    def queries(self, x: torch.Tensor, q_resid: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Per-head queries ``[B, T, Hi, D]`` and head weights ``[B, T, Hi]``."""
        bsz, t, _ = x.shape
        q = self.wq_b(q_resid).view(bsz, t, self.n_heads, self.head_dim)
        q = self._rope_first(q, cos, sin)
        weights = self.weights_proj(x.to(self.weights_proj.weight.dtype)).float() * self.n_heads**-0.5
        return q, weights

    def scores(self, q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """``q [B, Tq, Hi, D]``, ``weights [B, Tq, Hi]``, ``keys [B, Tk, D]`` -> ``[B, Tq, Tk]`` (unmasked)."""
        bsz, tq, heads, dim = q.shape
        per_head = torch.bmm(q.float().reshape(bsz, tq * heads, dim), keys.float().transpose(1, 2))
        if torch.is_grad_enabled():
            per_head = F.relu(per_head * self.scale)
        else:  # in place: this is the indexer's largest temporary
            per_head = per_head.mul_(self.scale).relu_()
        per_head = per_head.view(bsz, tq, heads, -1)  # [B, Tq, Hi, Tk]
        return torch.matmul(weights.unsqueeze(-2), per_head).squeeze(-2)

    @torch.no_grad()
    def select(self, q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, step: Step) -> list[Selection]:
        """Top-k keys per query, chunk by chunk, with the policy applied. ``keys`` covers ``0 .. start+T-1``."""
        bsz, t = q.shape[:2]
        out: list[Selection] = []
        chunk = max(8, min(QUERY_CHUNK, INDEXER_CHUNK_FLOATS // (bsz * self.n_heads * (step.start + t))))
        for q0 in range(0, t, chunk):
            q1 = min(t, q0 + chunk)
            kend = step.start + q1
            if kend <= step.topk:  # every row has at most top-k causal keys: it keeps them all
                out.append(Selection(q0, q1, kend))
                continue
            s = self.scores(q[:, q0:q1], weights[:, q0:q1], keys[:, :kend])  # [B, Tq, Tk]
            allowed = causal_allowed(step.start + q0, q1 - q0, kend, s.device).unsqueeze(0)
            if step.key_bias is not None:
                s = s + step.key_bias[:, None, :kend] * _row_std(s, allowed)
            s = s.masked_fill(~allowed, float("-inf"))
            forced = step.forced_keys[:, :kend] if step.forced_keys is not None else None
            if forced is not None:
                s = s.masked_fill(forced[:, None, :], float("-inf"))  # chosen below, outside the budget
            vals, idx = s.topk(min(step.topk, kend), dim=-1, sorted=False)  # a set: order is not needed
            # Every row has at least top-k causal keys and none is masked out otherwise: no -inf is picked.
            all_valid = forced is None and step.start + q0 + 1 >= step.topk
            if not all_valid:
                idx = idx.masked_fill(vals == float("-inf"), -1)
            dense_rows = None
            if forced is not None and bool(forced.any()):
                idx = _append_forced(idx, forced, allowed)
                dense_rows = step.forced_rows[:, q0:q1]
            out.append(Selection(q0, q1, kend, idx.to(torch.int32), dense_rows, all_valid))  # int32: half the memory
        return out


def _one_selection(idx: torch.Tensor | None, kend: int) -> Selection:
    """The newest query's ``Selection`` from the key positions ``decode.decode_one`` picked (None: all keys)."""
    if idx is None:
        return Selection(0, 1, kend)
    return Selection(0, 1, kend, idx.view(1, 1, -1).to(torch.int32), all_valid=True)


def _row_std(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Standard deviation of each row's allowed scores: ``[B, Tq, 1]`` (1 where undefined)."""
    mask = allowed.to(scores.dtype)
    n = mask.sum(-1, keepdim=True).clamp(min=1)
    mean = (scores * mask).sum(-1, keepdim=True) / n
    var = (((scores - mean) * mask) ** 2).sum(-1, keepdim=True) / n
    std = var.sqrt()
    return torch.where(std > 0, std, torch.ones_like(std))


def _append_forced(idx, forced, allowed):
    """Add every forced key (``forced [B, Tk]``) to each row's selection where it is causal (-1 elsewhere)."""
    bsz = idx.shape[0]
    counts = forced.sum(-1)
    width = int(counts.max())
    pos = torch.zeros(bsz, width, dtype=torch.long, device=idx.device)
    ok = torch.zeros(bsz, width, dtype=torch.bool, device=idx.device)
    for b in range(bsz):
        where = forced[b].nonzero().squeeze(-1)
        pos[b, : where.numel()] = where
        ok[b, : where.numel()] = True
    tq = idx.shape[1]
    extra_idx = pos[:, None, :].expand(bsz, tq, width)
    causal = allowed.expand(bsz, -1, -1).gather(2, extra_idx)  # [B, Tq, F]
    extra_idx = extra_idx.masked_fill(~(ok[:, None, :] & causal), -1)
    return torch.cat([idx, extra_idx], dim=-1)


def selection_mask(selections: list[Selection], bsz: int, tq: int, tk: int, start: int, device) -> torch.Tensor:
    """The dense ``[B, Tq, Tk]`` bool mask equivalent to a list of selections (for the reference path)."""
    mask = torch.zeros(bsz, tq, tk, dtype=torch.bool, device=device)
    causal = causal_allowed(start, tq, tk, device)
    for sel in selections:
        rows = slice(sel.q0, sel.q1)
        if sel.idx is None:
            mask[:, rows] = causal[rows].unsqueeze(0)
            continue
        chunk = torch.zeros(bsz, sel.q1 - sel.q0, tk + 1, dtype=torch.bool, device=device)
        slots = torch.where(sel.valid, sel.idx.long(), tk)  # "no key" goes to a spare column, dropped below
        chunk = chunk.scatter_(2, slots, True)[:, :, :tk]
        if sel.dense_rows is not None:
            chunk = chunk | (sel.dense_rows[:, :, None] & causal[rows].unsqueeze(0))
        mask[:, rows] = chunk
    return mask


class MLAttention(nn.Module):
    """Multi-head latent attention with DSA top-k selection."""

    def __init__(self, config: GlmMoeDsaConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads = config.num_attention_heads
        self.nope_dim = config.qk_nope_head_dim
        self.rope_dim = config.qk_rope_head_dim
        self.v_dim = config.v_head_dim
        self.kv_rank = config.kv_lora_rank
        self.q_dim = config.qk_head_dim
        self.scale = self.q_dim**-0.5
        bias = config.attention_bias
        self.q_a_proj = nn.Linear(config.hidden_size, config.q_lora_rank, bias=bias)
        self.q_a_layernorm = RMSNorm(config.q_lora_rank)
        self.q_b_proj = nn.Linear(config.q_lora_rank, self.n_heads * self.q_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(config.hidden_size, self.kv_rank + self.rope_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_rank)
        self.kv_b_proj = nn.Linear(self.kv_rank, self.n_heads * (self.nope_dim + self.v_dim), bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.v_dim, config.hidden_size, bias=bias)
        self.indexer = Indexer(config) if config.indexer_types[layer_idx] == "full" else None

    # -- helpers for the absorbed (latent-space) form ---------------------------------------------
    def _kv_b(self) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.kv_b_proj.weight.view(self.n_heads, self.nope_dim + self.v_dim, self.kv_rank)
        return w[:, : self.nope_dim], w[:, self.nope_dim :]  # W_uk [H, dn, L], W_uv [H, dv, L]

    def _expand(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head keys ``[B, H, Tk, dq]`` and values ``[B, H, Tk, dv]`` from latents ``[B, Tk, L + R]``."""
        bsz, tk, _ = latents.shape
        kv = self.kv_b_proj(latents[..., : self.kv_rank]).view(bsz, tk, self.n_heads, -1)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)
        k_rope = latents[..., self.kv_rank :].unsqueeze(2).expand(-1, -1, self.n_heads, -1)
        k = torch.cat([k_nope, k_rope], dim=-1)
        return k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x: torch.Tensor, step: Step, prev: list[Selection] | None):
        bsz, t, _ = x.shape
        fused = t <= DECODE_MAX_TOKENS and step.stage is None and not step.reference and not torch.is_grad_enabled()
        q_resid, q_nope, q_rope, new_latents, idx_keys, iq, iw = (
            self._project_fused(x, step) if fused else self._project(x, step)
        )
        if step.cache is not None:
            step.cache.write(self.layer_idx, new_latents, idx_keys, step.start)
            latents = step.cache.latents[self.layer_idx][:, : step.start + t]
            if idx_keys is not None:
                idx_keys = step.cache.index_keys[self.layer_idx][:, : step.start + t]
        else:
            latents = new_latents

        if step.stage is not None:
            return self._forward_train(x, q_resid, q_nope, q_rope, latents, idx_keys, step, prev)

        selections = prev
        if step.needs_selection and self.indexer is not None:
            if iq is None:
                iq, iw = self.indexer.queries(x, q_resid, step.cos, step.sin)
            selections = self.indexer.select(iq, iw, idx_keys, step)
        if step.needs_selection and selections is None:
            raise ValueError(f"layer {self.layer_idx} is 'shared' but no earlier layer ran the indexer")

        if step.reference:
            out = self._attend_reference(q_nope, q_rope, latents, step, selections)
        else:
            out = self._attend_fast(q_nope, q_rope, latents, step, selections)
        return self.o_proj(out.reshape(bsz, t, self.n_heads * self.v_dim)), selections

    def _project(self, x: torch.Tensor, step: Step):
        """Queries, the new latents and indexer keys; indexer queries are left to ``forward`` (None)."""
        bsz, t, _ = x.shape
        q_resid = self.q_a_layernorm(self.q_a_proj(x))  # [B, T, q_lora]
        q = self.q_b_proj(q_resid).view(bsz, t, self.n_heads, self.q_dim)  # [B, T, H, dq]
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        q_rope = apply_rope(q_rope, step.cos, step.sin)
        c_kv, k_rope = self.kv_a_proj_with_mqa(x).split([self.kv_rank, self.rope_dim], dim=-1)
        new_latents = torch.cat([self.kv_a_layernorm(c_kv), apply_rope(k_rope, step.cos, step.sin)], dim=-1)
        idx_keys = self.indexer.keys(x, step.cos, step.sin) if self.indexer is not None else None
        return q_resid, q_nope, q_rope, new_latents, idx_keys, None, None

    # -- decoding: the same projections with fewer, larger operations -----------------------------
    def _fused_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Projections that read the same input, concatenated (recomputed if any weight changes).

        ``w_x`` maps the hidden state to [q latent | kv latent + rope key | indexer key | indexer head
        weights]; ``w_q`` maps the q latent to [per-head queries | indexer queries].
        """
        idx = self.indexer
        srcs = [self.q_a_proj.weight, self.kv_a_proj_with_mqa.weight, self.q_b_proj.weight]
        if idx is not None:
            srcs += [idx.wk.weight, idx.weights_proj.weight, idx.wq_b.weight]
        key = tuple((t.data_ptr(), t._version) for t in srcs)
        if getattr(self, "_fused_key", None) != key:
            w_x = [self.q_a_proj.weight, self.kv_a_proj_with_mqa.weight]
            w_q = [self.q_b_proj.weight]
            if idx is not None:
                w_x += [idx.wk.weight, idx.weights_proj.weight.to(self.q_a_proj.weight.dtype)]
                w_q += [idx.wq_b.weight]
            self._fused = (torch.cat(w_x).detach(), torch.cat(w_q).detach())
            self._fused_key = key
        return self._fused

    def _project_fused(self, x: torch.Tensor, step: Step):
        """``_project`` plus the indexer queries, in three matmuls and one RoPE call (for decoding)."""
        if self.q_a_proj.bias is not None or self.kv_a_proj_with_mqa.bias is not None:
            return self._project(x, step)
        bsz, t, _ = x.shape
        idx = self.indexer
        w_x, w_q = self._fused_weights()
        sizes = [self.q_a_proj.out_features, self.kv_rank, self.rope_dim]
        if idx is not None:
            sizes += [idx.head_dim, idx.n_heads]
        parts = F.linear(x, w_x).split(sizes, dim=-1)
        q_resid = self.q_a_layernorm(parts[0])
        qs = F.linear(q_resid, w_q)
        q = qs[..., : self.n_heads * self.q_dim].view(bsz, t, self.n_heads, self.q_dim)
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        rot = [q_rope, parts[2].unsqueeze(2)]  # every rotary slice of this layer, rotated at once
        if idx is not None:
            iq = qs[..., self.n_heads * self.q_dim :].view(bsz, t, idx.n_heads, idx.head_dim)
            ik = idx.k_norm(parts[3])
            rot += [iq[..., : self.rope_dim], ik[..., : self.rope_dim].unsqueeze(2)]
        rot = apply_rope(torch.cat(rot, dim=2), step.cos, step.sin)
        q_rope, k_rope = rot[:, :, : self.n_heads], rot[:, :, self.n_heads]
        new_latents = torch.cat([self.kv_a_layernorm(parts[1]), k_rope], dim=-1)
        if idx is None:
            return q_resid, q_nope, q_rope, new_latents, None, None, None
        h = self.n_heads + 1
        iq = torch.cat([rot[:, :, h : h + idx.n_heads], iq[..., self.rope_dim :]], dim=-1)
        idx_keys = torch.cat([rot[:, :, -1], ik[..., self.rope_dim :]], dim=-1)
        weights = parts[4].float() * idx.n_heads**-0.5
        return q_resid, q_nope, q_rope, new_latents, idx_keys, iq, weights

    def _attend_reference(self, q_nope, q_rope, latents, step: Step, selections) -> torch.Tensor:
        bsz, t = q_nope.shape[:2]
        tk = latents.shape[1]
        if selections is None:
            allowed = causal_allowed(step.start, t, tk, latents.device).expand(bsz, -1, -1)
        else:
            allowed = selection_mask(selections, bsz, t, tk, step.start, latents.device)
        k, v = self._expand(latents)
        q = torch.cat([q_nope, q_rope], dim=-1).transpose(1, 2)  # [B, H, T, dq]
        out, _ = eager_attention(q, k, v, allowed.unsqueeze(1), self.scale)
        return out.transpose(1, 2)  # [B, T, H, dv]

    def _attend_fast(self, q_nope, q_rope, latents, step: Step, selections) -> torch.Tensor:
        bsz, t = q_nope.shape[:2]
        if selections is None:
            selections = [Selection(0, t, step.start + t)]
        out = q_nope.new_empty(bsz, t, self.n_heads, self.v_dim)
        w_uk, w_uv = self._kv_b()
        pending: list[Selection] = []  # consecutive "all keys" chunks, attended together

        def flush() -> None:
            if pending:
                q0, q1 = pending[0].q0, pending[-1].q1
                out[:, q0:q1] = self._attend_all(q_nope[:, q0:q1], q_rope[:, q0:q1], latents, step.start + q0, w_uk, w_uv)
                pending.clear()

        for sel in selections:
            if sel.idx is None:
                pending.append(sel)
                continue
            flush()
            rows = slice(sel.q0, sel.q1)
            q_cat = self._absorb(q_nope[:, rows], q_rope[:, rows], w_uk)
            keys = latents[:, : sel.kend]
            valid = None if sel.all_valid else sel.valid
            o_lat = torch.cat(
                [
                    latent_attention_gathered(
                        q_cat[:, a : a + GATHER_CHUNK], keys, sel.idx[:, a : a + GATHER_CHUNK],
                        None if valid is None else valid[:, a : a + GATHER_CHUNK], self.scale, self.kv_rank,
                    )
                    for a in range(0, sel.q1 - sel.q0, GATHER_CHUNK)
                ],
                dim=1,
            )
            if sel.dense_rows is not None and bool(sel.dense_rows.any()):
                allowed = causal_allowed(step.start + sel.q0, sel.q1 - sel.q0, sel.kend, latents.device)
                full = latent_attention_dense(q_cat, latents[:, : sel.kend], allowed.expand(bsz, -1, -1), self.scale, self.kv_rank)
                o_lat = torch.where(sel.dense_rows[:, :, None, None], full, o_lat)
            out[:, rows] = torch.einsum("bthl,hvl->bthv", o_lat, w_uv)
        flush()
        return out

    def _absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``W_uk [H, dn, L]`` and ``W_uv`` transposed ``[H, L, dv]``, contiguous, for decoding (no autograd)."""
        w = self.kv_b_proj.weight
        key = (w.data_ptr(), w._version)
        if getattr(self, "_absorbed_key", None) != key:
            w_uk, w_uv = self._kv_b()
            self._absorbed = (w_uk.detach().contiguous(), w_uv.detach().transpose(1, 2).contiguous())
            self._absorbed_key = key
        return self._absorbed

    def _absorb(self, q_nope: torch.Tensor, q_rope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
        """Queries in latent space: ``[B, Tq, H, L + R]``."""
        return torch.cat([torch.einsum("bthd,hdl->bthl", q_nope, w_uk), q_rope], dim=-1)

    def _attend_all(self, q_nope, q_rope, latents, qstart: int, w_uk, w_uv) -> torch.Tensor:
        """Queries at ``qstart ..`` attending to every causal key: ``-> [B, Tq, H, dv]``."""
        bsz, tq = q_nope.shape[:2]
        kend = qstart + tq
        if tq >= EXPAND_MIN_QUERIES:  # many queries: expanding K/V once is cheaper, and SDPA is fused
            k, v = self._expand(latents[:, :kend])
            q = torch.cat([q_nope, q_rope], dim=-1).transpose(1, 2)
            return causal_sdpa(q, k, v, qstart, self.scale).transpose(1, 2)
        q_cat = self._absorb(q_nope, q_rope, w_uk)
        allowed = causal_allowed(qstart, tq, kend, latents.device).expand(bsz, -1, -1)
        o_lat = latent_attention_dense(q_cat, latents[:, :kend], allowed, self.scale, self.kv_rank)
        return torch.einsum("bthl,hvl->bthv", o_lat, w_uv)

    # -- training (DeepSeek-V3.2's recipe: dense, indexer warm-up by KL, sparse) -------------------
    def _forward_train(self, x, q_resid, q_nope, q_rope, latents, idx_keys, step: Step, prev):
        bsz, t = q_nope.shape[:2]
        causal = causal_allowed(0, t, t, x.device).expand(bsz, -1, -1)
        selections = prev
        iq = iw = None
        if self.indexer is not None and step.stage != "dense":
            # The indexer learns from its own KL loss only: its inputs are cut from the main graph.
            iq, iw = self.indexer.queries(x.detach(), q_resid.detach(), step.cos, step.sin)
            idx_keys = self.indexer.keys(x.detach(), step.cos, step.sin)
            if step.stage == "sparse":
                selections = self.indexer.select(iq.detach(), iw.detach(), idx_keys.detach(), step)
        if step.stage == "sparse" and selections is not None:
            allowed = selection_mask(selections, bsz, t, t, 0, x.device)
        else:
            allowed = causal
        k, v = self._expand(latents)
        q = torch.cat([q_nope, q_rope], dim=-1).transpose(1, 2)
        out, probs = eager_attention(q, k, v, allowed.unsqueeze(1), self.scale)
        kl = None
        if iq is not None:
            target = probs.detach().float().sum(1)  # [B, T, T], summed over heads
            target = target / target.sum(-1, keepdim=True).clamp(min=1e-12)
            logits = self.indexer.scores(iq, iw, idx_keys).masked_fill(~allowed, float("-inf"))
            logq = torch.log_softmax(logits, dim=-1)
            terms = torch.where(target > 0, target * (torch.log(target.clamp(min=1e-12)) - logq), torch.zeros_like(logq))
            kl = terms.sum(-1).mean()
        out = self.o_proj(out.transpose(1, 2).reshape(bsz, t, self.n_heads * self.v_dim))
        return out, selections, kl


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """Sigmoid scores; ``e_score_correction_bias`` steers the choice only; grouped top-k."""

    def __init__(self, config: GlmMoeDsaConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.n_experts = config.n_routed_experts
        self.n_group = config.n_group
        self.topk_group = config.topk_group
        self.norm_topk_prob = config.norm_topk_prob
        self.scaling = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.zeros(self.n_experts, config.hidden_size, dtype=torch.float32))
        self.register_buffer("e_score_correction_bias", torch.zeros(self.n_experts, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [N, H]`` -> expert ids ``[N, k]`` and weights ``[N, k]`` (fp32)."""
        scores = F.linear(x.float(), self.weight.float()).sigmoid()
        choice = scores + self.e_score_correction_bias
        if self.n_group > 1:
            grouped = choice.view(-1, self.n_group, self.n_experts // self.n_group)
            group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1)[0].sum(-1)  # [N, G]
            keep = torch.zeros_like(group_scores, dtype=torch.bool)
            keep.scatter_(1, group_scores.topk(self.topk_group, dim=-1, sorted=False)[1], True)
            choice = choice.masked_fill(~keep.repeat_interleave(self.n_experts // self.n_group, dim=1), float("-inf"))
        idx = choice.topk(self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, idx)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return idx, weights * self.scaling


class Experts(nn.Module):
    def __init__(self, config: GlmMoeDsaConfig) -> None:
        super().__init__()
        e, h, i = config.n_routed_experts, config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h))  # [E, 2I, H]: gate rows, then up rows
        self.down_proj = nn.Parameter(torch.empty(e, h, i))  # [E, H, I]

    def forward(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Tokens grouped by expert, one matmul pair per expert that has any."""
        n, k = idx.shape
        if n == 1:  # decoding: just the chosen experts
            out = torch.zeros_like(x)
            for expert, w in zip(idx[0].tolist(), weights[0].tolist()):
                gate, up = F.linear(x, self.gate_up_proj[expert]).chunk(2, dim=-1)
                out = out + F.linear(F.silu(gate) * up, self.down_proj[expert]) * w
            return out
        flat = idx.reshape(-1)
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.gate_up_proj.shape[0]).tolist()
        tokens = order // k
        w = weights.reshape(-1)[order].to(x.dtype)
        out = torch.zeros_like(x)
        pos = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            rows = tokens[pos : pos + count]
            h = F.linear(x[rows], self.gate_up_proj[expert])
            gate, up = h.chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down_proj[expert]) * w[pos : pos + count, None]
            out.index_add_(0, rows, y)
            pos += count
        return out


class MoE(nn.Module):
    def __init__(self, config: GlmMoeDsaConfig) -> None:
        super().__init__()
        self.gate = Router(config)
        self.experts = Experts(config)
        self.shared_experts = MLP(config.hidden_size, config.moe_intermediate_size * config.n_shared_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        idx, weights = self.gate(flat)
        return (self.experts(flat, idx, weights) + self.shared_experts(flat)).view(shape)


class DecoderLayer(nn.Module):
    def __init__(self, config: GlmMoeDsaConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = MLAttention(config, layer_idx)
        if config.mlp_layer_types[layer_idx] == "sparse":
            self.mlp: nn.Module = MoE(config)
        else:
            self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, step: Step, prev: list[Selection] | None, keep: bool = True):
        """``keep``: return this layer's selections (a later shared layer, or the caller, needs them)."""
        result = self.self_attn(self.input_layernorm(x), step, prev)
        h, selections = result[0], (result[1] if keep else None)
        kl = result[2] if len(result) == 3 else None
        del result  # so a selection nobody needs is freed before the MLP runs
        x = x + h
        if torch.is_grad_enabled() or x.shape[1] <= FFN_CHUNK:
            x = x + self.mlp(self.post_attention_layernorm(x))
        else:  # long prefill: bound the MLP's intermediate activations
            for a in range(0, x.shape[1], FFN_CHUNK):
                part = x[:, a : a + FFN_CHUNK]
                x[:, a : a + FFN_CHUNK] = part + self.mlp(self.post_attention_layernorm(part))
        return x, selections, kl


class GlmMoeDsaModel(nn.Module):
    def __init__(self, config: GlmMoeDsaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


@dataclass
class TrainOutput:
    logits: torch.Tensor  # [B, T, V]
    indexer_kl: torch.Tensor  # scalar, mean over full-indexer layers (0 in the dense stage)


class GlmMoeDsaForCausalLM(nn.Module):
    def __init__(self, config: GlmMoeDsaConfig) -> None:
        super().__init__()
        self.config = config
        self.lean_decode = True  # one-token CPU steps take ``decode.decode_one`` (False: the general path; tests)
        self.model = GlmMoeDsaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def init_weights(self, seed: int | None = None) -> None:
        """Random initialisation like Hugging Face's (normal, std ``initializer_range``; norms at 1)."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.data.normal_(0.0, std, generator=gen)
                if getattr(module, "bias", None) is not None:
                    module.bias.data.zero_()
            elif isinstance(module, Experts):
                module.gate_up_proj.data.normal_(0.0, std, generator=gen)
                module.down_proj.data.normal_(0.0, std, generator=gen)
            elif isinstance(module, Router):
                module.weight.data.normal_(0.0, std, generator=gen)
                module.e_score_correction_bias.zero_()
            elif isinstance(module, (RMSNorm, nn.LayerNorm)):
                module.weight.data.fill_(1.0)
                if getattr(module, "bias", None) is not None:
                    module.bias.data.zero_()

    def _step(self, bsz: int, t: int, cache: KVCache | None, roles, policy, dense: bool, reference: bool, stage=None):
        start = cache.length if cache is not None else 0
        device = self.lm_head.weight.device
        cos, sin = rope_cos_sin(torch.arange(start, start + t, device=device), self.config.qk_rope_head_dim, self.config.rope_theta)
        topk = self.config.index_topk
        step = Step(start, cos, sin, cache, topk, dense, reference, stage)
        if policy is not None and not dense:
            step.topk = policy.topk(topk)
            if stage is None and start + t <= step.topk:
                # Every query keeps all its causal keys: the biases and forced keys would change nothing
                # (and forced keys would keep a single token off the lean decoding step).
                return step
            all_roles = roles
            if cache is not None and start:
                all_roles = torch.cat([cache.roles[:, :start], roles], dim=1)
            step.key_bias = policy.key_bias(all_roles)
            forced = policy.forced(all_roles)
            if bool(forced.any()):
                step.forced_keys = forced
                step.forced_rows = forced[:, start:]
        return step

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        cache: KVCache | None = None,
        roles: torch.Tensor | list | None = None,
        policy: AttentionPolicy | None = None,
        dense: bool = False,
        reference: bool = False,
        last_only: bool = False,
        return_selections: bool = False,
    ):
        """``input_ids [B, T]`` -> logits ``[B, T, V]`` (``[B, 1, V]`` with ``last_only``).

        ``cache``: continue after the tokens it holds and append these. ``roles [B, T]``: per-token
        ``Role`` ids for the attention ``policy``. ``dense``: full causal attention, no DSA.
        ``reference``: dense masked kernels (tests). ``return_selections``: also return each layer's
        ``list[Selection]`` (None where attention was dense).
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T], got shape {list(input_ids.shape)}")
        bsz, t = input_ids.shape
        if cache is not None:
            if cache.batch_size != bsz:
                raise ValueError(f"cache holds batch size {cache.batch_size}, input has {bsz}")
            cache.reserve(cache.length + t)
        role_ids = roles_tensor(roles, bsz, t)
        if role_ids is None:
            role_ids = torch.full((bsz, t), int(Role.CODE), dtype=torch.long)
        step = self._step(bsz, t, cache, role_ids.to(input_ids.device), policy, dense, reference)
        if cache is not None and decode.applies(self, input_ids, cache, step):  # one token: the lean step
            picked: list[torch.Tensor | None] | None = [] if return_selections else None
            logits = decode.decode_one(self, input_ids, cache, step, role_ids, picked)
            if picked is None:
                return logits
            return logits, [None if step.dense else [_one_selection(idx, step.start + 1)] for idx in picked]
        if cache is not None and last_only and not return_selections and decode.applies_dense(self, input_ids, cache, step):
            return decode.prefill_dense(self, input_ids, cache, step, role_ids)  # a short prompt: every key attended
        x = self.model.embed_tokens(input_ids)
        selections = None
        per_layer = []
        layers = list(self.model.layers)
        for i, layer in enumerate(layers):
            prev = selections if layer.self_attn.indexer is None else None
            selections = None  # a full layer selects afresh: let the last selection go
            shared_next = i + 1 < len(layers) and layers[i + 1].self_attn.indexer is None
            x, selections, _ = layer(x, step, prev, keep=shared_next or return_selections)
            del prev
            if return_selections:
                per_layer.append(selections)
        if cache is not None:
            cache.commit(input_ids, role_ids)
        if last_only:
            x = x[:, -1:]
        logits = self.lm_head(self.model.norm(x))
        return (logits, per_layer) if return_selections else logits

    def forward_train(self, input_ids: torch.Tensor, stage: str) -> TrainOutput:
        """Training forward for one of ``TRAIN_STAGES``.

        - ``dense``: full causal attention; the indexer is idle (``indexer_kl`` is 0).
        - ``indexer_warmup``: full causal attention; ``indexer_kl`` is KL(p || q) between the main
          attention ``p`` (summed over heads, normalised, detached) and the indexer's softmax ``q``
          over causal keys, per full-indexer layer, averaged. Freeze everything but the indexers.
        - ``sparse``: attention over the indexer's top-k; ``indexer_kl`` over the selected keys only.
        The indexer's inputs are detached, so ``indexer_kl`` trains only the indexers.
        """
        if stage not in TRAIN_STAGES:
            raise ValueError(f"stage must be one of {TRAIN_STAGES}, got {stage!r}")
        bsz, t = input_ids.shape
        step = self._step(bsz, t, None, None, None, dense=(stage == "dense"), reference=True, stage=stage)
        x = self.model.embed_tokens(input_ids)
        selections = None
        kls = []
        for layer in self.model.layers:
            x, selections, kl = layer(x, step, selections)
            if kl is not None:
                kls.append(kl)
        logits = self.lm_head(self.model.norm(x))
        indexer_kl = torch.stack(kls).mean() if kls else logits.new_zeros(())
        return TrainOutput(logits, indexer_kl)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
