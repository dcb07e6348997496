"""Python's own parser, to syntax trees, from any thread.

CPython 3.11 and 3.12 count the depth of the tree they turn into ``ast`` objects in one counter per
interpreter, not per call (python/cpython#106905 and its follow-ups). When two threads convert at
once -- an allocation can run a finalizer, which can hand the interpreter to another thread -- the
counter is left wrong and the call fails with ``SystemError: AST constructor recursion depth
mismatch``. The server parses on many threads (a fix's quick fixes, the checks, the exception
finder), and the fuzz test met this as an internal error answering ``glm5.fix``.

Every parse to a tree in this package goes through :func:`parse`: one at a time under a process-wide
lock (a parse holds the interpreter lock for most of its run anyway, so nothing is lost), and tried
once more if a parser outside this package (a library's) still tripped the counter. A library call
that parses much, such as ``torch.jit.script`` (which reads the scripted methods' source with
``ast.parse``; a failure there would leave the session on the slower Python paths), runs inside
:func:`exclusive`. Compiling to bytecode builds no ``ast`` objects and needs none of this.
"""

from __future__ import annotations

import ast
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

_LOCK = threading.RLock()
_MISMATCH = "recursion depth mismatch"


def parse(source: str | bytes, filename: str = "<unknown>", mode: str = "exec", flags: int = 0) -> Any:
    """``ast.parse(source, filename, mode)`` (extra ``compile`` ``flags`` allowed), safe across threads.

    Raises what ``ast.parse`` raises (``SyntaxError``, ``ValueError`` for a NUL byte, ...)."""
    with _LOCK:
        try:
            return compile(source, filename, mode, flags | ast.PyCF_ONLY_AST, dont_inherit=True)
        except SystemError as error:
            if _MISMATCH not in str(error):
                raise
            log.debug("a parse met another thread's (%s): parsing again", error)
            return compile(source, filename, mode, flags | ast.PyCF_ONLY_AST, dont_inherit=True)


@contextmanager
def exclusive() -> Iterator[None]:
    """No parse of this package's runs inside (for a library call that parses to trees itself)."""
    with _LOCK:
        yield


def literal_eval(text: str) -> Any:
    """``ast.literal_eval(text)`` through :func:`parse`."""
    return ast.literal_eval(parse(text.lstrip(" \t"), mode="eval"))
