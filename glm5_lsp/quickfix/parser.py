"""Syntax errors turned into edits: what the parsers already know about the fix.

Three readers of the same broken text, each saying what it expected where:

- **Python's compiler** (source ``compile``) names the first error in words a fix can be read
  from: "expected ':'", "'(' was never closed" (at the opener), "unterminated string literal" (at
  the quote), "unexpected indent", "unindent does not match any outer indentation level", "expected
  an indented block after 'if' statement", "invalid syntax. Perhaps you forgot a comma?", "Maybe you
  meant '==' or ':=' instead of '='?", "unmatched ')'", "closing parenthesis ']' does not match";
- **ruff's parser** (source ``ruff``, code ``invalid-syntax``) recovers and reports every error, as
  "Expected `)`, found newline": the token to insert, at the place it belongs;
- **tree-sitter** (any language with a grammar): its ``MISSING`` nodes are the token its error
  recovery inserted, at the byte where it did.

Where the place is not certain (which line closes a bracket, which column ends a string, which
indentation level a line belongs to) every plausible place is proposed, in the order a person would
try them; the ranking (:mod:`glm5_lsp.quickfix.rank`) keeps those that compile and add nothing.
Strings and comments are told apart from code by ``postprocess.code_chars``.
"""

from __future__ import annotations

import keyword
import re
from collections import Counter
from collections.abc import Iterable

from glm5_lsp.checks.introduced import LineIndex, is_syntax_error
from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.postprocess import CLOSERS, COMMENT, OPENERS, code_chars, open_brackets
from glm5_lsp.pynames.scope import names_in_scope, top_level_pieces
from glm5_lsp.quickfix.edits import Candidate, Edit, insertion, word_distance

MAX_CLOSER_LINES = 30  # lines after an unclosed bracket or string where its closer may go
MAX_PER_ERROR = 40  # candidates proposed for one error (the cheap compile check then filters them)
MAX_QUOTE_PLACES = 120  # where a string may end on its line: one a column, the likeliest first
_INSERTABLE = (":", ")", "]", "}", ",")
PASS_COST = 1000.0  # "Insert 'pass'" ranks after any re-indentation that leaves as few diagnostics
_EXPECTED = re.compile(r"^Expected `([^`]+)`")
_NEVER_CLOSED = re.compile(r"^'([(\[{])' was never closed")
_MISMATCH = re.compile(r"^closing parenthesis '([)\]}])' does not match opening parenthesis '([(\[{])'")
_UNMATCHED = re.compile(r"^unmatched '([)\]}])'")
_UNTERMINATED = re.compile(r"^unterminated (triple-quoted )?string literal")
_INDENTED_BLOCK = re.compile(r"^expected an indented block")
_EQUALS = re.compile(r"Maybe you meant '==' (?:or ':=' )?instead of '='")
_CONDITION_START = re.compile(r"^\s*(?:if|elif|while|assert|return)\b")
_CLAUSE = re.compile(r"^\s*(?:elif|else|except|finally)\b")
_CLAUSE_HEADS = {"elif": ("if", "elif"), "else": ("if", "elif", "for", "while", "try", "except"),
                 "except": ("try", "except"), "finally": ("try", "except", "else")}
_STRING_PREFIX = "rRbBuUfF"
# What may follow a string literal's closing quote and a dot: one of its methods (``"".join``).
_STRING_METHOD = re.compile(r"\.(?:" + "|".join(sorted(n for n in dir(str) + dir(bytes) if not n.startswith("_"))) + r")\b")
_ENDS_BLOCK = re.compile(r"\s*(?:return|raise|break|continue)\b")
# Keywords a misspelling may mean (the expression-only ones too: ``retrun x if y esle z``).
_KEYWORDS = tuple(k for k in keyword.kwlist if k not in ("True", "False", "None"))
_FOREIGN_KEYWORDS = {"function": "def", "func": "def", "elsif": "elif", "elseif": "elif", "catch": "except"}
_FOREIGN_OPERATORS = (
    (re.compile(r"\s*(?P<op>&&)\s*"), " and ", "Replace '&&' with 'and'"),
    (re.compile(r"\s*(?P<op>\|\|)\s*"), " or ", "Replace '||' with 'or'"),
    (re.compile(r"(?P<op>!)(?!=)\s*"), "not ", "Replace '!' with 'not '"),
    (re.compile(r"(?P<target>[A-Za-z_][\w.]*(?:\[[^\]\n]*\])?)[ \t]*(?P<op>\+)\+[ \t]*$"),
     r"\g<target> \g<op>= 1", "Replace 'x++' with 'x += 1'"),
    (re.compile(r"(?P<target>[A-Za-z_][\w.]*(?:\[[^\]\n]*\])?)[ \t]*(?P<op>-)-[ \t]*$"),
     r"\g<target> \g<op>= 1", "Replace 'x--' with 'x -= 1'"),
    (re.compile(r"^(?P<target>[ \t]*[A-Za-z_][\w.]*[ \t]*)(?P<op>:=)"), r"\g<target>=", "Replace ':=' with '='"),
    (re.compile(r"^(?P<target>[ \t]*)(?P<op>var|let|const)[ \t]+(?=[A-Za-z_]\w*[ \t]*(?::[^=\n]*)?=)"),
     r"\g<target>", "Remove the declaration keyword"),
)
_BLOCK_HEADER = re.compile(r"^\s*(?:if|elif|else|for|while|def|class|try|except|finally|with)\b")
BRACE_BLOCK_COST = 0.5  # below the plain ':' (1.0): the braces meant a block, not a set display
_ELSE_IF = re.compile(r"^\s*(else\s+if)\b")
_PY2_CALL = re.compile(r"^Missing parentheses in call to '(\w+)'")
_EXCEPT_LIST = re.compile(r"^(\s*except\s+)([^:()\n#]+?,[^:()\n#]+?)\s*:")


