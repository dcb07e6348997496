"""Style consistency: a candidate follows the file's naming, quote and comment conventions.

:func:`detect_style` reads the document: for each kind of name (functions, variables, classes)
the majority case among names that show one (``snake_case`` vs ``camelCase``; a one-word
lowercase name shows neither), the majority quote character of plain string literals, and
whether line comments put a space after the marker. A convention needs ``min_votes`` examples and
a ``min_share`` majority, otherwise it is not enforced.

:meth:`StyleProfile.fix` repairs what is safe to repair mechanically (Python): quotes of plain
literals that contain neither quote character nor a backslash, and the space after ``#``.
:meth:`StyleProfile.violations` lists what remains (names defined against the convention cannot be
renamed safely: the candidate is ranked down instead, ``RepairLoop(penalties=...)``).
"""

from __future__ import annotations

import io
import re
import threading
import tokenize
from collections import Counter
from dataclasses import dataclass, field

from glm5_lsp.pysource import HEADER_LINE

_JS_FUNCTION = re.compile(r"^[ \t]*function[ \t]+([A-Za-z_$][\w$]*)", re.MULTILINE)
_ASSIGN = re.compile(r"^[ \t]*(?:(?:let|const|var)[ \t]+)?([A-Za-z_]\w*)[ \t]*(?::[^=\n]+)?=(?!=)", re.MULTILINE)
_SIMPLE_STRING = re.compile(r"""(?<![\w'"])([rRbBuUfF]{0,2})('([^'"\\\n]*)'|"([^'"\\\n]*)")""")
_COMMENT_MARKERS = {"python": "#"}


