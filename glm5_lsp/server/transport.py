"""The LSP base protocol on a byte stream: ``Content-Length`` framing that survives a lying client.

:class:`MessageReader` yields each message's body, or a :class:`FramingError` the protocol answers
(``-32700``/``-32600`` with ``id: null``) before it goes on. After any framing error it
resynchronises on the next ``Content-Length`` header, wherever in the stream that lies:

- a ``Content-Length`` too short: the body is cut there (and fails to parse); what is left of it is
  skipped up to the next header;
- too long: a raw ``Content-Length: N`` line inside a body ends it there (a JSON text cannot hold
  one: raw line breaks are not allowed in its strings, letters not outside them), so the next
  message is read at once instead of waiting for bytes that never come;
- non-numeric, negative, missing, or a header line that is not ``Name: value``: answered, then
  skipped to the next header;
- over ``max_body_bytes`` (``limits.maxMessageMb``): answered and skipped as it arrives, never
  held in memory (``Content-Length: 99999999999`` costs nothing).

Header names are matched without regard to case (``content-length`` is the same header), as
vscode-jsonrpc does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import BinaryIO

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 16
MAX_HEADER_BYTES = 8192  # a header block longer than this is not one
_HEADER_END = b"\r\n\r\n"
_HEADER_START = re.compile(rb"content-length[ \t]*:", re.IGNORECASE)
# A raw Content-Length line: never inside a JSON text, so inside a body it starts the next message.
_EMBEDDED_HEADER = re.compile(rb"content-length[ \t]*:[ \t]*\d+[ \t]*\r\n", re.IGNORECASE)
_HEADER_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+)[ \t]*:[ \t]*(.*?)[ \t]*")
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]*")
_OVERLAP = 64  # bytes kept between scans of a body, so a header split across reads is still found


@dataclass(frozen=True)
class FramingError:
    """A message that could not be framed: ``code`` is the JSON-RPC error it is answered with."""

    code: int
    message: str


@dataclass(frozen=True)
class Body:
    data: bytes


class MessageReader:
    """Reads framed messages from ``read`` (an awaitable ``read(n)`` returning b"" at the end)."""

    def __init__(self, read: Callable[[int], Awaitable[bytes]], max_body_bytes: Callable[[], int]) -> None:
        self._read = read
        self._max_body = max_body_bytes
        self._buffer = bytearray()
        self._eof = False

    async def _fill(self) -> bool:
        """Read more into the buffer; False at the end of the stream."""
        if self._eof:
            return False
        data = await self._read(READ_CHUNK)
        if not data:
            self._eof = True
            return False
        self._buffer += data
        return True

    async def next(self) -> Body | FramingError | None:
        """The next message body or framing error; None once the stream has ended."""
        while True:
            head = await self._header_block()
            if head is None:
                return None
            if isinstance(head, FramingError):
                return head
            length = head
            limit = self._max_body()
            if length > limit:
                log.warning("a message of %d bytes was refused unread: over the limit of %d bytes "
                            "(limits.maxMessageMb)", length, limit)
                await self._skip(length)
                return FramingError(-32600, f"message refused: its {length} bytes are over the server's "
                                            f"limit of {limit} bytes (limits.maxMessageMb)")
            return await self._body(length)

    async def _header_block(self) -> int | FramingError | None:
        """The Content-Length of the next header block, or the framing error it has."""
        while True:
            while len(self._buffer) < 2 and await self._fill():
                pass
            if not self._buffer:
                return None
            if self._buffer.startswith(b"\r\n"):  # blank lines between messages are harmless
                del self._buffer[:2]
                continue
            looks = _starts_like_header(self._buffer)
            if looks is None and await self._fill():
                continue
            if not looks:
                skipped = await self._resync()
                log.warning("skipped %d bytes that were not a message header", skipped)
                return FramingError(-32700, f"{skipped} bytes that are not a message were skipped")
            end = self._buffer.find(_HEADER_END, 0, MAX_HEADER_BYTES + len(_HEADER_END))
            if end < 0:
                if len(self._buffer) > MAX_HEADER_BYTES:
                    return await self._bad_header(f"a header block longer than {MAX_HEADER_BYTES} bytes")
                if not await self._fill():
                    return None
                continue
            problem, length = _content_length(bytes(self._buffer[:end]))
            if problem:
                return await self._bad_header(problem)
            del self._buffer[: end + len(_HEADER_END)]
            return length

    async def _bad_header(self, why: str) -> FramingError:
        """Answer a bad header block, then look for the next header from just inside it (a real
        header may follow garbage on the same line)."""
        log.warning("framing error: %s; skipping to the next header", why)
        del self._buffer[:1]
        await self._resync()
        return FramingError(-32700, f"framing error: {why}")

    async def _resync(self) -> int:
        """Drop bytes up to the next Content-Length header (or the end of the stream); how many."""
        dropped = 0
        while True:
            match = _HEADER_START.search(self._buffer)
            if match is not None:
                dropped += match.start()
                del self._buffer[: match.start()]
                return dropped
            keep = min(len(self._buffer), _OVERLAP)
            dropped += len(self._buffer) - keep
            del self._buffer[: len(self._buffer) - keep]
            if not await self._fill():
                dropped += len(self._buffer)
                self._buffer.clear()
                return dropped

    async def _body(self, length: int) -> Body | FramingError | None:
        scanned = 0
        while True:
            match = _EMBEDDED_HEADER.search(self._buffer, max(0, scanned - _OVERLAP), min(len(self._buffer), length + _OVERLAP))
            if match is not None and match.start() < length:
                body = bytes(self._buffer[: match.start()])
                del self._buffer[: match.start()]
                log.warning("Content-Length %d, but the next message's header starts after %d bytes: "
                            "the body is cut there", length, len(body))
                return Body(body)
            if len(self._buffer) >= length:
                body = bytes(self._buffer[:length])
                del self._buffer[:length]
                return Body(body)
            scanned = len(self._buffer)
            if not await self._fill():
                if self._buffer:
                    log.warning("the stream ended %d bytes into a %d-byte message", len(self._buffer), length)
                return None

    async def _skip(self, length: int) -> None:
        """Drop ``length`` bytes as they arrive (holding at most one read), stopping early at a header."""
        left = length
        while True:
            match = _EMBEDDED_HEADER.search(self._buffer, 0, min(len(self._buffer), left + _OVERLAP))
            if match is not None and match.start() < left:
                del self._buffer[: match.start()]
                return
            if len(self._buffer) >= left:
                del self._buffer[:left]
                return
            drop = max(0, len(self._buffer) - _OVERLAP)
            del self._buffer[:drop]
            left -= drop
            if not await self._fill():
                self._buffer.clear()
                return


def _starts_like_header(buffer: bytearray) -> bool | None:
    """Whether ``buffer`` starts with ``Name:`` (None: too little read to tell)."""
    name = _TOKEN.match(buffer).end()
    rest = buffer[name : name + 64].lstrip(b" \t")
    if not rest:
        return None if len(buffer) - name < 64 and name < 256 else False
    return name > 0 and rest[:1] == b":"


def _content_length(block: bytes) -> tuple[str, int]:
    """``("", length)`` for a header block, or ``(problem, 0)``."""
    lengths: list[bytes] = []
    for line in block.split(b"\r\n"):
        match = _HEADER_LINE.fullmatch(line)
        if match is None:
            return f"a header line that is not 'Name: value': {_show(line)}", 0
        if match.group(1).lower() == b"content-length":
            lengths.append(match.group(2))
    if not lengths:
        return "a message without a Content-Length header", 0
    if len(set(lengths)) > 1:
        return "conflicting Content-Length headers", 0
    if not lengths[0].isdigit():
        return f"an invalid Content-Length: {_show(lengths[0])}", 0
    return "", int(lengths[0])


def _show(value: bytes) -> str:
    text = value[:60].decode("ascii", "replace")
    return repr(text + ("..." if len(value) > 60 else ""))


class ThreadedStreamReader:
    """``read(n)`` over a blocking binary stream (stdin), read by a daemon thread so a client that
    never closes the stream cannot keep the process alive after ``exit``."""

    def __init__(self, stream: BinaryIO, loop: asyncio.AbstractEventLoop, queue_size: int = 16) -> None:
        self._stream = stream
        self._loop = loop
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(queue_size)
        self._thread = threading.Thread(target=self._run, name="glm5-stdin", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:  # the file descriptor itself: a buffered reader's lock, held by this thread's blocked
            fd = self._stream.fileno()  # read, would abort the interpreter's exit
            read: Callable[[int], bytes] = lambda n: os.read(fd, n)
        except (AttributeError, OSError, ValueError):
            read = getattr(self._stream, "read1", self._stream.read)
        while True:
            try:
                data = read(READ_CHUNK)
            except (OSError, ValueError):
                data = b""
            try:
                asyncio.run_coroutine_threadsafe(self._queue.put(data), self._loop).result()
            except (RuntimeError, asyncio.CancelledError):  # the loop is gone: the server is exiting
                return
            if not data:
                return

    async def read(self, n: int) -> bytes:
        return await self._queue.get()
