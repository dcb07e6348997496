"""The decoding cache: MLA's compressed latents and the DSA indexer's keys, per layer.

MLA caches one latent per token (``[c_kv ; k_rope]``, ``kv_lora_rank + qk_rope_head_dim`` floats)
instead of per-head keys and values; the indexer caches its single shared key per token. The cache
also remembers the token ids and roles it holds, so a new request that shares a prefix with the
last one computes only the rest (:meth:`KVCache.common_prefix` then :meth:`KVCache.truncate`).
"""

from __future__ import annotations

import torch

from glm5_lsp.model.config import GlmMoeDsaConfig


class KVCache:
    def __init__(
        self,
        config: GlmMoeDsaConfig,
        batch_size: int = 1,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        capacity: int = 256,
    ) -> None:
        self.config = config
        self.batch_size = batch_size
        self.dtype = dtype
        self.device = torch.device(device)
        self.length = 0
        self.capacity = 0
        width = config.kv_lora_rank + config.qk_rope_head_dim
        self.latents: list[torch.Tensor] = [self._empty(width, 0) for _ in range(config.num_hidden_layers)]
        self.index_keys: list[torch.Tensor | None] = [
            self._empty(config.index_head_dim, 0) if kind == "full" else None for kind in config.indexer_types
        ]
        self.token_ids = torch.zeros(batch_size, 0, dtype=torch.long)
        self.roles = torch.zeros(batch_size, 0, dtype=torch.long)
        self.reserve(capacity)

    def _empty(self, width: int, length: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.zeros(self.batch_size, length, width, dtype=dtype or self.dtype, device=self.device)

    def reserve(self, total: int) -> None:
        """Make room for ``total`` tokens (grows geometrically, keeping what is cached)."""
        if total <= self.capacity:
            return
        new_cap = max(total, 2 * self.capacity, 64)

        def grow(t: torch.Tensor) -> torch.Tensor:
            out = t.new_zeros((t.shape[0], new_cap) + tuple(t.shape[2:]))
            out[:, : self.length] = t[:, : self.length]
            return out

        self.latents = [grow(t) for t in self.latents]
        self.index_keys = [None if t is None else grow(t) for t in self.index_keys]
        self.token_ids = grow(self.token_ids)
        self.roles = grow(self.roles)
        self.capacity = new_cap

    def write(self, layer: int, latents: torch.Tensor, index_keys: torch.Tensor | None, start: int) -> None:
        """Store one layer's new entries at positions ``start .. start + T - 1``."""
        end = start + latents.shape[1]
        self.latents[layer][:, start:end] = latents
        if index_keys is not None:
            cache = self.index_keys[layer]
            assert cache is not None, f"layer {layer} has no indexer cache"
            cache[:, start:end] = index_keys

    def commit(self, token_ids: torch.Tensor, roles: torch.Tensor) -> None:
        """Record the ids and roles of the tokens just written and advance ``length``."""
        end = self.length + token_ids.shape[1]
        self.token_ids[:, self.length : end] = token_ids
        self.roles[:, self.length : end] = roles
        self.length = end

    def common_prefix(self, token_ids: torch.Tensor, roles: torch.Tensor) -> int:
        """How many leading tokens of ``token_ids [B, T]`` (with ``roles``) the cache already holds.

        A cached token is reusable only if its id *and* its role match at every earlier position:
        roles steer which keys each query selected, so they shape the cached latents too.
        """
        n = min(self.length, token_ids.shape[1])
        if n == 0:
            return 0
        same = (self.token_ids[:, :n] == token_ids[:, :n]) & (self.roles[:, :n] == roles[:, :n])
        same = same.all(dim=0)
        mismatch = (~same).nonzero()
        return int(mismatch[0, 0]) if mismatch.numel() else n

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} tokens to {length}")
        self.length = length
