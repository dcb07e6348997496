"""Names the code uses but nothing defines: the closest name that exists, or the import that binds it.

- **An undefined name** (pyflakes' ``F821``): every name visible there (``repair.scope.names_in_scope``:
  the enclosing functions' locals and parameters, the module's names, the builtins) within a small
  edit distance of it ("Replace 'ojb' with 'obj'", a swapped pair of letters counting one), and
  the imports that would bind it as written (:mod:`glm5_lsp.quickfix.imports`: "Add 'import os'").
  ``self`` or ``cls`` in a method that does not take it gets it as the first parameter ("Add 'self'
  as the first parameter of 'get'"), where the method's kind (plain, ``classmethod``) asks for it.
  A bare name that is an attribute of the instance, in a method, gets its receiver ("Replace 'count'
  with 'self.count'": ``pynames.members.self_attributes`` reads what the class sets).
- **An attribute a module does not have** (``os.path.joni``, ``json.lods``): the checkers never
  see these, so :func:`attribute_problems` finds them. The module's attributes come from jedi (its
  completions after ``module.``, each module loaded once per process and bounded in time); a module
  with a ``__getattr__`` of its own, or a name the code binds again, is never judged. An attribute of
  ``self`` that no method of its class sets, and that the class body does not define, is judged
  from the file's text (``pynames.members.self_attributes``).

Both kinds give a :class:`~glm5_lsp.quickfix.edits.Candidate` per plausible name, every use of the
same undefined name replaced at once.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import logging
import re
import time
from collections.abc import Iterable, Iterator, Sequence

from glm5_lsp import pyparse
from glm5_lsp.checks.introduced import LineIndex
from glm5_lsp.deadline import call_with_timeout
from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.positions import byte_col_to_char
from glm5_lsp.pynames.jedi import members_known, module_members
from glm5_lsp.pynames.members import self_attributes
from glm5_lsp.pynames.scope import ALWAYS, names_in_scope
from glm5_lsp.quickfix import imports
from glm5_lsp.quickfix.edits import ADDED_LINE_COST, Candidate, Edit, word_distance

log = logging.getLogger(__name__)

SOURCE = "names"  # the source of :func:`attribute_problems`' diagnostics
ATTRIBUTE_CODE = "unknown-attribute"
WEAK_IMPORT_COST = 1.5  # a name found only among a module's public names: after a one-letter respelling
NOT_LOCAL_COST = 0.75  # a respelling as a builtin or a module-level name, rather than as a local
MAX_SUGGESTIONS = 3
_UNDEFINED = re.compile(r"^[Uu]ndefined name [`']([A-Za-z_]\w*)[`']")
_NOT_NAMES = frozenset(keyword.kwlist) - {"True", "False", "None"}


def undefined_name(diagnostic: Diagnostic) -> str | None:
    """The name an "undefined name" diagnostic (ruff's ``F821``, pyflakes' ``UndefinedName``) is about."""
    if diagnostic.code not in ("F821", "UndefinedName"):
        return None
    found = _UNDEFINED.match(diagnostic.message)
    return found.group(1) if found else None


def max_distance(word: str) -> int:
    """How far a misspelling of ``word`` may be from the name meant: one edit from 3 letters, two
    from 6 (shorter words: only a different case)."""
    return 0 if len(word) < 3 else 1 if len(word) < 6 else 2


def close_names(word: str, pool: Iterable[str], limit: int = MAX_SUGGESTIONS,
                counts: dict[str, int] | None = None) -> list[tuple[int, str]]:
    """``(distance, name)`` for the names of ``pool`` close to ``word``: nearest first, then the one
    the code uses most."""
    allowed = max_distance(word)
    lowered = word.lower()
    found = []
    for name in set(pool):
        if name == word or not name.isidentifier():
            continue
        if name.lower() == lowered:
            found.append((1, name))
            continue
        if abs(len(name) - len(word)) > allowed:
            continue
        distance = word_distance(word, name)
        if 0 < distance <= allowed:
            found.append((distance, name))
    counts = counts or {}
    # Nearest first; then the name whose first letter has the word's case (``cignature``: ``signature``
    # before ``Signature``), then the one the code uses most.
    found.sort(key=lambda item: (item[0], item[1][:1].isupper() != word[:1].isupper(), -counts.get(item[1], 0), item[1]))
    return found[:limit]


def word_counts(code: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for word in re.findall(r"[A-Za-z_]\w*", code):
        counts[word] = counts.get(word, 0) + 1
    return counts


def name_candidates(code: str, diagnostics: Sequence[Diagnostic], path: str | None = None) -> list[Candidate]:
    """For each undefined name: the close names visible at its first use, and its imports."""
    index = LineIndex(code)
    uses: dict[str, list[tuple[int, Diagnostic]]] = {}
    for diagnostic in diagnostics:
        name = undefined_name(diagnostic)
        if name is None:
            continue
        at = index.offset(diagnostic.line, diagnostic.col)
        if code[at:at + len(name)] == name:
            uses.setdefault(name, []).append((at, diagnostic))
    if not uses:
        return []
    undefined = set(uses)
    counts = word_counts(code)
    module_names = names_in_scope(code) - ALWAYS  # what the end of the file sees: the module's own names
    tree = _parsed(code)  # for the methods holding the uses (the receiver and attribute fixes)
    out: list[Candidate] = []
    for name, places in uses.items():
        first = places[0][0]
        lines = tuple(sorted({d.line for _, d in places}))
        visible = (names_in_scope(code[:first], code[first + len(name):]) | _comprehension_names(code, index, places[0][1]))
        visible -= undefined | _NOT_NAMES
        outer = module_names | ALWAYS
        if name in _FOREIGN_NAMES:  # another language's word for a Python constant
            meant = _FOREIGN_NAMES[name]
            out.append(Candidate(f"Replace {name!r} with {meant!r}", tuple(Edit(at, at + len(name), meant) for at, _ in places),
                                 "name", SOURCE, cost=RECEIVER_COST, targets=lines))
        for distance, other in close_names(name, visible, counts=counts):
            edits = tuple(Edit(at, at + len(name), other) for at, _ in places)
            # A local of the enclosing function is a likelier meaning than a builtin or a module's name.
            cost = distance + (NOT_LOCAL_COST if other in outer else 0.0)
            out.append(Candidate(f"Replace {name!r} with {other!r}", edits, "name", SOURCE, cost=cost,
                                 order=len(out), targets=lines))
        method = _enclosing_method(tree, index, first) if tree is not None else None
        if method is not None and name in _RECEIVERS:
            out += _receiver_candidates(code, index, method, name, lines)
        elif method is not None:
            out += _attribute_candidates(code, index, method, name, first, lines)
        for rank, suggestion in enumerate(imports.suggestions(name, code, path)):
            cost = ADDED_LINE_COST if suggestion.strong else WEAK_IMPORT_COST
            out.append(Candidate(f"Add {suggestion.statement!r}", (imports.import_edit(code, suggestion),), "import",
                                 SOURCE, cost=cost + rank * 0.01, targets=lines))
    return out


_FOREIGN_NAMES = {"null": "None", "NULL": "None", "nil": "None", "undefined": "None", "nullptr": "None"}
_RECEIVERS = {"self": "instance", "cls": "class"}  # the first parameter a method's kind names
RECEIVER_COST = 0.5  # one missing parameter: likelier than any respelling or import
SELF_ATTRIBUTE_COST = 0.5  # ``count`` where the instance has a ``count``: likelier than a respelling


def _parsed(code: str) -> ast.Module | None:
    """``code``'s tree, or None where it does not parse."""
    try:
        return pyparse.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _offset(code: str, index: LineIndex, lineno: int, col_offset: int) -> int:
    """The offset in ``code`` of an ``ast`` position (1-based line, UTF-8 byte column), reading only
    that line."""
    row = lineno - 1
    start = index.starts[row]
    end = index.starts[row + 1] if row + 1 < len(index.starts) else len(code)
    return start + byte_col_to_char(code[start:end], 0, col_offset)