def name_case(name: str) -> str | None:
    """``snake``, ``camel``, ``pascal``, ``upper`` or None for a name that shows no convention."""
    core = name.strip("_")
    if not core or not re.search(r"[A-Za-z]", core):
        return None
    if core.isupper() and "_" in core:
        return "upper"
    if re.fullmatch(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+", core):
        return "snake"
    if re.fullmatch(r"[a-z][a-z0-9]*(?:[A-Z][a-z0-9]*)+", core):
        return "camel"
    if re.fullmatch(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+|[A-Z][a-z0-9]+", core):
        return "pascal"
    if re.fullmatch(r"[A-Z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+", core):
        return "snake"  # Capitalised_snake: counted with snake
    return None


def defined_names(code: str) -> dict[str, list[str]]:
    """Names the code defines, by kind: ``function``, ``class``, ``variable``."""
    headers = [(m.start(), m.group("kind"), m.group("name")) for m in HEADER_LINE.finditer(code)]
    functions = sorted([(at, name) for at, kind, name in headers if kind == "def"]
                       + [(m.start(), m.group(1)) for m in _JS_FUNCTION.finditer(code)])
    return {
        "function": [name for _, name in functions],
        "class": [name for _, kind, name in headers if kind == "class"],
        "variable": [n for n in _ASSIGN.findall(code) if not n.isupper()],  # CONSTANTS are their own case
    }


@dataclass
class StyleProfile:
    naming: dict[str, str] = field(default_factory=dict)  # kind -> "snake"/"camel"/"pascal"
    quote: str | None = None  # "'" or '"'
    comment_space: bool | None = None  # "# note" (True) vs "#note" (False)
    language: str = "python"

    def violations(self, code: str) -> list[str]:
        """What ``code`` does against the profile (one readable line each)."""
        found: list[str] = []
        for kind, names in defined_names(code).items():
            want = self.naming.get(kind)
            for name in names:
                case = name_case(name)
                if want and case and case != want and case != "upper":
                    found.append(f"{kind} name {name!r} is {case} case; this file uses {want} case")
        if self.quote:
            other = '"' if self.quote == "'" else "'"
            for _, literal, _, _ in _SIMPLE_STRING.findall(_strip_comments(code, self.language)):
                if literal.startswith(other) and self.quote not in literal[1:-1]:
                    found.append(f"string {literal} uses {other}; this file uses {self.quote}")
        if self.comment_space is not None and self.language in _COMMENT_MARKERS:
            for comment in _comments(code):
                body = comment[1:]
                if body and not body.startswith("!") and body[:1].isspace() != self.comment_space:
                    found.append(f"comment {comment[:20]!r} does not follow the file's '# ' spacing")
        return found

    def fix(self, code: str) -> str:
        """Mechanically safe fixes (Python): quotes of plain literals, comment spacing."""
        if self.language != "python":
            return code
        tokens = _tokens(code)
        if tokens is None:
            return code
        lines = code.split("\n")
        edits: list[tuple[int, int, int, str]] = []  # (row, col_start, col_end, replacement)
        for tok in tokens:
            (row, col), (end_row, end_col) = tok.start, tok.end
            if row != end_row:
                continue
            if tok.type == tokenize.STRING and self.quote:
                fixed = _requote(tok.string, self.quote)
                if fixed != tok.string:
                    edits.append((row - 1, col, end_col, fixed))
            elif tok.type == tokenize.COMMENT and self.comment_space is True:
                body = tok.string[1:]
                if body and not body[:1].isspace() and not body.startswith("!"):
                    edits.append((row - 1, col, end_col, "# " + body))
        for row, start, end, text in sorted(edits, reverse=True):
            lines[row] = lines[row][:start] + text + lines[row][end:]
        return "\n".join(lines)


def _requote(literal: str, quote: str) -> str:
    match = re.fullmatch(r"([rRbBuUfF]{0,2})(['\"])(.*)\2", literal, re.DOTALL)
    if match is None:
        return literal
    prefix, current, body = match.groups()
    if current == quote or literal.endswith(current * 3) or "\\" in body or "'" in body or '"' in body:
        return literal
    if "f" in prefix.lower() and "{" in body:
        return literal  # nested expressions may hold quotes
    return f"{prefix}{quote}{body}{quote}"


def _tokens(code: str) -> list[tokenize.TokenInfo] | None:
    """Python tokens of a fragment, up to the point where it stops tokenizing."""
    found: list[tokenize.TokenInfo] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            found.append(tok)  # noqa: PERF402 -- keep the tokens read before a TokenError
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return found


def _comments(code: str) -> list[str]:
    return [t.string for t in (_tokens(code) or []) if t.type == tokenize.COMMENT]


def _strip_comments(code: str, language: str) -> str:
    marker = _COMMENT_MARKERS.get(language, "//")
    out = []
    for line in code.split("\n"):
        cut = line.find(marker)
        out.append(line if cut == -1 or line[:cut].count('"') % 2 or line[:cut].count("'") % 2 else line[:cut])
    return "\n".join(out)


def _majority(votes: Counter[str], min_votes: int, min_share: float) -> str | None:
    total = sum(votes.values())
    if total < min_votes:
        return None
    winner, count = votes.most_common(1)[0]
    return winner if count / total >= min_share else None


def detect_style(document: str, language: str = "python", min_votes: int = 3, min_share: float = 0.7) -> StyleProfile:
    """The document's conventions (see the module docstring)."""
    profile = StyleProfile(language=language)
    for kind, names in defined_names(document).items():
        votes = Counter(c for c in map(name_case, names) if c and c != "upper")
        convention = _majority(votes, min_votes, min_share)
        if convention:
            profile.naming[kind] = convention
    quotes = Counter(lit[0] for _, lit, _, _ in _SIMPLE_STRING.findall(_strip_comments(document, language)))
    profile.quote = _majority(quotes, min_votes, min_share)
    if language in _COMMENT_MARKERS:
        spacing = Counter(str(c[1:2].isspace()) for c in _comments(document) if len(c) > 1 and c[1] != "!")
        verdict = _majority(spacing, min_votes, min_share)
        profile.comment_space = None if verdict is None else verdict == "True"
    return profile


class StyleConsistency:
    """Repair-loop hooks: ``rewrite`` (:meth:`StyleProfile.fix`) and ``penalty`` (the number of style
    breaks left), each reading the conventions of the target's document (cached for the last one).
    Thread-safe: a file's conventions may be read ahead (a warm-up thread) while a request reads them."""

    def __init__(self, min_votes: int = 3, min_share: float = 0.7) -> None:
        self.min_votes = min_votes
        self.min_share = min_share
        self._last: tuple[int, str, StyleProfile] | None = None
        self._by_path: dict[tuple[str, str], tuple[int, StyleProfile]] = {}
        self._lock = threading.Lock()

    def profile(self, document: str, language: str, path: str = "") -> StyleProfile:
        """The document's conventions. For a named file, kept while its size stays within
        ``_drift`` of the size they were read at: a few keystrokes do not change a majority, and
        reading a 2,500-line file's conventions costs tens of milliseconds."""
        with self._lock:  # read outside it: a warm-up's reading of one file holds up no request
            if path:
                known = self._by_path.get((path, language))
                if known is not None and abs(len(document) - known[0]) <= _drift(known[0]):
                    return known[1]
            last = self._last
        key = hash(document)  # not for a file already read: a new text's hash reads all of it
        if last is not None and last[:2] == (key, language):
            profile = last[2]
        else:
            profile = detect_style(document, language, self.min_votes, self.min_share)
        with self._lock:
            self._last = (key, language, profile)
            if path:
                if len(self._by_path) >= 256:
                    self._by_path.pop(next(iter(self._by_path)))
                self._by_path[(path, language)] = (len(document), profile)
        return profile

    def rewrite(self, candidate: str, target: object) -> str | None:
        profile = self._profile_of(target)
        fixed = profile.fix(candidate)
        return fixed if fixed != candidate else None

    def penalty(self, candidate: str, target: object) -> int:
        return len(self._profile_of(target).violations(candidate))

    def _profile_of(self, target: object) -> StyleProfile:
        return self.profile(target.document, target.language, getattr(target, "path", "") or "")  # type: ignore[attr-defined]


def _drift(size: int) -> int:
    """How far a named file's size may move before its conventions are read again."""
    return max(64, size // 100)
