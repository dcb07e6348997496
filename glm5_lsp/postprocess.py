"""Completion post-processing: the one implementation of each rule, shared by every front end.

Pure text functions, no model, no LSP types. :meth:`glm5_lsp.pipeline.Pipeline.postprocess` runs
them on every model candidate before the repair loop judges it; the language server's
``indentation.py`` re-expresses multi-line text in the document's indentation unit (``PipelineSettings.reindent``).

Rules, in the order :func:`tidy` and the pipeline apply them:

- special tokens (:func:`strip_special_tokens`): cut at an end-of-text or FIM token, drop the rest;
- stop strings, then the block end for multi-line (:func:`cut_at_block_end`) or the first line
  for single-line (:func:`first_line`) -- the pipeline's, since only it knows the stops;
- text that fits the cursor (:func:`fit_cursor`): in the middle of a line no leading run of
  spaces or tabs (one space where the language wants one: after ``=`` or ``,``, between words;
  none after ``.`` or ``(``); on an empty indented line the indent not repeated; a multi-line text
  whose later lines all sit deeper than its first, with nothing opened to explain it, brought back
  to the block's indentation;
- text that repeats what follows the cursor (:func:`strip_suffix_overlap`);
- brackets balanced against the code before the cursor (:func:`balance_brackets`);
- a bracket the user opened on the cursor's line not left open (:func:`close_line_brackets`): a
  comment that would swallow the rest of the line is cut, and a line with nothing after the cursor
  gets its closers;
- no comma ending a Python line outside every bracket (:func:`drop_statement_comma`);
- trailing whitespace (:func:`trim_trailing_space`).

Every bracket count skips strings and comments by the same rules: :func:`code_chars` walks the
text a character at a time; :func:`_brackets` and the bracket counts built on it find the same
strings, comments and brackets with one compiled regular expression a language family, so that
the regex engine, not Python, steps over the plain code between them.
"""

from __future__ import annotations

import re
import string
from collections.abc import Generator, Iterator

from glm5_lsp.pysource import open_triple_quote

# Special token strings of the GLM-5 code tokenizer; none of them may reach the user.
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>")
# Tokens that end a completion: end-of-text and FIM markers, ours and other tokenizers' spellings.
_END_TOKEN = re.compile(r"<\|(?:endoftext|end[a-z_]*|code_(?:prefix|suffix|middle)|fim_[a-z]+)\|>|<(?:fim|FIM)_[a-z]+>")
# Any other special token is dropped where it stands.
_SPECIAL_RE = re.compile(r"<\|[A-Za-z0-9_]+\|>")

OPENERS = {"(": ")", "[": "]", "{": "}"}
CLOSERS = {v: k for k, v in OPENERS.items()}
# Line-comment markers per language; a language not named here uses "//". ``None`` (unknown): both.
LINE_COMMENTS: dict[str, str] = {"python": "#", "ruby": "#", "shell": "#", "bash": "#", "r": "#", "perl": "#"}
# Yielded by code_chars at the start of a comment (never a real character: it is two long).
COMMENT = "#comment"
# How much text before the cursor is scanned for brackets that are still open.
_SCAN_CHARS = 4000
# At most this much text before the cursor is read by a rule that must see every bracket still open
# (a rare one: one regex pass over 200,000 characters takes about 2 ms).
_WHOLE_PREFIX_CHARS = 200_000
_QUOTE_LOOKBACK = 64_000  # before the scanned window: enough to tell whether it starts inside a docstring
IDENTIFIER_CHARS = string.ascii_letters + string.digits + "_"


def trailing_identifier(text: str) -> str:
    """The identifier ``text`` ends with ("" if none), read from the end: a regex search for a word
    at the end of a long text tries every start in it."""
    return text[len(text.rstrip(IDENTIFIER_CHARS)):].lstrip(string.digits)


# What may start the rest of the cursor's line and be re-typed by a completion.
_CLOSING_RUN = re.compile(r"[\)\]\}\"'`;,:]+")
# Languages whose blocks are delimited by braces.
BRACE_LANGUAGES = frozenset({"javascript", "typescript", "tsx", "go", "rust", "c", "cpp", "java"})


# ---- special tokens and lines -------------------------------------------------------------


