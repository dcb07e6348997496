"""The API-doc query for a cursor: what is being typed, on what, inside which call, in which file.

Both documents and queries go through :func:`tokenize`, which splits identifiers into their parts
(``ArgumentParser`` -> ``argument parser argumentparser``) and drops words too common to rank.
Structured tokens carry the strongest signals and are weighted by repetition (BM25 sums repeated
query terms): ``mp:<receiver>:<letters>`` joins the resolved receiver with the start of the name
being typed (``os.path.jo`` -> ``mp:os.path:jo``, matching only what ``os.path`` offers under that
prefix), ``mod:<module>`` for the receiver alone, ``pfx:<letters>`` for the typed start alone,
``name:<call>`` for the enclosing call.

Some signals re-rank BM25's best chunks instead of adding query terms (see ``ApiDocIndex.search``):
the calls on the same receiver the document already makes in lines shaped like the cursor's
(``shaped_calls``: ``if not os.path.`` is like ``if not os.path.isdir(d):``, ``name, ext = os.path.``
like ``root, ext = os.path.splitext(p)``), and whether the cursor sits in a condition (``condition``:
a predicate is wanted). A plain count of the document's calls is not used: it only repeats the
workspace's usage prior and pushes the most common call further ahead. The enclosing
function's name is added as words: ``def create_home_path`` says what the body reaches for.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from glm5_lsp.pysource import HEADER

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PARTS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_TYPED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")
_RECEIVER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\s*\.\s*[A-Za-z_][A-Za-z0-9_]*)*)\s*\.\s*$")
_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)\s*$")
# The last word before an expression that makes it a condition (``if not os.path.``, ``x and re.``).
_CONDITION = re.compile(r"(?:^|[^\w.])(?:if|elif|while|not|and|or|assert)\s*\(?\s*$")
_SHAPE_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[=(,]")
PREFIX_MAX = 6
STOP = frozenset(
    ["a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "if", "in", "into", "is", "it", "of", "on", "or", "that", "the", "this", "to", "with", "was", "will", "not", "no", "self", "cls", "none", "true", "false", "return", "def", "class", "import", "none", "else", "elif", "while", "try", "except", "pass", "lambda", "var", "let", "const", "function", "new", "int", "str"]
)

# Weights (repetitions) of each signal in the query.
W_RECEIVER_PREFIX, W_RECEIVER, W_PREFIX, W_CALL, W_TYPED, W_NEARBY, W_IMPORT = 4, 2, 3, 2, 1, 1, 1
W_FUNCTION = 1
SHAPE_SCAN_CHARS = 200_000  # document text searched for calls on the receiver (keeps huge files cheap)


def split_identifier(word: str) -> list[str]:
    """``parse_known_args`` -> ``parse known args``; ``HTTPServer`` -> ``http server``."""
    return [p.lower() for p in _PARTS.findall(word)]


def tokenize(text: str) -> list[str]:
    """Word tokens for BM25: identifier parts plus the whole identifier, lowercased, no stop words."""
    out: list[str] = []
    for word in _IDENT.findall(text):
        lower = word.lower()
        parts = split_identifier(word)
        if len(parts) > 1 and lower not in STOP:
            out.append(lower.replace("_", ""))
        out.extend(p for p in parts if len(p) > 1 and p not in STOP)
    return out


def receiver_prefix_tokens(receiver: str, name: str) -> list[str]:
    """``mp:os.path:``, ``mp:os.path:j``, ... ``mp:os.path:join`` (up to ``PREFIX_MAX`` letters; indexed side)."""
    where, lower = receiver.lower(), name.lower()
    return [f"mp:{where}:{lower[:k]}" for k in range(min(len(lower), PREFIX_MAX) + 1)]


def prefix_tokens(name: str) -> list[str]:
    """``pfx:c``, ``pfx:co``, ... up to ``PREFIX_MAX`` letters of a symbol's name (indexed side)."""
    lower = name.lower()
    return [f"pfx:{lower[:k]}" for k in range(1, min(len(lower), PREFIX_MAX) + 1)]


@dataclass
class CursorQuery:
    """What the text around a cursor says about the API the user is reaching for."""

    typed: str = ""  # identifier characters just before the cursor
    receiver: str = ""  # dotted expression before the '.' in front of ``typed`` (resolved when imported)
    call: str = ""  # function being called around the cursor
    nearby: list[str] = field(default_factory=list)  # identifiers on the lines just above
    imports: list[str] = field(default_factory=list)  # modules the file imports
    function: str = ""  # name of the function the cursor is in
    condition: bool = False  # the expression being typed is a condition (a predicate is wanted)
    # receiver's members called elsewhere in the document, weighted by their lines' likeness to this one
    shaped_calls: dict[str, float] = field(default_factory=dict)

    def tokens(self) -> list[str]:
        out: list[str] = []
        if self.receiver:
            out += [f"mp:{self.receiver.lower()}:{self.typed[:PREFIX_MAX].lower()}"] * W_RECEIVER_PREFIX
            out += [f"mod:{self.receiver.lower()}"] * W_RECEIVER
            out += tokenize(self.receiver.rsplit(".", 1)[-1])
        if self.typed:
            out += [f"pfx:{self.typed[:PREFIX_MAX].lower()}"] * W_PREFIX
            if len(self.typed) >= 3:
                out += tokenize(self.typed) * W_TYPED
        if self.call:
            out += [f"name:{self.call.rsplit('.', 1)[-1].lower()}"] * W_CALL
            out += tokenize(self.call)
        for word in self.nearby:
            out += tokenize(word) * W_NEARBY
        out += tokenize(self.function) * W_FUNCTION
        out += [f"mod:{m.lower()}" for m in self.imports] * W_IMPORT
        return out


