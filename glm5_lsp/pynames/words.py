"""The word being typed, finished from the names around it: the answer when nothing generated is clean.

At the start of a statement the small default model often writes a line that no check passes
(``im`` -> ``import numpy as a copy of the same.``), and an as-you-type completion then has nothing to
show although the user has typed half a word whose end is plain to see: ``return``, a name used a few
lines up. :func:`finishing_words` lists the words that finish it, likeliest first; the repair loop
judges them like any candidate (spliced in, nothing new may break) and returns the first clean one.

Candidates are the names visible at the cursor for Python (:func:`~glm5_lsp.pynames.scope.scope_at`:
the enclosing functions' names, the module's, builtins and keywords), the document's identifiers for
other languages. They are ranked by how often they occur near the cursor (within ``NEAR`` characters),
then in the whole document, then by length: what the code around the cursor keeps using is the likeliest
next word, as in the plain word completers editors have long had.

:func:`unknown_word` is the other side: the word a generated candidate finishes must be one something
binds (or one the candidate binds), which the checkers cannot tell while the line being typed keeps the
document from parsing.
"""

from __future__ import annotations

import builtins
import keyword
import re
from collections import Counter

from glm5_lsp.postprocess import ends_in_code
from glm5_lsp.pynames.scope import scope_at
from glm5_lsp.pysource import STAR_IMPORT, open_triple_quote, piece, top_level_pieces

NEAR = 3000  # characters on each side of the cursor counted as "near"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def finishing_words(before: str, typed: str, after: str, language: str, limit: int = 3) -> list[str]:
    """At most ``limit`` words that begin with ``typed`` (and are longer), likeliest first.

    ``before`` is the document up to the typed word, ``after`` the document after the cursor."""
    if not typed or not _IDENT.fullmatch(typed):
        return []
    receiver = _RECEIVER.search(before)
    line = before[before.rfind("\n") + 1:]
    first = ""  # a name that goes first when it finishes the word (a method's ``self``)
    if language == "python" and (open_triple_quote(before) is not None or line.lstrip().startswith("#")):
        # prose (a docstring, a comment): the document's words, not the names in scope
        pool = _document_words(before, after)
    elif language == "python" and not ends_in_code(line, language):  # a string: a name or a word
        pool = set(scope_at(before, after)[0]) | _document_words(before, after)
    elif receiver is not None:  # an attribute: what follows this receiver's dot elsewhere, else any dot
        pool = _attributes(before, after, receiver.group(1))
    elif language == "python" and _DEF_NAME.match(line):  # the name a ``def`` binds: a new one, never an import
        pool = _definition_names(before, after, line)
    elif language == "python":
        names, kind = scope_at(before, after)
        pool = set(names) - _misplaced_keywords(line)
        if kind == "class" and _FIRST_PARAMETER.search(line):  # ``def raw(se``: the method's own first
            first = "cls" if _CLASSMETHOD.search(before[: len(before) - len(line)]) else "self"
            pool.add(first)
    else:
        pool = _document_words(before, after)
    words = [w for w in pool if w.startswith(typed) and w != typed]
    if not words:
        return []
    near = Counter(_IDENT.findall(before[-NEAR:] + " " + after[:NEAR]))
    counted = [piece(part).fact(_piece_counts) for text in (before, after) for part in top_level_pieces(text)]
    total = {w: sum(counts[w] for counts in counted) for w in words}
    words.sort(key=lambda w: (w != first, -near[w], -total[w], _SPECIAL_RANK.get(w, len(SPECIAL_METHODS)), len(w), w))
    if language == "python" and not line.strip(" \t") and after[:1] in ("", "\n", "\r"):
        # ``el`` alone on its line: ``else`` does not compile there, ``else:`` does
        words = [w + ":" if w in _BARE_BLOCK_KEYWORDS else w for w in words]
    return words[:limit]


_RECEIVER = re.compile(r"([A-Za-z_][\w.]*)?\.\Z")  # the dotted name (if any) before the dot the word follows