def strip_special_tokens(text: str) -> str:
    """Cut at the first end-of-text or FIM token and drop any other ``<|...|>`` special token."""
    match = _END_TOKEN.search(text)
    return _SPECIAL_RE.sub("", text[: match.start()] if match else text)


# A short piece with a letter in it, said five or more times in a row at the end (``_to_to_to_to_to``,
# ``PPPPPPPPPP``, ``ssionssionssion...``): a small model stuck in a loop, never code worth the wait.
_STUCK = re.compile(r"(?=.{0,8}[A-Za-z])(.{1,8}?)\1{4,}$", re.DOTALL)
# The same with a longer piece inside one line (`` = __name__`` again and again). Not across lines:
# five short lines alike (``    None,``) are a data table as often as a loop. Over 3.3 million line
# ends of the installed packages (with and without the newline) it matches nowhere _STUCK does not.
_STUCK_IN_LINE = re.compile(r"(?=[^\n]{0,16}[A-Za-z])([^\n]{9,16}?)\1{4,}$")


def repetition_start(text: str, window: int = 80) -> int | None:
    """Where a degenerate repetition at the end of ``text`` begins (after its first occurrence), or
    None. Only the last ``window`` characters are looked at; the repeated run must be 10 or more."""
    tail_start = max(0, len(text) - window)
    match = _STUCK.search(text, tail_start) or _STUCK_IN_LINE.search(text, tail_start)
    if match is None or len(match.group(0)) < 10:
        return None
    return match.start() + len(match.group(1))


def first_line(text: str) -> str:
    """A single-line completion: everything before the first newline."""
    return text.split("\n", 1)[0].rstrip("\r")


def cut_at_stops(text: str, stops: list[str] | tuple[str, ...]) -> str:
    """Everything before the first stop string."""
    for stop in stops:
        at = text.find(stop)
        if at != -1:
            text = text[:at]
    return text


def block_indent(prefix: str) -> int:
    """Indentation (columns) of the block the cursor writes into, judged from the text before it."""
    lines = prefix.split("\n")
    current = lines[-1]
    if current.strip():
        return len(current) - len(current.lstrip())
    for line in reversed(lines[:-1]):
        if line.strip():
            indent = len(line) - len(line.lstrip())
            if line.rstrip().endswith((":", "{", "(", "[")):
                return max(len(current), indent + 1)
            return max(len(current), indent) if current else indent
    return len(current)


def cut_at_block_end(text: str, prefix: str, language: str) -> str:
    """Cut a multi-line completion where it leaves the cursor's block.

    Indentation languages (Python, and any language not known to use braces): at the first
    non-blank line, after the cursor's line, indented less than the block. Brace languages: where
    a closing brace (outside strings and comments) would close a block opened before the cursor.
    """
    if language not in BRACE_LANGUAGES:
        indent = block_indent(prefix)
        pieces = text.split("\n")
        kept = [pieces[0]]
        for line in pieces[1:]:
            if line.strip() and len(line) - len(line.lstrip()) < indent:
                break
            kept.append(line)
        return "\n".join(kept).rstrip() if len(kept) < len(pieces) else "\n".join(kept)
    depth = 0
    for at, char in _brackets(text, language):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth < 0:
                return text[:at].rstrip()
    return text


# ---- the bracket scanner ----------------------------------------------------------------------


def _family(language: str | None) -> tuple[tuple[str, ...], bool, bool]:
    """The scanner's rules for ``language``: its line-comment markers, whether ``/* */`` is a
    comment, whether triple quotes open a string."""
    if language is None:
        return ("#", "//"), False, True
    marker = LINE_COMMENTS.get(language, "//")
    return (marker,), marker == "//", language == "python"


def code_chars(text: str, language: str | None = None) -> Iterator[tuple[int, str]]:
    """``(index, char)`` for every character of ``text`` outside strings and comments.

    Strings: ``"``, ``'`` and backquotes, with backslash escapes; a one-quote string ends at the
    line end (unterminated). Triple quotes in Python (and when ``language`` is ``None``). Comments:
    the language's line comment (``#`` or ``//``; both when ``language`` is ``None``) and, for
    ``//`` languages, ``/* ... */``. A comment's start is yielded once as ``(index, COMMENT)``.
    """
    yield from _scan(text, language)


