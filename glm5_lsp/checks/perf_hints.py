"""Performance hints: a small ast rule set for common Python hot spots, each with a rewrite.

Rules (``PerfHint.rule``):

- ``string-concat-in-loop``: ``s += ...`` on a string inside a loop (quadratic copying) -> collect
  the parts in a list and ``"".join`` them after the loop.
- ``list-membership-in-loop``: ``x in items`` inside a loop where ``items`` is a list (or a list
  literal) -> a set built once before the loop.
- ``regex-compile-in-loop``: ``re.compile(<constant>)`` inside a loop -> compile once, before it.
- ``attribute-lookup-in-loop``: the same loop-invariant attribute chain (``self.items.append``,
  ``math.sqrt``) looked up repeatedly in a loop body -> bind it to a local before the loop.

Positions are 0-based lines and columns (like ``Diagnostic``); the server turns hints into
information diagnostics with a code action showing ``rewrite``.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass

from glm5_lsp import pyparse

LOOPS = (ast.For, ast.AsyncFor, ast.While)


@dataclass(frozen=True)
class PerfHint:
    line: int
    col: int
    end_line: int
    end_col: int
    rule: str
    message: str
    rewrite: str  # the suggested code, ready to show in a code action


def perf_hints(code: str) -> list[PerfHint]:
    """Every hint for ``code``; a text that does not parse gets none."""
    try:
        tree = pyparse.parse(code)
    except (SyntaxError, ValueError):
        return []
    hints: list[PerfHint] = []
    for scope, loops in _scopes_with_loops(tree):
        facts = _ScopeFacts(scope)
        for loop in loops:
            body = _body_nodes(loop)  # walked once, read by every rule
            hints += _string_concat(body, facts)
            hints += _list_membership(body, facts)
            hints += _regex_compile(body)
            hints += _attribute_lookups(loop, body)
    unique = {(h.line, h.col, h.rule): h for h in hints}
    return sorted(unique.values(), key=lambda h: (h.line, h.col, h.rule))


def _scopes_with_loops(tree: ast.Module) -> list[tuple[ast.AST, list[ast.stmt]]]:
    """The module and every function, each with its own loops (not those of nested functions; a class
    body's loops belong to no scope), for the scopes that have any. One pass over the tree."""
    found: list[tuple[ast.AST, list[ast.stmt]]] = []
    scopes: list[ast.AST] = [tree]
    while scopes:
        scope = scopes.pop()
        loops: list[ast.stmt] = []
        stack = [(node, True) for node in ast.iter_child_nodes(scope)]  # (node, its loops are the scope's)
        while stack:
            node, own = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scopes.append(node)
                continue
            if isinstance(node, (ast.ClassDef, ast.Lambda)):
                own = False  # only looked through for the functions in it
            elif own and isinstance(node, LOOPS):
                loops.append(node)
            stack.extend((child, own) for child in ast.iter_child_nodes(node))
        if loops:
            found.append((scope, loops))
    return found


class _ScopeFacts:
    """What the scope's assignments say about a name's type: "str" or "list"."""

    def __init__(self, scope: ast.AST) -> None:
        self.kinds: dict[str, str] = {}
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                kind = _value_kind(node.value)
                if kind:
                    self.kinds[node.targets[0].id] = kind
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                annotation = ast.unparse(node.annotation)
                if annotation == "str" or annotation.startswith(("list", "List")):
                    self.kinds[node.target.id] = "str" if annotation == "str" else "list"
            elif isinstance(node, ast.arg) and node.annotation is not None:
                annotation = ast.unparse(node.annotation)
                if annotation == "str" or annotation.startswith(("list", "List")):
                    self.kinds[node.arg] = "str" if annotation == "str" else "list"


def _value_kind(value: ast.expr) -> str | None:
    if isinstance(value, ast.JoinedStr) or (isinstance(value, ast.Constant) and isinstance(value.value, str)):
        return "str"
    if isinstance(value, (ast.List, ast.ListComp)):
        return "list"
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        return {"str": "str", "list": "list", "sorted": "list"}.get(value.func.id)
    return None


def _stored_names(nodes: list[ast.AST]) -> set[str]:
    """Names bound or deleted among ``nodes`` (every node of a loop's body, ``_body_nodes``)."""
    return {node.id for node in nodes if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del))}