def syntax_candidates(code: str, diagnostics: Iterable[Diagnostic], language: str) -> list[Candidate]:
    """Edits that may fix the syntax errors among ``diagnostics`` (Python: compile's and ruff's
    messages; other languages: tree-sitter's ``MISSING`` nodes)."""
    lines = code.split("\n")
    index = LineIndex(code)
    found: list[Candidate] = []
    for diagnostic in diagnostics:
        if not is_syntax_error(diagnostic) or diagnostic.line >= len(lines):
            continue
        if diagnostic.source == "tree-sitter" and diagnostic.code == "missing":
            found += _missing_node(code, index, diagnostic)
        elif language == "python":
            found += _python(code, lines, index, diagnostic)
    return found


def _python(code: str, lines: list[str], index: LineIndex, d: Diagnostic) -> list[Candidate]:
    message = d.message
    targets = (d.line,)
    if message.startswith("expected ':'"):
        return (_else_if(lines, index, d.line) + _brace_block(lines, index, d.line)
                + _insert_after_code(code, lines, index, ":", d.line, d.col, targets))
    if (found := _PY2_CALL.match(message)) is not None:
        return _py2_call(lines, index, d, found.group(1))
    if message == "multiple exception types must be parenthesized":
        return _except_comma(lines, index, d.line)
    if (found := _EXPECTED.match(message)) is not None and found.group(1) in _INSERTABLE:
        if found.group(1) == ":" and message.endswith("found `=`"):
            return []  # ``if i=pivot:``: a ':' there makes a walrus; the '==' is the compiler's to suggest
        braces = _brace_block(lines, index, d.line) if message.endswith("found `{`") else []
        return braces + _insert_after_code(code, lines, index, found.group(1), d.line, d.col, targets)
    if (found := _NEVER_CLOSED.match(message)) is not None:
        return _close_bracket(code, lines, index, found.group(1), d.line, d.col)
    if (found := _MISMATCH.match(message)) is not None:
        closer, opener = found.groups()
        at = index.offset(d.line, d.col)
        want = OPENERS[opener]
        out = [Candidate(f"Replace {closer!r} with {want!r}", (Edit(at, at + 1, want),), "syntax", "parser",
                         targets=targets),
               insertion(f"Insert missing {want!r}", at, want, order=1, targets=targets)]
        opened = _unclosed_opener(code, index, message, at)
        if opened is not None:  # or the bracket was left open further up: close it there
            row, col = opened
            out += _close_bracket(code, lines, index, opener, row, col)
        return out
    if (found := _UNMATCHED.match(message)) is not None:
        at = index.offset(d.line, d.col)
        if code[at:at + 1] == found.group(1):
            return [Candidate(f"Remove unmatched {found.group(1)!r}", (Edit(at, at + 1, ""),), "syntax", "parser",
                              targets=targets)]
        return []
    if (found := _UNTERMINATED.match(message)) is not None or message == "missing closing quote in string literal":
        triple = found is not None and found.group(1) is not None
        return _stray_quote(code, index, d) + _close_string(code, lines, index, d.line, d.col, triple)
    if message in ("unexpected indent", "Unexpected indentation"):
        return _reindent(code, lines, index, d.line, "unexpected")
    if message.startswith("unindent does not match"):
        return _reindent(code, lines, index, d.line, "unmatched")
    if _INDENTED_BLOCK.match(message):
        return _reindent(code, lines, index, d.line, "indented")
    if message.startswith("inconsistent use of tabs and spaces"):
        return _retab(code, lines, index, d.line)
    if "Perhaps you forgot a comma" in message:
        return _commas(code, lines, index, d)
    if message == "f-string: expecting '}'":
        return _fstring_brace(lines, index, d)
    out = []
    if message == "invalid syntax":
        out += _misspelled_keywords(lines, index, d.line) + _foreign_operators(lines, index, d.line)
    if message == "invalid syntax" and _CLAUSE.match(lines[d.line]) and d.col == _indent(lines[d.line]):
        out += _reindent(code, lines, index, d.line, "clause")  # ``elif`` at no ``if``'s indentation
    at_equals = lines[d.line][d.col:d.col + 2][:1] == "=" and lines[d.line][d.col:d.col + 2] != "=="
    if _EQUALS.search(message) or (message == "invalid syntax" and (_CONDITION_START.match(lines[d.line]) or at_equals)):
        out += _equals(code, lines, index, d.line, d.col)
    if message == "invalid syntax" or message.startswith("Expected `,`"):
        out += _close_open_brackets(code, lines, index, d.line, d.col)
    return out


