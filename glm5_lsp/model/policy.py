"""The attention policy: what the editor knows about each token, turned into DSA selection rules.

Every token carries a :class:`Role`. The policy changes *which keys each query selects* in the DSA
indexer; it never changes the attention arithmetic over the selected keys. The mapping (each rule
is checked by ``tests/test_model_policy.py``):

- ``global_sparsity`` s scales the top-k budget around the checkpoint's trained operating point:
  ``k = round(index_topk * (1 - s) / (1 - 0.4))`` (s = 0.4 keeps ``index_topk``; higher s keeps fewer
  keys, lower s more), at least ``MIN_TOPK`` and never more than the causal keys available.
- ``syntax_aware`` switches the soft role biases below on or off (error context is separate).
- Soft biases are added to a key's indexer score before top-k, in units of that query row's
  standard deviation of scores (so they mean the same on any checkpoint):
  ``api_doc`` keys get ``BIAS_SCALE * api_focus``, ``symbol`` and ``snippet`` keys half of that,
  ``indent`` keys ``BIAS_SCALE * indent_flow``, ``current_block`` keys ``BIAS_SCALE * CURRENT_BLOCK_BIAS``.
- ``error_context`` e > 0 forces full attention on ``error_context`` tokens: as keys they are added
  to every later query's selected set (outside the top-k budget, never dropped), and as queries they
  select every earlier key. Keys within ``round(ERROR_WINDOW * e)`` tokens of an error-context token
  get the bias ``BIAS_SCALE * e`` (the code around an error is likelier kept). e = 0 turns it all off.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import IntEnum

import torch

from glm5_lsp.spans import ROLE_NAMES


class Role(IntEnum):
    CODE = 0
    CURRENT_BLOCK = 1
    API_DOC = 2
    SYMBOL = 3
    INDENT = 4
    ERROR_CONTEXT = 5
    SNIPPET = 6  # chunks of other files like the code at the cursor (the workspace memory's too)


assert [r.name.lower() for r in Role] == list(ROLE_NAMES)

NEUTRAL_SPARSITY = 0.4  # the sparsity at which the checkpoint's own index_topk is kept
MIN_TOPK = 16
BIAS_SCALE = 2.0  # a knob of 1.0 adds two standard deviations of the query's index scores
CURRENT_BLOCK_BIAS = 0.5
ERROR_WINDOW = 16  # tokens around an error-context token that get the error bias at error_context = 1


@dataclass(frozen=True)
class AttentionConfig:
    """The coding attention config (the user-facing knobs)."""

    global_sparsity: float = 0.4
    syntax_aware: bool = True
    api_focus: float = 0.7
    error_context: float = 0.9
    indent_flow: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.global_sparsity < 1.0:
            raise ValueError(f"global_sparsity must be in [0, 1), got {self.global_sparsity}")
        for name in ("api_focus", "error_context", "indent_flow"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")


@dataclass(frozen=True)
class AttentionPolicy:
    """The knobs compiled into per-role biases and a budget rule the attention layers apply."""

    config: AttentionConfig

    @classmethod
    def from_config(cls, config: AttentionConfig | None = None) -> AttentionPolicy:
        return cls(config or AttentionConfig())

    def topk(self, index_topk: int) -> int:
        scale = (1.0 - self.config.global_sparsity) / (1.0 - NEUTRAL_SPARSITY)
        return max(MIN_TOPK, round(index_topk * scale))

    @property
    def forces_error_context(self) -> bool:
        return self.config.error_context > 0.0

    def role_bias(self) -> torch.Tensor:
        """Bias per role id, in units of a query row's score standard deviation: ``[len(Role)]``."""
        return _role_bias(self.config)

    def key_bias(self, roles: torch.Tensor) -> torch.Tensor:
        """Per-key bias units for a role sequence ``[B, T]`` -> ``[B, T]`` (float)."""
        bias = self.role_bias().to(roles.device)[roles]
        e = self.config.error_context
        window = round(ERROR_WINDOW * e)
        if e > 0 and window > 0:
            err = (roles == Role.ERROR_CONTEXT).float().unsqueeze(1)  # [B, 1, T]
            near = torch.nn.functional.max_pool1d(err, kernel_size=2 * window + 1, stride=1, padding=window)
            bias = bias + BIAS_SCALE * e * near.squeeze(1)
        return bias

    def forced(self, roles: torch.Tensor) -> torch.Tensor:
        """Which tokens get forced full attention: ``[B, T]`` bool."""
        if not self.forces_error_context:
            return torch.zeros_like(roles, dtype=torch.bool)
        return roles == Role.ERROR_CONTEXT


@functools.lru_cache(maxsize=64)
def _role_bias(c: AttentionConfig) -> torch.Tensor:
    """``AttentionPolicy.role_bias`` (built once per config: decoding asks at every token). Read-only."""
    bias = torch.zeros(len(Role))
    if c.syntax_aware:
        bias[Role.API_DOC] = BIAS_SCALE * c.api_focus
        bias[Role.SYMBOL] = BIAS_SCALE * c.api_focus / 2
        bias[Role.SNIPPET] = BIAS_SCALE * c.api_focus / 2  # other code's facts, as the symbol summary
        bias[Role.INDENT] = BIAS_SCALE * c.indent_flow
        bias[Role.CURRENT_BLOCK] = BIAS_SCALE * CURRENT_BLOCK_BIAS
    return bias


def roles_tensor(roles: torch.Tensor | list[int] | list[list[int]] | None, batch: int, length: int) -> torch.Tensor | None:
    """Normalise roles given as a list or tensor to a LongTensor ``[B, T]``; None stays None."""
    if roles is None:
        return None
    t = torch.as_tensor(roles, dtype=torch.long)
    if t.dim() == 1:
        t = t.unsqueeze(0).expand(batch, -1)
    if tuple(t.shape) != (batch, length):
        raise ValueError(f"roles must have shape [{batch}, {length}], got {list(t.shape)}")
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= len(Role)):
        raise ValueError(f"role ids must lie in [0, {len(Role) - 1}]")
    return t
