"""Run pure-Python work under a hard time limit, in the calling thread.

jedi answers most attribute lookups in tens of milliseconds, but one inference can run for a
second, and a completion that waits for it misses its budget. :func:`call_with_timeout` stops such
a call where it stands: a timer thread raises :class:`Overrun` inside the calling thread (CPython's
``PyThreadState_SetAsyncExc``), which unwinds the call at its next bytecode; the caller gets
``TimeoutError``. Work blocked inside one long C call is stopped only when that call returns.

``Overrun`` derives from ``BaseException`` so that the ``except Exception`` handlers of the code being
stopped do not swallow it. A timer that fires just as the call returns is disarmed under a lock,
and an exception it had already set but not yet delivered is withdrawn, so it never escapes into
the caller's later code.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
_set_async_exc.restype = ctypes.c_int


class Overrun(BaseException):
    """Raised inside a call that ran past its time (never seen by the caller of call_with_timeout)."""


def call_with_timeout(function: Callable[[], T], seconds: float) -> T:
    """``function()``, or ``TimeoutError`` once it has run ``seconds`` (checked between bytecodes)."""
    if seconds <= 0:
        raise TimeoutError("no time left")
    thread = threading.get_ident()
    lock = threading.Lock()
    state = {"done": False, "fired": False}

    def interrupt() -> None:
        with lock:
            if not state["done"]:
                state["fired"] = True
                _set_async_exc(thread, Overrun)

    timer = threading.Timer(seconds, interrupt)
    timer.daemon = True
    try:
        timer.start()
        try:
            return function()
        finally:
            with lock:
                state["done"] = True
                if state["fired"]:
                    _set_async_exc(thread, ctypes.py_object())  # withdraw it if still pending (NULL clears)
            timer.cancel()
    except Overrun:
        raise TimeoutError(f"stopped after {seconds:.3f} s") from None