def _close_open_brackets(code: str, lines: list[str], index: LineIndex, line: int, col: int) -> list[Candidate]:
    """``for i in range(len(x) - 1:``: the brackets the line left open, closed where the compiler
    stopped (white space skipped back over)."""
    still_open = open_brackets(lines[line][:col], "python")
    if not still_open:
        return []
    closers = "".join(OPENERS[b] for b in reversed(still_open))
    at = index.starts[line] + col
    while at > index.starts[line] and code[at - 1] in " \t":
        at -= 1
    return [insertion(f"Insert missing {closers!r}", at, closers, targets=(line,))]


# ---- insertions ------------------------------------------------------------------------------


def code_end(line: str) -> int:
    """The column where ``line``'s code ends: before a comment and trailing white space."""
    end = len(line)
    for column, char in code_chars(line, "python"):
        if char == COMMENT:
            end = column
            break
    return len(line[:end].rstrip())


def _insert_after_code(code: str, lines: list[str], index: LineIndex, token: str, line: int, col: int,
                       targets: tuple[int, ...]) -> list[Candidate]:
    """``token`` right after the code before ``line:col`` (white space and line breaks skipped back
    over), and at the end of that line's code when that is elsewhere (a header's colon)."""
    at = index.offset(line, col)
    while at > 0 and code[at - 1] in " \t":
        at -= 1
    row = code.count("\n", 0, at)
    while row > 0 and at == index.starts[row] and not lines[row][:code_end(lines[row])].strip():
        row -= 1  # the token belongs after the previous line's code, not before this one
        at = index.starts[row] + code_end(lines[row])
    places = [at]
    end = index.starts[row] + code_end(lines[row])
    if token == ":" and end != at:
        places.append(end)
    if token in CLOSERS and code[:end].endswith(":"):  # ``if f(x:``: the bracket closes before the header's colon
        colon = end - 1
        while colon > index.starts[row] and code[colon - 1] in " \t":
            colon -= 1
        places.append(colon)
    return [insertion(f"Insert missing {token!r}", place, token, order=n, targets=targets)
            for n, place in enumerate(places)]


_ON_LINE = re.compile(r" on line (\d+)$")


def _unclosed_opener(code: str, index: LineIndex, message: str, closer_at: int) -> tuple[int, int] | None:
    """``(line, column)`` of the bracket still open where the mismatched closer at ``closer_at``
    stands (on the line the message names, or the closer's own)."""
    named = _ON_LINE.search(message)
    row = int(named.group(1)) - 1 if named else code.count("\n", 0, closer_at)
    if not 0 <= row < len(index.starts):
        return None
    start = index.starts[row]
    stack: list[int] = []
    for at, char in code_chars(code[start:closer_at], "python"):
        if char in OPENERS:
            stack.append(start + at)
        elif char in CLOSERS and stack:
            stack.pop()
    if not stack:
        return None
    return index.position(stack[-1])


def _close_bracket(code: str, lines: list[str], index: LineIndex, opener: str, line: int, col: int) -> list[Candidate]:
    """The closer of the bracket opened at ``line:col``: at the end of each line's code from there
    down (the statement's last line first), then before each ``,`` and at each other token boundary
    of the opener's own line."""
    closer = OPENERS[opener]
    statement_indent = _indent(lines[line])
    title = f"Insert missing {closer!r}"
    places: list[tuple[float, int]] = []
    last = line
    for row in range(line, min(len(lines), line + MAX_CLOSER_LINES)):
        text = lines[row]
        if row > line and text.strip() and _indent(text) <= statement_indent and not text.lstrip().startswith(
                tuple(CLOSERS)):
            places.append((row - line + 0.5, index.starts[row] + len(_prefix(text))))  # ``]: ...``
            break  # a new statement: the bracket closed before it
        end = code_end(text)
        if text[:end].strip():
            last = row
            places.append((row - line, index.starts[row] + end))
            if text[:end].endswith(","):  # ``len(nodes,`` in a list of arguments: before the comma
                places.append((row - line + 0.25, index.starts[row] + len(text[:end - 1].rstrip())))
            if row > line:  # ``    ).path``: the closer began the next line
                places.append((row - line + 0.5, index.starts[row] + len(_prefix(text))))
    # The line where the statement stops is the likeliest: the opener's line and the last line first.
    places.sort(key=lambda p: (p[0] not in (0, last - line), p[0]))
    own = lines[line]
    depth = 0
    for column, char in code_chars(own[col + 1:code_end(own)], "python"):
        at = col + 1 + column
        if char in OPENERS:
            depth += 1
        elif char in CLOSERS:
            depth -= 1
            if depth < 0:
                places.append((0.5, index.starts[line] + at))  # before an outer closer
                break
        elif depth == 0 and char in ",:;=":
            places.append((0.6, index.starts[line] + at))
        elif depth == 0 and char == " " and at > col + 1 and own[at - 1] != " ":
            places.append((0.8, index.starts[line] + at))
    seen: set[int] = set()
    out = []
    for order, at in sorted(places, key=lambda p: p[0]):
        if at not in seen:
            seen.add(at)
            out.append(insertion(title, at, closer, order=order + len(out) * 1e-3, targets=(line,)))
    # ``abs(nums[i+1``: every bracket the line leaves open, closed at its end (or before its colon).
    end = code_end(own)
    still_open = open_brackets(own[:end], "python")
    if len(still_open) > 1:
        closers = "".join(OPENERS[b] for b in reversed(still_open))
        stop = end - 1 if own[:end].endswith(":") else end
        while stop > 0 and own[stop - 1] in " \t":
            stop -= 1
        out.append(insertion(f"Insert missing {closers!r}", index.starts[line] + stop, closers, order=0.05,
                             targets=(line,)))
    return out


