"""Python's own compiler: the first syntax error, exactly as the interpreter will report it.

The repair loop checks one document again and again with a small edit spliced in, and on a large file
a full ``compile`` is most of each check. So the provider cuts a text into *segments*, remembers for the
last few texts whether each segment compiles on its own (:class:`RecentCompiles`), and for a new text
one edit away from one of them (longest common prefix and suffix) recompiles only the segment the edit
touches, then derives the whole file's answer from the segments'. :func:`compile_diagnostics` is the
plain full compile that answer always equals; on a 2,600-line file it takes 15-20 ms, a one-line edit
inside a method well under 1 ms. A text whose edits lie far apart (the editor's cursor jumped: the old
line restored, a new one cut) is cut afresh rather than merged into one large segment; each segment's
status is remembered by what decides it (its source, its class, the compile flags; the last 2,048), so
only the segments not seen recently are compiled.

**Segments.** A segment begins at a line that starts a ``def``, ``class`` or decorator at column 0 or,
inside a long top-level class, at the body's indentation (the class's *head* segment holds its header,
its *body* segments follow). Where the cuts fall is guessed from the text; nothing below trusts the
guess, every segment is checked on its own:

* a module-level segment compiles as it is;
* a body segment compiles under a copy of its class header (``class X(Base):`` and nothing else);
* a head or body segment that another body segment of its class follows gets a *sentinel* statement at
  the body's indentation, and counts as compiling only if the sentinel ends up in that class's body:
  so the segment neither leaves the class nor ends inside a bracket, a string or a deeper block.

A segment's :class:`Status` is ``CLEAN``, ``COMPILER_ERROR`` (it parses, but the compiler proper,
symbol table or code generation, rejects it: ``'return' outside function``) or ``BROKEN`` (anything
else). Statuses are computed without padding, since line numbers do not change whether something
compiles; whatever is reported is compiled from a source padded with blank lines to the text's lines.

**Why the derived answer is exact.** A segment that compiles ends where the tokenizer is at a clean
line start (no open bracket, string or continuation), and each segment's first token begins a line at
module level or at its class's body indentation; so while every segment before one compiles, the
whole text's tokens are the segments' tokens one after another, and the parser reads the text as their
statements one after another (a statement reaches into the next segment only through ``else``,
``elif``, ``except`` or ``finally``, which are looked for). Hence, with ``k`` the first segment that is
not ``CLEAN``:

* there is none: the text compiles;
* ``k`` is ``COMPILER_ERROR`` and every other segment ``CLEAN``: the text parses, nothing else fails in
  the compiler, and ``k``'s error is the text's;
* otherwise the text's error is what compiling from segment ``k`` to the end of the file reports (under
  its class header for a body segment). The statements before ``k`` cannot change what the parser does
  after them (CPython's second, error-reporting parser pass raises only on invalid code); everything
  after ``k`` is needed, because a tokenizer error anywhere after a syntax error replaces it, and an
  unclosed bracket or string is only noticed at the end of the file. That compile usually stops soon
  after segment ``k`` and merely tokenizes the rest, which is fast.

Segments share compiler state only through module- or class-level ``global``/``nonlocal`` declarations
and ``from __future__`` imports. With such a declaration the text's parse errors are still found from
its segments, anything else by a full compile. The first segment's future features are passed to the
others as compile flags; ``__future__`` anywhere else, a ``barry_as_FLUFL`` import (as a flag it
changes the parser, as an import it does not) or an edit to a first segment that mentions
``__future__`` mean a full compile or a fresh start. Texts with ``\\r`` (a line break to the compiler
but not to ``str.count("\\n")``) or NUL characters and small texts are compiled whole, and so are
texts where a segment's compile raises ``RecursionError`` or ``MemoryError``. A text unlike any recent
one is cut up afresh, every segment compiled: about 1.5 times a full compile, once per document.
``tests/test_repair_compile_incremental.py`` compares both on random edits of standard-library modules.
"""

from __future__ import annotations
import __future__

import ast
import enum
import functools
import logging
import operator
import re
import threading
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from types import CodeType
from typing import NamedTuple

