"""Names for list completions at a cursor: the symbol table's view when the context engine offers it,
otherwise jedi for Python and the document's own identifiers for other languages."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from glm5_lsp.pynames.jedi import exclusive
from glm5_lsp.pynames.jedi import script as jedi_script

log = logging.getLogger(__name__)

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_NAMES = 200


@dataclass(frozen=True)
class Name:
    """One completable name: ``kind`` is ``function``, ``class``, ``variable``, ``module``, ``keyword``, ..."""

    name: str
    kind: str = "variable"
    detail: str = ""


def word_before(text: str, offset: int) -> str:
    """The identifier characters right before ``offset`` (what the user is typing)."""
    start = offset
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    return text[start:offset]


def names_at(text: str, offset: int, *, path: str | None, language: str, context: Any | None) -> list[Name]:
    """Names that may follow the cursor, best first, filtered by the word being typed."""
    typed = word_before(text, offset)
    finder = getattr(context, "names_at", None)
    if callable(finder):
        try:
            found = [Name(str(getattr(n, "name", n)), str(getattr(n, "kind", "variable")),
                          str(getattr(n, "detail", "") or getattr(n, "signature", "") or ""))
                     for n in finder(text, offset, path=path, language=language)]
            return _filter(found, typed)
        except Exception:  # the context engine must never cost the user the list
            log.exception("context engine names_at failed; falling back")
    if language == "python":
        jedi_names = _jedi_names(text, offset, path)
        if jedi_names is not None:
            return jedi_names[:_MAX_NAMES]
    return _filter(_buffer_names(text, offset), typed)


def _filter(names: list[Name], typed: str) -> list[Name]:
    seen: set[str] = set()
    out = []
    for name in names:
        if name.name.startswith(typed) and name.name != typed and name.name not in seen:
            seen.add(name.name)
            out.append(name)
    return out[:_MAX_NAMES]


def _jedi_names(text: str, offset: int, path: str | None) -> list[Name] | None:
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1)
    try:
        with exclusive():  # (the names' type and description are read from jedi too)
            script = jedi_script(text, path=path)
            return [Name(c.name, c.type or "variable", c.description or "") for c in script.complete(line, column)]
    except Exception:  # jedi raises on some malformed input; the buffer fallback still answers
        log.debug("jedi completion failed", exc_info=True)
        return None


def _buffer_names(text: str, offset: int) -> list[Name]:
    """Identifiers of the document, nearest to the cursor first."""
    distance: dict[str, int] = {}
    for match in _IDENTIFIER.finditer(text):
        if match.start() <= offset <= match.end():
            continue
        gap = abs(match.start() - offset)
        if gap < distance.get(match.group(0), 1 << 60):
            distance[match.group(0)] = gap
    return [Name(name) for name in sorted(distance, key=distance.__getitem__)]
