"""Tree-sitter's ERROR and MISSING nodes: a syntax check for every language with an installed grammar.

Grammars are imported lazily (``tree_sitter_python``, ``tree_sitter_javascript``, ...); a language
whose grammar package is absent is simply not checked by this provider.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable

from tree_sitter import Language, Node, Parser

from glm5_lsp.repair.diagnostics import Diagnostic
from glm5_lsp.repair.providers.positions import byte_col_to_char

# language id -> (grammar module, function returning the language pointer)
GRAMMARS: dict[str, tuple[str, str]] = {
    "python": ("tree_sitter_python", "language"),
    "javascript": ("tree_sitter_javascript", "language"),
    "javascriptreact": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"),
    "typescriptreact": ("tree_sitter_typescript", "language_tsx"),
    "go": ("tree_sitter_go", "language"),
    "rust": ("tree_sitter_rust", "language"),
    "c": ("tree_sitter_c", "language"),
    "cpp": ("tree_sitter_cpp", "language"),
}

_languages: dict[str, Language | None] = {}
_lock = threading.Lock()


def load_language(language: str) -> Language | None:
    """The grammar for ``language``, or None when it is unknown or its package is not installed."""
    with _lock:
        if language not in _languages:
            _languages[language] = _import_language(language)
        return _languages[language]


def _import_language(language: str) -> Language | None:
    spec = GRAMMARS.get(language)
    if spec is None:
        return None
    try:
        module = importlib.import_module(spec[0])
    except ImportError:
        return None
    factory: Callable[[], object] = getattr(module, spec[1])
    return Language(factory())


class TreeSitterProvider:
    """Reports the outermost ERROR node of each broken region and every MISSING node."""

    name = "tree-sitter"

    def __init__(self, max_reports: int = 20) -> None:
        self.max_reports = max_reports
        self.languages = frozenset(lang for lang in GRAMMARS if load_language(lang) is not None)

    def diagnose(self, text: str, path: str, language: str) -> list[Diagnostic]:
        grammar = load_language(language)
        if grammar is None:
            return []
        source = text.encode("utf-8")
        tree = Parser(grammar).parse(source)
        found: list[Diagnostic] = []
        stack: list[Node] = [tree.root_node]
        while stack and len(found) < self.max_reports:
            node = stack.pop()
            if node.is_missing:
                found.append(self._report(text, node, f"missing `{node.type}`", "missing"))
            elif node.is_error:
                found.append(self._report(text, node, _error_message(source, node), "error"))
            elif node.has_error:
                stack.extend(reversed(node.children))
        return found

    def _report(self, text: str, node: Node, message: str, code: str) -> Diagnostic:
        (row, bcol), (end_row, end_bcol) = node.start_point, node.end_point
        col = byte_col_to_char(text, row, bcol)
        end_col = byte_col_to_char(text, end_row, end_bcol)
        return Diagnostic(row, col, end_row, end_col, message, "error", self.name, code)


def _error_message(source: bytes, node: Node) -> str:
    first = node.children[0] if node.children else node
    snippet = source[first.start_byte:first.end_byte].decode("utf-8", errors="replace").split("\n")[0]
    snippet = snippet.strip()[:40]
    return f"syntax error: unexpected `{snippet}`" if snippet else "syntax error"
