"""Prompt text with attention roles: the one vocabulary shared by context, backends and the runtime.

The context engine builds a :class:`Prompt`; a backend turns its character spans into per-token
roles (``glm5_lsp.model.policy.Role``) with the tokenizer's offsets. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Role names, in the order of their integer ids in ``glm5_lsp.model.policy.Role``.
ROLE_NAMES: tuple[str, ...] = ("code", "current_block", "api_doc", "symbol", "indent", "error_context", "snippet")


@dataclass(frozen=True)
class Span:
    """A half-open character range ``[start, end)`` of ``Prompt.text()`` with an attention role."""

    start: int
    end: int
    role: str

    def __post_init__(self) -> None:
        if self.role not in ROLE_NAMES:
            raise ValueError(f"unknown role {self.role!r}; expected one of {ROLE_NAMES}")
        if not 0 <= self.start <= self.end:
            raise ValueError(f"bad span [{self.start}, {self.end})")


@dataclass
class Prompt:
    """What the model is shown for one request.

    ``prefix`` is everything before the cursor (context header first: API docs, symbol summary,
    other files; then the code before the cursor). ``suffix`` is the code after the cursor; an empty
    suffix means plain left-to-right generation rather than fill-in-the-middle. ``spans`` index into
    ``prefix + suffix`` (suffix offsets are shifted by ``len(prefix)``); characters outside every
    span have the role ``code``.
    """

    prefix: str
    suffix: str = ""
    spans: list[Span] = field(default_factory=list)

    def text(self) -> str:
        return self.prefix + self.suffix

    def role_at(self, offset: int) -> str:
        """The role of one character (the last matching span wins, so later, narrower spans override)."""
        role = "code"
        for span in self.spans:
            if span.start <= offset < span.end:
                role = span.role
        return role
