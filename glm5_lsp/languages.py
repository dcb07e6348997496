"""Languages: detection from a path or an LSP ``languageId``, tree-sitter grammars and their queries.

Grammars come from the published ``tree_sitter_<lang>`` packages and are loaded on first use;
queries are read from ``grammars/<lang>/*.scm`` (see ``grammars/README.md`` for the captures).
An unknown language is ``PLAIN`` ("plaintext"): no tree, plain-text context only.
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tree_sitter

PLAIN = "plaintext"
GRAMMARS_ENV = "GLM5_LSP_GRAMMARS_DIR"
QUERY_KINDS = ("definitions", "references", "blocks", "imports")

# language -> (module, function returning the language pointer)
_GRAMMAR_MODULES: dict[str, tuple[str, str]] = {
    "python": ("tree_sitter_python", "language"),
    "javascript": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"),
    "tsx": ("tree_sitter_typescript", "language_tsx"),
    "go": ("tree_sitter_go", "language"),
    "rust": ("tree_sitter_rust", "language"),
    "c": ("tree_sitter_c", "language"),
    "cpp": ("tree_sitter_cpp", "language"),
}
# Languages whose queries live in another language's folder.
_QUERY_FOLDER = {"tsx": "typescript"}

_EXTENSIONS: dict[str, str] = {
    ".py": "python", ".pyi": "python", ".pyw": "python",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".mts": "typescript", ".cts": "typescript", ".tsx": "tsx",
    ".go": "go", ".rs": "rust",
    ".c": "c", ".h": "c",
    ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".hpp": "cpp", ".hh": "cpp", ".hxx": "cpp", ".ipp": "cpp",
}
_LANGUAGE_IDS: dict[str, str] = {
    "python": "python", "javascript": "javascript", "javascriptreact": "javascript",
    "typescript": "typescript", "typescriptreact": "tsx", "go": "go", "rust": "rust",
    "c": "c", "cpp": "cpp", "cuda-cpp": "cpp", "objective-cpp": "cpp",
}
SOURCE_SUFFIXES = frozenset(_EXTENSIONS)
DOC_SUFFIXES = frozenset({".md", ".markdown", ".rst"})

# How each language writes a line comment (context headers are rendered as comments).
_COMMENT = {"python": "# "}


def detect_language(path: str | os.PathLike[str] | None = None, language_id: str | None = None) -> str:
    """The language name for a document: the LSP ``languageId`` wins, then the file extension."""
    if language_id:
        lang = _LANGUAGE_IDS.get(language_id.lower())
        if lang:
            return lang
    if path is not None:
        return _EXTENSIONS.get(Path(path).suffix.lower(), PLAIN)
    return PLAIN


def comment_prefix(language: str) -> str:
    """The line-comment marker (with a space) used to render context for ``language``."""
    return _COMMENT.get(language, "// " if language in _GRAMMAR_MODULES else "# ")


def grammars_dir() -> Path:
    """``$GLM5_LSP_GRAMMARS_DIR``, else the installed ``glm5_lsp/grammars``, else the repository's ``grammars/``."""
    env = os.environ.get(GRAMMARS_ENV)
    if env:
        return Path(env)
    installed = Path(__file__).resolve().parent / "grammars"  # a wheel maps grammars/ here
    return installed if installed.is_dir() else Path(__file__).resolve().parents[1] / "grammars"


@dataclass(frozen=True)
class Grammar:
    """A loaded tree-sitter language with its four compiled queries (``None`` where a file is absent)."""

    name: str
    language: tree_sitter.Language
    definitions: tree_sitter.Query | None
    references: tree_sitter.Query | None
    blocks: tree_sitter.Query | None
    imports: tree_sitter.Query | None

    def parser(self) -> tree_sitter.Parser:
        import tree_sitter

        return tree_sitter.Parser(self.language)


@functools.cache
def tree_sitter_language(language: str) -> tree_sitter.Language | None:
    """The tree-sitter language for a language name or LSP ``languageId`` (``typescriptreact`` -> tsx),
    or ``None`` when unknown or its grammar package is missing. The one place grammars are imported."""
    name = _LANGUAGE_IDS.get(language, language)
    spec = _GRAMMAR_MODULES.get(name)
    if spec is None:
        return None
    import logging

    import tree_sitter

    try:
        module = importlib.import_module(spec[0])
        return tree_sitter.Language(getattr(module, spec[1])())
    except (ImportError, AttributeError, ValueError) as err:
        logging.getLogger(__name__).warning("no tree-sitter grammar for %s (%s); using plain text", language, err)
        return None


def grammar_language_ids() -> frozenset[str]:
    """Every language name and LSP ``languageId`` that :func:`tree_sitter_language` can load."""
    names = set(_GRAMMAR_MODULES) | set(_LANGUAGE_IDS)
    return frozenset(n for n in names if tree_sitter_language(n) is not None)


@functools.cache
def load_grammar(language: str) -> Grammar | None:
    """The grammar for ``language``, or ``None`` for plain text or a grammar package that is missing."""
    ts_language = tree_sitter_language(language)
    if ts_language is None:
        return None
    import logging

    import tree_sitter

    folder = grammars_dir() / _QUERY_FOLDER.get(language, language)
    if not folder.is_dir():
        logging.getLogger(__name__).warning(
            "no tree-sitter queries for %s in %s (set $%s); summaries will be empty", language, folder, GRAMMARS_ENV
        )
    queries: dict[str, tree_sitter.Query | None] = {}
    for kind in QUERY_KINDS:
        path = folder / f"{kind}.scm"
        queries[kind] = tree_sitter.Query(ts_language, path.read_text(encoding="utf-8")) if path.exists() else None
    return Grammar(language, ts_language, **queries)


@functools.cache
def queries_fingerprint(language: str) -> str:
    """A digest of a language's query files: cached summaries are keyed by it, so editing a query
    invalidates what was extracted with the old one."""
    import hashlib

    digest = hashlib.blake2b(language.encode(), digest_size=8)
    folder = grammars_dir() / _QUERY_FOLDER.get(language, language)
    for kind in QUERY_KINDS:
        path = folder / f"{kind}.scm"
        if path.exists():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def supported_languages() -> tuple[str, ...]:
    """Languages with a tree-sitter grammar (everything else is plain text)."""
    return tuple(_GRAMMAR_MODULES)
