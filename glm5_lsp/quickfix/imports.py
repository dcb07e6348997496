"""The import that binds a name the code uses but never defines: ``os`` -> ``import os``,
``defaultdict`` -> ``from collections import defaultdict``.

Where a name may come from, the likeliest first:

1. a module of that name (the standard library's, or one installed here: ``importlib.util.find_spec``);
   a conventional alias (``np`` for ``numpy``) when that module is installed;
2. a module the file already imports from: a submodule of it (``from docutils import nodes`` next
   to ``from docutils import utils``) or a public name its source defines;
3. how the file's own package and the packages it imports from import that name elsewhere, then
   where they define it (:func:`project_suggestions`);
4. the standard library's public names (:func:`stdlib_index`), a module the standard library itself
   imports that name from most often first (``Mapping``: ``collections.abc`` before ``typing``).

The index is read from the standard library's own source files (names defined at the top of each
public module, or its ``__all__``; ``dir()`` of the built-in and C modules, which only need
importing) in about 0.3 s, once per process; :func:`warm` does it ahead of the first fix.

An import goes with the file's other imports at the top (after the module docstring and any
``from __future__`` import), or joins a ``from M import ...`` line for the same module.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.machinery
import importlib.util
import logging
import os
import re
import sys
import sysconfig
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from importlib.machinery import ModuleSpec
from pathlib import Path

from glm5_lsp import pyparse
from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.postprocess import bracket_depth
from glm5_lsp.pysource import HEADER_LINE
from glm5_lsp.quickfix.edits import Edit

log = logging.getLogger(__name__)

# Conventional aliases, as the libraries' own documentation writes them; offered only where installed.
ALIASES: dict[str, str] = {"np": "numpy", "pd": "pandas", "plt": "matplotlib.pyplot", "sns": "seaborn",
                           "tf": "tensorflow", "nx": "networkx", "mpl": "matplotlib", "ET": "xml.etree.ElementTree"}
# Standard-library folders that are not importable API (tests, tools, the IDE, vendored packages).
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__",
                        "ensurepip", "turtledemo", "tkinter", "venv", "pydoc_data", "macholib"})
# Modules whose names live under another name: ``posixpath`` is ``os.path``.
_RENAMED = {"posixpath": "os.path"}
_PLATFORM_TWINS = frozenset({"ntpath", "nturl2path", "genericpath", "macpath", "this", "antigravity"})
# C modules never imported to read their names (importing them changes the terminal or the process).
_NOT_IMPORTED = frozenset({"readline", "curses", "tkinter", "_tkinter", "antigravity", "this"})

_ASSIGNED = re.compile(r"^([A-Za-z]\w*)[ \t]*(?::[^=\n]*)?=(?!=)", re.MULTILINE)  # a module-level name bound
_ALL = re.compile(r"^__all__[ \t]*(?::[^=\n]*)?=[ \t]*[\[(]", re.MULTILINE)
_QUOTED_NAME = re.compile(r"""['"]([A-Za-z_]\w*)['"]""")
_FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+([A-Za-z_][\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)", re.MULTILINE)
_PLAIN_IMPORT = re.compile(r"^[ \t]*import[ \t]+([A-Za-z_][\w.]*(?:[ \t]*,[ \t]*[A-Za-z_][\w.]*)*)", re.MULTILINE)
_RELATIVE_IMPORT = re.compile(r"^[ \t]*from[ \t]+(\.+)([A-Za-z_][\w.]*)?[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)",
                              re.MULTILINE)
_ALIASED_IMPORT = re.compile(r"^[ \t]*import[ \t]+([A-Za-z_][\w.]*(?:[ \t]+as[ \t]+\w+)?"
                             r"(?:[ \t]*,[ \t]*[A-Za-z_][\w.]*(?:[ \t]+as[ \t]+\w+)?)*)", re.MULTILINE)
_STAR_IMPORT = re.compile(r"^[ \t]*from[ \t]+(\.?[A-Za-z_][\w.]*)[ \t]+import[ \t]+\*", re.MULTILINE)
_DOCSTRING = re.compile(r"""\A(?:[ \t]*(?:#[^\n]*)?\n)*[ \t]*[rRuU]?(\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|"[^"\n]*"|'[^'\n]*')[^\n]*\n""")
_TOP_IMPORT = re.compile(r"^(?:import|from)[ \t]+[A-Za-z_.]", re.MULTILINE)


@dataclass(frozen=True)
class Suggestion:
    """An import statement that binds ``name``, and how sure it is (``strong``: a module of that
    name, the file's own module, or a name the standard library itself imports from there)."""

    name: str
    module: str  # the module to import from ("" for ``import name``)
    statement: str  # "import os", "from collections import defaultdict", "import numpy as np"
    strong: bool


@dataclass
class StdlibIndex:
    """Public names of the standard library: name -> modules defining it, with how often the
    standard library imports the name from each and each module at all."""

    names: dict[str, set[str]]
    imported: Counter[tuple[str, str]]  # (name, module) -> ``from module import name`` statements
    modules: Counter[str]  # module -> statements importing it or from it
    public: set[str]  # importable public module names
    _members: dict[str, frozenset[str]] | None = field(default=None, repr=False)

    def members(self, module: str) -> frozenset[str]:
        """The public names of a standard-library ``module``."""
        if self._members is None:
            reverse: dict[str, set[str]] = defaultdict(set)
            for name, owners in self.names.items():
                for owner in owners:
                    reverse[owner].add(name)
            self._members = {m: frozenset(n) for m, n in reverse.items()}
        return self._members.get(module, frozenset())

    def modules_for(self, name: str) -> list[tuple[str, bool]]:
        """The modules ``name`` may be imported from, likeliest first, and whether the standard
        library itself imports it from there."""
        found = self.names.get(name, set())
        # How often the standard library imports the name from there counts most, then how often it
        # imports the module at all.
        ranked = sorted(found, key=lambda m: (-(4 * self.imported[(name, m)] + self.modules[m]), m.count("."), m))
        return [(m, self.imported[(name, m)] > 0) for m in ranked]


def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _module_files(root: Path) -> dict[str, Path]:
    """Public module name -> source file, for every ``.py`` under the standard library's ``root``."""
    found: dict[str, Path] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith((".", "_")) and d.isidentifier())
        relative = Path(folder).relative_to(root)
        package = ".".join(relative.parts)
        if package and not (Path(folder) / "__init__.py").is_file():
            dirs[:] = []
            continue
        for file in files:
            if not file.endswith(".py"):
                continue
            stem = file[:-3]
            if stem.startswith("_") and stem != "__init__" or not stem.isidentifier() and stem != "__init__":
                continue
            module = package if stem == "__init__" else f"{package}.{stem}" if package else stem
            if module and module.split(".")[0] not in _PLATFORM_TWINS:
                found[module] = Path(folder) / file
    return found


