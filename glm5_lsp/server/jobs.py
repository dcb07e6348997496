"""Cancellation tokens and per-document supersession for work that runs off the event loop.

Every model request gets a :class:`CancelToken`; decoding polls ``token.cancelled`` between tokens
(the pipeline's ``should_cancel``). A newer request of the same kind for the same document
cancels the older one's token (:class:`Supersession`), and ``$/cancelRequest`` cancels it too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable


class CancelToken:
    """Set once; ``reason`` says who cancelled (``"client"``, ``"superseded"``, ``"timeout"``, ...)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def cancel(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def __call__(self) -> bool:
        """So a token can be passed wherever a ``should_cancel`` callable is expected."""
        return self._event.is_set()


class Supersession:
    """The latest token per key; starting a new one cancels the previous with reason ``superseded``."""

    def __init__(self) -> None:
        self._latest: dict[Hashable, CancelToken] = {}
        self._lock = threading.Lock()
        self._finished_at = float("-inf")  # time.monotonic() when the last job finished

    def begin(self, key: Hashable) -> CancelToken:
        token = CancelToken()
        with self._lock:
            previous = self._latest.get(key)
            self._latest[key] = token
        if previous is not None:
            previous.cancel("superseded")
        return token

    def finish(self, key: Hashable, token: CancelToken) -> None:
        with self._lock:
            if self._latest.get(key) is token:
                del self._latest[key]
            self._finished_at = time.monotonic()

    def busy(self) -> bool:
        """Whether any job is still running (begun and not finished)."""
        with self._lock:
            return bool(self._latest)

    def quiet_for(self) -> float:
        """Seconds since the last job finished (0 while one runs; infinite before the first)."""
        with self._lock:
            return 0.0 if self._latest else time.monotonic() - self._finished_at

    def cancel_where(self, matches: Callable[[Hashable], bool], reason: str) -> None:
        """Cancel (and forget) the jobs whose key ``matches``."""
        with self._lock:
            keys = [key for key in self._latest if matches(key)]
            tokens = [self._latest.pop(key) for key in keys]
        for token in tokens:
            token.cancel(reason)

    def cancel_all(self, reason: str) -> None:
        with self._lock:
            tokens = list(self._latest.values())
            self._latest.clear()
        for token in tokens:
            token.cancel(reason)
