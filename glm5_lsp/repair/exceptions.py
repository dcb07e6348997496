"""Error handling by template plus adaptive fill: specific exception types instead of ``except Exception``.

When the code at the cursor opens a handler (``except``), a ``raise`` or a ``try``, the templates
offered are filled with exception types that are actually known there: what the APIs called in the
``try`` body raise, then the project's own exception classes. The knowledge comes through the tiny
:class:`KnownExceptions` protocol, so the symbol table (``glm5_lsp.context.symbols``), jedi, or a
test double can supply it:

- :class:`DocumentExceptions`: what the functions defined in the document raise (``raise X`` /
  ``raise X(...)`` in their bodies) for a try body's calls, and the document's own exception
  classes at a ``raise`` (no calls);
- :class:`JediExceptions`: the called APIs resolved with jedi, their source read, their ``raise``
  statements collected (qualified with the module they were called through: ``json.JSONDecodeError``),
  plus a few builtins whose failures are documented rather than written as ``raise`` (``int`` ->
  ``ValueError``, ``open`` -> ``OSError``);
- :class:`SymbolTableExceptions`: the workspace's classes whose bases look like exceptions (at a
  ``raise``: the table knows classes, not what a call raises).

For generated code, :func:`exception_rewriter` is a repair-loop rewriter: a candidate's broad
handler (bare ``except:``, ``except Exception``/``BaseException``) over calls with known exception
types is narrowed to those types; the loop keeps the rewrite only if it adds no diagnostic.
"""

from __future__ import annotations

import ast
import builtins
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Protocol

from glm5_lsp import pyparse
from glm5_lsp.pynames.jedi import one_at_a_time
from glm5_lsp.pynames.jedi import script as jedi_script

log = logging.getLogger(__name__)

BROAD = frozenset({"Exception", "BaseException"})
BUILTIN_EXCEPTIONS = frozenset(n for n in dir(builtins) if isinstance(getattr(builtins, n), type)
                               and issubclass(getattr(builtins, n), BaseException))
# Builtins whose failures are documented rather than raised in Python source (typeshed has no bodies).
DOCUMENTED_RAISES: dict[str, tuple[str, ...]] = {
    "int": ("ValueError",), "float": ("ValueError",), "open": ("OSError",), "next": ("StopIteration",),
    "json.loads": ("json.JSONDecodeError",), "json.load": ("json.JSONDecodeError",),
    "dict.pop": ("KeyError",), "list.index": ("ValueError",), "list.remove": ("ValueError",),
    "os.remove": ("OSError",), "os.listdir": ("OSError",), "os.makedirs": ("OSError",),
    "subprocess.run": ("subprocess.CalledProcessError", "subprocess.TimeoutExpired"),
    "importlib.import_module": ("ImportError",),
}


class KnownExceptions(Protocol):
    """Exception class names relevant to a ``try`` body in ``code`` that calls ``called`` (dotted
    names as written), most specific first."""

    def exception_classes(self, code: str, called: Sequence[str]) -> list[str]: ...


@dataclass(frozen=True)
class ExceptionSite:
    """The cursor opens a handler, a raise, or a try block."""

    kind: str  # "except", "raise" or "try"
    indent: str  # indentation of the statement being written
    called: tuple[str, ...]  # calls in the enclosing try body (for "except")