def public_names(source: str) -> set[str]:
    """The names a module's source offers: its literal ``__all__``, else what it defines at the top
    (``def``, ``class``, assignments) without a leading underscore."""
    found = _ALL.search(source)
    if found is not None:
        end = source.find("\n", found.end())
        while end != -1 and bracket_depth(source[found.end() - 1:end], "python") > 0:
            end = source.find("\n", end + 1)
        literal = source[found.end() - 1:end if end != -1 else len(source)]
        try:
            names = {n for n in pyparse.literal_eval(literal.strip()) if isinstance(n, str) and n.isidentifier()}
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            names = set()  # computed (``[n for n in globals() ...]``, ``a + b``): read the definitions
        if names:
            return names
    defined = {m.group("name") for m in HEADER_LINE.finditer(source) if not m.group("indent")}
    return {name for name in defined | set(_ASSIGNED.findall(source)) if not name.startswith("_")}


def _imports_of(source: str, counts: Counter[tuple[str, str]], modules: Counter[str], own: str = "") -> None:
    """Count ``source``'s imports (``own``: the source's top-level package, whose imports from
    itself say nothing of how others use it: ``email`` imports its own ``Generator``)."""
    for found in _FROM_IMPORT.finditer(source):
        module = found.group(1)
        if any(part.startswith("_") for part in module.split(".")) or (own and module.split(".")[0] == own):
            continue
        modules[module] += 1
        for part in found.group(2).strip("()").replace("\n", " ").split(","):
            name = part.strip().split(" as ")[0].strip()
            if name.isidentifier():
                counts[(name, module)] += 1
    for found in _PLAIN_IMPORT.finditer(source):
        for module in found.group(1).split(","):
            modules[module.strip()] += 1