def _body_nodes(loop: ast.stmt) -> list[ast.AST]:
    return [sub for stmt in loop.body for sub in ast.walk(stmt)]  # type: ignore[attr-defined]


def _hint(node: ast.AST, rule: str, message: str, rewrite: str) -> PerfHint:
    return PerfHint(node.lineno - 1, node.col_offset, (node.end_lineno or node.lineno) - 1,  # type: ignore[attr-defined]
                    node.end_col_offset or node.col_offset, rule, message, rewrite)  # type: ignore[attr-defined]


def _string_concat(body: list[ast.AST], facts: _ScopeFacts) -> list[PerfHint]:
    hints = []
    for node in body:
        if not (isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        if facts.kinds.get(name) == "str" or _value_kind(node.value) == "str":
            part = ast.unparse(node.value)
            hints.append(_hint(node, "string-concat-in-loop",
                               f"`{name} += ...` in a loop copies the string each time (quadratic)",
                               f"{name}_parts = []  # before the loop\n{name}_parts.append({part})  # in the loop\n"
                               f"{name} = \"\".join({name}_parts)  # after the loop"))
    return hints


def _list_membership(body: list[ast.AST], facts: _ScopeFacts) -> list[PerfHint]:
    hints = []
    rebound = _stored_names(body)
    for node in body:
        if not isinstance(node, ast.Compare):
            continue
        for op, right in zip(node.ops, node.comparators):
            if not isinstance(op, (ast.In, ast.NotIn)):
                continue
            if isinstance(right, ast.Name) and facts.kinds.get(right.id) == "list" and right.id not in rebound:
                hints.append(_hint(node, "list-membership-in-loop",
                                   f"`in {right.id}` scans the list on every iteration",
                                   f"{right.id}_set = set({right.id})  # before the loop\n"
                                   f"{ast.unparse(node).replace(right.id, right.id + '_set')}"))
            elif isinstance(right, ast.List) and len(right.elts) > 3:
                items = ", ".join(ast.unparse(e) for e in right.elts)
                hints.append(_hint(node, "list-membership-in-loop",
                                   "a list literal is built and scanned on every iteration",
                                   f"{ast.unparse(node.left)} {'in' if isinstance(op, ast.In) else 'not in'} {{{items}}}"))
    return hints


def _regex_compile(body: list[ast.AST]) -> list[PerfHint]:
    hints = []
    for node in body:
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "compile"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
                and node.args and all(isinstance(a, ast.Constant) for a in node.args)):
            hints.append(_hint(node, "regex-compile-in-loop", "the same regular expression is compiled on every iteration",
                               f"PATTERN = {ast.unparse(node)}  # once, before the loop (or at module level)"))
    return hints


def _chain(node: ast.Attribute) -> tuple[str, str] | None:
    """``("self.items.append", "self")`` for a pure name.attr.attr chain, else None."""
    parts = [node.attr]
    value = node.value
    while isinstance(value, ast.Attribute):
        parts.append(value.attr)
        value = value.value
    if not isinstance(value, ast.Name):
        return None
    return ".".join([value.id, *reversed(parts)]), value.id


def _attribute_lookups(loop: ast.stmt, body: list[ast.AST]) -> list[PerfHint]:
    rebound = _stored_names(body)
    if isinstance(loop, (ast.For, ast.AsyncFor)):
        rebound |= _stored_names(list(ast.walk(loop.target)))
    counts: Counter[str] = Counter()
    first: dict[str, ast.Attribute] = {}
    stored_attrs = {ast.unparse(n) for n in body if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
    for node in body:
        if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
            continue
        chain = _chain(node)
        if chain is None or chain[1] in rebound or chain[0] in stored_attrs:
            continue
        counts[chain[0]] += 1
        first.setdefault(chain[0], node)
    # count only the longest chains (self.items.append, not also self.items)
    longest = [c for c in counts if not any(o != c and o.startswith(c + ".") for o in counts)]
    hints = []
    for chain in longest:
        depth = chain.count(".")
        if counts[chain] >= 2 or (depth >= 2 and len(loop.body) <= 2):  # type: ignore[attr-defined]
            local = chain.rsplit(".", 1)[-1]
            hints.append(_hint(first[chain], "attribute-lookup-in-loop",
                               f"`{chain}` is looked up on every iteration ({counts[chain]}x per pass)",
                               f"{local} = {chain}  # before the loop, then call `{local}(...)` inside it"))
    return hints