from glm5_lsp import pyparse
from glm5_lsp.checks.providers.compile_worker import CompileWorker, worker_available
from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.lru import LRUCache
from glm5_lsp.pysource import HEADER_LINE, definition_starts, top_level_cuts
from glm5_lsp.textdiff import common_prefix, common_suffix

log = logging.getLogger(__name__)


class PythonCompileProvider:
    """``compile(text, path, "exec")``; at most one diagnostic (the compiler stops at the first error).

    ``in_worker``: compile in a helper process (:mod:`.compile_worker`), where the check does not hold
    this process's interpreter lock; where the helper cannot run (no ``select`` on pipes), in-process.
    """

    name = "compile"
    languages = frozenset({"python"})

    def __init__(self, recent_texts: int = 4, in_worker: bool = False, timeout_s: float = 10.0) -> None:
        self.recent = RecentCompiles(recent_texts)
        self.worker = CompileWorker(timeout_s, recent_texts) if in_worker and worker_available() else None

    @property
    def bounded_s(self) -> float | None:
        """A check's deadline with the helper process (one check at a time); in-process, none."""
        return self.worker.timeout_s if self.worker is not None else None

    def diagnose(self, text: str, path: str, language: str) -> list[Diagnostic]:
        return self.submit(text, path, language)()

    def submit(self, text: str, path: str, language: str) -> Callable[[], list[Diagnostic]]:
        """The check sent to the helper (the runner's other checks run while it compiles); calling
        the result waits for its answer. Without a helper, the returned function compiles here."""
        # Never the file's own name: for a name it can open, CPython takes the line of a syntax error
        # from the file on disk and counts the column in it, and the text checked here is seldom what
        # is saved (a 2-character column came back for a 31-character line).
        filename = f"<{path}>" if path else "<candidate>"
        worker = self.worker
        if worker is None:
            return functools.partial(self.recent.diagnose, text, filename)
        try:
            answer = worker.submit(text, filename)
        except RuntimeError as error:
            return functools.partial(self._without_helper, worker, error, text, filename)

        def answered() -> list[Diagnostic]:
            try:
                return answer()
            except RuntimeError as error:
                return self._without_helper(worker, error, text, filename)
        return answered

    def _without_helper(self, worker: CompileWorker, error: RuntimeError, text: str, filename: str) -> list[Diagnostic]:
        """After the helper failed with ``error``: raised when it had answered before (the next check
        starts another), else (it cannot import this package, say) compiled here from now on."""
        if worker.answered:
            raise error
        log.warning("the compile helper never answered (%s); Python is compiled in-process from now on", error)
        worker.close()
        self.worker = None
        return self.recent.diagnose(text, filename)


def compile_diagnostics(text: str, filename: str) -> list[Diagnostic]:
    """The whole text through ``compile``: the reference every incremental answer equals."""
    return _compile_report(text, filename, 0, text)


def _compile_report(source: str, filename: str, flags: int, text: str) -> list[Diagnostic]:
    """Compile ``source`` (``text`` itself, or a part of it padded to the same line numbers)."""
    try:
        compile(source, filename, "exec", flags, dont_inherit=True)
    except SyntaxError as exc:  # IndentationError and TabError are subclasses
        return [_from_syntax_error(text, exc)]
    except ValueError as exc:  # "source code string cannot contain null bytes"
        return [Diagnostic(0, 0, 0, 0, str(exc), "error", "compile", "ValueError")]
    return []


def _from_syntax_error(text: str, exc: SyntaxError) -> Diagnostic:
    lines = text.split("\n")

    def clamp(line: int, col: int) -> tuple[int, int]:  # checkers sometimes point one past the end
        line = max(0, min(line, len(lines) - 1))
        return line, max(0, min(col, len(lines[line])))

    line, col = clamp((exc.lineno or 1) - 1, (exc.offset or 1) - 1)
    end_line = (exc.end_lineno or exc.lineno or 1) - 1
    end_offset = exc.end_offset or 0
    if end_line < line or end_offset <= 0 or (end_line == line and end_offset - 1 <= col):
        end_line, end_col = line, max(col, min(col + 1, len(lines[line])))
    else:
        end_line, end_col = max(clamp(end_line, end_offset - 1), (line, col))
    return Diagnostic(line, col, end_line, end_col, exc.msg or "invalid syntax", "error", "compile",
                      type(exc).__name__)


