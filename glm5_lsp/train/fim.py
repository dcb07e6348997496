"""Fill-in-the-middle: turn a document into an infilling example, as token ids.

A document is cut into ``prefix | middle | suffix`` at two random points, either anywhere
(character level) or at line starts (line level: whole lines go to the middle, the case editors ask
for most). Then one of two layouts, each ending in ``<|endoftext|>``:

- PSM, exactly what ``Tokenizer.fim_prompt_ids(prefix, suffix)`` builds at inference, with the middle
  as the target: ``<|code_prefix|> prefix <|code_suffix|> suffix <|code_middle|> middle <|endoftext|>``
- SPM (the variant of Bavarian et al. 2022 where prefix and middle stay contiguous):
  ``<|code_prefix|> <|code_suffix|> suffix <|code_middle|> prefix middle <|endoftext|>``

Prefix, middle and suffix are tokenised separately, so the model learns to continue from a cut
anywhere, as it must when the cursor stands inside a word.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from glm5_lsp.train.tokenizer import SpecialIds

Encode = Callable[[str], list[int]]


@dataclass(frozen=True)
class FimConfig:
    """How often and how documents become infilling examples."""

    rate: float = 0.5  # share of documents transformed
    spm_rate: float = 0.5  # share of the transformed ones in SPM layout (the rest PSM)
    line_rate: float = 0.5  # share of the transformed ones split at line starts

    def __post_init__(self) -> None:
        for name in ("rate", "spm_rate", "line_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"FimConfig.{name} must be within [0, 1], got {value}")


def split_points(text: str, rng: random.Random, line_level: bool) -> tuple[int, int]:
    """Two sorted cut offsets into ``text``: any characters, or line starts (including the end)."""
    if line_level:
        starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]
        if starts[-1] != len(text):
            starts.append(len(text))
        a, b = sorted(rng.choice(starts) for _ in range(2))
    else:
        a, b = sorted(rng.randint(0, len(text)) for _ in range(2))
    return a, b


def psm_ids(prefix: list[int], suffix: list[int], middle: list[int], special: SpecialIds) -> list[int]:
    """PSM layout: the runtime's ``fim_prompt_ids(prefix, suffix)`` followed by the middle and end-of-text."""
    return [special.prefix, *prefix, special.suffix, *suffix, special.middle, *middle, special.eos]


def spm_ids(prefix: list[int], suffix: list[int], middle: list[int], special: SpecialIds) -> list[int]:
    """SPM layout: suffix first, then prefix and middle as one contiguous stretch."""
    return [special.prefix, special.suffix, *suffix, special.middle, *prefix, *middle, special.eos]


@dataclass(frozen=True)
class FimPlan:
    """How one document is laid out: its pieces of text (tokenised separately) and the layout."""

    layout: str  # "plain" (pieces: [text]), "psm" or "spm" (pieces: [prefix, middle, suffix])
    pieces: tuple[str, ...]


def plan_document(text: str, config: FimConfig, rng: random.Random) -> FimPlan:
    """Draw whether and how ``text`` becomes an infilling example (no tokenisation yet)."""
    if rng.random() >= config.rate:
        return FimPlan("plain", (text,))
    return plan_fim(text, config, rng)


def plan_fim(text: str, config: FimConfig, rng: random.Random) -> FimPlan:
    """An infilling example of ``text``: line- or character-level cut, PSM or SPM layout."""
    line_level = rng.random() < config.line_rate
    a, b = split_points(text, rng, line_level)
    layout = "spm" if rng.random() < config.spm_rate else "psm"
    return FimPlan(layout, (text[:a], text[a:b], text[b:]))


def assemble(plan: FimPlan, piece_ids: list[list[int]], special: SpecialIds) -> list[int]:
    """The training ids of a planned document, given each piece's token ids."""
    if plan.layout == "plain":
        return [*piece_ids[0], special.eos]
    prefix, middle, suffix = piece_ids
    layout = spm_ids if plan.layout == "spm" else psm_ids
    return layout(prefix, suffix, middle, special)


def document_ids(
    text: str, encode: Encode, special: SpecialIds, config: FimConfig, rng: random.Random
) -> list[int]:
    """One document as training ids: plain ``text <|endoftext|>`` or, at ``config.rate``, a FIM example."""
    plan = plan_document(text, config, rng)
    return assemble(plan, [encode(piece) for piece in plan.pieces], special)