def _close_string(code: str, lines: list[str], index: LineIndex, line: int, col: int, triple: bool) -> list[Candidate]:
    """The quote that ends the string opened at ``line:col``: at each column of that line where a
    string could end (before a delimiter, white space or the line's end; the earliest first, since
    what follows a string's end must read as code), then where an opening quote may be missing."""
    text = lines[line]
    start = col
    while start < len(text) and text[start] in _STRING_PREFIX:
        start += 1
    if start >= len(text) or text[start] not in "'\"":
        return []
    quote = text[start] * (3 if triple else 1)
    title = f"Insert missing {quote!r}"
    base = index.starts[line]
    out: list[Candidate] = []
    if triple:
        for row in range(line, min(len(lines), line + MAX_CLOSER_LINES)):
            end = len(lines[row].rstrip())
            if row == line and end <= start + 3:
                continue
            out.append(insertion(title, index.starts[row] + end, quote, order=row - line, targets=(line,)))
        return out
    # Where the missing quote goes: after the quote the compiler reports, or, when that quote closed
    # a string opened further left (``'abc, 'd'``: the first string's quote is missing), anywhere
    # after the line's first quote of that kind. The likeliest first: a string ends before a
    # delimiter, white space, one of its methods or the line's end; what is valid but rare comes last.
    first = min((i for i in range(start + 1) if text[i] == quote[0] and text[max(0, i - 1)] != "\\"), default=start)
    fstring = "f" in text[max(0, start - 2):start].lower()
    end = len(text.rstrip())
    ranked = []
    for at in range(first + 1, end + 1):
        after = text[at:].lstrip(" \t")
        before = text[:at].rstrip(" \t")
        # Valid but rare: two strings side by side (``'a' 'b'``), a string indexed or called
        # (``" " [x]``), an attribute after white space (``"," .join``), an f-string's placeholder
        # left outside it (``f"a {x}" == {y}``).
        odd = after.startswith(("'", '"', "[", "(")) or (before.endswith(quote) and at > first + 1) or \
            (fstring and "{" in after) or (after.startswith(".") and text[at] in " \t")
        delimited = at == end or text[at] in ",)]}:;" or (text[at] in " \t" and text[at - 1] not in " \t") or \
            _STRING_METHOD.match(text, at) is not None
        # Of the places left, the earliest after the reported quote: a string ends where the code
        # that follows can begin.
        ranked.append((at <= start, 2 * odd + (not delimited), at))
    if text != text.rstrip(" \t"):  # white space the line ends with was the string's own
        ranked.append((False, -1, len(text)))
    for order, (_, _, at) in enumerate(sorted(ranked)[:MAX_QUOTE_PLACES]):
        out.append(insertion(title, base + at, quote, order=order, targets=(line,)))
    return out


def _stray_quote(code: str, index: LineIndex, d: Diagnostic) -> list[Candidate]:
    """The quote that opens nothing (``return 'res``) taken out: tried before closing the string
    when a name bound there follows it (``res``), else after."""
    at = index.offset(d.line, d.col)
    while at < len(code) and code[at] in _STRING_PREFIX:
        at += 1
    if code[at:at + 1] not in ("'", '"') or code[at:at + 3] in ("'\'\'", '"""'):
        return []
    rest = code[at + 1:code.find("\n", at) if "\n" in code[at:] else len(code)]
    word = re.match(r"[A-Za-z_]\w*", rest)
    # ``return 'res``: a bound name, nothing a string's words would be cut at (``"key: value,``), no
    # bracket closed that the rest did not open (``d['key]``, ``f(name="value)``).
    likely = word is not None and not re.search(r"[,:]", rest) and _closes_nothing(rest) and \
        word.group() in names_in_scope(code[:at], code[at + 1 + word.end():])
    return [Candidate(f"Remove the stray {code[at]!r}", (Edit(at, at + 1, ""),), "syntax", "parser",
                      order=-1 if likely else 500, targets=(d.line,))]


def _closes_nothing(text: str) -> bool:
    depth = 0
    for _, char in code_chars(text, "python"):
        depth += char in OPENERS
        depth -= char in CLOSERS
        if depth < 0:
            return False
    return True