def build_stdlib_index(root: Path | None = None) -> StdlibIndex:
    """Read the standard library under ``root`` (this interpreter's by default) into an index."""
    root = root or _stdlib_root()
    files = _module_files(root)
    names: dict[str, set[str]] = defaultdict(set)
    imported: Counter[tuple[str, str]] = Counter()
    modules: Counter[str] = Counter()
    for module, file in files.items():
        try:
            source = file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        _imports_of(source, imported, modules, module.split(".")[0] if "." in module or file.name == "__init__.py" else "")
        owner = _RENAMED.get(module, module)
        found = public_names(source)
        # ``from _collections_abc import *``, ``from .tasks import *``: the module offers those names too.
        package = module if file.name == "__init__.py" else module.rpartition(".")[0]
        for star in _STAR_IMPORT.findall(source):
            source_module = f"{package}{star}" if star.startswith(".") else star
            found |= _star_names(root, source_module)
        for name in found:
            names[name].add(owner)
    compiled = [m for m in sorted(sys.stdlib_module_names) if not m.startswith("_") and m not in files
                and m not in _NOT_IMPORTED and m not in _PLATFORM_TWINS and _is_compiled(m)]
    for module in compiled:
        names_of = _compiled_names(module)
        for name in names_of:
            names[name].add(module)
    # A name a package offers through ``import *`` of its submodule is the package's to give.
    for name, owners in names.items():
        for owner in list(owners):
            parent = owner.rpartition(".")[0]
            if parent and parent in owners:
                owners.discard(owner)
    public = {_RENAMED.get(m, m) for m in files} | set(compiled)
    for name in list(names):
        if len(name) < 2:
            del names[name]
    return StdlibIndex(dict(names), imported, modules, public)


