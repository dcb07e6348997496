"""Run pure-Python work under a hard time limit, in the calling thread.

jedi answers most attribute lookups in tens of milliseconds, but one inference can run for a
second, and a completion that waits for it misses its budget. :func:`call_with_timeout` stops such
a call where it stands: a watchdog thread raises :class:`Overrun` inside the calling thread (CPython's
``PyThreadState_SetAsyncExc``), which unwinds the call at its next bytecode; the caller gets
``TimeoutError``. Work blocked inside one long C call is stopped only when that call returns.

``Overrun`` derives from ``BaseException`` so that the ``except Exception`` handlers of the code being
stopped do not swallow it. A watchdog that fires just as the call returns is told to stop through a
C-level queue (one call, never cut in half by the stop it waits for); once it has stopped, a stop it
set that Python has not raised yet is raised on purpose and caught, so none escapes into the
caller's later code. Two things this module avoids on the way out: a Python lock (under a tracer,
``sys.settrace`` or ``cProfile``, a stop can land between a lock's acquisition and the ``with`` block
that would release it, and the next acquisition waits forever), and withdrawing a stop by setting a
NULL one (CPython 3.11 then leaves the thread's eval breaker raised for good: every later call takes
the slow path, and under a tracer a function's first instruction runs again and again, a hang).
"""

from __future__ import annotations

import ctypes
import queue
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
_set_async_exc.restype = ctypes.c_int


class Overrun(BaseException):
    """Raised inside a call that ran past its time (never seen by the caller of call_with_timeout)."""


def _land_pending_stop() -> None:
    """Nothing: entering a function is where Python raises an exception set from another thread."""


def call_with_timeout(function: Callable[[], T], seconds: float, retry_s: float = 0.02) -> T:
    """``function()``, or ``TimeoutError`` once it has run ``seconds`` (checked between bytecodes).

    Python swallows an exception that lands in a finalizer (``__del__`` run by the garbage
    collector): the stop is then raised again every ``retry_s`` until the call ends."""
    if seconds <= 0:
        raise TimeoutError("no time left")
    thread = threading.get_ident()
    stop: queue.SimpleQueue[None] = queue.SimpleQueue()  # put and get are single C calls
    stopped: queue.SimpleQueue[None] = queue.SimpleQueue()
    gone = [False]
    posted = [False]

    def told_to_stop(timeout: float) -> bool:
        try:
            stop.get(timeout=timeout)
            return True
        except queue.Empty:
            return False

    def watch() -> None:
        try:
            if told_to_stop(seconds):
                return
            while True:
                posted[0] = True
                _set_async_exc(thread, Overrun)
                if told_to_stop(retry_s):
                    return
        finally:
            gone[0] = True  # it sets nothing more (before ``stopped``: a disarm cut short reads this)
            stopped.put(None)

    def disarm() -> None:
        while True:
            try:
                if not gone[0]:
                    stop.put(None)  # again after a stop that landed here: the watcher reads one
                    stopped.get()
                if posted[0]:
                    _land_pending_stop()  # a call: the stop it set last, if Python has not raised it yet
                return
            except Overrun:  # set before the watcher was told; raised here, even as ``get`` returns
                continue

    watcher = threading.Thread(target=watch, name="deadline", daemon=True)
    try:
        try:
            watcher.start()
        except RuntimeError:  # no thread to be had: nothing watches, nothing to wait for
            gone[0] = True
            raise
        try:
            return function()
        finally:
            disarm()
    except Overrun:
        disarm()  # a stop that landed after the call, before the first disarm got going
        raise TimeoutError(f"stopped after {seconds:.3f} s") from None