_SITE = re.compile(r"^(?P<indent>[ \t]*)(?P<kw>except|raise|try)\b[^\n]*$")
_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\s*\(")


def exception_site(prefix: str) -> ExceptionSite | None:
    """Whether the last line of ``prefix`` (the code before the cursor) opens an exception construct."""
    last = prefix[prefix.rfind("\n") + 1:]
    match = _SITE.match(last)
    if match is None:
        return None
    indent, kind = match.group("indent"), match.group("kw")
    called: tuple[str, ...] = ()
    if kind == "except":
        lines = prefix.split("\n")[:-1]
        body: list[str] = []
        for line in reversed(lines):
            if line.strip() and not line.startswith(indent + " ") and not line.startswith(indent + "\t"):
                if line.strip().startswith("try") and line.startswith(indent):
                    break
                if line.strip().startswith(("except", "else", "finally")):
                    continue
                body = []  # not a try body after all
                break
            body.append(line)
        called = tuple(dict.fromkeys(_CALL.findall("\n".join(reversed(body)))))
    return ExceptionSite(kind, indent, called)


def handler_templates(site: ExceptionSite, exceptions: Sequence[str], body: str = "raise") -> list[str]:
    """``except`` clauses to offer at ``site`` (the text after the ``except`` keyword's indentation)."""
    if not exceptions:
        return []
    inner = site.indent + "    "
    found = list(dict.fromkeys(exceptions))
    templates = []
    if len(found) > 1:
        templates.append(f"except ({', '.join(found)}) as exc:\n{inner}{body}\n")
    templates += [f"except {name} as exc:\n{inner}{body}\n" for name in found]
    return templates


def raise_templates(exceptions: Sequence[str]) -> list[str]:
    """``raise`` statements for the known exception types (the project's own first when given so)."""
    return [f'raise {name}("")' for name in dict.fromkeys(exceptions)]


def templates_at(prefix: str, code: str, known: KnownExceptions) -> list[str]:
    """The filled templates for the cursor at the end of ``prefix`` (empty when it opens nothing)."""
    site = exception_site(prefix)
    if site is None:
        return []
    exceptions = known.exception_classes(code, site.called)
    if site.kind == "raise":
        return raise_templates(exceptions)
    if site.kind == "except":
        return handler_templates(site, exceptions)
    inner = site.indent + "    "  # "try": a whole skeleton
    return [f"try:\n{inner}pass\n{site.indent}{clause}" for clause in handler_templates(site, exceptions)]


# ---- narrowing broad handlers in generated code ------------------------------------------------


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _calls(nodes: Iterable[ast.AST]) -> list[str]:
    names: list[str] = []
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call):
                name = _dotted(sub.func)
                if name:
                    names.append(name)
    return list(dict.fromkeys(names))


def _is_broad(handler: ast.ExceptHandler) -> bool:
    return handler.type is None or (isinstance(handler.type, ast.Name) and handler.type.id in BROAD)


def narrow_broad_handlers(code: str, first_line: int, last_line: int, known: KnownExceptions) -> str | None:
    """``code`` with the broad handlers on lines ``first_line..last_line`` (0-based) narrowed to the
    exception types their try bodies' calls are known to raise; None when nothing changes."""
    try:
        tree = pyparse.parse(code)
    except SyntaxError:
        return None
    lines = code.split("\n")
    changed = False
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        broad = [h for h in node.handlers if _is_broad(h) and first_line <= h.lineno - 1 <= last_line]
        if not broad:
            continue
        exceptions = known.exception_classes(code, _calls(node.body))
        if not exceptions:
            continue
        spec = exceptions[0] if len(exceptions) == 1 else f"({', '.join(exceptions)})"
        for handler in broad:
            row = handler.lineno - 1
            new = re.sub(r"\bexcept\s*(?:(?:Base)?Exception\b)?", f"except {spec}", lines[row], count=1)
            new = new.replace(f"except {spec} :", f"except {spec}:")
            if new != lines[row]:
                lines[row] = new
                changed = True
    return "\n".join(lines) if changed else None


def exception_rewriter(known: KnownExceptions) -> Callable[[str, object], str | None]:
    """A :class:`~glm5_lsp.repair.loop.RepairLoop` rewriter narrowing the candidate's broad handlers."""

    def rewrite(candidate: str, target: object) -> str | None:
        if "except" not in candidate or getattr(target, "language", "python") != "python":
            return None
        document, start, end = target.document, target.start, target.end  # type: ignore[attr-defined]
        spliced = document[:start] + candidate + document[end:]
        first = document.count("\n", 0, start)
        last = first + candidate.count("\n")
        narrowed = narrow_broad_handlers(spliced, first, last, known)
        if narrowed is None:
            return None
        tail = len(document) - end
        return narrowed[start: len(narrowed) - tail]

    return rewrite


# ---- sources of knowledge ------------------------------------------------------------------------


def _raised_names(body: Sequence[ast.stmt]) -> list[str]:
    """Names raised directly in a function body (nested functions and classes excluded)."""
    found: list[str] = []
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            name = _dotted(target)
            if name and name[:1].isupper() or (name and "." in name):
                found.append(name)
        stack.extend(ast.iter_child_nodes(node))
    return list(dict.fromkeys(found))