def _commas(code: str, lines: list[str], index: LineIndex, d: Diagnostic) -> list[Candidate]:
    """A comma at each gap between two tokens inside the range the compiler marked."""
    out = []
    end_line, end_col = (d.end_line, d.end_col) if (d.end_line, d.end_col) > (d.line, d.col) else (d.line, len(lines[d.line]))
    start, stop = index.offset(d.line, d.col), index.offset(end_line, end_col)
    segment = code[start:stop]
    gaps = [column for column, char in code_chars(segment, "python")
            if char in " \t\n" and column > 0 and segment[column - 1] not in " \t\n,:"]
    for column in gaps:
        out.append(insertion("Insert missing ','", start + column, ",", order=len(out), targets=(d.line,)))
    if (open_brackets(code[:start], "python") or [""])[-1] == "{":  # a dict display's key without its ':'
        for column in gaps:
            out.append(insertion("Insert missing ':'", start + column, ":", order=len(out), targets=(d.line,)))
    return out


def _else_if(lines: list[str], index: LineIndex, line: int) -> list[Candidate]:
    """``else if x:`` (C's and JavaScript's spelling): ``elif x:``."""
    found = _ELSE_IF.match(lines[line])
    if found is None:
        return []
    at = index.starts[line] + found.start(1)
    return [Candidate("Replace 'else if' with 'elif'", (Edit(at, index.starts[line] + found.end(1), "elif"),),
                      "syntax", "parser", targets=(line,))]


def _brace_block(lines: list[str], index: LineIndex, line: int) -> list[Candidate]:
    """``if x == 1 {`` ... ``}`` (a C-like block): ``:`` for the ``{``, and the line holding only the
    matching ``}`` (the first at the header's indentation) removed. Before a plain ``:`` inserted
    (``if x == 1: {``, a set display, compiles too): ``BRACE_BLOCK_COST``."""
    text = lines[line]
    end = code_end(text)
    if not _BLOCK_HEADER.match(text) or not text[:end].endswith("{"):
        return []
    indent = _indent(text)
    for row in range(line + 1, min(len(lines), line + 1 + MAX_CLOSER_LINES * 10)):
        if lines[row].strip() == "}" and _indent(lines[row]) == indent:
            brace = len(text[:end - 1].rstrip())
            start = index.starts[line]
            closer = index.starts[row]
            closer_end = index.starts[row + 1] if row + 1 < len(index.starts) else len(index.text)
            return [Candidate("Replace the braces with ':'", (Edit(start + brace, start + end, ":"),
                                                                              Edit(closer, closer_end, "")),
                              "syntax", "parser", cost=BRACE_BLOCK_COST, targets=(line,))]
        if lines[row].strip() and _indent(lines[row]) <= indent:
            return []
    return []


def _py2_call(lines: list[str], index: LineIndex, d: Diagnostic, name: str) -> list[Candidate]:
    """``print "x", y`` (Python 2's statement): ``print("x", y)``, the statement's arguments up to its
    comment or its end (a statement on one line; a backslash-continued one is left alone)."""
    text = lines[d.line]
    found = re.compile(rf"\b{name}\b[ \t]*").search(text, d.col)
    if found is None or text[:code_end(text)].endswith("\\"):
        return []
    end = code_end(text)
    arguments = text[found.end():end]
    if not arguments or arguments.startswith(("(", "=", ".")):
        return []
    start = index.starts[d.line] + found.start()
    return [Candidate(f"Call {name}(...)", (Edit(start, index.starts[d.line] + end, f"{name}({arguments.rstrip()})"),),
                      "syntax", "parser", targets=(d.line,))]


def _except_comma(lines: list[str], index: LineIndex, line: int) -> list[Candidate]:
    """``except ValueError, e:`` (Python 2's binding): ``except ValueError as e:``; and the types
    parenthesized (``except (KeyError, ValueError):``), the likelier first by the last name's case."""
    found = _EXCEPT_LIST.match(lines[line])
    if found is None:
        return []
    names = [n.strip() for n in found.group(2).split(",")]
    if not all(re.fullmatch(r"[A-Za-z_][\w.]*", n) for n in names):
        return []
    start, end = index.starts[line] + found.start(2), index.starts[line] + found.end(2)
    out = [Candidate("Parenthesize the exception types", (Edit(start, end, f"({', '.join(names)})"),),
                     "syntax", "parser", order=0 if names[-1][:1].isupper() else 1, targets=(line,))]
    if len(names) == 2 and names[1].isidentifier():
        out.append(Candidate(f"Replace ', {names[1]}' with ' as {names[1]}'",
                             (Edit(start, end, f"{names[0]} as {names[1]}"),), "syntax", "parser",
                             order=1 if names[-1][:1].isupper() else 0, targets=(line,)))
    return out


def _code_columns(text: str) -> set[int]:
    """The columns of a line outside its strings and comments."""
    return {column for column, char in code_chars(text, "python") if char != COMMENT}


def _code_words(text: str) -> Iterable[re.Match[str]]:
    """The words of a line outside its strings and comments."""
    code = _code_columns(text)
    return (m for m in re.finditer(r"[A-Za-z_]\w*", text) if m.start() in code)