class Status(enum.Enum):
    """What compiling one segment on its own gives."""

    CLEAN = "compiles on its own"
    COMPILER_ERROR = "parses, but the compiler rejects it"
    BROKEN = "does not parse, or was not shown to end inside its class body"


class ClassHeader(NamedTuple):
    """A split top-level class. Offsets and line counts are relative to its head segment's start,
    so they hold wherever the head moves; the header is ``text[head + header : head + body]``."""

    name: str
    indent: str  # the body's indentation
    header: int  # offset of the ``class`` line
    body: int  # offset of the first body statement's line
    header_lines: int  # lines from the head segment's first line to the ``class`` line
    body_lines: int  # ... to the first body statement's line


class Segment(NamedTuple):
    """One segment of a text, apart from where it is (see :class:`Layout`)."""

    owner: ClassHeader | None  # the split class this segment belongs to; None at module level
    opens_class: bool  # the head segment of ``owner`` (compiled at module level)
    status: Status
    late_future: bool  # mentions ``__future__`` but is not the first segment
    scope_declaration: bool  # declares a global/nonlocal at module or class level (or cannot tell)


class Layout(NamedTuple):
    """A text's segments; ``starts`` and ``lines`` move with edits, ``segments`` never need to."""

    starts: list[int]  # offset of each segment's first line
    lines: list[int]  # its 1-based line number
    segments: list[Segment]
    future_flags: int | None  # the first segment's ``__future__`` features; None: not known


class _Entry(NamedTuple):
    filename: str
    text: str
    layout: Layout
    diagnostics: tuple[Diagnostic, ...]


class RecentCompiles:
    """The last ``size`` texts checked, with their layouts; a new text is checked from the closest.

    Thread-safe (the runner checks a document and a candidate at once): the lock guards the list
    only; layouts are never changed once stored.
    """

    def __init__(self, size: int = 4, min_shared: float = 0.5, min_lines: int = 100,
                 class_lines: int = 60, segment_lines: int = 25) -> None:
        self.entries: deque[_Entry] = deque(maxlen=max(size, 0))
        self.min_shared = min_shared  # below this share of unchanged characters, start afresh
        self.min_lines = min_lines  # smaller texts are compiled whole: that is fast anyway
        self.class_lines = class_lines  # top-level classes at least this long are split by member
        self.segment_lines = segment_lines  # short neighbouring pieces are grouped up to this many
        # lines (each compile has a fixed cost)
        self.incremental = 0  # checks derived from an earlier text's layout (for tests and logs)
        self.recut = 0  # checks of a text close to an earlier one but cut afresh (edits far apart)
        self._lock = threading.Lock()

    def diagnose(self, text: str, filename: str) -> list[Diagnostic]:
        if (self.entries.maxlen == 0 or "\r" in text or "\0" in text
                or text.count("\n") < self.min_lines):
            return compile_diagnostics(text, filename)
        with self._lock:
            recent = [entry for entry in self.entries if entry.filename == filename]
        entry = None
        recut = False
        try:
            closest = _closest(recent, text)
            if closest is not None:
                base, prefix, suffix = closest
                if base.text == text:
                    self._touch(base)
                    return list(base.diagnostics)
                if prefix + suffix >= self.min_shared * len(text):
                    entry = _edited(base, text, prefix, suffix)
                    recut = entry is None
            incremental = entry is not None
            if entry is None:
                entry = _fresh(text, filename, self.class_lines, self.segment_lines)
        except (RecursionError, MemoryError):  # absurd nesting: let the full compile say what it says
            return compile_diagnostics(text, filename)
        with self._lock:
            self.entries.append(entry)
            self.incremental += incremental
            self.recut += recut
        return list(entry.diagnostics)

    def _touch(self, entry: _Entry) -> None:
        """Make ``entry`` the most recent (a document is checked again and again between candidates)."""
        with self._lock:
            for i, recent in enumerate(self.entries):
                if recent is entry:
                    del self.entries[i]
                    self.entries.append(entry)
                    return