def _enclosing_method(tree: ast.AST, index: LineIndex, at: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The innermost function defined directly in a class body whose lines hold offset ``at`` (None
    where there is none)."""
    use_line = index.position(at)[0] + 1  # as ast counts
    method = None
    for node in ast.walk(tree):  # outer classes first: the innermost method holding the use wins
        if isinstance(node, ast.ClassDef):
            for child in node.body:
                if (isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and child.lineno <= use_line <= (child.end_lineno or child.lineno)):
                    method = child
    return method


def _receiver_candidates(code: str, index: LineIndex, method: ast.FunctionDef | ast.AsyncFunctionDef, name: str,
                         lines: tuple[int, ...]) -> list[Candidate]:
    """``self`` (or ``cls``) used in ``method``, which does not take it (``def get():`` in a class
    body): the parameter added first. Not for a ``staticmethod`` (it takes none), nor ``self`` in a
    ``classmethod`` or ``cls`` in a plain method (the kind and the name disagree)."""
    decorators = {d.id if isinstance(d, ast.Name) else d.attr if isinstance(d, ast.Attribute) else ""
                  for d in method.decorator_list}
    kind = "class" if "classmethod" in decorators else "static" if "staticmethod" in decorators else "instance"
    if kind != _RECEIVERS[name]:
        return []
    arguments = method.args
    if any(a.arg == name for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)):
        return []
    def_at = _offset(code, index, method.lineno, method.col_offset)
    named = re.compile(rf"def\s+{re.escape(method.name)}\s*(?:\[[^\]]*\]\s*)?\(").search(code, def_at)
    if named is None:
        return []
    opening = named.end()
    takes_any = bool(arguments.posonlyargs or arguments.args or arguments.vararg or arguments.kwonlyargs
                     or arguments.kwarg)
    text = f"{name}, " if takes_any else name
    return [Candidate(f"Add {name!r} as the first parameter of {method.name!r}", (Edit(opening, opening, text),),
                      "name", SOURCE, cost=RECEIVER_COST, targets=lines)]


def _attribute_candidates(code: str, index: LineIndex, method: ast.FunctionDef | ast.AsyncFunctionDef, name: str,
                          first: int, lines: tuple[int, ...]) -> list[Candidate]:
    """A bare name that is an attribute of ``self`` in ``method``, which uses it (``count += 1`` where
    ``__init__`` sets ``self.count``; ``first``: its first reported use): ``self.`` before each use
    of it in that method."""
    if not method.args.args:
        return []
    receiver = method.args.args[0].arg
    attributes = self_attributes(code[:first], code[first:], receiver)
    if not attributes or name not in attributes:
        return []
    # Every use in the method, not only those reported: ``count += 1`` binds ``count`` as a local,
    # so a later ``return count`` is not undefined, and would be once the first became ``self.count``.
    uses = [node for node in ast.walk(method) if isinstance(node, ast.Name) and node.id == name]
    if any(isinstance(node.ctx, ast.Store) and not _augmented(method, node) for node in uses):
        return []  # assigned as a local somewhere: not the instance's
    edits = tuple(Edit(at, at, f"{receiver}.") for at in sorted(_offset(code, index, n.lineno, n.col_offset) for n in uses))
    if not edits:
        return []
    return [Candidate(f"Replace {name!r} with '{receiver}.{name}'", edits, "name", SOURCE, cost=SELF_ATTRIBUTE_COST,
                      targets=lines)]


def _augmented(scope: ast.AST, name: ast.Name) -> bool:
    """Whether ``name`` is the target of an augmented assignment (``count += 1``) in ``scope``."""
    return any(isinstance(node, ast.AugAssign) and node.target is name for node in ast.walk(scope))


_FOR_TARGETS = re.compile(r"\bfor\s+([\w\s,()\[\]]+?)\s+in\b")


def _comprehension_names(code: str, index: LineIndex, diagnostic: Diagnostic) -> set[str]:
    """The names a comprehension binds on the diagnostic's line (``x`` in ``[f(x) for x in xs]``,
    which ``names_in_scope`` reads only up to the use)."""
    line = diagnostic.line
    start = index.starts[line] if line < len(index.starts) else len(code)
    end = code.find("\n", start)
    text = code[start:end if end != -1 else len(code)]
    return {name for targets in _FOR_TARGETS.findall(text) for name in re.findall(r"[A-Za-z_]\w*", targets)}


# ---- attributes ------------------------------------------------------------------------------


def attribute_problems(code: str, path: str | None = None, seconds: float = 1.0) -> list[Diagnostic]:
    """Attributes read from an imported module that the module does not have, and ``self``
    attributes no method of the class sets; [] when ``code`` does not parse. jedi gets ``seconds``
    in all: a module it has not loaded by then is not judged."""
    try:
        tree = pyparse.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    found = _module_attribute_problems(code, tree, seconds)
    found += _imported_name_problems(code, tree)
    found += _self_attribute_problems(code, tree)
    return sorted(found, key=lambda d: (d.line, d.col))


def _module_aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> module, for the names an ``import`` binds to a module and nothing rebinds."""
    aliases: dict[str, str] = {}
    rebound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                module = alias.name if alias.asname else alias.name.split(".")[0]
                if bound in aliases and aliases[bound] != module:
                    rebound.add(bound)
                aliases[bound] = module
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                rebound.add(alias.asname or alias.name)  # a submodule at best: not judged
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            rebound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            rebound.add(node.name)
        elif isinstance(node, ast.arg):
            rebound.add(node.arg)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            rebound.update(node.names)
    return {name: module for name, module in aliases.items() if name not in rebound}


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]`` when the expression is names and attributes only."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _module_reads(tree: ast.AST) -> Iterator[tuple[ast.Attribute, str, str]]:
    """``(node, module, attribute)`` for each attribute read from an imported module (``os.path.joni``:
    ``os.path``, ``joni``; the modules between looked up, not imported)."""
    aliases = _module_aliases(tree)
    if not aliases:
        return
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
            continue
        parts = _dotted(node)
        if parts is None or parts[0] not in aliases or node.end_lineno is None or node.end_col_offset is None:
            continue
        module = aliases[parts[0]]
        for attribute in parts[1:-1]:  # ``os.path.joni``: ``os.path`` must be a module for ``joni`` to be judged
            if not imports.is_module(f"{module}.{attribute}"):
                module = ""
                break
            module = f"{module}.{attribute}"
        if module:
            yield node, module, parts[-1]