def _scan(text: str, language: str | None) -> Generator[tuple[int, str], None, str]:
    """:func:`code_chars`'s scanner; returns where the text ends: ``"code"``, ``"string"`` or ``"comment"``."""
    line_comments, block_comments, triple = _family(language)
    quote = ""
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if text.startswith(quote, i):
                i += len(quote)
                quote = ""
                continue
            if ch == "\n" and len(quote) == 1:
                quote = ""  # an unterminated one-line string: the line ends it, badly
            i += 1
            continue
        if ch in "\"'`":
            quote = text[i:i + 3] if triple and text.startswith(ch * 3, i) else ch
            i += len(quote)
            continue
        if block_comments and text.startswith("/*", i):
            yield i, COMMENT
            end = text.find("*/", i + 2)
            if end == -1:
                return "comment"
            i = end + 2
            continue
        if any(text.startswith(marker, i) for marker in line_comments):
            yield i, COMMENT
            end = text.find("\n", i)
            if end == -1:
                return "comment"
            i = end
            continue
        yield i, ch
        i += 1
    return "string" if quote else "code"


# The regex twins of _scan's strings, ``Q`` standing for the quote and ``END`` for the end of the
# text. Inside, a backslash takes the next character whatever it is (or ends the text); a
# one-quote string ends at its quote, at a line end (taken with it) or at the end of the text; a
# triple-quoted one at three quotes or at the end. Written as unrolled loops, so that the greedy
# first try is _scan's own reading and always matches: no backtracking.
_TRIPLE_STRING = r"QQQ[^Q\\]*(?:(?:\\.?|Q(?!QQ))[^Q\\]*)*(?:QQQ|END)"
_ONE_QUOTE_STRING = r"Q[^Q\\\n]*(?:\\.?[^Q\\\n]*)*(?:[Q\n]|END)"


def _skip_alternatives(language: str | None, end: str) -> list[str]:
    """The alternatives for what ``language``'s scanner skips (strings, then comments), in
    _scan's order; ``end`` is the end of the text where a string or comment runs into it."""
    line_comments, block_comments, triple = _family(language)
    strings = [_TRIPLE_STRING, _ONE_QUOTE_STRING] if triple else [_ONE_QUOTE_STRING]
    alternatives = [pattern.replace("Q", quote).replace("END", end) for quote in "\"'`" for pattern in strings]
    if block_comments:
        alternatives.append(r"/\*(?:.*?\*/|.*" + end + ")")
    alternatives += [re.escape(marker) + r"[^\n]*" + ("" if end == r"\Z" else "(?:" + end + ")?")
                     for marker in line_comments]
    return alternatives


# Per language family: strings, comments and brackets, each alternative starting with a plain
# character so that the engine's search jumps from one possible start to the next.
_BRACKET_TOKENS: dict[tuple[tuple[str, ...], bool, bool], re.Pattern[str]] = {}
# Per language family: strings and comments, with an empty group that takes part only where one
# runs into the end of the text unclosed.
_END_TOKENS: dict[tuple[tuple[str, ...], bool, bool], re.Pattern[str]] = {}


def _bracket_tokens(language: str | None) -> re.Pattern[str]:
    family = _family(language)
    pattern = _BRACKET_TOKENS.get(family)
    if pattern is None:
        alternatives = _skip_alternatives(language, r"\Z") + [re.escape(bracket) for bracket in "()[]{}"]
        pattern = _BRACKET_TOKENS[family] = re.compile("|".join(alternatives), re.DOTALL)
    return pattern


def _end_tokens(language: str | None) -> re.Pattern[str]:
    family = _family(language)
    pattern = _END_TOKENS.get(family)
    if pattern is None:
        pattern = _END_TOKENS[family] = re.compile("|".join(_skip_alternatives(language, r"(\Z)")), re.DOTALL)
    return pattern


def _brackets(text: str, language: str | None = None) -> Iterator[tuple[int, str]]:
    """``(index, bracket)`` for every bracket :func:`code_chars` yields, found by regex."""
    for match in _bracket_tokens(language).finditer(text):
        token = match.group()
        if token in OPENERS or token in CLOSERS:
            yield match.start(), token