def _closest(entries: list[_Entry], text: str) -> tuple[_Entry, int, int] | None:
    """The entry sharing the longest prefix and suffix with ``text``, with their lengths. The most
    recent entries are tried first, and one whose edit lies within a single segment is taken at once."""
    for entry in entries:
        if entry.text == text:
            return entry, len(text), 0
    best: tuple[_Entry, int, int] | None = None
    for entry in reversed(entries):
        prefix = common_prefix(entry.text, text)
        suffix = common_suffix(entry.text, text, min(len(entry.text), len(text)) - prefix)
        if best is None or prefix + suffix > best[1] + best[2]:
            best = (entry, prefix, suffix)
        starts = entry.layout.starts
        if bisect_right(starts, prefix) == bisect_right(starts, len(entry.text) - suffix):
            break
    return best


# ---------------------------------------------------------------------------------------------------
# A text seen for the first time: cut it, and check every segment


_INDENTATION = re.compile(r"[ \t\f]*")
_HEADER_LINES = 20  # a class header longer than this is not split
_MERGES = 2  # a segment that does not parse is tried together with at most this many next ones
_MAX_MERGED = 3  # an edit spanning more segments than this is checked by cutting the text afresh


def _fresh(text: str, filename: str, class_lines: int, segment_lines: int) -> _Entry:
    cuts = _cuts(text, class_lines, segment_lines)
    starts = [start for start, _, _ in cuts]
    layout = Layout(starts, _line_numbers(text, starts),
                    [Segment(owner, opens, Status.BROKEN, False, False) for _, owner, opens in cuts], 0)
    layout, first_code = _settled(text, layout, 0, filename)
    layout = layout._replace(future_flags=_future_flags(first_code, text[:_end(text, layout, 0)]))
    i = 1
    while i < len(layout.segments):
        layout, _ = _settled(text, layout, i, filename)
        i += 1
    return _Entry(filename, text, layout, tuple(_derived(text, layout, filename)))


def _future_flags(first_code: CodeType | None, first_segment: str) -> int | None:
    """The ``__future__`` features the first segment turns on, as compile flags for the others; None
    when that is not known (the segment does not compile) or not the same thing: as a flag,
    ``barry_as_FLUFL`` changes how the parser reads ``<>``, which the import itself does not."""
    if first_code is None:
        return None if "__future__" in first_segment else 0
    flags = first_code.co_flags & _FUTURE_FLAGS
    return None if flags & __future__.barry_as_FLUFL.compiler_flag else flags


def _cuts(text: str, class_lines: int, segment_lines: int) -> list[tuple[int, ClassHeader | None, bool]]:
    """``(offset, owner, opens_class)`` of each segment: top-level definitions, and the members of
    long top-level classes; a decorated definition starts at its first decorator. Neighbouring short
    pieces of one kind are grouped, up to ``segment_lines`` lines a group."""
    tops = [0, *top_level_cuts(text)]
    cuts: list[tuple[int, ClassHeader | None, bool]] = []
    for start, end in zip(tops, tops[1:] + [len(text)]):
        split = _split_class(text, start, end, class_lines)
        if split is None:
            cuts.append((start, None, False))
        else:
            owner, members = split
            cuts += [(start, owner, True)] + [(member, owner, False) for member in members]
    kept = cuts[:1]
    for cut, (end, _, _) in zip(cuts[1:], cuts[2:] + [(len(text), None, False)]):
        start, owner, opens = cut
        group_start, group_owner, group_opens = kept[-1]
        if (owner is not group_owner or opens or group_opens
                or text.count("\n", group_start, end) > segment_lines):
            kept.append(cut)
    return kept


