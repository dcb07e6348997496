"""Per-file symbol summaries extracted from a tree with the ``grammars/<lang>/*.scm`` queries.

:func:`summarize` reads a whole document; :func:`resummarize` updates a previous summary after one
edit by re-running the queries only over the innermost definition that contains the edit (a
one-line edit in a 2,500-line file touches one function, not the file), and falls back to a full
pass when the edit reaches outside every definition or changes the structure around it.
Reference counts (used to rank "most used" names) are refreshed only by full passes.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from glm5_lsp.languages import Grammar

if TYPE_CHECKING:
    import tree_sitter

    from glm5_lsp.context.documents import Change, Document

MAX_REGION_BYTES = 16_384
CONTAINER_KINDS = frozenset({"class", "function", "method", "module"})
_MAX_SIGNATURE = 160
_SPACES = re.compile(r"\s+")
# Comments inside a signature (a '#' or '//' comment to the end of the line, a /* block */).
_LINE_COMMENT = {"python": re.compile(r"(?m)\s#[^\n'\"]*$")}
_C_COMMENT = re.compile(r"(?m)//[^\n]*$|/\*.*?\*/", re.DOTALL)


@dataclass(slots=True)
class SymbolInfo:
    """A named definition. ``parent`` is the qualname of the enclosing definition (None: top level)."""

    name: str
    qualname: str
    kind: str  # class, function, method, variable, parameter, field, module, type, import
    signature: str  # compact source-like line, e.g. "def parse(self, args: list[str]) -> Namespace"
    path: str
    line: int  # 0-based first line
    end_line: int
    parent: str | None = None
    doc: str = ""  # first line of the docstring or leading comment
    start_byte: int = 0
    end_byte: int = 0


@dataclass(frozen=True)
class ImportInfo:
    """One imported binding: ``import module``, ``from module import name as alias``, ``use module::name``."""

    module: str
    name: str | None
    alias: str | None
    line: int
    start_byte: int = 0
    end_byte: int = 0

    @property
    def bound(self) -> str:
        """The local name this import binds ('' for C includes and wildcards)."""
        if self.alias:
            return self.alias
        if self.name and self.name not in ("*", "self"):
            return self.name.split(".")[-1]
        if self.name == "self":
            return self.module.replace("::", ".").split(".")[-1]
        if self.name == "*" or self.module.endswith((".h", ".hpp", ">")):
            return ""
        module = self.module.strip("\"'<>")
        # Python binds the first component; Go/JS bind the last path component.
        return module.split(".")[0] if "/" not in module else module.rsplit("/", 1)[-1]

    @property
    def binds_to(self) -> str:
        """The dotted name the bound name refers to: ``import os.path`` binds ``os`` to ``os``."""
        target = self.target
        if not self.alias and not self.name and "." in target and "/" not in self.module:
            return target.split(".")[0]
        return target

    @property
    def target(self) -> str:
        """The dotted name the binding refers to (``os.path``, ``json.dumps``)."""
        module = self.module.strip("\"'<>").replace("::", ".")
        if self.name and self.name not in ("*", "self"):
            return f"{module}.{self.name}" if module not in (".",) else self.name
        return module


@dataclass
class FileSummary:
    """What one file defines, imports and uses, keyed by its content hash."""

    path: str
    digest: str
    language: str
    symbols: list[SymbolInfo] = field(default_factory=list)  # sorted by start_byte
    imports: list[ImportInfo] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)  # reference counts by name
    doc: str = ""  # module docstring / leading comment, first paragraph
    has_errors: bool = False
    stale: bool = False  # kept from before an edit that broke the structure (see ``resummarize``)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["symbols"] = [[getattr(s, f) for f in _SYMBOL_FIELDS] for s in self.symbols]
        data["imports"] = [[getattr(i, f) for f in _IMPORT_FIELDS] for i in self.imports]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], path: str | None = None) -> FileSummary:
        where = path or data["path"]
        symbols = [SymbolInfo(**dict(zip(_SYMBOL_FIELDS, row), path=where)) for row in data["symbols"]]
        imports = [ImportInfo(*row) for row in data["imports"]]
        return cls(where, data["digest"], data["language"], symbols, imports, data["usage"], data["doc"],
                   data["has_errors"], data.get("stale", False))

    def top_level(self) -> list[SymbolInfo]:
        return [s for s in self.symbols if s.parent is None and s.kind != "parameter"]

    def children(self, qualname: str) -> list[SymbolInfo]:
        return [s for s in self.symbols if s.parent == qualname and s.kind != "parameter"]


_SYMBOL_FIELDS = ("name", "qualname", "kind", "signature", "line", "end_line", "parent", "doc", "start_byte", "end_byte")
_IMPORT_FIELDS = ("module", "name", "alias", "line", "start_byte", "end_byte")


# -- extraction ---------------------------------------------------------------------------
@dataclass
class _Raw:
    kind: str
    name: str
    node_type: str
    start_byte: int
    end_byte: int
    line: int
    end_line: int
    signature: str
    doc: str
    receiver: str | None


def _cursor(query: tree_sitter.Query, start: int | None, end: int | None) -> tree_sitter.QueryCursor:
    import tree_sitter

    cursor = tree_sitter.QueryCursor(query)
    if start is not None and end is not None:
        cursor.set_byte_range(start, end)
    return cursor


def _signature(doc: Document, node: tree_sitter.Node, body: tree_sitter.Node | None, kind: str) -> str:
    end = body.start_byte if body is not None else node.end_byte
    if body is None and kind in ("variable", "field", "type"):
        end = min(end, node.start_byte + _MAX_SIGNATURE)
    text = doc.data[node.start_byte : end].decode("utf-8", errors="replace")
    if body is None:
        text = text.split("\n", 1)[0] if kind not in ("function", "method") else text
    text = _LINE_COMMENT.get(doc.language, _C_COMMENT).sub("", text)
    text = _SPACES.sub(" ", text).strip()
    text = text.rstrip("{:= ").rstrip()
    if len(text) > _MAX_SIGNATURE:
        text = text[: _MAX_SIGNATURE - 3] + "..."
    return text


def _docstring(doc: Document, node: tree_sitter.Node, body: tree_sitter.Node | None) -> str:
    """First line of a Python docstring, else of the comment right above the definition."""
    if body is not None and doc.language == "python" and body.named_child_count:
        first = body.named_children[0]
        if first.type == "expression_statement" and first.named_child_count and first.named_children[0].type == "string":
            return _first_line(_unquote(doc.node_text(first.named_children[0])))
    prev = node.prev_named_sibling
    if prev is not None and prev.type == "comment" and prev.end_point[0] + 1 >= node.start_point[0]:
        return _first_line(doc.node_text(prev).lstrip("/#*! "))
    return ""


_QUOTED = re.compile(r"""^[rRbBuUfF]*("{3}|'{3}|"|')(.*)\1$""", re.DOTALL)


def _unquote(literal: str) -> str:
    """The contents of a Python string literal (prefix and quotes removed)."""
    match = _QUOTED.match(literal.strip())
    return match.group(2) if match else literal


def _first_line(text: str) -> str:
    for line in text.strip().splitlines():
        line = line.strip().strip("\"'").strip()
        if any(c.isalnum() for c in line):
            return line[:_MAX_SIGNATURE]
    return ""


def _extract_defs(doc: Document, grammar: Grammar, start: int | None = None, end: int | None = None) -> list[_Raw]:
    out: list[_Raw] = []
    if grammar.definitions is None or doc.tree is None:
        return out
    seen: set[tuple[int, str]] = set()
    for _, caps in _cursor(grammar.definitions, start, end).matches(doc.tree.root_node):
        kind = node = None
        for cap, nodes in caps.items():
            if cap.startswith("definition."):
                kind, node = cap[11:], nodes[0]
                break
        if node is None or (start is not None and not (start <= node.start_byte and node.end_byte <= end)):
            continue
        names = caps.get("name")
        receiver = caps.get("receiver")
        if names is None and receiver is None:
            continue
        name = doc.node_text(names[0]) if names else doc.node_text(receiver[0])
        key = (node.start_byte, name)
        if key in seen:  # a node matched by two patterns (e.g. a function-valued variable)
            continue
        seen.add(key)
        body = caps.get("body", [None])[0]
        is_def = kind in CONTAINER_KINDS or kind == "type"
        out.append(
            _Raw(
                kind=kind,
                name=name,
                node_type=node.type,
                start_byte=node.start_byte,
                end_byte=node.end_byte,
                line=node.start_point[0],
                end_line=node.end_point[0],
                signature=name if kind == "parameter" else _signature(doc, node, body, kind),
                doc=_docstring(doc, node, body) if is_def else "",
                receiver=doc.node_text(receiver[0]) if receiver and names else None,
            )
        )
    out.sort(key=lambda r: (r.start_byte, -r.end_byte))
    return out


def _extract_imports(doc: Document, grammar: Grammar, start: int | None = None, end: int | None = None) -> list[ImportInfo]:
    out: list[ImportInfo] = []
    if grammar.imports is None or doc.tree is None:
        return out
    for _, caps in _cursor(grammar.imports, start, end).matches(doc.tree.root_node):
        stmt = caps.get("import", [None])[0]
        module = caps.get("module")
        if stmt is None or module is None:
            continue
        if start is not None and not (start <= stmt.start_byte and stmt.end_byte <= end):
            continue
        name = caps.get("name")
        alias = caps.get("alias")
        out.append(
            ImportInfo(
                module=doc.node_text(module[0]),
                name=doc.node_text(name[0]) if name else None,
                alias=doc.node_text(alias[0]) if alias else None,
                line=stmt.start_point[0],
                start_byte=stmt.start_byte,
                end_byte=stmt.end_byte,
            )
        )
    out.sort(key=lambda i: i.start_byte)
    return out


def _count_references(doc: Document, grammar: Grammar) -> dict[str, int]:
    if grammar.references is None or doc.tree is None:
        return {}
    counts: Counter[str] = Counter()
    for nodes in _cursor(grammar.references, None, None).captures(doc.tree.root_node).values():
        for node in nodes:
            counts[doc.data[node.start_byte : node.end_byte].decode("utf-8", errors="replace")] += 1
    return dict(counts)


def _link(
    raws: list[_Raw], path: str, python: bool, stack: list[tuple[int, str, str]] | None = None
) -> list[SymbolInfo]:
    """Give each raw definition its parent and qualname; functions inside classes become methods.

    ``stack`` holds the ``(end_byte, qualname, kind)`` of containers already open around ``raws``.
    """
    out: list[SymbolInfo] = []
    stack = list(stack or [])
    for raw in raws:
        while stack and stack[-1][0] <= raw.start_byte:
            stack.pop()
        # A parameter belongs to the function it sits in; so does anything else inside it.
        parent_q, parent_kind = (stack[-1][1], stack[-1][2]) if stack else (None, None)
        kind = raw.kind
        if raw.receiver:
            parent_q, parent_kind = raw.receiver, "class"
            if kind == "function":
                kind = "method"
        elif kind == "function" and parent_kind == "class":
            kind = "method"
        elif python and kind == "field" and parent_kind == "method":
            # self.x = ... inside a method: an attribute of the class.
            parent_q = parent_q.rsplit(".", 1)[0] if parent_q and "." in parent_q else parent_q
        elif kind == "variable" and parent_kind == "class":
            kind = "field"
        if raw.node_type == "impl_item":  # Rust impl: a container for the type's methods, not a symbol
            stack.append((raw.end_byte, raw.name, "class"))
            continue
        qualname = f"{parent_q}.{raw.name}" if parent_q else raw.name
        out.append(
            SymbolInfo(raw.name, qualname, kind, raw.signature, path, raw.line, raw.end_line, parent_q, raw.doc,
                       raw.start_byte, raw.end_byte)
        )
        if kind in CONTAINER_KINDS:
            stack.append((raw.end_byte, qualname, kind))
    return out


def _module_doc(doc: Document) -> str:
    if doc.tree is None:
        return ""
    root = doc.tree.root_node
    if not root.named_child_count:
        return ""
    first = root.named_children[0]
    if doc.language == "python" and first.type == "expression_statement" and first.named_child_count:
        inner = first.named_children[0]
        if inner.type == "string":
            return _unquote(doc.node_text(inner)).strip().split("\n\n", 1)[0].strip()
    if first.type == "comment":
        return doc.node_text(first).lstrip("/#*! ").split("\n\n", 1)[0].strip()
    return ""


def summarize(doc: Document, digest: str = "", usage: dict[str, int] | None = None) -> FileSummary:
    """A full summary of one document (plain text yields an empty one).

    ``usage`` (reference counts from a previous summary) skips recounting references.
    """
    grammar = doc.grammar
    summary = FileSummary(doc.path, digest, doc.language)
    if grammar is None or doc.tree is None:
        return summary
    python = doc.language == "python"
    summary.symbols = _link(_extract_defs(doc, grammar), doc.path, python)
    summary.imports = _extract_imports(doc, grammar)
    summary.usage = usage if usage is not None else _count_references(doc, grammar)
    summary.doc = _module_doc(doc)
    summary.has_errors = doc.has_errors
    return summary


def resummarize(doc: Document, old: FileSummary, change: Change, digest: str = "") -> FileSummary:
    """Update ``old`` after one edit (``change``: its byte range before and after, and its line delta).

    The region re-read is the innermost definition strictly around the edit, else the top-level
    statements the edit touches. When the edit broke the structure around it (half-typed code that
    tree-sitter recovers differently), the previous summary is kept with shifted positions and
    marked ``stale`` until an edit leaves the structure whole again.
    """
    grammar = doc.grammar
    if grammar is None or doc.tree is None or old.language != doc.language:
        return summarize(doc, digest)
    start, old_end, new_end = change.start_byte, change.old_end_byte, change.new_end_byte
    delta = new_end - old_end
    span_lo, span_hi = change.changed  # new-text bytes whose syntax changed
    region: SymbolInfo | None = None
    for sym in old.symbols:
        if (sym.kind in CONTAINER_KINDS and sym.start_byte < start and old_end < sym.end_byte
                and sym.start_byte < span_lo and span_hi < sym.end_byte + delta
                and (region is None or sym.start_byte >= region.start_byte)):
            region = sym
    if region is not None:
        lo, old_hi = region.start_byte, region.end_byte
        fresh = _extract_defs(doc, grammar, lo, old_hi + delta)
        whole = bool(fresh) and fresh[0].start_byte == lo and fresh[0].end_byte == old_hi + delta \
            and fresh[0].name == region.name
    else:
        lo, new_hi = min(start, span_lo), max(new_end, span_hi)
        for child in doc.tree.root_node.children:
            if child.start_byte <= max(span_hi, new_end, start + 1) and child.end_byte >= lo:
                lo, new_hi = min(lo, child.start_byte), max(new_hi, child.end_byte)
        old_hi = new_hi - delta
        # A large restructured region (half-typed code swallowing a class) is left stale rather
        # than re-read on every keystroke; queries re-read stale summaries in full.
        whole = old_hi >= lo and new_hi - lo <= MAX_REGION_BYTES and not any(
            s.start_byte < lo < s.end_byte or s.start_byte < old_hi < s.end_byte
            for s in [*old.symbols, *old.imports]
        )
        fresh = _extract_defs(doc, grammar, lo, new_hi) if whole else []
    if not whole:
        lo = old_hi = old_end  # keep everything; only move what follows the edit
        fresh = []
    before: list[SymbolInfo] = []
    after: list[SymbolInfo] = []
    stack: list[tuple[int, str, str]] = []
    lines = change.line_delta
    for sym in old.symbols:
        if sym.end_byte <= lo and (whole or sym.end_byte <= start):
            before.append(sym)  # untouched
        elif sym.start_byte < lo or (not whole and sym.start_byte <= start):  # around the edit: end moves
            moved = replace(sym, end_byte=sym.end_byte + delta, end_line=sym.end_line + lines)
            before.append(moved)
            stack.append((moved.end_byte, moved.qualname, moved.kind))
        elif sym.start_byte >= old_hi:
            after.append(
                SymbolInfo(sym.name, sym.qualname, sym.kind, sym.signature, sym.path, sym.line + lines,
                           sym.end_line + lines, sym.parent, sym.doc, sym.start_byte + delta, sym.end_byte + delta)
            )
    linked = _link(fresh, doc.path, doc.language == "python", stack) if fresh else []
    imports = [i for i in old.imports if not (whole and lo <= i.start_byte and i.end_byte <= old_hi)]
    imports = [
        replace(i, start_byte=i.start_byte + delta, end_byte=i.end_byte + delta, line=i.line + lines)
        if i.start_byte >= old_hi else i
        for i in imports
    ]
    if whole:
        imports = sorted(imports + _extract_imports(doc, grammar, lo, old_hi + delta), key=lambda i: i.start_byte)
    return FileSummary(doc.path, digest, doc.language, before + linked + after, imports, old.usage, old.doc,
                       doc.has_errors, stale=not whole or old.stale)