def ends_in_code(text: str, language: str | None = None) -> bool:
    """Whether the end of ``text`` is code: not inside a string or a comment (:func:`_scan`'s
    rules, read by regex: the last string or comment is the one that may run into the end)."""
    last = None
    for last in _end_tokens(language).finditer(text):
        pass
    return last is None or last.lastindex is None


def open_brackets(text: str, language: str | None = None) -> list[str]:
    """The brackets still open at the end of ``text`` (a mismatched closer unwinds to its opener)."""
    stack: list[str] = []
    for token in _bracket_tokens(language).findall(text):
        if token in OPENERS:
            stack.append(token)
        elif token in CLOSERS:
            opener = CLOSERS[token]
            if stack and stack[-1] == opener:
                stack.pop()
            elif opener in stack:
                while stack and stack.pop() != opener:
                    pass
    return stack


def bracket_depth(text: str, language: str | None = None) -> int:
    """Openers less closers in ``text``, outside strings and comments (< 0: it closes more)."""
    depth = 0
    for token in _bracket_tokens(language).findall(text):
        if token in OPENERS:
            depth += 1
        elif token in CLOSERS:
            depth -= 1
    return depth


def _own_open(text: str, language: str | None) -> int:
    """How many brackets ``text`` opens and leaves open (closers of earlier brackets ignored)."""
    own = 0
    for token in _bracket_tokens(language).findall(text):
        if token in OPENERS:
            own += 1
        elif token in CLOSERS and own:
            own -= 1
    return own


# ---- text after the cursor -----------------------------------------------------------------


def drop_double_space(text: str, prefix: str) -> str:
    """No second space when the cursor already follows one on a line of code (``x = |``)."""
    line_before = prefix.rsplit("\n", 1)[-1]
    if line_before.strip() and line_before.endswith(" ") and text.startswith(" "):
        return text.lstrip(" ")
    return text


# Words after which an opening bracket starts an expression of its own (``return (a, b)``), not a call.
_KEYWORDS = frozenset({
    "and", "as", "assert", "async", "await", "case", "del", "elif", "else", "except", "for", "from", "global",
    "if", "import", "in", "is", "lambda", "match", "nonlocal", "not", "or", "raise", "return", "while", "with",
    "yield", "const", "let", "var", "new", "typeof", "void", "throw", "delete", "instanceof", "of",
})
_OPERATOR_CHARS = "=+-*/%<>|&^!~"
_KWARG = re.compile(r"[(,]\s*\**[A-Za-z_]\w*=$")  # ``f(a=``: PEP 8 puts no spaces around a keyword's ``=``


def _unary_position(before: str) -> bool:
    """Whether an operator at the end of ``before`` (already cut off it) starts an operand: after an
    opener, a comma, another operator, a keyword or nothing (``f(-``, ``x = -``, ``return -``)."""
    head = before.rstrip()
    if not head or head[-1] in "([{,:;" or head[-1] in _OPERATOR_CHARS:
        return True
    return trailing_identifier(head) in _KEYWORDS


def wants_space(line_before: str, text: str, language: str | None = None) -> bool:
    """Whether ``text``, inserted after ``line_before`` (code before the cursor on its line), should
    start with a space: the language's spacing between the two, not the model's whitespace.

    None after a space, after an opener or a dot, before a closer, a comma, a dot or a colon, in a
    keyword argument (``f(a=``), after a unary operator, between an operator and the rest of it
    (``+`` and ``=``), before a call's or subscript's bracket; one between two words, after ``,``,
    after ``=`` and the binary operators, after a dict's or annotation's ``:`` (not a slice's).
    """
    if not line_before or not text or line_before[-1].isspace() or text[0].isspace():
        return False
    last, first = line_before[-1], text[0]
    if first in ")]},;.:" or last in "([{.@~\\":
        return False
    if first == "#":
        return True
    if last in _OPERATOR_CHARS and first in _OPERATOR_CHARS:
        return False  # one operator being finished (``+=``, ``==``, ``**``, ``->``)
    if first in "([":
        word = trailing_identifier(line_before)
        if word:  # a call or subscript (``f(``, ``x[``), or a keyword's operand (``return (``)
            return word in _KEYWORDS
        return last not in ")]\"'"
    if last == ",":
        return True
    if last == "=":
        return not (_KWARG.search(line_before) and open_brackets(line_before, language)[-1:] == ["("])
    if last == ":":
        return open_brackets(line_before, language)[-1:] != ["["]
    if last in _OPERATOR_CHARS:
        # not after a unary operator: ``-1``, ``f(*args``, ``**kwargs``
        return not (last in "+-*" and _unary_position(line_before[:-1].rstrip("*")))
    return True  # two words, a word and an operator, a closer and what follows it