def _is_compiled(module: str) -> bool:
    """Whether ``module`` is a built-in or C extension module (importing it runs no Python code)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    origin = getattr(spec, "origin", None) if spec is not None else None
    return origin is not None and (origin == "built-in" or origin.endswith((".so", ".pyd")))


def _compiled_names(module: str) -> set[str]:
    try:
        with warnings.catch_warnings():  # ``audioop``, ``nis``: deprecated, still listed
            warnings.simplefilter("ignore")
            loaded = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - a module this platform lacks fails in its own way
        return set()
    return {name for name in dir(loaded) if not name.startswith("_")}


def _star_names(root: Path, module: str) -> set[str]:
    """The public names ``from module import *`` brings, read from its source under ``root`` (or
    from ``dir()`` when it is a C module)."""
    file = root.joinpath(*module.split(".")).with_suffix(".py")
    if not file.is_file():
        file = root.joinpath(*module.split("."), "__init__.py")
    if file.is_file():
        try:
            return public_names(file.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            return set()
    if module.split(".")[0] in _NOT_IMPORTED or not _is_compiled(module):
        return set()
    return _compiled_names(module)


@functools.cache
def stdlib_index() -> StdlibIndex:
    """:func:`build_stdlib_index` of this interpreter, built once per process."""
    return build_stdlib_index()


def warm(code: str = "", path: str | None = None) -> None:
    """Build the standard library's index now, and read the packages ``code`` (the file at ``path``)
    belongs to and imports from (the first fix that needs them would otherwise pay 0.3-1 s)."""
    stdlib_index()
    for package, root in _packages(code, path):
        _project_files(root, package)


@functools.lru_cache(maxsize=1024)
def find_module(module: str) -> ModuleSpec | None:
    """Where ``module`` would be imported from, found without importing anything: a loaded module's
    own spec, else each part looked up in its parent package's folders (``importlib.util.find_spec``
    would import the parent packages, running their code in this process)."""
    loaded = sys.modules.get(module)
    if loaded is not None:
        return getattr(loaded, "__spec__", None) or ModuleSpec(module, None)
    parts = module.split(".")
    if not all(part.isidentifier() for part in parts):
        return None
    try:
        if parts[0] in sys.builtin_module_names:
            spec = importlib.machinery.BuiltinImporter.find_spec(parts[0])
        else:
            spec = importlib.machinery.PathFinder.find_spec(parts[0])
        for part in parts[1:]:
            locations = getattr(spec, "submodule_search_locations", None) if spec is not None else None
            if not locations:
                return None
            spec = importlib.machinery.PathFinder.find_spec(f"{spec.name}.{part}", list(locations))
    except (ImportError, ValueError, OSError):
        return None
    return spec


def is_module(module: str) -> bool:
    """Whether ``module`` names an importable module (looked up, not imported)."""
    return find_module(module) is not None


@functools.lru_cache(maxsize=256)
def _module_names(module: str) -> frozenset[str]:
    """The public names of an installed module, read from its source (never imported)."""
    spec = find_module(module)
    origin = getattr(spec, "origin", None) if spec is not None else None
    if not origin or not origin.endswith(".py"):
        return frozenset()
    try:
        return frozenset(public_names(Path(origin).read_text(encoding="utf-8", errors="replace")))
    except OSError:
        return frozenset()


def imported_modules(code: str) -> list[str]:
    """The absolute modules ``code`` imports or imports from, in order of appearance."""
    found: list[str] = []
    for match in _FROM_IMPORT.finditer(code):
        found.append(match.group(1))
    for match in _PLAIN_IMPORT.finditer(code):
        found += [m.strip() for m in match.group(1).split(",")]
    return list(dict.fromkeys(m for m in found if not m.startswith(".")))


MAX_PROJECT_FILES = 1500  # a package with more source files than this is not read for its imports


def import_statements(source: str, module: str = "") -> list[tuple[str, str, str]]:
    """``(bound name, module, statement)`` for each name an import statement of ``source`` binds,
    relative imports made absolute from ``module`` (the source's own module name)."""
    found = []
    for match in _FROM_IMPORT.finditer(source):
        target = match.group(1)
        for part in match.group(2).strip("()").replace("\n", " ").replace("\\", " ").split(","):
            pieces = part.split()
            if not pieces or not pieces[0].isidentifier() or pieces[0] == "*":
                continue
            bound = pieces[2] if len(pieces) == 3 and pieces[1] == "as" else pieces[0]
            alias = f" as {bound}" if bound != pieces[0] else ""
            found.append((bound, target, f"from {target} import {pieces[0]}{alias}"))
    for match in _RELATIVE_IMPORT.finditer(source):
        dots, rest = match.group(1), match.group(2) or ""
        base = module.split(".")
        if len(dots) > len(base):
            continue
        target = ".".join(base[:len(base) - len(dots)] + ([rest] if rest else []))
        if not target:
            continue
        for part in match.group(3).strip("()").replace("\n", " ").replace("\\", " ").split(","):
            pieces = part.split()
            if not pieces or not pieces[0].isidentifier():
                continue
            bound = pieces[2] if len(pieces) == 3 and pieces[1] == "as" else pieces[0]
            alias = f" as {bound}" if bound != pieces[0] else ""
            found.append((bound, target, f"from {target} import {pieces[0]}{alias}"))
    for match in _ALIASED_IMPORT.finditer(source):
        for part in match.group(1).split(","):
            pieces = part.split()
            if not pieces:
                continue
            if len(pieces) == 3 and pieces[1] == "as":
                found.append((pieces[2], pieces[0], f"import {pieces[0]} as {pieces[2]}"))
            else:
                found.append((pieces[0].split(".")[0], "", f"import {pieces[0]}"))
    return found


@dataclass
class _ProjectFile:
    module: str
    imports: list[tuple[str, str, str]]
    defined: frozenset[str]


@functools.lru_cache(maxsize=16)
def _project_files(root: str, package: str) -> tuple[tuple[str, _ProjectFile], ...]:
    """Every source file of the package whose folder is ``root``: its imports and top-level names."""
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d.isidentifier() and d not in _SKIP_DIRS)
        relative = Path(folder).relative_to(root).parts
        for file in sorted(files):
            if not file.endswith(".py"):
                continue
            if len(out) >= MAX_PROJECT_FILES:
                return ()
            stem = file[:-3]
            module = ".".join([package, *relative] + ([] if stem == "__init__" else [stem]))
            path = os.path.join(folder, file)
            try:
                source = Path(path).read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            package_of = module if stem == "__init__" else module.rpartition(".")[0]
            out.append((os.path.realpath(path), _ProjectFile(module, import_statements(source, package_of + ".x"),
                                                             frozenset(public_names(source)))))
    return tuple(out)


