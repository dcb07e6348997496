"""Where API-doc chunks come from: installed Python packages (read statically) and workspace docs.

Packages are never imported: a module is located with ``importlib.util.find_spec`` on its top-level
name (which runs finders only) and the package directories below it, then read with ``ast``. A
compiled module falls back to its typeshed stub shipped with jedi (signatures without docstrings).
Re-exports are followed one level (``from .decoder import JSONDecoder`` listed in ``__all__``,
``import posixpath as path`` in ``os``). A module that cannot be found or parsed yields no chunks
and one log line.

Chunks: one per public function, class and method (signature line plus docstring; a long docstring
is split at its section boundaries into several chunks with the same title), one for each module
docstring, and one per Markdown/reStructuredText section of the workspace's docs.
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import os
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from glm5_lsp import pyparse
from glm5_lsp.context.sources import read_source

log = logging.getLogger(__name__)

MAX_CHUNK_CHARS = 900
_STDLIB = Path(sysconfig.get_paths()["stdlib"])
# Docstring section headers: numpydoc ("Parameters" over dashes), Google ("Args:"), reST fields.
_SECTION = re.compile(
    r"^\s*(?:(?:[A-Z][A-Za-z ]{2,30})\n\s*[-=~]{3,}\s*$|"
    r"(?:Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|Examples?|Notes?|Attributes|"
    r"See Also|Warnings?|Keyword Arguments|Other Parameters|References):\s*$|:param\b)",
    re.MULTILINE,
)
_MD_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)
_RST_HEADING = re.compile(r"^(.+)\n([=\-~^\"'`#*+]{3,})\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Chunk:
    """One retrievable piece of documentation.

    ``title`` is a source-like line (``re.compile(pattern, flags=0)``), ``text`` the documentation
    under it, ``module`` the dotted module the symbol is reached through (``os.path``), ``name``
    the symbol's own name (``compile``), ``origin`` what produced it (``package:re``, ``doc:README.md``).
    """

    title: str
    text: str
    module: str
    name: str
    kind: str  # function, class, method, module, doc
    origin: str
    part: int = 0
    owner: str = ""  # the class of a method

    def render(self) -> str:
        return self.title + ("\n" + self.text if self.text else "")


# -- locating modules -------------------------------------------------------------------------
def _stub_dirs() -> list[Path]:
    try:
        import jedi
    except ImportError:
        return []
    base = Path(jedi.__file__).parent / "third_party" / "typeshed"
    return [base / "stdlib", *sorted((base / "stubs").glob("*"))]


def locate_module(dotted: str) -> Path | None:
    """The source (or stub) file of an installed module, found without importing it."""
    return _locate_source(dotted) or _stub_path(dotted)


def _locate_source(dotted: str) -> Path | None:
    top, *rest = dotted.split(".")
    if not top.isidentifier():
        return None
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError, AttributeError) as err:
        log.info("cannot locate module %s (%s)", top, err)
        return None
    if spec is None:
        return None
    path: Path | None = None
    if spec.origin and spec.origin not in ("built-in", "frozen") and spec.origin.endswith(".py"):
        path = Path(spec.origin)
    elif spec.origin == "frozen" and (_STDLIB / f"{top}.py").exists():
        path = _STDLIB / f"{top}.py"
    elif spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            init = Path(loc) / "__init__.py"
            if init.exists():
                path = init
                break
    for part in rest:
        if path is None or path.name != "__init__.py":
            return None
        folder = path.parent
        if (folder / part / "__init__.py").exists():
            path = folder / part / "__init__.py"
        elif (folder / f"{part}.py").exists():
            path = folder / f"{part}.py"
        else:
            return None
    return path


def is_installed(path: Path) -> bool:
    """True for files under the interpreter's stdlib or site-packages, or jedi's typeshed stubs."""
    paths = sysconfig.get_paths()
    roots = {paths["stdlib"], paths["platstdlib"], paths["purelib"], paths["platlib"]}
    text = str(path)
    return any(text.startswith(r + os.sep) for r in roots) or "typeshed" in path.parts


# -- reading a module with ast ----------------------------------------------------------------
def _parse(path: Path) -> ast.Module | None:
    source = read_source(path)
    if source is None:
        return None
    try:
        return pyparse.parse(source.text, filename=str(path))
    except (SyntaxError, ValueError, RecursionError) as err:
        log.info("%s: cannot parse for API docs (%s); skipped", path, err)
        return None


def _top_statements(tree: ast.Module) -> list[ast.stmt]:
    """Module-level statements, looking inside ``if``/``try`` blocks (platform branches)."""
    out: list[ast.stmt] = []
    stack = list(reversed(tree.body))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If):
            stack.extend(reversed(node.body + node.orelse))
        elif isinstance(node, ast.Try):
            stack.extend(reversed(node.body + node.orelse + node.finalbody))
        else:
            out.append(node)
    return out


def _static_all(stmts: list[ast.stmt]) -> list[str] | None:
    """``__all__`` when it is built from string literals (``=``, ``+=``, ``.extend``, ``.append``)."""
    names: list[str] | None = None

    def strings(node: ast.AST) -> list[str]:
        if isinstance(node, (ast.List, ast.Tuple)):
            return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        return []

    for node in stmts:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            names = strings(node.value)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id == "__all__":
            names = (names or []) + strings(node.value)
        elif (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
              and isinstance(node.value.func, ast.Attribute) and node.value.func.attr in ("extend", "append")
              and isinstance(node.value.func.value, ast.Name) and node.value.func.value.id == "__all__"
              and node.value.args):
            names = (names or []) + strings(node.value.args[0])
    return names


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef, drop_self: bool = False) -> str:
    args = node.args
    if drop_self and (args.posonlyargs or args.args):
        posonly, plain = list(args.posonlyargs), list(args.args)
        defaults = list(args.defaults)
        total = len(posonly) + len(plain)
        (posonly if posonly else plain).pop(0)
        if len(defaults) == total:
            defaults.pop(0)
        args = ast.arguments(posonlyargs=posonly, args=plain, vararg=args.vararg, kwonlyargs=args.kwonlyargs,
                             kw_defaults=args.kw_defaults, kwarg=args.kwarg, defaults=defaults)
    try:
        text = f"({ast.unparse(args)})"
        if node.returns is not None:
            text += f" -> {ast.unparse(node.returns)}"
    except (ValueError, AttributeError, RecursionError):
        text = "(...)"
    return text


def split_doc(doc: str, max_chars: int = MAX_CHUNK_CHARS) -> list[str]:
    """Split a docstring at section boundaries, then at paragraphs, into pieces of at most ``max_chars``."""
    doc = doc.strip()
    if len(doc) <= max_chars:
        return [doc] if doc else [""]
    cuts = sorted({0, *(m.start() for m in _SECTION.finditer(doc))})
    sections = [doc[a:b].strip() for a, b in zip(cuts, cuts[1:] + [len(doc)])]
    pieces: list[str] = []
    for section in filter(None, sections):
        current = ""
        for para in section.split("\n\n"):
            if current and len(current) + len(para) + 2 > max_chars:
                pieces.append(current)
                current = ""
            current = f"{current}\n\n{para}" if current else para
            while len(current) > max_chars:
                pieces.append(current[:max_chars])
                current = current[max_chars:]
        if current:
            pieces.append(current)
    return pieces or [""]


def _chunks_for(
    title: str, doc: str | None, module: str, name: str, kind: str, origin: str, owner: str = ""
) -> list[Chunk]:
    return [Chunk(title, piece, module, name, kind, origin, i, owner) for i, piece in enumerate(split_doc(doc or ""))]


def module_chunks(dotted: str, as_name: str | None = None, depth: int = 0) -> list[Chunk]:
    """Chunks for the public API of installed module ``dotted``, titled under ``as_name`` (default: itself).

    Names the source does not define (C functions pulled in by ``from posix import *``) are taken
    from the module's typeshed stub when one exists.
    """
    if depth == 0 and _locate_source(dotted) is None:
        alias = submodule_alias(dotted)
        if alias is not None:
            return module_chunks(alias, as_name or dotted)
    chunks = _source_chunks(dotted, as_name or dotted, depth)
    if depth == 0:
        covered = {(c.owner, c.name) for c in chunks}
        stub = _stub_path(dotted)
        if stub is not None and stub != locate_module(dotted):
            extra = _source_chunks(dotted, as_name or dotted, 1, stub)
            chunks += [c for c in extra if (c.owner, c.name) not in covered and c.kind != "module"]
    return chunks


def _stub_path(dotted: str) -> Path | None:
    source = _locate_source(dotted)
    if source is not None and source.with_suffix(".pyi").exists():
        return source.with_suffix(".pyi")
    for stub_dir in _stub_dirs():
        for candidate in (stub_dir.joinpath(*dotted.split(".")).with_suffix(".pyi"),
                          stub_dir.joinpath(*dotted.split("."), "__init__.pyi")):
            if candidate.exists():
                return candidate
    return None


def _source_chunks(dotted: str, shown: str, depth: int, path: Path | None = None) -> list[Chunk]:
    path = path or locate_module(dotted)
    if path is None:
        log.info("API docs: module %s not found; skipped", dotted)
        return []
    tree = _parse(path)
    if tree is None:
        return []
    origin = f"package:{dotted.split('.')[0]}"
    stmts = _top_statements(tree)
    public = _static_all(stmts)
    allowed = set(public) if public is not None else None

    def is_public(name: str) -> bool:
        return name in allowed if allowed is not None else not name.startswith("_")

    chunks: list[Chunk] = []
    module_doc = ast.get_docstring(tree)
    if module_doc:
        chunks += _chunks_for(f"module {shown}", module_doc, shown, shown.rsplit(".", 1)[-1], "module", origin)
    defined: set[str] = set()
    for node in stmts:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and is_public(node.name) and node.name not in defined:
            defined.add(node.name)
            chunks += _chunks_for(f"{shown}.{node.name}{_signature(node)}", ast.get_docstring(node), shown,
                                  node.name, "function", origin)
        elif isinstance(node, ast.ClassDef) and is_public(node.name) and node.name not in defined:
            defined.add(node.name)
            chunks += _class_chunks(node, shown, origin)
    if depth < 2:
        package = dotted if path.name.startswith("__init__.") else dotted.rpartition(".")[0]
        chunks += _reexports(stmts, package, shown, is_public, defined, allowed is not None, depth)
    return chunks


def _class_chunks(node: ast.ClassDef, module: str, origin: str) -> list[Chunk]:
    qual = f"{module}.{node.name}"
    init = next((n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "__init__"), None)
    try:
        bases = ", ".join(ast.unparse(b) for b in node.bases)
    except (ValueError, RecursionError):
        bases = ""
    title = f"class {qual}" + (_signature(init, drop_self=True) if init else f"({bases})" if bases else "")
    out = _chunks_for(title, ast.get_docstring(node), module, node.name, "class", origin)
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("_"):
            out += _chunks_for(f"{qual}.{item.name}{_signature(item, drop_self=True)}", ast.get_docstring(item),
                               module, item.name, "method", origin, owner=node.name)
    return out


def _reexports(
    stmts: list[ast.stmt], package: str, shown: str, is_public, defined: set[str], has_all: bool, depth: int
) -> list[Chunk]:
    """Public names the module imports from elsewhere, titled under ``shown``.

    With a static ``__all__``: the names it lists. Without: names (and ``*``) imported from the
    module's own package (``from .api import get``), the usual way a package exposes its API.
    """
    wanted: dict[str, set[str]] = {}
    for node in stmts:
        if isinstance(node, ast.ImportFrom) and (has_all or node.level):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                name = alias.asname or alias.name
                if alias.name == "*" and node.level:
                    wanted.setdefault(base, set()).add("*")
                elif alias.name != "*" and is_public(name) and name not in defined:
                    wanted.setdefault(base, set()).add(alias.name)
    out: list[Chunk] = []
    for source, names in wanted.items():
        for chunk in _source_chunks(source, shown, depth + 1):
            if chunk.kind == "module":
                continue
            if "*" in names or (chunk.kind in ("function", "class") and chunk.name in names) or chunk.owner in names:
                out.append(chunk)
    return out


def submodule_alias(dotted: str) -> str | None:
    """The module that ``dotted`` names through an import alias (``os.path`` -> ``posixpath``)."""
    parent, _, attr = dotted.rpartition(".")
    if not parent:
        return None
    path = _locate_source(parent)
    tree = _parse(path) if path is not None else None
    if tree is None:
        return None
    for node in _top_statements(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname == attr:
                    return alias.name
    return None


# -- workspace documentation -----------------------------------------------------------------
def doc_file_chunks(path: Path, rel: str) -> list[Chunk]:
    """One chunk per Markdown/reST section (split further when long), titled by its heading."""
    source = read_source(path)
    if source is None:
        return []
    text = source.text
    pattern = _MD_HEADING if path.suffix.lower() in (".md", ".markdown") else _RST_HEADING
    heads = [(m.start(), m.group(2) if pattern is _MD_HEADING else m.group(1)) for m in pattern.finditer(text)]
    if not heads or heads[0][0] > 0:
        heads.insert(0, (0, Path(rel).stem))
    out: list[Chunk] = []
    for (start, title), (end, _) in zip(heads, heads[1:] + [(len(text), "")]):
        body = text[start:end].strip()
        first_nl = body.find("\n")
        body = body[first_nl + 1 :].strip() if first_nl >= 0 and start > 0 else body
        if body:
            out += _chunks_for(f"{rel}: {title.strip()}", body, rel, title.strip(), "doc", f"doc:{rel}")
    return out


def python_doc_chunks(path: Path, rel: str, module: str) -> list[Chunk]:
    """Module and class docstrings of one workspace Python file."""
    tree = _parse(path)
    if tree is None:
        return []
    out: list[Chunk] = []
    doc = ast.get_docstring(tree)
    if doc:
        out += _chunks_for(f"module {module}", doc, module, module.rsplit(".", 1)[-1], "module", f"doc:{rel}")
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            cdoc = ast.get_docstring(node)
            if cdoc:
                out += _chunks_for(f"class {module}.{node.name}", cdoc, module, node.name, "class", f"doc:{rel}")
    return out