def _module_attribute_problems(code: str, tree: ast.AST, seconds: float) -> list[Diagnostic]:
    found: list[Diagnostic] = []
    started = time.monotonic()
    for node, module, attribute in _module_reads(tree):
        if attribute.startswith("__") and attribute.endswith("__"):
            continue  # ``module.__dict__``: every module has these, and jedi does not list them all
        members = _members(module, max(0.0, seconds - (time.monotonic() - started)))
        if not members or "__getattr__" in members or attribute in members:
            continue
        assert node.end_lineno is not None and node.end_col_offset is not None
        line = node.end_lineno - 1
        end = byte_col_to_char(code, line, node.end_col_offset)
        found.append(Diagnostic(line, max(0, end - len(attribute)), line, end,
                                f"module '{module}' has no attribute '{attribute}'", "error", SOURCE, ATTRIBUTE_CODE))
    return found


def _imported_name_problems(code: str, tree: ast.AST) -> list[Diagnostic]:
    """``from collections import defualtdict``: a name imported from a module that has no such
    attribute and no such submodule (judged as module attributes are: jedi's listing, no module
    ``__getattr__``). Only modules already listed are judged (``warm(imported_from=True)`` lists
    them where nobody waits): this runs for every candidate a fix judges, and a file imports from
    many modules."""
    found: list[Diagnostic] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module or not members_known(node.module):
            continue
        for alias in node.names:
            if alias.name == "*" or imports.is_module(f"{node.module}.{alias.name}"):
                continue
            members = module_members(node.module)
            if not members or "__getattr__" in members or alias.name in members:
                continue
            line = alias.lineno - 1
            col = byte_col_to_char(code, line, alias.col_offset)
            found.append(Diagnostic(line, col, line, col + len(alias.name),
                                    f"module '{node.module}' has no attribute '{alias.name}'", "error", SOURCE,
                                    ATTRIBUTE_CODE))
    return found