def _packages(code: str, path: str | None) -> list[tuple[str, str]]:
    """``(package, folder)`` for the top-level packages ``code`` imports from and the package the
    file at ``path`` belongs to."""
    names = [m.split(".")[0] for m in imported_modules(code)]
    found = []
    if path:
        folder = Path(os.path.abspath(path)).parent
        top = None
        while (folder / "__init__.py").is_file():
            top = folder
            folder = folder.parent
        if top is not None and top.name.isidentifier():
            found.append((top.name, str(top)))
    for name in dict.fromkeys(names):
        if name in sys.stdlib_module_names or any(name == package for package, _ in found):
            continue
        spec = find_module(name)
        locations = list(getattr(spec, "submodule_search_locations", None) or []) if spec is not None else []
        if locations:
            found.append((name, locations[0]))
    return found


def project_suggestions(name: str, code: str, path: str | None) -> list[Suggestion]:
    """How the file's own package, and the packages it imports from, import ``name`` elsewhere
    (the statement most of their files use first), then where they define it. The document's own
    file on disk is left out: ``code`` is what it holds now."""
    own = os.path.realpath(path) if path else None
    statements: Counter[str] = Counter()
    modules: dict[str, str] = {}
    defined: list[str] = []
    for package, root in _packages(code, path):
        for file, summary in _project_files(root, package):
            if file == own:
                continue
            for bound, module, statement in summary.imports:
                if bound == name:
                    statements[statement] += 1
                    modules[statement] = module
            if name in summary.defined:
                defined.append(summary.module)
    out = [Suggestion(name, modules[s], s, True) for s, _ in statements.most_common()]
    out += [Suggestion(name, m, f"from {m} import {name}", True) for m in sorted(defined, key=lambda m: (m.count("."), m))]
    return out


def suggestions(name: str, code: str, path: str | None = None, limit: int = 3) -> list[Suggestion]:
    """Import statements that would bind ``name`` in ``code`` (the file at ``path``), likeliest first."""
    if not name.isidentifier():
        return []
    out: list[Suggestion] = []
    index = stdlib_index()
    # A module is used through its attributes: ``sorted(time)`` means a variable, not ``import time``.
    as_module = re.search(rf"(?<![\w.]){re.escape(name)}\s*\.\s*[A-Za-z_]", code) is not None
    if name in index.public or (name not in sys.builtin_module_names and is_module(name)):
        # ``rsa.key.PublicKey(...)``: ``import rsa.key`` binds ``rsa`` and loads what is used.
        used = [f"{name}.{attribute}" for attribute in
                dict.fromkeys(re.findall(rf"(?<![\w.]){re.escape(name)}\s*\.\s*([A-Za-z_]\w*)\s*\.", code))
                if is_module(f"{name}.{attribute}")]
        if used:
            out.append(Suggestion(name, "", f"import {', '.join(used)}", True))
        out.append(Suggestion(name, "", f"import {name}", as_module))
    if name in ALIASES and is_module(ALIASES[name]):
        out.append(Suggestion(name, ALIASES[name], f"import {ALIASES[name]} as {name}", True))
    for module in imported_modules(code):
        if is_module(f"{module}.{name}") or name in _module_names(module) or name in index.members(module):
            out.append(Suggestion(name, module, f"from {module} import {name}", True))
    # The project's own ``import a.b`` statements bind ``a`` too, but load ``a.b``: only when the code uses it.
    out += [p for p in project_suggestions(name, code, path) if not re.fullmatch(r"import [\w.]+\.\w+", p.statement)
            or re.search(rf"(?<![\w.]){re.escape(p.statement[len('import '):])}\b", code)]
    # A lowercase name the code neither calls nor reads attributes of reads as a variable (``sorted(time)``
    # with ``times`` in scope), so the standard library's ``time`` is a weak guess there.
    called = re.search(rf"(?<![\w.]){re.escape(name)}\s*\(", code) is not None
    like_import = name[:1].isupper() or called or as_module
    for module, strong in index.modules_for(name):
        out.append(Suggestion(name, module, f"from {module} import {name}", strong and like_import))
    first: dict[str, Suggestion] = {}
    for suggestion in out:
        first.setdefault(suggestion.statement, suggestion)
    unique = list(first.values())
    if unique and unique[0].statement == f"import {name}" and not _used_as_module(name, code, index):
        member = next((s for s in unique if s.statement == f"from {name} import {name}"), None)
        if member is not None:  # ``datetime.now()``, ``glob(pattern)``: the module's namesake is meant
            unique.remove(member)
            unique.insert(0, member)
    return unique[:limit]