def _block_opener(line: str, language: str | None) -> bool:
    """Whether a line of code ends by opening a block (``:`` in Python, ``{`` elsewhere)."""
    code = "".join(ch for _, ch in code_chars(line, language) if ch != COMMENT).rstrip()
    return code.endswith(":" if language not in BRACE_LANGUAGES else "{")


def fit_cursor(text: str, prefix: str, language: str | None = None) -> str:
    """The start of ``text`` fitted to where the cursor is on its line.

    In the middle of a line (code before the cursor): no leading run of spaces or tabs; one space
    where :func:`wants_space` says so, added too where the model wrote none after ``,`` or an
    assignment's ``=``. On an empty indented line (only indentation before the cursor): the
    indentation is not written again; only a cursor short of the block a line before it opens
    (``if x:`` above, the cursor at the ``if``'s own indentation or less) keeps the model's. Then a
    multi-line text whose later lines all sit deeper than the cursor though its first line opens
    nothing (no block, no bracket) is moved back so they line up with it.
    """
    if not text:
        return text
    line_before = prefix.rsplit("\n", 1)[-1]
    first = text.split("\n", 1)[0]
    lead = first[: len(first) - len(first.lstrip(" \t"))]
    if line_before.strip():  # the middle of a line
        body = text[len(lead):]
        if lead:
            if body[:1] in ("", "\n"):
                return body
            return (" " if wants_space(line_before, body, language) else "") + body
        last = line_before[-1]
        if (last == "," or (last == "=" and line_before[-2:-1] not in tuple(_OPERATOR_CHARS))) and \
                wants_space(line_before, text, language) and text[0] not in _OPERATOR_CHARS:
            return " " + text
        return text
    if not line_before:  # the start of a line: the text's own indentation is the line's
        return text
    width = len(line_before.expandtabs(4))
    if lead and not _short_of_block(prefix, width, language):
        text = text[len(lead):]
    return _realign(text, line_before, language)


def _short_of_block(prefix: str, width: int, language: str | None) -> bool:
    """Whether an indented cursor at ``width`` columns sits short of the block the previous line of
    code opens (so the model's own indentation is what the line needs)."""
    for line in reversed(prefix.split("\n")[:-1][-50:]):
        if not line.strip() or line.lstrip().startswith(("#", "//")):
            continue
        return _block_opener(line, language) and len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip()) >= width
    return False


def _realign(text: str, line_before: str, language: str | None) -> str:
    """Later lines of ``text`` (written after ``line_before``'s indentation) that all sit deeper than
    it though its first line opens nothing are moved back to its column."""
    lines = text.split("\n")
    if len(lines) < 2 or lines[0].strip() == "" or (language in BRACE_LANGUAGES):
        return text
    head = lines[0]
    if _block_opener(head, language) or open_brackets(head, language) or _ends_in_string(head, language):
        return text
    indent = len(line_before)
    widths = [len(line) - len(line.lstrip(" \t")) for line in lines[1:] if line.strip()]
    if not widths or min(widths) <= indent:
        return text
    shift = min(widths) - indent
    return "\n".join([head] + [line[shift:] if line.strip() else line for line in lines[1:]])


def _ends_in_string(text: str, language: str | None) -> bool:
    """Whether ``text`` ends inside a string (a comment at its end is fine)."""
    scan = _scan(text, language)
    while True:
        try:
            next(scan)
        except StopIteration as end:
            return end.value == "string"


_DANGLING = re.compile(r"[\s,+\-*/%=<>&|^~.:@]+$")


