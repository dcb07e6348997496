"""Judge a candidate spliced into its document: only the diagnostics it introduces count.

A file that is already broken elsewhere must not block completions, so the document is checked
with and without the candidate and the two lists are compared. A diagnostic of the document "moves"
with the splice: one before the replaced range keeps its position, one after it shifts by the
length difference (lines and, on the splice's last line, columns). Matching is by
:meth:`Diagnostic.key` (source, code, message with line numbers blanked), in two passes:

1. same key and same position after shifting -- the usual case;
2. same key, different position, and the new diagnostic lies outside the candidate's text -- a
   pre-existing error whose reported position depends on what follows it (Python's "unexpected
   EOF", "'(' was never closed" when the candidate adds lines), matched at most once each.

3. when the document had a syntax error, a non-syntax diagnostic outside the candidate's text is
   the document's: its checker could not see that code before (pyflakes needs a parse), so the
   candidate that repaired the parse merely revealed it.

Tree-sitter's ERROR nodes are matched by source and code only: their extent and first token change
with whatever follows them, so their messages are not stable.

Whatever is left in the spliced document's list is what the candidate introduced.

A one-line Python candidate that ends a block header (``for x in xs:``) where no body follows yet
(the end of the file, or a line no deeper than the header) is judged with a placeholder body
(``...``) under it: the user writes the body next, so its absence is no fault of the candidate, and
the rest of the header is still checked, names included (:func:`with_body_to_come`).
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from glm5_lsp.checks.providers.runner import DiagnosticRunner
from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.indentation import indent_unit
from glm5_lsp.postprocess import open_brackets
from glm5_lsp.pysource import blank

# A compound statement's header: what may end its line with the colon that opens a block.
_COMPOUND = re.compile(r"[ \t]*(?:async[ \t]+)?(?:if|elif|else|for|while|try|except|finally|with|def|class|match|case)\b")


@dataclass(frozen=True)
class Splice:
    """``text`` replacing ``document[start:end]`` (``start == end`` for a plain insertion)."""

    document: str
    start: int
    end: int
    text: str

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end <= len(self.document):
            raise ValueError(f"bad splice range [{self.start}, {self.end}) in a document of {len(self.document)} chars")

    def apply(self) -> str:
        return self.document[: self.start] + self.text + self.document[self.end:]

    def map_offset(self, offset: int) -> int | None:
        """Where a document offset lands in the spliced text; None if the candidate replaced it. The
        start of a replaced range stays where it is: a problem reported at the word the user typed
        (``help=he`` + a newline: "forgot a comma?") is the same problem if it stays at the start of
        the word the candidate writes there (``help``)."""
        if offset < self.start or (offset == self.start < self.end):
            return offset
        if offset >= self.end:
            return offset + len(self.text) - (self.end - self.start)
        return None

    def covers(self, spliced_offset: int) -> bool:
        """Whether an offset of the spliced text falls inside the candidate's own text."""
        return self.start <= spliced_offset < self.start + len(self.text)