def _misspelled_keywords(lines: list[str], index: LineIndex, line: int) -> list[Candidate]:
    """A word of the line one or two edits from a keyword (``retrun``, ``improt``, ``esle``) or from
    another language's word for one (``function``, ``elsif``, ``catch``): the keyword, nearest first."""
    out = []
    for found in _code_words(lines[line]):
        word = found.group()
        if keyword.iskeyword(word) or keyword.issoftkeyword(word):
            continue
        limit = 1 if len(word) < 6 else 2
        near = sorted((word_distance(word, k), k) for k in (*_KEYWORDS, *_FOREIGN_KEYWORDS)
                      if abs(len(k) - len(word)) <= limit and len(word) >= 2)
        at = index.starts[line] + found.start()
        for distance, meant in near:
            if 0 < distance <= limit or (distance == 0 and meant in _FOREIGN_KEYWORDS):
                target = _FOREIGN_KEYWORDS.get(meant, meant)
                out.append(Candidate(f"Replace {word!r} with {target!r}", (Edit(at, at + len(word), target),),
                                     "syntax", "parser", order=distance, targets=(line,)))
    return out


def _foreign_operators(lines: list[str], index: LineIndex, line: int) -> list[Candidate]:
    """Other languages' operators: ``&&`` and ``||`` (``and``, ``or``), ``!x`` (``not x``), ``i++`` /
    ``i--`` as a statement (``i += 1``), ``x := 1`` as one (``x = 1``), and a declaration's ``var``,
    ``let`` or ``const`` (dropped); each kind its own fix, every use on the line."""
    text = lines[line]
    code = _code_columns(text)
    start = index.starts[line]
    out = []
    for pattern, replacement, title in _FOREIGN_OPERATORS:
        edits = tuple(Edit(start + m.start(), start + m.end(), m.expand(replacement))
                      for m in pattern.finditer(text) if m.start("op") in code)
        if edits:
            out.append(Candidate(title, edits, "syntax", "parser", targets=(line,)))
    return out


def _fstring_brace(lines: list[str], index: LineIndex, d: Diagnostic) -> list[Candidate]:
    """``f"hello {name"``: the ``}`` before the quote that ends the string (the last one at or
    before the reported column)."""
    text = lines[d.line]
    quote = max(text.rfind('"', 0, d.col + 1), text.rfind("'", 0, d.col + 1))
    if quote <= 0:
        return []
    return [insertion("Insert missing '}'", index.starts[d.line] + quote, "}", targets=(d.line,))]


def _equals(code: str, lines: list[str], index: LineIndex, line: int, col: int) -> list[Candidate]:
    """``==`` for each lone ``=`` of the line (not a keyword argument's), the one nearest the
    reported column first."""
    text = lines[line]
    chars = dict(code_chars(text, "python"))
    out = []
    depth = 0
    for column in sorted(chars):
        char = chars[column]
        if char in OPENERS:
            depth += 1
        elif char in CLOSERS:
            depth -= 1
        if char != "=" or chars.get(column + 1) == "=" or chars.get(column - 1, "") in "=<>!:+-*/%&|^@":
            continue
        before = text[:column].rstrip()
        if depth > 0 and re.search(r"[(,]\s*[A-Za-z_]\w*$", before) and not _CONDITION_START.match(text):
            continue  # ``f(key=value)``
        at = index.starts[line] + column
        out.append(Candidate("Replace '=' with '=='", (Edit(at, at + 1, "=="),), "syntax", "parser",
                             order=abs(column - col), targets=(line,)))
    return out


# ---- indentation -----------------------------------------------------------------------------


def _indent(line: str) -> int:
    stripped = line.lstrip(" \t")
    prefix = line[:len(line) - len(stripped)]
    return len(prefix.expandtabs(8))


def piece_start(code: str, line: int) -> int:
    """The first line of the top-level piece (``scope.top_level_pieces``: cut where a ``def``,
    ``class`` or decorator starts a line) that holds ``line``."""
    row = 0
    for piece in top_level_pieces(code):
        rows = piece.count("\n")
        if row + rows > line or rows == 0:
            return row
        row += rows
    return row


def _statement_lines(lines: list[str], first: int, upto: int) -> list[int]:
    """The lines from ``first`` to before ``upto`` that begin a logical line and hold code (not
    inside a bracket or a string that another line opened, not blank, not only a comment)."""
    window = lines[first:upto]
    if not window:
        return []
    text = "\n".join(window)
    starts = [0]
    for part in window[:-1]:
        starts.append(starts[-1] + len(part) + 1)
    begins = {0}
    depth = 0
    previous = ""
    for at, char in code_chars(text, "python"):
        if char in OPENERS:
            depth += 1
        elif char in CLOSERS:
            depth = max(0, depth - 1)
        elif char == "\n" and depth == 0 and previous != "\\":
            begins.add(at + 1)
        if char != COMMENT:
            previous = char
    return [first + n for n, start in enumerate(starts)
            if start in begins and window[n][:code_end(window[n])].strip()]


def _unit(lines: list[str]) -> str:
    """The file's indentation step: a tab, or the most common increase in spaces (4 by default)."""
    steps: Counter[int] = Counter()
    previous = 0
    tabs = 0
    for line in lines:
        if not line.strip():
            continue
        if line.startswith("\t"):
            tabs += 1
        width = _indent(line)
        if width > previous:
            steps[width - previous] += 1
        previous = width
    if tabs > len(lines) // 2:
        return "\t"
    if sum(steps.values()) < 3:  # too few blocks to tell (and one of them may be the line out of place)
        return "  " if steps.get(2) else "    "
    most = max(steps.values())
    return " " * min(step for step, count in steps.items() if count == most)  # a line out of place skews it