_SLOW: dict[str, float] = {}  # module -> the time its listing ran out of: not tried again with as little


def _members(module: str, seconds: float, retry: bool = False) -> frozenset[str] | None:
    """``module``'s attributes (``pynames.jedi.module_members``, kept per process), or None when they
    cannot be listed within ``seconds``. A module whose listing ran out of time is tried again only
    with more time than it had (each fix would lose its time the same way), or by :func:`warm`
    (``retry``)."""
    if members_known(module):
        return module_members(module)
    if seconds <= 0 or (not retry and seconds <= _SLOW.get(module, 0.0)):  # (an odd name: module_members says None)
        return None
    try:
        listed = call_with_timeout(lambda: module_members(module), seconds)
    except TimeoutError:
        _SLOW[module] = max(seconds, _SLOW.get(module, 0.0))
        return None
    _SLOW.pop(module, None)
    return listed


def warm(code: str, seconds: float = 10.0, imported_from: bool = False) -> int:
    """List the attributes of the modules ``code`` imports and reads attributes of, so that the
    first fix does not wait for jedi (the server does this when a file opens); with
    ``imported_from``, of the modules it imports names from too (``from m import x``: where nobody
    waits, as in batch; the editor lists those when a fix asks). Returns how many."""
    try:
        tree = pyparse.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return 0
    modules = {module for _, module, _ in _module_reads(tree)}
    if imported_from:
        modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    listed = 0
    started = time.monotonic()
    for module in sorted(modules):
        left = seconds - (time.monotonic() - started)
        if left <= 0:
            break
        listed += _members(module, left, retry=True) is not None
    return listed