def _split_class(text: str, start: int, end: int, class_lines: int) -> tuple[ClassHeader, list[int]] | None:
    """The header of the class in ``text[start:end]`` and where its members after the first begin."""
    if not text.startswith(("class", "@"), start) or text.count("\n", start, end) < class_lines:
        return None
    match = _class_line(text, start, end)
    if match is None:
        return None
    line = match.start()
    for _ in range(_HEADER_LINES):  # the header ends at the first line ending with ':'
        eol = text.find("\n", line, end)
        if eol < 0:
            return None
        if text[line:eol].split("#", 1)[0].rstrip().endswith(":"):
            break
        line = eol + 1
    else:
        return None
    body = _first_token_line(text, eol + 1, end)
    if body is None:
        return None
    indent = _INDENTATION.match(text, body).group()
    if not indent:
        return None
    members = definition_starts(text, indent, body, end)
    if not members:
        return None
    owner = ClassHeader(match.group("name"), indent, match.start() - start, body - start,
                        text.count("\n", start, match.start()), text.count("\n", start, body))
    return owner, members


def _class_line(text: str, start: int, end: int) -> re.Match[str] | None:
    """The first header line of ``text[start:end]`` if it is a class's at column 0 (after decorators)."""
    match = HEADER_LINE.search(text, start, end)
    if match is None or match.group("indent") or match.group("kind") != "class":
        return None
    return match


def _line_numbers(text: str, starts: list[int]) -> list[int]:
    numbers, line, previous = [], 1, 0
    for start in starts:
        line += text.count("\n", previous, start)
        numbers.append(line)
        previous = start
    return numbers


# ---------------------------------------------------------------------------------------------------
# A text one edit away from a checked one: recheck the segment the edit touches


def _edited(base: _Entry, text: str, prefix: int, suffix: int) -> _Entry | None:
    """``text`` checked from ``base``, or None when it must start afresh (an edited ``__future__``,
    or an edit over more than ``_MAX_MERGED`` segments: merged, they would be recompiled as one
    ever after)."""
    old, layout = base.text, base.layout
    old_end, new_end = len(old) - suffix, len(text) - suffix
    delta = new_end - old_end
    first = bisect_right(layout.starts, prefix) - 1
    last = bisect_right(layout.starts, old_end) - 1  # a segment that starts where the edit ends too
    if old_end == prefix == layout.starts[first] and first > 0 and text.endswith("\n", 0, new_end):
        first = last = first - 1  # whole lines inserted before a segment: they end the one before
    first, last, owner, opens = _edited_span(text, layout, first, last, prefix, delta)
    if last - first >= _MAX_MERGED:  # edits far apart (or a whole class): cut afresh, unchanged segments remembered
        return None
    if first == 0 and ("__future__" in old[:_end(old, layout, last)]
                       or "__future__" in text[:_end(old, layout, last) + delta]):
        return None
    line_delta = text.count("\n", prefix, new_end) - old.count("\n", prefix, old_end)
    edited = Layout(layout.starts[:first + 1] + [start + delta for start in layout.starts[last + 1:]],
                    layout.lines[:first + 1] + [line + line_delta for line in layout.lines[last + 1:]],
                    layout.segments[:first] + [Segment(owner, opens, Status.BROKEN, False, False)]
                    + layout.segments[last + 1:],
                    layout.future_flags)
    edited, _ = _settled(text, edited, first, base.filename)
    return _Entry(base.filename, text, edited, tuple(_derived(text, edited, base.filename)))


def _edited_span(text: str, layout: Layout, first: int, last: int, prefix: int,
                 delta: int) -> tuple[int, int, ClassHeader | None, bool]:
    """The segments to merge and recompile, and what the merged one is. Several segments of one class
    body stay a body segment and a class's head stays a head when the edit is past its header;
    otherwise every class involved is taken whole, as one module-level segment. The merged segment
    must begin with a statement at its level, or the segment before it joins in."""
    segments = layout.segments
    while True:
        kind = _span_kind(segments, first, last, layout.starts[first], prefix)
        if kind is None:
            first, last = _whole_classes(segments, first, last)
            kind = None, False
        owner, opens = kind
        indent = owner.indent if owner is not None and not opens else ""
        end = layout.starts[last + 1] + delta if last + 1 < len(segments) else len(text)
        if first == 0 or _begins_statement(text, layout.starts[first], end, indent):
            return first, last, owner, opens
        if indent:
            first, last = _whole_classes(segments, first, last)
        else:
            first -= 1