def _prefix(line: str) -> str:
    return line[:len(line) - len(line.lstrip(" \t"))]


def _open_levels(lines: list[str], statements: list[int]) -> list[tuple[int, str]]:
    """The indentation levels open after ``statements`` (``(width, white space)``, outermost first);
    after a header (a line ending in ``:``) one step deeper than it too."""
    stack: list[tuple[int, str]] = [(0, "")]
    for row in statements:
        width = _indent(lines[row])
        while len(stack) > 1 and stack[-1][0] > width:
            stack.pop()
        if width > stack[-1][0]:
            stack.append((width, _prefix(lines[row])))
    if statements and lines[statements[-1]][:code_end(lines[statements[-1]])].endswith(":"):
        step = _prefix(lines[statements[-1]]) + _unit(lines)
        stack = [level for level in stack if level[0] < _indent(step)] + [(_indent(step), step)]
    return list(dict.fromkeys(stack))


def _reindent(code: str, lines: list[str], index: LineIndex, line: int, kind: str) -> list[Candidate]:
    """Line ``line`` (alone, with the block under it, or with the run of lines after it) moved to
    each indentation level open there, the nearest first; for a header with no body (``kind``
    "indented"), its first line indented one step, the header moved instead, or a ``pass`` added."""
    # From the piece the line before is in: a line cut at column 0 (``def`` out of its class) starts
    # a piece of its own, with the header it belongs to in the one before.
    statements = _statement_lines(lines, piece_start(code, max(0, line - 1)), line)
    current = _indent(lines[line])
    candidates: list[Candidate] = []
    if kind == "indented" and statements:
        header_row = statements[-1]
        header = lines[header_row]
        deeper = [(_indent(header) + len(_unit(lines).expandtabs(8)), _prefix(header) + _unit(lines))]
        for row in range(line + 1, min(len(lines), line + 5)):
            if lines[row].strip() and _indent(lines[row]) > _indent(header):
                deeper.append((_indent(lines[row]), _prefix(lines[row])))
                break
        candidates += _moves(lines, index, line, current, list(dict.fromkeys(deeper)))
        # Or the header is the line out of place: moved to a level open before it, alone.
        before = _open_levels(lines, statements[:-1])
        floor = before[-1][0] if before else 0
        for row in range(line + 1, min(len(lines), line + 10)):  # ``else:`` further down shows where ``if`` was
            width = _indent(lines[row])
            if lines[row].strip() and floor <= width < _indent(header):
                before.append((width, _prefix(lines[row])))
        candidates += _moves(lines, index, header_row, _indent(header), list(dict.fromkeys(before)), alone=True)
        at = index.starts[header_row] + len(header)
        empty = insertion("Insert 'pass'", at, "\n" + _prefix(header) + _unit(lines) + "pass", order=1e3, targets=(line,))
        empty.cost = PASS_COST  # a body given up on: only when no indentation will do
        candidates.append(empty)
        return candidates
    levels = _open_levels(lines, statements)
    if kind == "unexpected":
        levels = [level for level in levels if level[0] < current] or levels
    if kind == "clause":  # ``elif`` goes where an ``if`` above it stands
        clause = lines[line].split()[0].rstrip(":")
        heads = _CLAUSE_HEADS.get(clause, ())
        levels = [(_indent(lines[row]), _prefix(lines[row])) for row in statements
                  if lines[row].split() and lines[row].split()[0].rstrip(":") in heads]
        levels = [level for level in dict.fromkeys(levels) if level[0] != current]
    # A line indented less than the one before, but to no level open there: a dedent cut short, so
    # of two levels as near the outer one first.
    candidates = _moves(lines, index, line, current, levels, outer_first=kind == "unmatched")
    if kind == "unmatched":
        candidates += _move_run_above(lines, index, statements, line, current)
    return candidates


def _move_run_above(lines: list[str], index: LineIndex, statements: list[int], line: int,
                    current: int) -> list[Candidate]:
    """Or the lines above were indented too far (a docstring pushed right opens a level the next
    line cannot match): the statements from where that level began, moved to ``line``'s column."""
    deeper = sorted({_indent(lines[row]) for row in statements if _indent(lines[row]) > current})
    if not deeper:
        return []
    level = deeper[0]
    run: list[int] = []
    for row in reversed(statements):
        if _indent(lines[row]) < level:
            if _indent(lines[row]) >= current:
                return []  # a level between the two: not one run pushed right
            break
        run.append(row)
    run.reverse()
    if not run or _indent(lines[run[0]]) != level:
        return []
    shift = current - level
    edits = []
    for row in run:
        text = lines[row]
        old = _prefix(text)
        edits.append(Edit(index.starts[row], index.starts[row] + len(old), " " * max(0, _indent(text) + shift)))
    where = f"lines {run[0] + 1}-{run[-1] + 1}" if len(run) > 1 else f"line {run[0] + 1}"
    return [Candidate(f"Dedent {where} to column {current}", tuple(edits), "syntax", "parser", order=50,
                      targets=(line,))]