# The special methods a class body defines, the usual ones first (the order breaks ties between names
# the document does not use yet: ``def __`` in a new class is ``__init__`` before ``__eq__``).
SPECIAL_METHODS = (
    "__init__", "__repr__", "__str__", "__eq__", "__hash__", "__call__", "__len__", "__iter__", "__next__",
    "__getitem__", "__setitem__", "__delitem__", "__contains__", "__enter__", "__exit__", "__post_init__",
    "__new__", "__bool__", "__lt__", "__le__", "__gt__", "__ge__", "__ne__", "__getattr__", "__setattr__",
    "__delattr__", "__getattribute__", "__get__", "__set__", "__set_name__", "__init_subclass__",
    "__class_getitem__", "__aenter__", "__aexit__", "__aiter__", "__anext__", "__await__", "__add__", "__sub__",
    "__mul__", "__truediv__", "__floordiv__", "__mod__", "__pow__", "__neg__", "__pos__", "__abs__", "__and__",
    "__or__", "__xor__", "__invert__", "__radd__", "__rsub__", "__rmul__", "__iadd__", "__index__", "__int__",
    "__float__", "__format__", "__reversed__", "__missing__", "__del__", "__reduce__", "__reduce_ex__",
    "__getstate__", "__setstate__", "__copy__", "__deepcopy__", "__dir__", "__sizeof__", "__fspath__",
)
_SPECIAL_RANK = {name: rank for rank, name in enumerate(SPECIAL_METHODS)}
_DEF_NAME = re.compile(r"^[ \t]*(?:async[ \t]+)?def[ \t]+\w*\Z")
_DEFINED = re.compile(r"^([ \t]*)(?:async[ \t]+)?def[ \t]+([A-Za-z_]\w*)", re.MULTILINE)
_CALLED = re.compile(r"(?<![\w.])([A-Za-z_]\w*)[ \t]*\(")
_CALLED_ON_SELF = re.compile(r"(?<![\w.])(?:self|cls)\.([A-Za-z_]\w*)[ \t]*\(")
_BUILTIN_NAMES = frozenset(dir(builtins))


def _definition_names(before: str, after: str, line: str) -> set[str]:
    """Candidates for the name of the ``def`` being typed on ``line``: the names other ``def``s in the
    document bind (methods are named alike across classes) and the names it calls (a function is often
    called before it is written; builtins aside), and in a class body its special methods and what
    ``self.`` or ``cls.`` calls; not the names in scope, which a definition does not read (``def __`` was
    finished as ``__future__``, a module an import named). Those the same class (or module) defines
    already before the cursor are left out: a second definition would replace the first."""
    indent = line[: len(line) - len(line.lstrip(" \t"))]
    text = before + "\n" + after
    pool = {name for _, name in _DEFINED.findall(text)}
    pool |= set(_CALLED.findall(text)) - _BUILTIN_NAMES - _KEYWORDS
    siblings = set()
    for earlier in reversed(before[: len(before) - len(line)].split("\n")):
        code = earlier.strip()
        if not code or code.startswith(("#", "@")):
            continue
        current = earlier[: len(earlier) - len(earlier.lstrip(" \t"))]
        if len(current) < len(indent):
            if code.startswith("class ") and indent:
                pool.update(SPECIAL_METHODS)
                pool.update(_CALLED_ON_SELF.findall(text))
            break
        found = _DEFINED.match(earlier)
        if found is not None and found.group(1) == indent:
            siblings.add(found.group(2))
    return pool - siblings


def _document_words(before: str, after: str) -> set[str]:
    """Every identifier-like word of the document (``before`` and ``after`` the cursor)."""
    return set(_IDENT.findall(before)) | set(_IDENT.findall(after))


def _attributes(before: str, after: str, receiver: str | None) -> set[str]:
    """Names written after ``receiver.`` in the document (after any dot where it has none): a word
    typed after a dot is an attribute, never one of the scope's names for that alone (``self.fl`` is
    not ``float``)."""
    text = before + "\n" + after
    if receiver:
        found = set(re.findall(rf"(?<![\w.]){re.escape(receiver)}\.([A-Za-z_]\w*)", text))
        if found:
            return found
    return set(re.findall(r"\.([A-Za-z_]\w*)", text))


def _piece_counts(text: str) -> Counter[str]:
    """How often each word occurs in one :func:`~glm5_lsp.pysource.top_level_pieces` piece (kept per
    piece: a keystroke changes one, and counting a 2,600-line file at once takes about 10 ms). Read-only."""
    return Counter(_IDENT.findall(text))