def close_line_brackets(text: str, prefix: str, suffix: str, language: str | None = None) -> str:
    """A bracket the user opened on the cursor's line is not left open by ``text``.

    When the brackets opened before the cursor on its line are still open after the text and the
    rest of the line: a comment the text starts (which would swallow them) is cut off, and if
    nothing follows the cursor on its line, the text gets their closers (after its own code; ""
    if no code is left). The rest of the line closing them (an editor's auto-close) is enough.
    """
    line_before = prefix.rsplit("\n", 1)[-1]
    if not text or not line_before.strip():
        return text
    mine = open_brackets(line_before, language)
    if not mine:
        return text
    rest = suffix.split("\n", 1)[0]
    left = open_brackets(line_before + text + "\n" + rest if "\n" in text else line_before + text + rest, language)
    if len(left) < len(mine) or left[: len(mine)] != mine:
        return text  # closed (or mismatched: balance_brackets' business)
    comment = next((at for at, ch in code_chars(text, language) if ch == COMMENT), None)
    if comment is not None:
        text = text[:comment].rstrip()
        if not text.strip():
            return ""
    if rest.strip() or "\n" in text:
        return text
    still = open_brackets(line_before + text, language)
    if still[: len(mine)] != mine:
        return text
    text = _DANGLING.sub("", text)  # an operator or a comma with nothing after it is no argument
    if not text.strip():
        return ""
    return text + "".join(OPENERS[b] for b in reversed(still[: len(mine)]))


def strip_suffix_overlap(text: str, suffix: str, at_line_start: bool = False, language: str | None = None) -> str:
    """Remove what the completion repeats of the code after the cursor.

    The rest of the cursor's line: the completion's end is cut where it re-types all of it
    (``print(|"done")`` completed as ``"all " + "done")``), a leading run of closing characters
    (``)``, ``"]``, ``;``), or -- when it closes more brackets than it opens -- any start of it;
    never so that a bracket the completion opened is left open (``bar()`` before ``)`` stays).
    The following lines: a completion that runs on into the suffix's first non-blank line is cut
    before it. ``at_line_start``: the cursor is at the start of a line, so the suffix's first line
    is a whole line of code after the completion rather than the rest of the cursor's line.
    """
    if not suffix or not text:
        return text
    rest_of_line = "" if at_line_start else suffix.split("\n", 1)[0]
    stripped = rest_of_line.strip()
    if stripped:
        body = text.rstrip()
        candidates = [stripped]
        closing = _CLOSING_RUN.match(rest_of_line)
        if closing:
            run = closing.group(0)
            candidates += [run[:size] for size in range(len(run), 0, -1)]
        if bracket_depth(text, language) < 0:
            candidates += [rest_of_line[:size] for size in range(len(rest_of_line), 0, -1)]
        for repeat in candidates:
            if repeat and body.endswith(repeat) and len(body) > len(repeat) \
                    and _own_open(body[: -len(repeat)], language) == 0:
                text = body[: -len(repeat)]
                break
    following = suffix.split("\n") if not stripped else suffix.split("\n")[1:]
    next_line = next((line.strip() for line in following if line.strip()), None)
    if next_line:
        lines = text.split("\n")
        for index in range(0 if at_line_start else 1, len(lines)):
            if lines[index].strip() == next_line:
                return "\n".join(lines[:index]).rstrip()
    return text


def balance_brackets(text: str, prefix: str, language: str | None = None, suffix: str = "") -> str:
    """Cut ``text`` at a closer that matches nothing open, and close what it leaves open.

    A closer is allowed when it matches a bracket opened in ``text`` or still open in ``prefix``.
    Brackets the completion opened and left open get their closers appended: closers already
    after the cursor belong to brackets opened before it (an editor's auto-close). Not where the
    text ends inside a string or a comment: a closer there would be part of it. Nor where the code
    after the cursor (``suffix``) closes every bracket then open, the completion's with the right
    closers first: the call goes on on the lines below (``raise ValueError(`` before an indented
    message and a lone ``)``).
    """
    stack = open_brackets(_scan_window(prefix, language), language)
    own: list[str] = []  # brackets opened by the completion itself, still open
    for i, ch in _brackets(text, language):
        if ch in OPENERS:
            stack.append(ch)
            own.append(ch)
        elif ch in CLOSERS:
            if not stack or stack[-1] != CLOSERS[ch]:
                return text[:i].rstrip(" ,")
            stack.pop()
            if own:
                own.pop()
    if own and not ends_in_code(text, language):
        return text  # it ends inside a string it opened (a docstring's first line) or a comment
    if own and suffix and _closed_after(stack, suffix, language):
        return text
    return text + "".join(OPENERS[b] for b in reversed(own))