def _looks_like_exception(bases: Iterable[str]) -> bool:
    return any(b.split(".")[-1] in BUILTIN_EXCEPTIONS or b.endswith(("Error", "Exception", "Warning"))
               for b in bases)


class DocumentExceptions:
    """What the document itself knows: its exception classes and what its functions raise."""

    def exception_classes(self, code: str, called: Sequence[str]) -> list[str]:
        try:
            tree = pyparse.parse(code)
        except SyntaxError:
            return []
        defined: list[str] = []
        raises: dict[str, list[str]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and _looks_like_exception(filter(None, map(_dotted, node.bases))):
                defined.append(node.name)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                raises.setdefault(node.name, _raised_names(node.body))
        if not called:  # a raise site: the project's own classes
            return list(dict.fromkeys(defined))
        found: list[str] = []
        for name in called:
            found += raises.get(name.split(".")[-1], [])
        return list(dict.fromkeys(found))


class JediExceptions:
    """The called APIs resolved with jedi; the exceptions their source raises (see module docstring)."""

    def exception_classes(self, code: str, called: Sequence[str]) -> list[str]:
        found: list[str] = []
        for name in called:
            found += DOCUMENTED_RAISES.get(name, ())
            try:
                found += self._raised_by(code, name)
            except Exception:
                log.debug("jedi could not resolve %s", name, exc_info=True)
        return list(dict.fromkeys(found))

    @one_at_a_time
    def _raised_by(self, code: str, called: str) -> list[str]:
        probe = code + "\n" + called
        lines = probe.split("\n")
        definitions = jedi_script(probe).infer(len(lines), len(lines[-1]) - 1)
        result: list[str] = []
        module = called.rsplit(".", 1)[0] if "." in called else ""
        for definition in definitions:
            if definition.module_path is None or definition.line is None or definition.type not in ("function",):
                continue
            for raised in _raises_in_file(str(definition.module_path), definition.line):
                base = raised.split(".")[-1]
                if base in BUILTIN_EXCEPTIONS:
                    result.append(base)
                elif module and "." not in raised and _resolves(code, f"{module}.{base}"):
                    result.append(f"{module}.{base}")
        return result


@lru_cache(maxsize=256)
def _raises_in_file(path: str, line: int) -> tuple[str, ...]:
    if not path.endswith(".py"):
        return ()
    try:
        tree = pyparse.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return ()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno == line:
            return tuple(_raised_names(node.body))
    return ()


@one_at_a_time
def _resolves(code: str, dotted: str) -> bool:
    probe = code + "\n" + dotted
    lines = probe.split("\n")
    return bool(jedi_script(probe).infer(len(lines), len(lines[-1]) - 1))


class SymbolTableExceptions:
    """The workspace's exception classes from a symbol table with ``summaries()`` of files whose
    ``symbols`` carry ``kind`` and ``signature`` (``glm5_lsp.context.symbols.SymbolTable``)."""

    def __init__(self, table: object) -> None:
        self.table = table

    def exception_classes(self, code: str, called: Sequence[str]) -> list[str]:
        if called:  # the table knows classes, not what a call raises
            return []
        found: list[str] = []
        for summary in self.table.summaries():  # type: ignore[attr-defined]
            for symbol in getattr(summary, "symbols", ()):
                if getattr(symbol, "kind", "") != "class" or getattr(symbol, "parent", None):
                    continue
                bases = re.search(r"\(([^()]*)\)", getattr(symbol, "signature", ""))
                if bases and _looks_like_exception(b.strip() for b in bases.group(1).split(",")):
                    found.append(symbol.name)
        return list(dict.fromkeys(found))


class CombinedExceptions:
    """Several sources in order (called APIs before project classes, say), duplicates dropped."""

    def __init__(self, sources: Sequence[KnownExceptions]) -> None:
        self.sources = list(sources)

    def exception_classes(self, code: str, called: Sequence[str]) -> list[str]:
        found: list[str] = []
        for source in self.sources:
            found += source.exception_classes(code, called)
        return list(dict.fromkeys(found))
