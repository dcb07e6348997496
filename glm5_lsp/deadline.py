"""Run pure-Python work under a hard time limit, in the calling thread.

jedi answers most attribute lookups in tens of milliseconds, but one inference can run for a
second, and a completion that waits for it misses its budget. :func:`call_with_timeout` stops such
a call where it stands: a watchdog thread raises :class:`Overrun` inside the calling thread (CPython's
``PyThreadState_SetAsyncExc``), which unwinds the call at its next bytecode; the caller gets
``TimeoutError``. Work blocked inside one long C call is stopped only when that call returns.

``Overrun`` derives from ``BaseException`` so that the ``except Exception`` handlers of the code being
stopped do not swallow it. A watchdog that fires just as the call returns is disarmed under a lock,
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


def call_with_timeout(function: Callable[[], T], seconds: float, retry_s: float = 0.02) -> T:
    """``function()``, or ``TimeoutError`` once it has run ``seconds`` (checked between bytecodes).

    Python swallows an exception that lands in a finalizer (``__del__`` run by the garbage
    collector): the stop is then raised again every ``retry_s`` until the call ends."""
    if seconds <= 0:
        raise TimeoutError("no time left")
    thread = threading.get_ident()
    lock = threading.Lock()
    finished = threading.Event()

    def watch() -> None:
        if finished.wait(seconds):
            return
        while True:
            with lock:
                if finished.is_set():
                    return
                _set_async_exc(thread, Overrun)
            if finished.wait(retry_s):
                return

    def disarm() -> None:
        while True:
            try:
                with lock:  # the watcher only raises while holding it: none comes after this
                    finished.set()
                    _set_async_exc(thread, ctypes.py_object())  # withdraw a stop still pending (NULL)
                return
            except Overrun:  # one delivered just before the lock was taken
                continue

    watcher = threading.Thread(target=watch, name="deadline", daemon=True)
    try:
        try:
            watcher.start()
            return function()
        finally:
            disarm()
    except Overrun:
        disarm()  # a stop that landed after the call, before the first disarm got going
        raise TimeoutError(f"stopped after {seconds:.3f} s") from None