def _used_as_module(name: str, code: str, index: StdlibIndex) -> bool:
    """Whether ``code`` uses ``name`` as the module of that name: only attributes the module has
    (``copy.deepcopy``), and never calls it (``copy(x)``)."""
    if re.search(rf"(?<![\w.]){re.escape(name)}\s*\(", code):
        return False
    attributes = set(re.findall(rf"(?<![\w.]){re.escape(name)}\s*\.\s*([A-Za-z_]\w*)", code))
    members = index.members(name) or _module_names(name)
    return not attributes or not members or attributes <= members


def import_edit(code: str, suggestion: Suggestion) -> Edit:
    """Where ``suggestion``'s statement goes in ``code``: joined to a one-line ``from M import ...``
    of the same module, else on its own line after the imports at the top of the file."""
    if suggestion.module and suggestion.statement.startswith("from "):
        pattern = re.compile(rf"^from[ \t]+{re.escape(suggestion.module)}[ \t]+import[ \t]+([^\n#;()\\]+?)[ \t]*$",
                             re.MULTILINE)
        found = pattern.search(code)
        if found is not None and " as " not in found.group(1):
            return Edit(found.end(1), found.end(1), f", {suggestion.name}")
    at = _import_line(code)
    return Edit(at, at, suggestion.statement + "\n")


def _import_line(code: str) -> int:
    """The offset of the line before which a new top-level import goes: after the last import of
    the file's leading block of imports (docstring, comments and ``__future__`` first)."""
    start = 0
    docstring = _DOCSTRING.match(code)
    if docstring is not None:
        start = docstring.end()
    last_import_end = None
    at = start
    while at < len(code):
        end = code.find("\n", at)
        end = len(code) if end == -1 else end + 1
        line = code[at:end]
        stripped = line.strip()
        if _TOP_IMPORT.match(line):
            statement_end = end
            while bracket_depth(code[at:statement_end], "python") > 0 and statement_end < len(code):
                next_end = code.find("\n", statement_end)
                statement_end = len(code) if next_end == -1 else next_end + 1
            last_import_end = statement_end
            at = statement_end
            continue
        if stripped and not stripped.startswith("#") and not line[0].isspace():
            break  # the first top-level code: imports end here
        if stripped and line[0].isspace():
            break
        at = end
    if last_import_end is not None:
        return last_import_end
    return start


_UNUSED = re.compile(r"^`([\w.]+)` imported but unused")


def unused_import_edits(code: str, diagnostics: list[Diagnostic]) -> list[tuple[str, Edit, int]]:
    """``(name, edit, line)`` removing each import that ruff reports unused (``F401``) and offers
    no fix for itself (it offers none in ``__init__.py``, where an import may be a re-export): the
    name taken out of its statement, the statement when it was the last. [] when the code does
    not parse."""
    wanted = [(d, _UNUSED.match(d.message)) for d in diagnostics if d.code in ("F401", "UnusedImport")]
    wanted = [(d, m.group(1)) for d, m in wanted if m is not None]
    if not wanted:
        return []
    try:
        tree = pyparse.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    statements = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    lines = code.split("\n")
    starts = [0]
    for text in lines:
        starts.append(starts[-1] + len(text) + 1)
    out = []
    for diagnostic, dotted in wanted:
        node = next((n for n in statements if n.lineno - 1 <= diagnostic.line <= (n.end_lineno or n.lineno) - 1), None)
        if node is None or node.end_lineno is None:
            continue
        def bound(alias: ast.alias, node: ast.stmt = node) -> str:
            if isinstance(node, ast.ImportFrom):
                return f"{node.module or ''}.{alias.asname or alias.name}".lstrip(".") if alias.asname is None else alias.asname
            return alias.asname or alias.name
        keep = [a for a in node.names if bound(a) != dotted and (a.asname or a.name) != dotted]
        if len(keep) == len(node.names):
            continue
        first, last = node.lineno - 1, node.end_lineno - 1
        if lines[first][:node.col_offset].strip() or lines[last][len(lines[last]) - 1:].strip() == ";":
            continue  # shares its line with other code: left to the user
        if keep:
            node.names = keep
            text = lines[first][:node.col_offset] + ast.unparse(node)
            edit = Edit(starts[first], starts[last] + len(lines[last]), text)
        else:
            edit = Edit(starts[first], min(starts[last + 1], len(code)), "")
        out.append((dotted, edit, diagnostic.line))
    return out
