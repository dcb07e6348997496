"""The attributes of ``self`` inside a method, from the file's text alone.

The decoding monitor asks for the attributes valid after a receiver (``self.``) to mask the ones
that do not exist. jedi infers them in 50-200 ms for a class of a 2,600-line file (``argparse``'s
``ArgumentParser``), often more than a completion's whole budget for such lookups; most receivers
the model writes in a method are ``self``, and a class defined in the same file has its members in
plain sight. :func:`self_attributes` reads them in a few milliseconds:

- the class is the one whose method (a ``def`` directly in its body, not a ``staticmethod`` or
  ``classmethod``) encloses the cursor, and the receiver must be that method's first parameter;
- its members are the names its body binds (``def``, nested ``class``, assignment and annotation
  targets), every ``<first parameter>.name`` its methods mention (assigned or read: a name too
  many only weakens the mask, a name too few would forbid a correct completion), the same for each
  base class defined at the top of this file, the attributes of a builtin base (``ValueError``,
  ``dict``) and what every instance has (``__dict__``, ``object``'s methods);
- where that cannot be told from the text (a base class imported from elsewhere, a subscripted or
  keyword base such as ``metaclass=``, a receiver that is not the method's first parameter, a
  ``from x import *``-style dynamic class) it answers None, and the caller asks jedi.

Blocks are read by :mod:`glm5_lsp.pysource` (strings and comments blanked out, logical lines,
indentation), as every other room reads them.
"""

from __future__ import annotations

import builtins
import keyword
import re

from glm5_lsp.pysource import Block, LogicalLine, logical_lines, walk_blocks

_TARGETS = re.compile(r"([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*,?\s*(?::(?!=)|=(?!=)|[-+*/%&|^@]=|//=|\*\*=|>>=|<<=)")
_FIRST_PARAM = re.compile(r"\s*([A-Za-z_]\w*)")


class _Plain:
    pass


# What any instance of a class has (``__dict__``, ``__module__``, ``__weakref__``, ``object``'s methods).
_INSTANCE_ATTRIBUTES = frozenset(dir(_Plain())) | {"__annotations__"}
_NOT_INSTANCE_METHODS = frozenset({"staticmethod", "classmethod"})


def _first_param(block: Block) -> str | None:
    found = _FIRST_PARAM.match(block.params)
    return found.group(1) if found else None


def _is_instance_method(block: Block) -> bool:
    if block.kind != "def" or block.parent is None or block.parent.kind != "class":
        return False
    return not any(d.split("(")[0].strip().split(".")[-1] in _NOT_INSTANCE_METHODS for d in block.decorators)


def _blocks(lines: list[LogicalLine], cursor: int) -> tuple[list[Block], list[Block]]:
    """The top-level blocks of ``lines`` and the chain of blocks enclosing line ``cursor``."""
    top: list[Block] = []
    chain: list[Block] = []

    def opened(block: Block) -> None:
        if block.parent is None:
            top.append(block)

    for number, (line, _found, stack) in enumerate(walk_blocks(lines, opened)):
        if number == cursor:  # the cursor's own line: inside every open block it is indented under
            chain = [b for b in stack if b.indent < line.indent]
    return top, chain


def _members(cls: Block, top: dict[str, Block], seen: set[str]) -> set[str] | None:
    """What an instance of ``cls`` has, or None when a base class is out of sight."""
    if cls.name in seen:
        return set()
    seen.add(cls.name)
    names: set[str] = set()
    for base in (b.strip() for b in cls.params.split(",") if b.strip()):
        builtin = getattr(builtins, base, None) if base not in top else None
        if isinstance(builtin, type):  # ``ValueError``, ``dict``: their attributes are known here
            names |= set(dir(builtin)) | ({"__notes__"} if issubclass(builtin, BaseException) else set())
            continue
        if not base.isidentifier() or base not in top or top[base].kind != "class":
            return None  # imported, subscripted (``Generic[T]``) or a keyword (``metaclass=``)
        inherited = _members(top[base], top, seen)
        if inherited is None:
            return None
        names |= inherited
    for line in cls.lines:
        found = _TARGETS.match(line.code)
        if found is not None:
            names.update(n.strip() for n in found.group(1).split(",") if not keyword.iskeyword(n.strip()))
    for child in cls.children:
        names.add(child.name)
        if _is_instance_method(child):
            receiver = _first_param(child)
            if receiver:
                names |= _mentioned(child, receiver)
    return names


def _mentioned(method: Block, receiver: str) -> set[str]:
    """Every ``receiver.name`` in ``method`` and the functions nested in it (not nested classes,
    whose methods have a ``self`` of their own)."""
    pattern = re.compile(rf"(?<![.\w]){re.escape(receiver)}\s*\.\s*([A-Za-z_]\w*)")
    found: set[str] = set()
    pending = [method]
    while pending:
        block = pending.pop()
        for line in block.lines:
            found.update(pattern.findall(line.code))
        pending.extend(child for child in block.children if child.kind == "def")
    return found


def self_attributes(before: str, after: str, receiver: str) -> set[str] | None:
    """The attributes valid after ``receiver.`` at the end of ``before`` (the file up to there;
    ``after`` is the rest of the file from the cursor on), or None when the text cannot tell."""
    lines = logical_lines(before)
    if not lines:
        return None
    cursor = len(lines) - 1
    newline = after.find("\n")
    if newline != -1:
        lines += logical_lines(after[newline + 1:])
    top_blocks, chain = _blocks(lines, cursor)
    method = next((b for b in reversed(chain) if _is_instance_method(b)), None)
    if method is None or _first_param(method) != receiver or method.parent is None:
        return None
    top = {b.name: b for b in top_blocks}
    members = _members(method.parent, top, set())
    return None if members is None else members | _INSTANCE_ATTRIBUTES
