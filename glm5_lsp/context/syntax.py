"""What tree-sitter says about a cursor: should a completion span one line or several, and which
functions have an empty body ("Generate body").

Offsets here are character offsets into a ``str``; tree-sitter works in UTF-8 bytes, so every
node boundary is converted back through :class:`_Source`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import tree_sitter

from glm5_lsp.context.trees import RecentTrees
from glm5_lsp.languages import tree_sitter_language

_PY_BLOCK_OPENER = re.compile(
    r"^\s*(async\s+def|def|class|if|elif|else|for|async\s+for|while|with|async\s+with|try|except|"
    r"finally|match|case)\b.*:\s*(#.*)?$"
)
_STRINGY = ("string", "comment", "string_content", "template_string", "raw_string_literal",
            "interpreted_string_literal", "char_literal", "line_comment", "block_comment")
_FUNCTIONS = ("function_definition", "function_declaration", "method_definition", "function_item",
              "method_declaration", "function_expression", "arrow_function", "generator_function_declaration")
_BRACE_BODIES = ("statement_block", "compound_statement", "block")


# The document at every keystroke: parsed from the closest of the last few trees, not afresh
# (a fresh parse of a 2,600-line file takes 20-25 ms, holding the interpreter lock).
_TREES = RecentTrees(4)


def forget_trees() -> None:
    """Let the recent trees go (a document closed; the next parse is a fresh one)."""
    _TREES.entries.clear()


@functools.cache
def parser_for(language: str) -> tree_sitter.Parser | None:
    """A parser for one of our languages, or None when its grammar package is missing."""
    grammar = tree_sitter_language(language)
    return tree_sitter.Parser(grammar) if grammar is not None else None


class _Source:
    """A text with its UTF-8 encoding and byte <-> character conversions."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.data = text.encode("utf-8")
        self._ascii = len(self.data) == len(text)

    def byte(self, offset: int) -> int:
        return offset if self._ascii else len(self.text[:offset].encode("utf-8"))

    def char(self, byte: int) -> int:
        return byte if self._ascii else len(self.data[:byte].decode("utf-8", errors="replace"))


def _line_bounds(text: str, offset: int) -> tuple[int, int]:
    start = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", offset)
    return start, len(text) if end < 0 else end


def _inside_string_or_comment(tree: tree_sitter.Tree, byte: int) -> bool:
    node = tree.root_node.descendant_for_byte_range(max(byte - 1, 0), byte)
    while node is not None:
        if node.type in _STRINGY and node.start_byte < byte and (byte < node.end_byte or node.type.endswith("comment")):
            return True
        node = node.parent
    return False


def wants_multiline(text: str, offset: int, language: str) -> bool:
    """True when the cursor starts a block or sits in an empty one; False mid-line and in strings.

    * text after the cursor on its line, or code before it that does not open a block: one line;
    * inside a string or comment: one line;
    * right after a block opener (``def f():`` / ``{``), on its line or the empty line below,
      or in a body that is only ``pass``/``...``: several lines.
    """
    start, end = _line_bounds(text, offset)
    before, after = text[start:offset], text[offset:end]
    if after.strip():
        return False
    if before.strip() and not _opens_block(before, language):
        return False  # one line, in a string or not: no parse (0.7-1.9 ms for a 1,200-2,600-line file)
    parser = parser_for(language)
    if parser is not None:
        source = _Source(text)
        tree = _TREES.parse(parser, language, source.data)
        if _inside_string_or_comment(tree, source.byte(offset)):
            return False
    if before.strip():
        return True  # it opens a block
    previous = text[:start].rstrip("\n").rsplit("\n", 1)[-1] if start else ""
    if _opens_block(previous, language):
        return True
    return any(body.start <= offset <= body.end for body in empty_bodies(text, language))


def _opens_block(line: str, language: str) -> bool:
    if language == "python":
        return bool(_PY_BLOCK_OPENER.match(line))
    return line.rstrip().endswith("{")


@dataclass(frozen=True)
class EmptyBody:
    """A function whose body is empty, ``pass`` or ``...`` (Python: perhaps after a docstring).

    ``start``/``end`` delimit the placeholder to replace with a generated body (character
    offsets); ``header_start`` is where the function's definition begins, ``name`` its name.
    """

    name: str
    header_start: int
    header_end: int
    start: int
    end: int


def empty_bodies(text: str, language: str) -> list[EmptyBody]:
    """Every function in ``text`` whose body is still a placeholder."""
    parser = parser_for(language)
    if parser is None:
        return []
    source = _Source(text)
    tree = _TREES.parse(parser, language, source.data)
    found: list[EmptyBody] = []
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        stack.extend(reversed(node.children))
        if node.type not in _FUNCTIONS:
            continue
        body = node.child_by_field_name("body")
        if body is None:
            continue
        span = _python_placeholder(body) if language == "python" else _brace_placeholder(body)
        if span is None:
            continue
        name_node = node.child_by_field_name("name") or node.child_by_field_name("declarator")
        name = name_node.text.decode("utf-8", "replace") if name_node is not None and name_node.text else ""
        found.append(
            EmptyBody(
                name=name.split("(")[0],
                header_start=source.char(node.start_byte),
                header_end=source.char(body.start_byte),
                start=source.char(span[0]),
                end=source.char(span[1]),
            )
        )
    return found


def _python_placeholder(body: tree_sitter.Node) -> tuple[int, int] | None:
    statements = [child for child in body.named_children if child.type != "comment"]
    if statements and _is_docstring(statements[0]):
        statements = statements[1:]
    if len(statements) != 1:
        return None
    only = statements[0]
    if only.type == "pass_statement" or (
        only.type == "expression_statement" and [c.type for c in only.named_children] == ["ellipsis"]
    ):
        return only.start_byte, only.end_byte
    return None


def _is_docstring(node: tree_sitter.Node) -> bool:
    return node.type == "expression_statement" and [c.type for c in node.named_children] == ["string"]


def _brace_placeholder(body: tree_sitter.Node) -> tuple[int, int] | None:
    if body.type not in _BRACE_BODIES or body.text is None or not body.text.startswith(b"{"):
        return None
    if any(child.type not in ("comment", "line_comment", "block_comment") for child in body.named_children):
        return None
    return body.start_byte + 1, body.end_byte - 1