def attribute_members(module: str, seconds: float = 1.0) -> list[str]:
    """The attributes jedi lists for ``module`` ([] when it cannot)."""
    return sorted(_members(module, seconds) or {})


# Attributes that come from somewhere the text does not show.
_DYNAMIC_ATTRIBUTES = re.compile(r"\bdef[ \t]+__(?:getattr|getattribute)__\b|\b(?:setattr|vars)\(|__dict__|__slots__")


def _self_attribute_problems(code: str, tree: ast.AST) -> list[Diagnostic]:
    """``self.name`` read in a method where the class has no ``name``: nothing in its body binds
    it, no method assigns it, no base defined in this file or built in has it. A class with a base
    from elsewhere, a metaclass, or one that makes attributes up (``__getattr__``, ``setattr``,
    ``__dict__``, ``__slots__``) is not judged. One walk of the tree (the file parses here)."""
    if _DYNAMIC_ATTRIBUTES.search(code):
        return []
    classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    found: list[Diagnostic] = []
    for node in classes.values():
        members = _class_members(node, classes, set())
        if members is None:
            continue
        for method, receiver in _instance_methods(node):
            for inner in ast.walk(method):
                if (isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Load)
                        and isinstance(inner.value, ast.Name) and inner.value.id == receiver
                        and inner.attr not in members and inner.end_col_offset is not None
                        and inner.end_lineno is not None):
                    line = inner.end_lineno - 1
                    end = byte_col_to_char(code, line, inner.end_col_offset)
                    found.append(Diagnostic(line, end - len(inner.attr), line, end,
                                            f"'{node.name}' has no attribute '{inner.attr}'", "error", SOURCE,
                                            ATTRIBUTE_CODE))
    return found


_NOT_INSTANCE = frozenset({"staticmethod", "classmethod"})
_OBJECT_ATTRIBUTES = frozenset(dir(type("_Plain", (), {})())) | {"__annotations__"}