class LineIndex:
    """Offset <-> (0-based line, character column) for one text."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = [0]
        newline = text.find("\n")
        while newline != -1:  # (str.find: a character loop costs 20 ms on a 100 KB file, every judgement)
            self.starts.append(newline + 1)
            newline = text.find("\n", newline + 1)

    def offset(self, line: int, col: int) -> int:
        if line >= len(self.starts):
            return len(self.text)
        line_end = self.starts[line + 1] - 1 if line + 1 < len(self.starts) else len(self.text)
        return min(self.starts[line] + col, line_end)

    def position(self, offset: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.starts, offset) - 1
        return line, offset - self.starts[line]


def introduced_diagnostics(before: Sequence[Diagnostic], after: Sequence[Diagnostic],
                           splice: Splice) -> list[Diagnostic]:
    """The diagnostics of the spliced text (``after``) that the document (``before``) did not have."""
    key = _match_key
    doc_index, new_index = LineIndex(splice.document), LineIndex(splice.apply())
    # Pass 1: same key at the shifted position.
    expected: dict[tuple[object, ...], int] = defaultdict(int)
    unmatched_keys: dict[tuple[str, str, str], int] = defaultdict(int)
    for diag in before:
        mapped = splice.map_offset(doc_index.offset(diag.line, diag.col))
        if mapped is None:
            unmatched_keys[key(diag)] += 1
            continue
        expected[(key(diag), new_index.position(mapped))] += 1
    leftover: list[Diagnostic] = []
    for diag in after:
        slot = (key(diag), (diag.line, diag.col))
        if expected[slot] > 0:
            expected[slot] -= 1
        else:
            leftover.append(diag)
    for (old_key, _), count in expected.items():
        unmatched_keys[old_key] += count  # type: ignore[index]
    # Pass 2: a pre-existing problem reported somewhere else, outside the candidate's text.
    # Pass 3: in a document that did not parse, semantic findings outside the candidate are old.
    document_broken = any(is_syntax_error(d) for d in before)
    result: list[Diagnostic] = []
    for diag in leftover:
        inside = splice.covers(new_index.offset(diag.line, diag.col))
        if not inside and unmatched_keys[key(diag)] > 0:
            unmatched_keys[key(diag)] -= 1
        elif not inside and document_broken and not is_syntax_error(diag):
            continue
        else:
            result.append(diag)
    return result


SYNTAX_SOURCES: frozenset[str] = frozenset({"compile", "tree-sitter", "node"})
SYNTAX_CODES: frozenset[str] = frozenset({"invalid-syntax", "SyntaxError", "IndentationError", "TabError"})


def is_syntax_error(diag: Diagnostic) -> bool:
    """Whether a diagnostic says the text does not parse (rather than a semantic problem)."""
    return diag.severity == "error" and (diag.source in SYNTAX_SOURCES or diag.code in SYNTAX_CODES
                                         or diag.code.startswith("E9"))


def _match_key(diag: Diagnostic) -> tuple[str, str, str]:
    if diag.source == "tree-sitter":
        return (diag.source, diag.code, "")
    return diag.key()


@dataclass
class Judgement:
    """A candidate's verdict: what the document had, what the spliced text has, what is new."""

    spliced: str
    before: list[Diagnostic]
    after: list[Diagnostic]
    introduced: list[Diagnostic]
    skipped: list[str] = field(default_factory=list)  # providers that failed on either text

    def blocking(self, severities: Sequence[str] = ("error",)) -> list[Diagnostic]:
        return [d for d in self.introduced if d.severity in severities]


def judge(splice: Splice, runner: DiagnosticRunner, path: str, language: str,
          before: Sequence[Diagnostic] | None = None, before_skipped: Sequence[str] = ()) -> Judgement:
    """Diagnose the spliced text (and the document, unless its ``before`` list is given, with the
    providers that were skipped on it in ``before_skipped``) and compare."""
    skipped: list[str] = list(before_skipped)
    if before is None:
        report = runner.diagnose(splice.document, path, language)
        before, skipped = report.diagnostics, list(report.skipped)
    if language == "python":
        splice = with_body_to_come(splice)
    spliced = splice.apply()
    report = runner.diagnose(spliced, path, language)
    # A provider that failed on one side only would make its findings on the other side look new
    # (or vanish): drop that provider's diagnostics from both sides.
    failed = {entry.split(":", 1)[0] for entry in skipped + report.skipped}
    before_kept = [d for d in before if d.source not in failed]
    after_kept = [d for d in report.diagnostics if d.source not in failed]
    return Judgement(spliced, list(before_kept), after_kept,
                     introduced_diagnostics(before_kept, after_kept, splice),
                     skipped + [s for s in report.skipped if s not in skipped])


def with_body_to_come(splice: Splice) -> Splice:
    """``splice`` with a placeholder body (``...``, one level deeper) after its text where that text is
    one line ending a compound statement's header and nothing indented under it follows; otherwise
    ``splice`` itself."""
    text, document = splice.text, splice.document
    if "\n" in text or not text.rstrip().endswith(":"):
        return splice
    line_end = document.find("\n", splice.end)
    line_end = len(document) if line_end < 0 else line_end
    if document[splice.end:line_end].strip():
        return splice  # the line goes on after the candidate
    line = document[document.rfind("\n", 0, splice.start) + 1: splice.start] + text
    code = blank(line).rstrip()
    if not code.endswith(":") or not _COMPOUND.match(code) or open_brackets(code, "python"):
        return splice
    indent = line[: len(line) - len(line.lstrip(" \t"))]
    for below in document[line_end + 1:].split("\n"):
        if below.strip():
            if len(below) - len(below.lstrip(" \t")) > len(indent):
                return splice  # its body is there
            break
    return Splice(document, splice.start, splice.end, f"{text}\n{indent}{indent_unit(document)}...")