_BARE_BLOCK_KEYWORDS = frozenset({"else", "try", "finally"})  # a block header with nothing between keyword and colon
_KEYWORDS = frozenset(keyword.kwlist)
# Keywords that only begin a statement: never a word typed inside one (``if not de`` is not ``def``).
_STATEMENT_KEYWORDS = frozenset({
    "assert", "async", "break", "class", "continue", "def", "del", "elif", "except", "finally", "global",
    "import", "nonlocal", "pass", "raise", "return", "try", "while", "with",
})
_FIRST_PARAMETER = re.compile(r"^[ \t]*(?:async[ \t]+)?def[ \t]+\w+[ \t]*\([ \t]*\Z")
_CLASSMETHOD = re.compile(r"@classmethod[ \t]*\n(?:[ \t]*@[^\n]*\n)*[ \t]*\Z")


def _misplaced_keywords(line: str) -> frozenset[str]:
    """The keywords that cannot be the word typed at the end of ``line`` (the current line up to it):
    inside a statement, those that only begin one, and ``from`` unless after ``yield`` or in a
    ``raise`` (``matches = fr`` is not ``from``), ``for`` unless inside brackets or at the start."""
    code = line.strip()
    if not code or code.endswith(";"):
        return frozenset()
    misplaced = set(_STATEMENT_KEYWORDS)
    if not re.search(r"(?:\byield|[)\]}])\s*\Z", code) and not code.startswith(("raise", "from")):
        misplaced.add("from")  # ``yield from``, ``raise E(...) from e``, ``from x import``
    if code.startswith("from") and " import" not in code:
        misplaced.discard("import")
    if code.count("(") + code.count("[") + code.count("{") <= code.count(")") + code.count("]") + code.count("}"):
        misplaced.add("for")
    if code.startswith("import") or (code.startswith("from") and " import" in code):
        misplaced |= _KEYWORDS - {"as"}  # a module or a name it exports
    return frozenset(misplaced)


_BINDS_ON_LINE = re.compile(r"\b(?:def|class|for|as|import|from|lambda|global|nonlocal|with|except|del)\b")
_BOUND_AFTER = re.compile(r"\s*(?:=(?!=)|[-+*/%&|^@]=|//=|\*\*=|>>=|<<=|,|:=?|in\b|as\b)")
_WORD_HEAD = re.compile(r"[A-Za-z0-9_]*")


def unknown_word(before: str, typed: str, text: str, after: str, language: str) -> str | None:
    """The word ``typed`` + ``text``'s leading identifier characters when nothing could bind it, else None.

    For a document that does not parse (the line being typed is often cut short), the checkers see no
    names at all, so ``el`` finished as ``ele_to`` passes them. This is the check they cannot make:
    the word is code (not in a string or comment) and read (not after ``.``, not on a line that binds
    names with ``def``/``for``/``import``/..., not followed by ``=``, ``:=``, ``,``, ``:``, ``in``,
    ``as``), and it is neither anywhere else in the document nor in scope at the cursor
    (:func:`~glm5_lsp.pynames.scope.scope_at`, builtins and keywords included). Python only; lenient
    wherever the text leaves room for doubt (a star import, say). ``before`` is the document up to the
    typed word, ``after`` the document after the cursor."""
    if language != "python" or not typed or not _IDENT.fullmatch(typed) or before.endswith("."):
        return None
    tail = _WORD_HEAD.match(text)
    word = typed + (tail.group(0) if tail else "")
    rest = text[len(word) - len(typed):]
    line = before[before.rfind("\n") + 1:]
    if open_triple_quote(before) is not None or not ends_in_code(line, language):
        return None  # prose in a docstring, a string or a comment: words, not names
    if _BINDS_ON_LINE.search(line) or _BOUND_AFTER.match(rest) or _BINDS_ON_LINE.search(rest.split("\n", 1)[0]):
        return None  # bound before it on its line, right after it, or later on it (``[x for x in xs]``)
    pattern = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(word)}(?![A-Za-z0-9_])")
    if pattern.search(before) or pattern.search(after) or STAR_IMPORT.search(before) or STAR_IMPORT.search(after):
        return None  # (searched first: a scan of the text in C, where the scope below is 10-14 ms of Python)
    return None if word in scope_at(before, after)[0] else word