def _instance_methods(node: ast.ClassDef) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str]]:
    for method in node.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or not method.args.args:
            continue
        decorators = {d.id if isinstance(d, ast.Name) else d.attr if isinstance(d, ast.Attribute) else ""
                      for d in method.decorator_list}
        if not decorators & _NOT_INSTANCE:
            yield method, method.args.args[0].arg


def _class_members(node: ast.ClassDef, classes: dict[str, ast.ClassDef], seen: set[str]) -> set[str] | None:
    """What an instance of ``node`` has, or None when part of it is out of sight."""
    if node.name in seen or node.keywords:
        return None if node.keywords else set()
    seen.add(node.name)
    names = set(_OBJECT_ATTRIBUTES)
    for base in node.bases:
        builtin = getattr(builtins, base.id, None) if isinstance(base, ast.Name) and base.id not in classes else None
        if isinstance(builtin, type):
            names |= set(dir(builtin)) | ({"__notes__"} if issubclass(builtin, BaseException) else set())
            continue
        if not isinstance(base, ast.Name) or base.id not in classes:
            return None  # imported, subscripted (``Generic[T]``) or computed
        inherited = _class_members(classes[base.id], classes, seen)
        if inherited is None:
            return None
        names |= inherited
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(statement.name)
        for target in _targets(statement):
            names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    for method, receiver in _instance_methods(node):
        for inner in ast.walk(method):
            if isinstance(inner, ast.Attribute) and isinstance(inner.ctx, (ast.Store, ast.Del)) and \
                    isinstance(inner.value, ast.Name) and inner.value.id == receiver:
                names.add(inner.attr)
    return names


def _targets(statement: ast.stmt) -> list[ast.expr]:
    if isinstance(statement, ast.Assign):
        return list(statement.targets)
    if isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
        return [statement.target]
    return []


def _members_of_class(code: str, name: str) -> set[str]:
    try:
        tree = pyparse.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    members = _class_members(classes[name], classes, set()) if name in classes else None
    return {m for m in members or () if not (m.startswith("__") and m.endswith("__"))}


_ATTRIBUTE = re.compile(r"^(?:module '([\w.]+)'|'(\w+)') has no attribute '(\w+)'$")


def attribute_candidates(code: str, problems: Sequence[Diagnostic], seconds: float = 1.0) -> list[Candidate]:
    """For each unknown attribute: the close attributes its module or class has."""
    index = LineIndex(code)
    counts = word_counts(code)
    tree: ast.AST | None = None  # parsed for the first imported name
    out: list[Candidate] = []
    for problem in problems:
        found = _ATTRIBUTE.match(problem.message) if problem.code == ATTRIBUTE_CODE else None
        if found is None:
            continue
        module, _class, attribute = found.groups()
        at = index.offset(problem.line, problem.col)
        if code[at:at + len(attribute)] != attribute:
            continue
        if module:
            pool: Iterable[str] = _members(module, seconds) or ()
        else:
            pool = _members_of_class(code, _class or "")
        # An imported name (``from m import defualtdict``) is also respelled where the file uses it.
        places = [at]
        if module:
            tree = tree or _parsed(code)
            places += _uses_of_imported(code, index, tree, problem, attribute) if tree is not None else []
        for distance, other in close_names(attribute, pool, counts=counts):
            edits = tuple(Edit(place, place + len(attribute), other) for place in sorted(set(places)))
            out.append(Candidate(f"Replace {attribute!r} with {other!r}", edits,
                                 "attribute", SOURCE, cost=float(distance), order=len(out), targets=(problem.line,)))
    return out


def _uses_of_imported(code: str, index: LineIndex, tree: ast.AST, problem: Diagnostic, name: str) -> list[int]:
    """Where the file (``tree``) uses ``name`` when ``problem`` is at a ``from ... import`` binding it
    under its own name (none otherwise: an attribute read, or ``import ... as`` another name)."""
    bound = any(isinstance(node, ast.ImportFrom) and any(
        a.name == name and a.asname is None and a.lineno - 1 == problem.line for a in node.names)
        for node in ast.walk(tree))
    if not bound:
        return []
    return [_offset(code, index, node.lineno, node.col_offset)
            for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id == name]