def _span_kind(segments: list[Segment], first: int, last: int, start: int,
               prefix: int) -> tuple[ClassHeader | None, bool] | None:
    owner = segments[first].owner
    span = segments[first:last + 1]
    if any(segment.owner is not owner for segment in span):
        return None
    if owner is None or not any(segment.opens_class for segment in span):
        return owner, False
    if first == last and prefix >= start + owner.body:  # an edit in the head, past the header
        return owner, True
    return None


def _whole_classes(segments: list[Segment], first: int, last: int) -> tuple[int, int]:
    while segments[first].owner is not None and not segments[first].opens_class:
        first -= 1
    while (last + 1 < len(segments) and segments[last].owner is not None
           and segments[last + 1].owner is segments[last].owner and not segments[last + 1].opens_class):
        last += 1
    return first, last


# ---------------------------------------------------------------------------------------------------
# One segment on its own


_SENTINEL = "_glm5_lsp_segment_end_"


_STATUSES: LRUCache[tuple[Status, CodeType | None]] = LRUCache(2048)  # see ``_status``
_SCOPE_DECLARATION = re.compile(r"\b(?:global|nonlocal)\b")
_CONTINUATION = re.compile(r"(?:else|elif|except|finally)\b")
_FUTURE_FLAGS = functools.reduce(operator.or_, (getattr(__future__, name).compiler_flag
                                                for name in __future__.all_feature_names))


def _settled(text: str, layout: Layout, i: int, filename: str) -> tuple[Layout, CodeType | None]:
    """``layout`` with segment ``i`` checked. A segment that does not parse is tried together with
    the next segments of its kind (an edit can make a decorator or an open string run into the next
    member); the merge is kept if it parses."""
    checked, code = _checked(text, layout, i, filename)
    trial = checked
    for _ in range(_MERGES):
        if trial.segments[i].status is not Status.BROKEN or not _mergeable(trial.segments, i):
            break
        merged = Layout(trial.starts[:i + 1] + trial.starts[i + 2:], trial.lines[:i + 1] + trial.lines[i + 2:],
                        trial.segments[:i + 1] + trial.segments[i + 2:], trial.future_flags)
        trial, trial_code = _checked(text, merged, i, filename)
        if trial.segments[i].status is not Status.BROKEN:
            return trial, trial_code
    return checked, code


def _mergeable(segments: list[Segment], i: int) -> bool:
    if i + 1 >= len(segments) or segments[i].opens_class or segments[i + 1].opens_class:
        return False
    return segments[i].owner is segments[i + 1].owner


def _checked(text: str, layout: Layout, i: int, filename: str) -> tuple[Layout, CodeType | None]:
    status, code = _status(text, layout, i, filename)
    piece = text[layout.starts[i]:_end(text, layout, i)]
    segment = layout.segments[i]._replace(status=status, late_future=i > 0 and "__future__" in piece,
                                          scope_declaration=_scope_declaration(text, layout, i, filename))
    return layout._replace(segments=layout.segments[:i] + [segment] + layout.segments[i + 1:]), code


def _status(text: str, layout: Layout, i: int, filename: str) -> tuple[Status, CodeType | None]:
    """What segment ``i`` gives on its own: a function of its unpadded source and of what it is
    (flags, head or body of which class), so the answers are remembered by those (``_STATUSES``):
    a text cut afresh costs only the segments not seen recently."""
    segment = layout.segments[i]
    source, sentinel = _source(text, layout, i, padded=False)
    owner = segment.owner
    key = (source, sentinel, _flags(layout, i), segment.opens_class,
           None if owner is None else (owner.name, owner.header_lines, owner.body_lines))
    known = _STATUSES.get(key)
    if known is None:
        known = _compute_status(source, sentinel, key[2], segment, filename)
        _STATUSES.put(key, known)
    return known


