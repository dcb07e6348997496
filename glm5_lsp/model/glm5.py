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

``forward`` is the general path. For inference, :meth:`GlmMoeDsaForCausalLM.prepare_inference`
(``load_model`` and ``Generator`` call it) builds each attention layer's fused projections
(``MLAttention.fused``) and absorbed ``W_uk``/``W_uv`` (``MLAttention.absorbed``) once; the generator
then sends the calls they fit to ``decode.decode_one`` / ``decode.prefill_dense``, which compute the
same thing from those fields and the modules' functional forms (``RMSNorm.one_row``,
``Router.route_one``, ``Experts.one``, ``MLP.swiglu``, ...) in far fewer operations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from glm5_lsp.model.attention import (
    apply_rope,
    causal_sdpa,
    eager_attention,
    latent_attention_dense,
    latent_attention_gathered,
    rope_span,
)
from glm5_lsp.model.config import GlmMoeDsaConfig
from glm5_lsp.model.kv_cache import KVCache
from glm5_lsp.model.policy import AttentionPolicy, Role, roles_tensor

if TYPE_CHECKING:
    from glm5_lsp.model.stats import StatsProbe

QUERY_CHUNK = 128  # at most this many queries have their keys selected together
INDEXER_CHUNK_FLOATS = 2**21  # and their per-head indexer scores stay under this many floats (8 MiB)
FFN_CHUNK = 2048  # tokens whose MLP/MoE activations are computed at once during a long prefill
DECODE_MAX_TOKENS = 4  # forward calls this short use the fused projections (once prepared for inference)
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
            return self.rows(x)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """``forward`` for fp32 rows, without the module call."""
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)

    def one_row(self, x: torch.Tensor) -> torch.Tensor:
        """The same for one fp32 row, its scale a Python float from one vector norm (``F.rms_norm``'s
        composite kernel takes about 1.6x as long on one row)."""
        norm = float(torch.linalg.vector_norm(x))
        return torch.mul(x, self.weight).mul_(1.0 / math.sqrt(norm * norm / x.shape[-1] + self.eps))


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
    role_ids: torch.Tensor | None = None  # [B, T] the new tokens' roles (committed to the cache with them)
    probe: StatsProbe | None = None  # per-step statistics wanted (``stats.py``); None: none collected

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


class Projection(NamedTuple):
    """What one attention layer's input projects to for the new tokens (``MLAttention.project``)."""

    q_resid: torch.Tensor  # [B, T, q_lora]: the normalised query latent
    q_nope: torch.Tensor  # [B, T, H, dn]
    q_rope: torch.Tensor  # [B, T, H, dr], rotated
    latents: torch.Tensor  # [B, T, L + R]: normalised c_kv, rotated k_rope (what the cache stores)
    index_keys: torch.Tensor | None = None  # [B, T, Di], rotated (layers with an indexer)
    index_queries: torch.Tensor | None = None  # [B, T, Hi, Di] (the fused projection computes them too)
    index_weights: torch.Tensor | None = None  # [B, T, Hi], scaled


class HiddenParts(NamedTuple):
    """The fused projection of the hidden state, split (``FusedWeights.hidden``); nothing normalised or rotated."""

    q_latent: torch.Tensor  # [.., q_lora]
    kv_latent: torch.Tensor  # [.., L]
    rope_key: torch.Tensor  # [.., R]
    index_key: torch.Tensor | None = None  # [.., Di] (layers with an indexer)
    index_weights: torch.Tensor | None = None  # [.., Hi], unscaled


@dataclass
class FusedWeights:
    """One attention layer's projections that read the same input, concatenated (``prepare_inference``).

    ``w_x`` maps the hidden state to [q latent | kv latent | rope key | indexer key | indexer head
    weights] (``x_sizes``); ``w_q`` maps the normalised q latent to [per-head queries (``q_rows``) |
    indexer queries].
    """

    w_x: torch.Tensor
    w_q: torch.Tensor
    x_sizes: tuple[int, ...]
    q_rows: int

    def hidden(self, x: torch.Tensor) -> HiddenParts:
        return HiddenParts(*F.linear(x, self.w_x).split(self.x_sizes, dim=-1))


@dataclass
class AbsorbedWeights:
    """``kv_b_proj`` split for the absorbed form, contiguous and detached (``prepare_inference``)."""

    w_uk: torch.Tensor  # [H, dn, L]: folded into the queries
    w_uv_t: torch.Tensor  # [H, L, dv]: applied to the attended latent


