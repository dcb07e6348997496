"""``$/progress`` reporting that worker threads can call, and ``window/logMessage`` for log records."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING

from lsprotocol import types

if TYPE_CHECKING:
    from pygls.lsp.server import LanguageServer

log = logging.getLogger(__name__)

_LEVELS = {
    logging.ERROR: types.MessageType.Error,
    logging.WARNING: types.MessageType.Warning,
    logging.INFO: types.MessageType.Info,
    logging.DEBUG: types.MessageType.Log,
}


class WorkProgress:
    """One server-initiated progress bar: ``begin`` once, ``report`` from any thread, ``end`` once.

    Silently does nothing when the client does not support ``window/workDoneProgress``.
    """

    def __init__(self, server: LanguageServer, loop: asyncio.AbstractEventLoop, title: str) -> None:
        self.server = server
        self.loop = loop
        self.title = title
        self.token = f"glm5-{uuid.uuid4().hex[:12]}"
        window = server.client_capabilities.window if server.client_capabilities else None
        self.enabled = bool(window and window.work_done_progress)
        self._begun = False  # reports before the client accepted the token are dropped

    async def begin(self, message: str = "") -> None:
        if not self.enabled:
            return
        try:
            await self.server.work_done_progress.create_async(self.token)
        except Exception:  # a client that refuses the token just gets no progress bar
            log.debug("progress token refused", exc_info=True)
            self.enabled = False
            return
        self.server.work_done_progress.begin(
            self.token, types.WorkDoneProgressBegin(title=self.title, message=message or None, percentage=0)
        )
        self._begun = True

    def report(self, message: str, percentage: int | None = None) -> None:
        """Thread-safe: schedules the notification on the event loop."""
        if not (self.enabled and self._begun):
            return
        value = types.WorkDoneProgressReport(message=message, percentage=percentage)
        self.loop.call_soon_threadsafe(self.server.work_done_progress.report, self.token, value)

    def end(self, message: str = "") -> None:
        """Thread-safe."""
        if not (self.enabled and self._begun):
            return
        self.enabled = False
        value = types.WorkDoneProgressEnd(message=message or None)
        self.loop.call_soon_threadsafe(self.server.work_done_progress.end, self.token, value)


class ClientLogHandler(logging.Handler):
    """Forwards log records to the client as ``window/logMessage`` (from any thread)."""

    def __init__(self, server: LanguageServer, loop: asyncio.AbstractEventLoop, level: int) -> None:
        super().__init__(level)
        self.server = server
        self.loop = loop
        self.setFormatter(logging.Formatter("%(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            kind = _LEVELS.get(record.levelno, types.MessageType.Log)
            params = types.LogMessageParams(type=kind, message=message)
            if self.loop.is_closed():
                return
            self.loop.call_soon_threadsafe(self.server.window_log_message, params)
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)