def _compute_status(source: str, sentinel: bool, flags: int, segment: Segment,
                    filename: str) -> tuple[Status, CodeType | None]:
    if sentinel:
        assert segment.owner is not None
        body_end = len(source) - len(_sentinel_line(segment.owner))
        if source.count(_SENTINEL) != 1 or source.endswith("\\\n", 0, body_end):
            return Status.BROKEN, None  # the sentinel could be taken into a line continuation
    try:
        code = compile(source, filename, "exec", flags, dont_inherit=True)
    except SyntaxError:
        code = None
    if code is not None and not segment.opens_class:
        if sentinel and not _class_code_holds_sentinel(code, segment.owner):
            return Status.BROKEN, None
        return Status.CLEAN, code
    # A head segment is always checked on its tree: its first body line sets the indentation, so a
    # sentinel could land in a nested block at the expected one.
    try:
        tree = pyparse.parse(source, filename, flags=flags)
    except SyntaxError:
        return Status.BROKEN, None
    if sentinel and not _tree_ends_in_class_body(tree, segment):
        return Status.BROKEN, None
    return (Status.CLEAN, code) if code is not None else (Status.COMPILER_ERROR, None)


def _class_code_holds_sentinel(code: CodeType, owner: ClassHeader) -> bool:
    """The class of a body segment's source (its header is line 1) has the sentinel among its names."""
    return any(isinstance(const, CodeType) and const.co_name == owner.name and const.co_firstlineno == 1
               and _SENTINEL in const.co_names for const in code.co_consts)


def _tree_ends_in_class_body(tree: ast.Module, segment: Segment) -> bool:
    owner = segment.owner
    assert owner is not None
    node = tree.body[-1] if tree.body else None
    class_line = owner.header_lines + 1 if segment.opens_class else 1
    if not (isinstance(node, ast.ClassDef) and node.name == owner.name and node.lineno == class_line):
        return False
    if segment.opens_class and _first_line(node.body[0]) != owner.body_lines + 1:
        return False
    last = node.body[-1]
    return (isinstance(last, ast.Assign) and isinstance(last.targets[0], ast.Name)
            and last.targets[0].id == _SENTINEL)


def _first_line(node: ast.stmt) -> int:
    return min([node.lineno] + [decorator.lineno for decorator in getattr(node, "decorator_list", ())])


def _scope_declaration(text: str, layout: Layout, i: int, filename: str) -> bool:
    """Whether segment ``i`` declares a global or nonlocal at module level or in the body of its own
    class, which reaches into other segments (True when it does not parse, so cannot tell)."""
    piece = text[layout.starts[i]:_end(text, layout, i)]
    if ("global" not in piece and "nonlocal" not in piece) or not _SCOPE_DECLARATION.search(piece):
        return False
    source, _ = _source(text, layout, i, padded=False)
    try:
        tree = pyparse.parse(source, filename, flags=_flags(layout, i))
    except SyntaxError:
        return True
    statements = list(tree.body)
    segment = layout.segments[i]
    if segment.owner is not None:
        class_line = segment.owner.header_lines + 1 if segment.opens_class else 1
        classes = [node for node in tree.body if isinstance(node, ast.ClassDef)
                   and node.name == segment.owner.name and node.lineno == class_line]
        if not classes:
            return True
        statements += classes[0].body
    return _has_declaration(statements)


def _has_declaration(statements: list[ast.stmt]) -> bool:
    """A global or nonlocal declaration in the statements' own scope (not in a function or class)."""
    stack: list[ast.AST] = list(statements)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))
    return False