def build_query(
    text: str, offset: int, aliases: dict[str, str] | None = None, imports: Iterable[str] = (), nearby_lines: int = 3
) -> CursorQuery:
    """Read the cursor's surroundings. ``aliases`` maps bound names to import targets (``np`` -> ``numpy``)."""
    aliases = aliases or {}
    line_start = text.rfind("\n", 0, offset) + 1
    before = text[line_start:offset]
    query = CursorQuery(imports=list(dict.fromkeys(imports)))
    typed = _TYPED.search(before)
    query.typed = typed.group(0) if typed else ""
    rest = before[: len(before) - len(query.typed)]
    receiver = _RECEIVER.search(rest)
    if receiver:
        written = re.sub(r"\s+", "", receiver.group(1))
        query.receiver = _resolve(written, aliases)
        lead = rest[: receiver.start()]
        query.condition = bool(_CONDITION.search(lead))
        if written.partition(".")[0] in aliases:  # the API docs cover imported modules only
            query.shaped_calls = _shaped_calls(text, written, query.receiver, lead, line_start)
    query.function = _enclosing_function(text, line_start, len(before) - len(before.lstrip(" \t")))
    query.call = _resolve(_enclosing_call(text, offset, line_start), aliases)
    above_start = line_start
    for _ in range(nearby_lines):
        if above_start == 0:
            break
        above_start = text.rfind("\n", 0, above_start - 1) + 1
    query.nearby = _IDENT.findall(text[above_start:line_start]) + _IDENT.findall(rest)
    return query


def _resolve(dotted: str, aliases: dict[str, str]) -> str:
    if not dotted:
        return ""
    head, _, tail = dotted.partition(".")
    target = aliases.get(head)
    if target is None:
        return dotted
    return f"{target}.{tail}" if tail else target


def _shape(lead: str) -> set[str]:
    """The words and ``= ( ,`` marks on a line before a receiver: how the call's result is used."""
    return set(_SHAPE_WORD.findall(lead))


def _shaped_calls(text: str, written: str, resolved: str, lead: str, line_start: int) -> dict[str, float]:
    """Calls ``<written>.<name>(`` elsewhere in the document (written the same way, without spaces
    around the dots), by resolved name, each counted by the share of this line's shape words
    (:func:`_shape` of ``lead``) its own line repeats.

    The cursor's own line is skipped (what is typed there is not a call yet).
    """
    here = _shape(lead)
    if not here:
        return {}
    # A literal start lets ``re`` skip ahead with a fast substring search (a look-behind or spaces
    # around the dots make it test every position: 50x slower on a 100 KB file); what precedes the
    # receiver is checked below instead.
    pattern = re.compile(re.escape(written + ".") + r"([A-Za-z_]\w*)\s*\(")
    line_end = text.find("\n", line_start)
    shaped: dict[str, float] = {}
    lo = max(0, line_start - SHAPE_SCAN_CHARS // 2)
    for match in pattern.finditer(text, lo, min(len(text), lo + SHAPE_SCAN_CHARS)):
        at = match.start()
        on_cursor_line = line_start <= at and (line_end < 0 or at < line_end)
        if on_cursor_line or (at and (text[at - 1].isalnum() or text[at - 1] in "._")):  # or ``xos.path.``
            continue
        start = text.rfind("\n", 0, at) + 1
        alike = len(here & _shape(text[start:at])) / len(here)
        if alike:
            key = f"{resolved}.{match.group(1)}"
            shaped[key] = shaped.get(key, 0.0) + alike
    return shaped


def _enclosing_function(text: str, line_start: int, indent: int, max_lines: int = 400) -> str:
    """The function the cursor is in: walking up from the cursor's line (``indent`` columns deep),
    each less-indented line opens the block around it; the first ``def`` among them names it.
    A class or a line at column 0 first means the cursor is in no function."""
    end = line_start
    for _ in range(max_lines):
        if end == 0 or indent == 0:
            return ""
        start = text.rfind("\n", 0, end - 1) + 1
        line = text[start : end - 1]
        end = start
        body = line.lstrip(" \t")
        depth = len(line) - len(body)
        if not body or body.startswith("#") or depth >= indent:
            continue
        match = HEADER.match(line)
        if match and match.group("kind") == "def":
            return match.group("name")
        if body.startswith("class ") or depth == 0:
            return ""
        indent = depth
    return ""


def _enclosing_call(text: str, offset: int, line_start: int, max_chars: int = 400) -> str:
    """The callee of the innermost unclosed '(' before the cursor (within ``max_chars``)."""
    depth = 0
    lo = max(0, min(line_start, offset - max_chars))
    for i in range(offset - 1, lo - 1, -1):
        ch = text[i]
        if ch in ")]}":
            depth += 1
        elif ch in "([{":
            if depth == 0:
                if ch != "(":
                    return ""
                match = _CALL.search(text, max(lo, i - 80), i)
                return match.group(1).rstrip(".") if match else ""
            depth -= 1
    return ""
