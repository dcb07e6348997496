"""Attention kernels for MLA with DSA, written as plain PyTorch functions.

Three ways to attend, which must agree wherever they overlap (tests check it):

- :func:`eager_attention`: the dense reference. Expanded per-head keys, a boolean ``allowed`` mask
  over *all* keys, softmax, values. Materialises ``[B, H, Tq, Tk]``; for tests and training.
- :func:`latent_attention_gathered`: the sparse fast path. MLA in its "absorbed" form is multi-query
  attention over the cached latent ``[c_kv ; k_rope]``: each query gathers only its selected
  latents ``[K, L + R]`` and attends to those. Work and memory scale with ``K``, not the context.
- :func:`latent_attention_dense`: the same absorbed form over every key up to the chunk's end, for
  rows that must see everything (forced error-context queries) and for short decode contexts.

Interleaved RoPE (GLM/DeepSeek lay rotary dims out in pairs) is :func:`apply_rope`.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


@functools.lru_cache(maxsize=8)
def _inv_freq(dim: int, theta: float, device: torch.device) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))


def rope_cos_sin(positions: torch.Tensor, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin per position and rotary pair: ``[T] -> ([T, dim/2], [T, dim/2])`` in fp32."""
    inv_freq = _inv_freq(dim, theta, positions.device)  # a decoding step would spend ~1/4 of this call on it
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return freqs.cos(), freqs.sin()


_ROPE_TABLES: dict[tuple[int, float, str], tuple[torch.Tensor, torch.Tensor]] = {}


def rope_span(start: int, t: int, dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rope_cos_sin` of positions ``start .. start + t - 1``: rows of a table kept per (dim,
    theta, device) and doubled as positions grow, so a decoding step slices its cos/sin instead of
    computing them (a quarter of the Python around a C step). Every path reads the same table, so a
    position's values never depend on which call computed it."""
    key = (dim, theta, str(device))
    end = start + t
    table = _ROPE_TABLES.get(key)
    if table is None or table[0].shape[0] < end:
        size = max(1024, 1 << (end - 1).bit_length())
        with torch.inference_mode(False), torch.no_grad():  # usable by training and inference alike
            table = rope_cos_sin(torch.arange(size, device=device), dim, theta)
        _ROPE_TABLES[key] = table  # (replaced whole: a reader on another thread keeps the one it had)
    return table[0][start:end], table[1][start:end]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs ``(x0, x1), (x2, x3), ...``; ``x: [B, T, ..., R]``, ``cos/sin: [T, R/2]``.

    The output lists the rotated even slots, then the rotated odd slots (Hugging Face's layout);
    queries and keys are permuted alike, so their dot products are those of the interleaved form.
    """
    shape = (1, cos.shape[0]) + (1,) * (x.dim() - 3) + (cos.shape[-1],)
    cos = cos.view(shape).to(x.dtype)
    sin = sin.view(shape).to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def eager_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense masked attention. ``q: [B, H, Tq, D]``, ``k: [B, H, Tk, D]``, ``v: [B, H, Tk, Dv]``,
    ``allowed: [B, 1 or H, Tq, Tk]`` bool. Returns ``(out [B, H, Tq, Dv], probs [B, H, Tq, Tk])``."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    probs = torch.nan_to_num(probs, nan=0.0)  # a row with nothing allowed attends to nothing
    return torch.matmul(probs, v), probs


def latent_attention_gathered(
    q_cat: torch.Tensor, latents: torch.Tensor, idx: torch.Tensor, valid: torch.Tensor | None, scale: float,
    value_dim: int,
) -> torch.Tensor:
    """Absorbed MLA over gathered keys.

    ``q_cat: [B, Tq, H, L + R]`` (``W_uk``-absorbed nope part, then the rope part), ``latents:
    [B, Tk, L + R]`` (normalised ``c_kv`` then rotated ``k_rope``), ``idx/valid: [B, Tq, K]``
    (``valid`` None: every index names a key, so nothing is masked and no index needs clamping).
    Returns the attended latent ``[B, Tq, H, L]`` (``value_dim`` = L); ``W_uv`` is applied by the caller.
    """
    bsz, tk, width = latents.shape
    tq, kk = idx.shape[1], idx.shape[2]
    offsets = (torch.arange(bsz, device=idx.device) * tk).view(bsz, 1, 1)
    flat = ((idx.long() if valid is None else idx.long().clamp(min=0)) + offsets).reshape(-1)
    picked = latents.reshape(bsz * tk, width).index_select(0, flat).view(bsz * tq, kk, width)  # [B*Tq, K, L+R]
    q = q_cat.reshape(bsz * tq, q_cat.shape[2], width)  # [B*Tq, H, L+R]
    scores = torch.bmm(q, picked.transpose(1, 2)) * scale  # [B*Tq, H, K]
    if valid is not None:
        scores = scores.masked_fill(~valid.reshape(bsz * tq, 1, kk), float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # every row has a valid key: a query always keeps >= 1 causal key
    out = torch.bmm(probs, picked[:, :, :value_dim])  # [B*Tq, H, L]
    return out.view(bsz, tq, q_cat.shape[2], value_dim)


def latent_attention_dense(
    q_cat: torch.Tensor, latents: torch.Tensor, allowed: torch.Tensor, scale: float, value_dim: int
) -> torch.Tensor:
    """Absorbed MLA over all of ``latents [B, Tk, L + R]`` with ``allowed [B, Tq, Tk]``: ``-> [B, Tq, H, L]``."""
    bsz, tq, heads, width = q_cat.shape
    q = q_cat.reshape(bsz, tq * heads, width)
    scores = torch.bmm(q, latents.transpose(1, 2)).view(bsz, tq, heads, -1) * scale  # [B, Tq, H, Tk]
    scores = scores.masked_fill(~allowed.unsqueeze(2), float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # causal rows always allow the query's own key
    out = torch.bmm(probs.view(bsz, tq * heads, -1), latents[:, :, :value_dim])
    return out.view(bsz, tq, heads, value_dim)


def causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float) -> torch.Tensor:
    """Dense causal attention for queries at positions ``start .. start + Tq - 1`` over keys ``0 .. Tk - 1``.

    ``q: [B, H, Tq, D]``, ``k: [B, H, Tk, D]``, ``v: [B, H, Tk, Dv]``; PyTorch's fused kernel, so the
    ``[Tq, Tk]`` scores are never materialised at once.
    """
    dv = v.shape[-1]
    if dv != q.shape[-1]:  # the fused (flash) kernel wants one head size; zero-padded values change nothing
        v = F.pad(v, (0, q.shape[-1] - dv))
    if start == 0 and q.shape[2] == k.shape[2]:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    else:
        tq, tk = q.shape[2], k.shape[2]
        qpos = torch.arange(start, start + tq, device=q.device)
        allowed = torch.arange(tk, device=q.device)[None, :] <= qpos[:, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
    return out[..., :dv]