def _source(text: str, layout: Layout, i: int, padded: bool, to_end: bool = False) -> tuple[str, bool]:
    """What segment ``i`` is compiled as (to the end of the text with ``to_end``), and whether a
    sentinel closes it. ``padded``: on the text's line numbers."""
    segment, start = layout.segments[i], layout.starts[i]
    body = text[start:len(text) if to_end else _end(text, layout, i)]
    owner = segment.owner
    sentinel = not to_end and _continues_class(layout.segments, i)
    if sentinel:
        assert owner is not None
        body += _sentinel_line(owner)
    if owner is None or segment.opens_class:
        return "\n" * (layout.lines[i] - 1 if padded else 0) + body, sentinel
    head = i
    while not layout.segments[head].opens_class:
        head -= 1
    header = text[layout.starts[head] + owner.header:layout.starts[head] + owner.body]
    if not padded:
        return header + body, sentinel
    class_line = layout.lines[head] + owner.header_lines
    body_line = layout.lines[head] + owner.body_lines
    return "\n" * (class_line - 1) + header + "\n" * (layout.lines[i] - body_line) + body, sentinel


def _sentinel_line(owner: ClassHeader) -> str:
    return f"{owner.indent}{_SENTINEL} = 0\n"


def _continues_class(segments: list[Segment], i: int) -> bool:
    """Another body segment of the same class follows segment ``i``."""
    return (i + 1 < len(segments) and segments[i].owner is not None
            and segments[i + 1].owner is segments[i].owner and not segments[i + 1].opens_class)


def _end(text: str, layout: Layout, i: int) -> int:
    return layout.starts[i + 1] if i + 1 < len(layout.starts) else len(text)


def _flags(layout: Layout, i: int) -> int:
    return 0 if i == 0 else layout.future_flags or 0


def _first_token_line(text: str, start: int, end: int) -> int | None:
    """Offset of the first line in ``text[start:end]`` that is neither blank nor a comment."""
    line = start
    while line < end:
        eol = text.find("\n", line, end)
        stripped = text[line:end if eol < 0 else eol].lstrip(" \t\f")
        if stripped and not stripped.startswith("#"):
            return line
        if eol < 0:
            return None
        line = eol + 1
    return None


def _begins_statement(text: str, start: int, end: int, indent: str) -> bool:
    """The first token of ``text[start:end]`` begins a line right after ``indent``: a statement at that
    level. At module level a segment of comments only will do; a class body needs a statement."""
    line = _first_token_line(text, start, end)
    if line is None:
        return not indent
    return text.startswith(indent, line) and text[line + len(indent)] not in " \t\f\\"


# ---------------------------------------------------------------------------------------------------
# The whole text's answer from its segments


def _derived(text: str, layout: Layout, filename: str) -> list[Diagnostic]:
    segments = layout.segments
    if layout.future_flags is None or any(segment.late_future for segment in segments):
        return compile_diagnostics(text, filename)
    # With a module- or class-level global/nonlocal the compiler stage cannot be split, but the
    # parser's can: a parse error is found as before, anything else by a full compile.
    scoped = any(segment.scope_declaration for segment in segments)
    k = next((i for i, segment in enumerate(segments) if segment.status is not Status.CLEAN), None)
    if k is None:
        return compile_diagnostics(text, filename) if scoped else []
    if segments[k].status is Status.COMPILER_ERROR:
        if scoped:
            return compile_diagnostics(text, filename)
        if all(segment.status is Status.CLEAN for segment in segments[k + 1:]):
            source, _ = _source(text, layout, k, padded=True)
            return _compile_report(source, filename, _flags(layout, k), text)
    while k > 0 and _continues_statement(text, layout, k):
        k -= 1
    if k == 0:
        return compile_diagnostics(text, filename)
    source, _ = _source(text, layout, k, padded=True, to_end=True)
    if not scoped:
        return _compile_report(source, filename, _flags(layout, k), text)
    try:
        pyparse.parse(source, filename, flags=_flags(layout, k))
    except SyntaxError as exc:
        return [_from_syntax_error(text, exc)]
    return compile_diagnostics(text, filename)


def _continues_statement(text: str, layout: Layout, i: int) -> bool:
    """Segment ``i`` begins with a clause of the statement before it (``else:``, ``except``...)."""
    segment = layout.segments[i]
    indent = segment.owner.indent if segment.owner is not None and not segment.opens_class else ""
    line = _first_token_line(text, layout.starts[i], _end(text, layout, i))
    return line is not None and _CONTINUATION.match(text, line + len(indent)) is not None
