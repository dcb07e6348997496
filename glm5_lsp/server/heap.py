"""Keeping Python's cyclic garbage collector out of the requests' way.

A full (generation 2) collection walks every object the collector tracks. After loading, the
server holds about 460,000 (the model, the vocabulary, the API-doc index, jedi's builtins), and a
full collection cost 0.4-0.6 s, landing in whichever request happened to allocate the object that
tipped the count. Three measures:

- :func:`settle_heap` after the model loads: collect, then ``gc.freeze()`` what survives, which
  moves it out of the collector's sight for good (reference counting still frees it when unused).
- :func:`freeze_survivors` after a document's warm-up (jedi's parse of the file and its imports:
  about 180,000 objects for ``argparse.py``): those live as long as the file is open, and left
  unfrozen they made each later full collection cost 130-230 ms instead of 3-80.
- :class:`IdleSettler`: frozen objects that later become cyclic garbage are never collected (a
  parse tree jedi drops is full of parent links), so after a quiet spell the server settles the
  heap again (unfreeze, full collection, freeze), on the model worker, where no completion waits.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import sys
from collections.abc import Callable

log = logging.getLogger(__name__)

IDLE_SETTLE_S = 30.0  # quiet seconds after the last activity before the heap is settled again


def settle_heap() -> None:
    """Undo the last freeze, collect everything, freeze what survives."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def release_memory() -> None:
    """Hand freed memory back to the system (glibc keeps what a large document's text and parse
    released for reuse, so the process would stay at its largest). Nothing elsewhere."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def freeze_survivors() -> None:
    """Freeze what the young generations hold after their garbage is collected (cheap: the frozen
    heap is not walked)."""
    gc.collect(1)
    gc.freeze()


class IdleSettler:
    """Runs ``settle`` once no activity was reported for ``idle_s`` seconds (and ``busy()`` is
    false), at most once per burst of activity. ``run`` executes the blocking ``settle`` off the
    event loop (the server passes its model worker, so a completion never overlaps it)."""

    def __init__(self, run: Callable[[Callable[[], None]], asyncio.Future[None]], busy: Callable[[], bool],
                 idle_s: float = IDLE_SETTLE_S, settle: Callable[[], None] = settle_heap) -> None:
        self.run = run
        self.busy = busy
        self.idle_s = idle_s
        self.settle = settle
        self.settled = 0  # how many times it ran (for logs and tests)
        self._timer: asyncio.TimerHandle | None = None

    def touch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Activity: (re)start the quiet-period clock."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_later(self.idle_s, lambda: loop.create_task(self._fire(loop)))

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        if self.busy():  # a request is running: wait for the next quiet spell
            self.touch(loop)
            return
        try:
            await self.run(self.settle)
        except Exception:  # never fatal: the collector still runs on its own
            log.exception("settling the heap failed")
            return
        self.settled += 1
        log.debug("heap settled after %.0f quiet seconds (%d objects frozen)", self.idle_s, gc.get_freeze_count())