def _moves(lines: list[str], index: LineIndex, line: int, current: int, levels: list[tuple[int, str]],
           alone: bool = False, outer_first: bool = False) -> list[Candidate]:
    """Line ``line``, alone or with the lines that go with it, moved to each of ``levels`` (the
    nearest first; of two as near, the inner one, or the outer one with ``outer_first``)."""
    candidates = []
    blocks = [[line]] if alone else _blocks_after(lines, line, current)
    sign = 1 if outer_first else -1
    unit = _unit(lines)
    ranked = sorted(levels, key=lambda level: (abs(level[0] - current), sign * level[0]))
    for rank, (width, prefix) in enumerate(ranked):
        if width == current:
            continue
        for scope, rows in enumerate(blocks):
            edits = tuple(_set_indent(lines, index, row, current, width, prefix) for row in rows)
            verb = "Indent" if width > current else "Dedent"
            where = f"lines {line + 1}-{rows[-1] + 1}" if len(rows) > 1 else f"line {line + 1}"
            # ``return`` moved out to where more code follows at its level: that code could never run.
            dead = _ENDS_BLOCK.match(lines[rows[-1]]) is not None and _next_indent(lines, rows[-1]) == width
            moved = list(lines)
            for row, edit in zip(rows, edits):
                moved[row] = edit.text + lines[row].lstrip(" \t")
            order = abs(width - current) + scope * 0.1 + rank * 0.01 + 100 * dead + 5 * _misfits(moved, unit, line)
            candidates.append(Candidate(f"{verb} {where} to column {width}", edits, "syntax", "parser", order=order,
                                        targets=(line,)))
    return candidates


def _misfits(lines: list[str], unit: str, line: int, reach: int = 40) -> int:
    """Blocks near ``line`` not indented by one ``unit`` past their header (``with`` eight columns
    under a ``def``, where the file steps by four): the fewer, the likelier the indentation."""
    step = len(unit.expandtabs(8))
    count = 0
    header: int | None = None
    for row in range(max(0, line - reach), min(len(lines), line + reach)):
        text = lines[row]
        code = text[:code_end(text)]
        if not code.strip():
            continue
        if header is not None and _indent(text) - header != step:
            count += 1
        header = _indent(text) if code.endswith(":") else None
    return count


def _next_indent(lines: list[str], row: int) -> int | None:
    """The indentation of the next line after ``row`` that holds code."""
    for text in lines[row + 1:]:
        if text[:code_end(text)].strip():
            return _indent(text)
    return None


def _blocks_after(lines: list[str], line: int, current: int) -> list[list[int]]:
    """The line alone; with the lines under it (indented deeper); with every line after it down to
    one indented less (a run moved together). Blank lines are never touched."""
    alone = [line]
    under = [line]
    for row in range(line + 1, len(lines)):
        if not lines[row].strip():
            continue
        if _indent(lines[row]) <= current:
            break
        under.append(row)
    run = [line]
    for row in range(line + 1, len(lines)):
        if not lines[row].strip():
            continue
        if _indent(lines[row]) < current:
            break
        run.append(row)
    out: list[list[int]] = []
    for rows in (alone, under, run):
        if rows not in out:
            out.append(rows)
    return out


def _set_indent(lines: list[str], index: LineIndex, row: int, current: int, width: int, prefix: str) -> Edit:
    """Row ``row``'s leading white space moved by ``width - current`` columns (``prefix``, the level's
    own white space, for a line that stood at ``current``)."""
    text = lines[row]
    old = text[:len(text) - len(text.lstrip(" \t"))]
    own = _indent(text)
    target = max(0, own + width - current)
    if own == current:
        new = prefix
    elif prefix and set(prefix) == {"\t"} and target % 8 == 0:
        new = "\t" * (target // 8)
    else:
        new = " " * target
    start = index.starts[row]
    return Edit(start, start + len(old), new)


def _retab(code: str, lines: list[str], index: LineIndex, line: int) -> list[Candidate]:
    """Tabs in the file's indentation written as the spaces they stand for (8 columns a tab)."""
    edits = []
    for row, text in enumerate(lines):
        old = text[:len(text) - len(text.lstrip(" \t"))]
        if "\t" in old:
            edits.append(Edit(index.starts[row], index.starts[row] + len(old), old.expandtabs(8)))
    if not edits:
        return []
    return [Candidate("Replace tabs in the indentation with spaces", tuple(edits), "syntax", "parser",
                      targets=(line,))]


# ---- tree-sitter -----------------------------------------------------------------------------


def _missing_node(code: str, index: LineIndex, d: Diagnostic) -> list[Candidate]:
    """The token tree-sitter's recovery inserted (``missing `;```), where it inserted it."""
    found = re.match(r"missing `(.+)`$", d.message)
    if found is None:
        return []
    token = found.group(1)
    if not token or any(c.isalnum() or c == "_" for c in token) and not token.isidentifier():
        return []
    if token.isidentifier() and token not in ("in", "then", "do", "end"):
        return []  # a missing identifier or expression: nothing to insert without the model
    at = index.offset(d.line, d.col)
    return [insertion(f"Insert missing {token!r}", at, token, source="tree-sitter", targets=(d.line,))]