class AttentionOutput(NamedTuple):
    """What ``MLAttention.forward`` returns."""

    out: torch.Tensor  # [B, T, D]
    selections: list[Selection] | None  # the keys each query chunk attended (None: all, dense)
    indexer_kl: torch.Tensor | None = None  # training: the indexer's KL loss (full-indexer layers)


class LayerOutput(NamedTuple):
    """What ``DecoderLayer.forward`` returns."""

    hidden: torch.Tensor  # [B, T, D]
    selections: list[Selection] | None  # this layer's (when kept)
    indexer_kl: torch.Tensor | None


class Route(NamedTuple):
    """One token's routing (``Router.route_one``): Python lists, as the lean step reads them."""

    experts: list[int]
    weights: list[float]  # normalised and scaled, as ``Router.choose`` gives them
    scores: torch.Tensor  # [1, E]: every expert's sigmoid score


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
        # Built by ``prepare_inference`` (None before, and for ``fused`` with attention biases):
        self.fused: FusedWeights | None = None
        self.absorbed: AbsorbedWeights | None = None
        self._stamp: tuple | None = None  # the source weights' (storage, version) when they were built

    # -- inference weights, built once ------------------------------------------------------------
    def _sources(self) -> list[torch.Tensor]:
        srcs = [self.q_a_proj.weight, self.kv_a_proj_with_mqa.weight, self.q_b_proj.weight, self.kv_b_proj.weight]
        if self.indexer is not None:
            srcs += [self.indexer.wk.weight, self.indexer.weights_proj.weight, self.indexer.wq_b.weight]
        return srcs

    def _weights_stamp(self) -> tuple:
        return tuple((t.data_ptr(), t._version) for t in self._sources())

    @torch.no_grad()
    def prepare_inference(self) -> None:
        """Build ``fused`` and ``absorbed`` from the current weights."""
        idx = self.indexer
        w_x = [self.q_a_proj.weight, self.kv_a_proj_with_mqa.weight]
        w_q = [self.q_b_proj.weight]
        sizes = [self.q_a_proj.out_features, self.kv_rank, self.rope_dim]
        if idx is not None:
            w_x += [idx.wk.weight, idx.weights_proj.weight.to(self.q_a_proj.weight.dtype)]
            w_q += [idx.wq_b.weight]
            sizes += [idx.head_dim, idx.n_heads]
        biased = self.q_a_proj.bias is not None or self.kv_a_proj_with_mqa.bias is not None
        self.fused = None if biased else FusedWeights(torch.cat(w_x), torch.cat(w_q), tuple(sizes), self.n_heads * self.q_dim)
        w_uk, w_uv = self._kv_b()
        self.absorbed = AbsorbedWeights(w_uk.contiguous(), w_uv.transpose(1, 2).contiguous())
        self._stamp = self._weights_stamp()

    def inference_current(self) -> bool:
        """Whether ``fused``/``absorbed`` were built from the weights as they are now (a cheap check)."""
        return self._stamp is not None and self._stamp == self._weights_stamp()

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
        fused = (
            self.fused is not None and t <= DECODE_MAX_TOKENS and step.stage is None and not step.reference
            and not torch.is_grad_enabled() and self.inference_current()
        )
        p = self.project_fused(x, step) if fused else self.project(x, step)
        idx_keys = p.index_keys
        if step.cache is not None:
            step.cache.write(self.layer_idx, p.latents, idx_keys, step.start)
            latents = step.cache.latents[self.layer_idx][:, : step.start + t]
            if idx_keys is not None:
                idx_keys = step.cache.index_keys[self.layer_idx][:, : step.start + t]
        else:
            latents = p.latents

        if step.stage is not None:
            return self._forward_train(x, p.q_resid, p.q_nope, p.q_rope, latents, idx_keys, step, prev)

        iq, iw = p.index_queries, p.index_weights
        selections = prev
        if step.needs_selection and self.indexer is not None:
            if iq is None:
                iq, iw = self.indexer.queries(x, p.q_resid, step.cos, step.sin)
            selections = self.indexer.select(iq, iw, idx_keys, step)
        if step.needs_selection and selections is None:
            raise ValueError(f"layer {self.layer_idx} is 'shared' but no earlier layer ran the indexer")

        if step.reference:
            out = self._attend_reference(p.q_nope, p.q_rope, latents, step, selections)
        else:
            out = self._attend_fast(p.q_nope, p.q_rope, latents, step, selections)
        if step.probe is not None:
            self._observe(step, x, p._replace(index_queries=iq, index_weights=iw), latents, selections)
        return AttentionOutput(self.o_proj(out.reshape(bsz, t, self.n_heads * self.v_dim)), selections)

    def project(self, x: torch.Tensor, step: Step) -> Projection:
        """Queries, the new latents and indexer keys; the indexer's queries are left to ``forward`` (None)."""
        bsz, t, _ = x.shape
        q_resid = self.q_a_layernorm(self.q_a_proj(x))  # [B, T, q_lora]
        q = self.q_b_proj(q_resid).view(bsz, t, self.n_heads, self.q_dim)  # [B, T, H, dq]
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        q_rope = apply_rope(q_rope, step.cos, step.sin)
        c_kv, k_rope = self.kv_a_proj_with_mqa(x).split([self.kv_rank, self.rope_dim], dim=-1)
        new_latents = torch.cat([self.kv_a_layernorm(c_kv), apply_rope(k_rope, step.cos, step.sin)], dim=-1)
        idx_keys = self.indexer.keys(x, step.cos, step.sin) if self.indexer is not None else None
        return Projection(q_resid, q_nope, q_rope, new_latents, idx_keys)

    def project_fused(self, x: torch.Tensor, step: Step) -> Projection:
        """``project`` plus the indexer's queries, from ``fused``: three matmuls and one RoPE call."""
        bsz, t, _ = x.shape
        idx = self.indexer
        fused = self.fused
        assert fused is not None, "prepare_inference() builds the fused projections"
        parts = fused.hidden(x)
        q_resid = self.q_a_layernorm(parts.q_latent)
        qs = F.linear(q_resid, fused.w_q)
        q = qs[..., : fused.q_rows].view(bsz, t, self.n_heads, self.q_dim)
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        rot = [q_rope, parts.rope_key.unsqueeze(2)]  # every rotary slice of this layer, rotated at once
        if idx is not None:
            iq = qs[..., fused.q_rows :].view(bsz, t, idx.n_heads, idx.head_dim)
            ik = idx.k_norm(parts.index_key)
            rot += [iq[..., : self.rope_dim], ik[..., : self.rope_dim].unsqueeze(2)]
        rot = apply_rope(torch.cat(rot, dim=2), step.cos, step.sin)
        q_rope, k_rope = rot[:, :, : self.n_heads], rot[:, :, self.n_heads]
        new_latents = torch.cat([self.kv_a_layernorm(parts.kv_latent), k_rope], dim=-1)
        if idx is None:
            return Projection(q_resid, q_nope, q_rope, new_latents)
        h = self.n_heads + 1
        iq = torch.cat([rot[:, :, h : h + idx.n_heads], iq[..., self.rope_dim :]], dim=-1)
        idx_keys = torch.cat([rot[:, :, -1], ik[..., self.rope_dim :]], dim=-1)
        weights = parts.index_weights.float() * idx.n_heads**-0.5
        return Projection(q_resid, q_nope, q_rope, new_latents, idx_keys, iq, weights)

    def _observe(self, step: Step, x: torch.Tensor, p: Projection, latents: torch.Tensor,
                 selections: list[Selection] | None) -> None:
        """Record ``step.probe``'s rows (``stats.py``): the attention's mass per key role over the keys
        each row attended, and the indexer's queries (scored at the end of the generation). Batch 1."""
        probe = step.probe
        assert probe is not None
        rows = probe.rows
        t, tk = x.shape[1], latents.shape[1]
        if selections is None:
            allowed = causal_allowed(step.start, t, tk, x.device)[rows]
        else:
            allowed = selection_mask(selections, 1, t, tk, step.start, x.device)[0, rows]
        w_uk, _ = self._kv_b()
        q_cat = self._absorb(p.q_nope[:, rows], p.q_rope[:, rows], w_uk)[0]  # [n, H, L + R]
        scores = torch.einsum("nhl,kl->nhk", q_cat, latents[0]).float() * self.scale
        probs = torch.softmax(scores.masked_fill(~allowed[:, None], float("-inf")), dim=-1)
        probe.attention(probs, probe.key_roles(tk))
        if self.indexer is not None:
            if p.index_queries is None:
                iq, iw = self.indexer.queries(x[:, rows], p.q_resid[:, rows], step.cos[rows], step.sin[rows])
            else:
                iq, iw = p.index_queries[:, rows], p.index_weights[:, rows]
            r = self.rope_dim
            probe.index_query(self.layer_idx, iq[0, :, :, :r].contiguous(), iq[0, :, :, r:], iw[0], 1.0, self.indexer.scale)

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
        return AttentionOutput(out, selections, kl)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for a ``[.., 2I]`` product whose first half is the gate."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.swiglu(x)

    def swiglu(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP as three products on its weights (no module calls)."""
        gate = F.silu(F.linear(x, self.gate_proj.weight))
        return F.linear(gate * F.linear(x, self.up_proj.weight), self.down_proj.weight)


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
        return self.choose(self.scores(x))

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """Each expert's sigmoid score ``[N, E]`` (fp32)."""
        return F.linear(x.float(), self.weight.float()).sigmoid()

    def choose(self, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert ids ``[N, k]`` and their weights ``[N, k]`` from ``scores [N, E]``."""
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

    def route_one(self, h: torch.Tensor) -> Route:
        """One token ``h [1, H]`` (fp32): the chosen experts and their weights as Python lists (the same
        choice as ``choose``, read once as floats: a handful of experts costs less in Python than in
        tensor operations), and the scores ``[1, E]``."""
        scores = self.scores(h)
        choice = (scores + self.e_score_correction_bias)[0].tolist()
        candidates: Sequence[int] = range(len(choice))
        if self.n_group > 1:  # the groups whose two best choice values sum highest, as ``choose`` keeps
            size = len(choice) // self.n_group
            best_two = [sum(sorted(choice[g * size:(g + 1) * size], reverse=True)[:2]) for g in range(self.n_group)]
            kept = sorted(sorted(range(self.n_group), key=best_two.__getitem__, reverse=True)[: self.topk_group])
            candidates = [e for g in kept for e in range(g * size, (g + 1) * size)]
        chosen = sorted(candidates, key=choice.__getitem__, reverse=True)[: self.top_k]
        values = scores[0].tolist()
        picked = [values[e] for e in chosen]
        if self.norm_topk_prob:
            total = sum(picked) + 1e-20
            picked = [w / total for w in picked]
        return Route(chosen, [w * self.scaling for w in picked], scores)


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
            out = self.one(x, idx[0].tolist(), weights[0].tolist())
            return torch.zeros_like(x) if out is None else out
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
            y = F.linear(swiglu(F.linear(x[rows], self.gate_up_proj[expert])), self.down_proj[expert])
            out.index_add_(0, rows, y * w[pos : pos + count, None])
            pos += count
        return out

    def one(self, x: torch.Tensor, chosen: list[int], weights: list[float]) -> torch.Tensor | None:
        """One token ``x [1, H]`` through the ``chosen`` experts, weighted (None when none is chosen)."""
        out = None
        for expert, weight in zip(chosen, weights):
            y = F.linear(swiglu(F.linear(x, self.gate_up_proj[expert])), self.down_proj[expert]) * weight
            out = y if out is None else out + y
        return out

    def padded(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``forward`` for a few tokens in a fixed number of operations: each expert's tokens gathered
        into one padded batch ``[E, C, H]`` (C: the busiest expert's count; padding rows read a zero
        row and are dropped), two batched products, one scatter back. A short prompt's tokens spread
        over most experts, and the per-expert loop's dozens of small operations cost more than the
        padded rows' arithmetic."""
        n, hidden = x.shape
        n_experts = self.gate_up_proj.shape[0]
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
        batch = torch.cat([x, x.new_zeros(1, hidden)])[rows]  # [E, C, H]
        y = torch.bmm(swiglu(torch.bmm(batch, self.gate_up_proj.transpose(1, 2))), self.down_proj.transpose(1, 2))
        out = x.new_zeros(n + 1, hidden)
        out.index_add_(0, rows.view(-1), (y * scale).view(-1, hidden))
        return out[:n]


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

    def observe(self, h: torch.Tensor, probe: StatsProbe) -> None:
        """Record the router's statistics for the tokens ``h [n, H]`` (the layer's normalised input at
        the probe's rows), computed on the side: routed and shared outputs, as ``forward`` makes them."""
        scores = self.gate.scores(h)
        idx, weights = self.gate.choose(scores)
        probe.router(scores, weights.max(-1).values, self.experts(h, idx, weights), self.shared_experts.swiglu(h))


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
        h, selections, kl = result.out, (result.selections if keep else None), result.indexer_kl
        del result  # so a selection nobody needs is freed before the MLP runs
        x = x + h
        if step.probe is not None and isinstance(self.mlp, MoE):
            self.mlp.observe(self.post_attention_layernorm(x[0, step.probe.rows]), step.probe)
        if torch.is_grad_enabled() or x.shape[1] <= FFN_CHUNK:
            x = x + self.mlp(self.post_attention_layernorm(x))
        else:  # long prefill: bound the MLP's intermediate activations
            for a in range(0, x.shape[1], FFN_CHUNK):
                part = x[:, a : a + FFN_CHUNK]
                x[:, a : a + FFN_CHUNK] = part + self.mlp(self.post_attention_layernorm(part))
        return LayerOutput(x, selections, kl)


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

    # -- inference ---------------------------------------------------------------------------------
    def prepare_inference(self) -> GlmMoeDsaForCausalLM:
        """Build every attention layer's ``fused`` projections and ``absorbed`` weights from the
        weights as they are (``load_model`` and ``Generator`` call it; call it again after changing
        weights). Returns the model."""
        for layer in self.model.layers:
            layer.self_attn.prepare_inference()
        return self

    @property
    def prepared(self) -> bool:
        """Whether ``prepare_inference`` has run (the lean paths need it)."""
        return all(layer.self_attn.absorbed is not None for layer in self.model.layers)

    def inference_current(self) -> bool:
        """Whether the inference weights were built from the weights as they are now (one look at each
        source tensor's storage and version: cheap, but once per generation, not per step). A change
        made through ``.data`` bypasses the version counter: call ``prepare_inference`` after one."""
        return all(layer.self_attn.inference_current() for layer in self.model.layers)

    def _step(self, bsz: int, t: int, cache: KVCache | None, roles, policy, dense: bool, reference: bool, stage=None):
        start = cache.length if cache is not None else 0
        device = self.lm_head.weight.device
        cos, sin = rope_span(start, t, self.config.qk_rope_head_dim, self.config.rope_theta, device)
        topk = self.config.index_topk
        step = Step(start, cos, sin, cache, topk, dense, reference, stage, role_ids=roles)
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

    def prepare_step(
        self,
        input_ids: torch.Tensor,
        *,
        cache: KVCache | None = None,
        roles: torch.Tensor | list | None = None,
        policy: AttentionPolicy | None = None,
        dense: bool = False,
        reference: bool = False,
        probe: StatsProbe | None = None,
    ) -> Step:
        """The :class:`Step` of one forward call of ``input_ids [B, T]`` (arguments as ``forward``'s):
        positions, RoPE, the top-k budget and the policy's biases and forced keys; the cache made
        room for the new tokens. ``forward_step`` or one of ``lean.py``'s paths then runs it."""
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
        step.probe = probe
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
        probe: StatsProbe | None = None,
    ):
        """``input_ids [B, T]`` -> logits ``[B, T, V]`` (``[B, 1, V]`` with ``last_only``), by the general path.

        ``cache``: continue after the tokens it holds and append these. ``roles [B, T]``: per-token
        ``Role`` ids for the attention ``policy``. ``dense``: full causal attention, no DSA.
        ``reference``: dense masked kernels (tests). ``return_selections``: also return each layer's
        ``list[Selection]`` (None where attention was dense). ``probe``: record the per-step
        statistics of the last row (``last_only``) or of every row (``stats.py``; batch 1).
        """
        step = self.prepare_step(input_ids, cache=cache, roles=roles, policy=policy, dense=dense,
                                 reference=reference, probe=probe)
        return self.forward_step(input_ids, step, last_only=last_only, return_selections=return_selections)

    def forward_step(self, input_ids: torch.Tensor, step: Step, *, last_only: bool = False,
                     return_selections: bool = False):
        """``forward`` for a prepared ``step`` (``prepare_step``)."""
        t = input_ids.shape[1]
        probe = step.probe
        if probe is not None:
            probe.begin(step, t, last_only)
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
        if step.cache is not None:
            step.cache.commit(input_ids, step.role_ids)
        if probe is not None:
            probe.hidden(x[0, probe.rows])
            probe.end()
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
