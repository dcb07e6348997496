"""List completion ranked as a language server's users expect (issue 21, point 3).

Pure text functions over the names the pipeline found (the symbol table's, or jedi's): no LSP
types, no model. :func:`cursor_kind` tells what the cursor completes (an attribute after a dot, a
module after ``import`` / ``from``, a name); :func:`rank` orders names by relevance to the cursor:

1. how the name matches the typed word: same-case prefix, then any-case prefix;
2. public before private (``_x``) before dunder (``__x__``), unless the typed word starts with ``_``;
3. a score from the document: nearness (lines between the cursor and the name's nearest
   occurrence, before the cursor counting double) and how often the file uses the name;
4. the finder's own order.

Labels come out once each (the first, best-ranked, wins), and a name is never cut: a candidate
that is only a prefix of another candidate the document really uses is never made up here (the
model's line is judged by :func:`truncated`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_IMPORT = re.compile(r"^\s*(?:import\s+[\w., ]*|from\s+[\w.]*)$")
_FROM_IMPORT = re.compile(r"^\s*from\s+[\w.]+\s+import\s+")
_ATTRIBUTE = re.compile(r"(?:(?<![\w.])[A-Za-z_]\w*|\w[A-Za-z_]\w*|[)\]}'\"])\s*\.\s*\w*$")
# A string or comment on one line, blanked before counting a line's identifiers.
_SKIP = re.compile(r"#[^\n]*|'''.*?'''|\"\"\".*?\"\"\"|'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"", re.DOTALL)

NEAR_WEIGHT = 3.0  # weights of the document score, tuned on BENCHMARK_FIT packages (benchmarks/completion_list.py)
FREQUENCY_WEIGHT = 1.0
BEFORE_BONUS = 2.0  # an occurrence before the cursor counts as this much nearer


def cursor_kind(line_before: str) -> str:
    """What the cursor completes on its line: ``"import"`` (a module after ``import`` or
    ``from``), ``"from-import"`` (a name after ``from m import``), ``"attribute"`` (after a dot),
    or ``"name"``."""
    if _FROM_IMPORT.match(line_before):
        return "from-import"
    if _IMPORT.match(line_before):
        return "import"
    if _ATTRIBUTE.search(line_before):
        return "attribute"
    return "name"


def occurrences(text: str) -> dict[str, list[int]]:
    """The lines (0-based) each identifier of ``text`` occurs on, outside strings and comments."""
    blanked = _SKIP.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)
    found: dict[str, list[int]] = {}
    line, last = 0, 0
    for match in _IDENTIFIER.finditer(blanked):
        line += blanked.count("\n", last, match.start())
        last = match.start()
        found.setdefault(match.group(), []).append(line)
    return found


def _visibility(name: str, typed: str) -> int:
    if typed.startswith("_"):
        return 0
    if name.startswith("__") and name.endswith("__"):
        return 2
    return 1 if name.startswith("_") else 0


def _match(name: str, typed: str) -> int:
    if not typed or name.startswith(typed):
        return 0
    return 1 if name.lower().startswith(typed.lower()) else 2


def rank(items: Sequence[T], text: str, offset: int, typed: str, *, name: Callable[[T], str] = str,
         seen: dict[str, list[int]] | None = None, tier: Callable[[T], int] | None = None) -> list[T]:
    """``items`` best first for a cursor at ``offset`` of ``text`` with ``typed`` before it, each
    label once. ``seen``: :func:`occurrences` of ``text`` when the caller has them. ``tier``: a
    rank that comes right after the prefix match (jedi's attributes before the file's words)."""
    seen = occurrences(text) if seen is None else seen
    cursor_line = text.count("\n", 0, offset)
    counts = {key: len(lines) for key, lines in seen.items()}
    if typed and typed in counts:  # the word being typed is no use of the name
        counts[typed] -= 1

    def document_score(label: str) -> float:
        lines = seen.get(label)
        if not lines or not counts.get(label):
            return 0.0
        gap = min((cursor_line - line) / BEFORE_BONUS if line <= cursor_line else line - cursor_line
                  for line in lines)
        return NEAR_WEIGHT / (1.0 + gap / 10.0) + FREQUENCY_WEIGHT * math.log1p(counts[label])

    keyed = []
    for index, item in enumerate(items):
        label = name(item)
        level = tier(item) if tier is not None else 0
        keyed.append(((_match(label, typed), level, _visibility(label, typed), -document_score(label), index),
                      label, item))
    keyed.sort(key=lambda entry: entry[0])
    out: list[T] = []
    labels: set[str] = set()
    for _key, label, item in keyed:
        if label not in labels:
            labels.add(label)
            out.append(item)
    return out


def truncated(label: str, names: Iterable[str], seen: dict[str, list[int]]) -> bool:
    """Whether ``label`` ends in a cut name: its last identifier is no name the document or the
    list has, yet it begins one of them (``_split_lin`` where ``_split_lines`` exists)."""
    match = re.search(r"[A-Za-z_][A-Za-z0-9_]*$", label)
    if match is None:
        return False
    word = match.group()
    known = set(names) | set(seen)
    if word in known:
        return False
    return any(other.startswith(word) for other in known)


def document_words(seen: dict[str, list[int]], typed: str, listed: set[str], make: Callable[..., T]) -> list[T]:
    """The document's own identifiers that begin with ``typed`` (any case) and the list lacks, as
    ``make(word, "text")``: a name defined further on, a parameter named as elsewhere in the file,
    a keyword argument. The word being typed is not one of them (nor a word of one letter)."""
    wanted = typed.lower()
    out = []
    for word in seen:
        if word != typed and len(word) > 1 and word not in listed and word.lower().startswith(wanted):
            out.append(make(word, "text"))
    return out


def attribute_words(text: str) -> set[str]:
    """The identifiers ``text`` reads after a dot (``x.name``), outside strings and comments: the
    attributes its code uses, offered after jedi's when the receiver's type is unknown to it."""
    blanked = _SKIP.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)
    return set(re.findall(r"(?<![\d\s])\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)", blanked))


def starts_known(label: str, names: Iterable[str], seen: dict[str, list[int]]) -> bool:
    """Whether ``label`` (the model's line) starts with a name the list or the document has."""
    match = re.match(r"[A-Za-z_][A-Za-z0-9_]*", label.lstrip())
    if match is None:
        return True  # an operator, a bracket, a string: the model's to say
    word = match.group()
    return word in seen or word in set(names) or word in _PYTHON_KEYWORDS


_PYTHON_KEYWORDS = frozenset({
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue", "def", "del",
    "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in", "is", "lambda",
    "nonlocal", "not", "or", "pass", "raise", "return", "try", "while", "with", "yield",
})