def _closed_after(stack: list[str], suffix: str, language: str | None) -> bool:
    """Whether the code in ``suffix`` (its first ``_SCAN_CHARS`` characters) closes all of ``stack``
    (the brackets open at its start, innermost last), each with its own closer."""
    wanted = [OPENERS[b] for b in reversed(stack)]
    depth: list[str] = []  # brackets the suffix opens itself
    found = 0
    for _, ch in _brackets(suffix[:_SCAN_CHARS], language):
        if ch in OPENERS:
            depth.append(ch)
        elif depth:
            if depth.pop() != CLOSERS[ch]:
                return False  # mismatched code below: no telling what it closes
        else:
            if ch != wanted[found]:
                return False
            found += 1
            if found == len(wanted):
                return True
    return False


def _scan_window(prefix: str, language: str | None) -> str:
    """The end of ``prefix`` scanned for open brackets: its last ``_SCAN_CHARS`` characters, started
    after the docstring they would otherwise begin inside (read from there, its closing quotes open a
    string and every bracket after them looks quoted)."""
    if len(prefix) <= _SCAN_CHARS:
        return prefix
    cut = len(prefix) - _SCAN_CHARS
    window = prefix[cut:]
    if language in (None, "python"):
        quote = open_triple_quote(prefix[max(0, cut - _QUOTE_LOOKBACK):cut])
        if quote is not None:
            end = window.find(quote)
            window = window[end + len(quote):] if end >= 0 else ""
    return window


def trim_trailing_space(text: str, suffix: str) -> str:
    """No trailing whitespace on any line; the last line keeps its spaces only before more code."""
    if "\n" in text or not suffix.split("\n", 1)[0].strip():
        text = text.rstrip()
    return "\n".join(line.rstrip() for line in text.split("\n")) if "\n" in text else text


def tidy(text: str, prefix: str, suffix: str, *, multiline: bool, language: str | None = None,
         at_line_start: bool | None = None) -> str:
    """The rules that need the code around the cursor, after the stops and the block or line end:
    double space, special tokens, single line, the cursor's column, suffix repeats, brackets, the
    line's own brackets, a statement's last comma, trailing space.

    Idempotent: the server may run it again on the pipeline's answer and change nothing. Returns
    "" when nothing useful is left.
    """
    if at_line_start is None:
        at_line_start = not prefix or prefix.endswith("\n")
    text = drop_double_space(strip_special_tokens(text), prefix)
    if not multiline:
        text = first_line(text)
    text = fit_cursor(text, prefix, language)
    text = trim_trailing_space(text, suffix)
    text = strip_suffix_overlap(text, suffix, at_line_start, language)
    text = balance_brackets(text, prefix, language, suffix)
    text = close_line_brackets(text, prefix, suffix, language)
    if not multiline:
        text = drop_statement_comma(text, prefix, suffix, language)
    text = trim_trailing_space(text, suffix)
    return text if text.strip() else ""


def drop_statement_comma(text: str, prefix: str, suffix: str, language: str | None = None) -> str:
    """A single-line Python answer does not end the cursor's line with a comma outside every bracket.

    There a comma makes the statement a tuple (``size = int(n / steps),``): almost never meant, and
    what a continuation remembered from inside a call or a list brings along. Kept where the rest of
    the line follows (the comma is then not at its end) or a bracket is still open after the text
    (an argument list going on below), read from the start of the file: an entry of a literal longer
    than the usual scan window keeps its comma. Kept too in a file too long to read so.
    """
    if language != "python" or not text.rstrip().endswith(",") or "\n" in text or suffix.split("\n", 1)[0].strip():
        return text
    if len(prefix) > _WHOLE_PREFIX_CHARS or open_brackets(prefix + text, language) or not ends_in_code(text, language):
        return text
    kept = text.rstrip()[:-1].rstrip()
    return kept if kept.strip() else text
