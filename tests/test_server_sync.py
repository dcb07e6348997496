"""Document sync: the server's copy of a document stays the editor's, by LSP's line rules.

The editor here is a reference written independently of the server's (``Editor``: the text split
with one regular expression, positions counted in UTF-16 units); every change goes through the
server's real message path (``Glm5Protocol.receive``: parsing, the strict converter, pygls'
dispatch, ``SyncedDocument``), and after each one the two texts are compared.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import re
import time
from typing import Any

import pytest
from lsprotocol import types

from glm5_lsp.server import text as text_module
from glm5_lsp.server.server import build_server
from glm5_lsp.server.text import ChunkedText, SyncedDocument, View, document_view, line_starts, split_chunks

# Every character str.splitlines breaks at that LSP does not, and the three that LSP does.
LINE_LIKE = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
BREAKS = ["\n", "\r\n", "\r"]
PIECES = [*LINE_LIKE, *BREAKS, "a", "b", "def f():", "    ", "é", "€", "😀", "𝔸", "\t", "x = 1"]
URI = "file:///tmp/glm5_sync/doc.py"


class Editor:
    """What the client holds: the text, and positions in UTF-16 units by LSP's line rules."""

    def __init__(self, text: str) -> None:
        self.text = text

    def lines(self) -> list[tuple[int, int]]:
        """``(start, end)`` of each line without its break."""
        spans, start = [], 0
        for match in re.finditer(r"\r\n|\r|\n", self.text):
            spans.append((start, match.start()))
            start = match.end()
        spans.append((start, len(self.text)))
        return spans

    def offset(self, line: int, units: int) -> int:
        start, end = self.lines()[line]
        count = 0
        for index in range(start, end):
            if count >= units:
                return index
            count += 2 if ord(self.text[index]) > 0xFFFF else 1
        return end

    def units(self, line: int, offset: int) -> int:
        start, _ = self.lines()[line]
        return sum(2 if ord(ch) > 0xFFFF else 1 for ch in self.text[start:offset])

    def random_position(self, rng: random.Random) -> types.Position:
        lines = self.lines()
        line = rng.randrange(len(lines))
        start, end = lines[line]
        if rng.random() < 0.05:  # past the line's end: the protocol says it means the line's end
            return types.Position(line=line, character=self.units(line, end) + rng.randint(1, 5))
        return types.Position(line=line, character=self.units(line, rng.randint(start, end)))

    def apply(self, start: types.Position, end: types.Position, text: str) -> None:
        a, b = self.offset(start.line, start.character), self.offset(end.line, end.character)
        a, b = min(a, b), max(a, b)
        self.text = self.text[:a] + text + self.text[b:]


def _random_text(rng: random.Random, pieces: int) -> str:
    return "".join(rng.choice(PIECES) for _ in range(pieces))


def _notification(method: str, params: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode()


async def _sync_run(edits: int, seed: int, initial: str) -> None:
    server = build_server()
    written: list[bytes] = []
    server.protocol.set_writer(type("W", (), {"write": lambda self, data: written.append(data), "close": lambda self: None})())
    protocol = server.protocol
    protocol.receive(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "processId": None, "capabilities": {}, "initializationOptions": {
            "features": {"diagnostics": False}, "model": {"backend": "openai", "url": "http://127.0.0.1:9"}}}}).encode())
    assert protocol.initialized
    rng = random.Random(seed)
    editor = Editor(initial)
    protocol.receive(_notification("textDocument/didOpen", {"textDocument": {
        "uri": URI, "languageId": "python", "version": 1, "text": initial}}))
    await asyncio.sleep(0)
    document = server.document(URI)
    assert document is not None and document.source == editor.text
    for version in range(2, edits + 2):
        changes = []
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            start, end = editor.random_position(rng), editor.random_position(rng)
            if (end.line, end.character) < (start.line, start.character) and rng.random() < 0.8:
                start, end = end, start
            text = _random_text(rng, rng.randint(0, 6))
            changes.append({"range": {"start": {"line": start.line, "character": start.character},
                                      "end": {"line": end.line, "character": end.character}}, "text": text})
            editor.apply(start, end, text)
        if rng.random() < 0.02:  # now and then the whole text
            editor.text = _random_text(rng, rng.randint(0, 200))
            changes.append({"text": editor.text})
        protocol.receive(_notification("textDocument/didChange", {
            "textDocument": {"uri": URI, "version": version}, "contentChanges": changes}))
        assert document.source == editor.text, f"diverged after edit {version - 1}: {changes}"
        assert document.version == version
        assert [line.rstrip("\r\n") for line in document.lines] == [editor.text[a:b] for a, b in editor.lines()] \
            or editor.text.endswith(("\n", "\r"))  # pygls' lines drop the empty last line, as splitlines does
    assert not [w for w in written if b'"error"' in w]


def test_a_thousand_random_edits_keep_the_server_text_equal_to_the_editors() -> None:
    """UTF-16 ranges, non-BMP characters and every line-break-like character: ``str.splitlines``
    would split at eight of them; LSP at three."""
    rng = random.Random(19)
    initial = _random_text(rng, 400)
    assert any(ch in initial for ch in LINE_LIKE)
    asyncio.run(_sync_run(int(os.environ.get("GLM5_SYNC_EDITS", "1000")), 19, initial))


def test_random_edits_across_many_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A document of many chunks (``ChunkedText``: whole lines; 16 K characters each in use, 256
    here), so edits land on, across and between chunk boundaries."""
    monkeypatch.setattr(text_module, "CHUNK_CHARS", 256)
    rng = random.Random(7)
    initial = "".join(rng.choice(PIECES) for _ in range(6_000))
    asyncio.run(_sync_run(400, 7, initial))


def test_chunked_text_edits_match_a_plain_string() -> None:
    rng = random.Random(3)
    alphabet = ["a", " ", "\n", "\r", "\r\n", "\x0c", "é", "😀", "\u2028"]
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300)))
        chunked = ChunkedText(text, chunk_chars=rng.choice([2, 5, 16, 64]))
        for _ in range(40):
            a, b = sorted((rng.randint(0, len(text)), rng.randint(0, len(text))))
            new = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
            chunked.replace(a, b, new)
            text = text[:a] + new + text[b:]
            x, y = sorted((rng.randint(0, len(text)), rng.randint(0, len(text))))
            assert chunked.slice(x, y) == text[x:y]
            starts = line_starts(text)
            assert chunked.line_count == len(starts)
            line = rng.randrange(len(starts))
            assert chunked.line_span(line)[0] == starts[line]
        assert chunked.value == text
        pieces = list(chunked.chunks())
        assert all(p.endswith(("\n", "\r")) for p in pieces[:-1])
        assert not any(p.endswith("\r") and q.startswith("\n") for p, q in itertools.pairwise(pieces))


def test_only_lsp_line_breaks_split_lines() -> None:
    text = "a\x0bb\x0cc\x1cd\x1de\x1ef\x85g\u2028h\u2029i\nj\r\nk\rl"
    assert line_starts(text) == [0, text.index("j"), text.index("k"), text.index("l")]
    assert len(text.splitlines()) == 12  # what pygls used
    assert split_chunks("ab\r\ncd", 3) == ["ab\r\n", "cd"]  # never between \r and \n


def test_200_small_edits_on_a_10_mb_document_do_not_rebuild_it() -> None:
    """Each change rewrites the chunk it lands in: 200 edits of a 10 MB document cost about what
    they cost in a 100 KB one (pygls rebuilt the whole text per edit: 5.7 s for 200)."""

    def run(size: int) -> float:
        line = "value = compute(alpha, beta)  # a comment\n"
        document = SyncedDocument(URI, line * (size // len(line)))
        rng = random.Random(1)
        started = time.perf_counter()
        for _ in range(200):
            where = types.Position(line=rng.randrange(document.chunked.line_count - 1), character=5)
            document.apply_change(types.TextDocumentContentChangePartial(
                range=types.Range(start=where, end=where), text="x"))
        return time.perf_counter() - started

    small, large = min(run(100_000) for _ in range(3)), min(run(10_000_000) for _ in range(2))
    assert large < 1.0, f"200 edits of 10 MB took {large:.2f} s"
    assert large < 10 * small + 0.05, f"10 MB: {large * 1000:.0f} ms, 100 KB: {small * 1000:.0f} ms"


def test_a_large_document_is_read_as_its_head_and_a_window_that_maps_back() -> None:
    head = "import os\nimport sys\n\n"
    body = "".join(f"def f{i}(x):\n    return x + {i}  # é😀\n\n" for i in range(20_000))
    document = SyncedDocument(URI, head + body)
    cursor = len(document.source) // 2
    view = document_view(document, cursor, 20_000)
    assert view.windowed and len(view.text) <= 22_000 and view.text.startswith("import os")
    local = view.offset_of_document(cursor)
    assert local is not None and view.text[local:local + 40] == document.source[cursor:cursor + 40]
    assert view.position(local) == document.position_at(cursor)
    assert view.offset(document.position_at(cursor)) == local
    assert view.text[view.segments[-1].start:].startswith("def ")  # cut where a top-level line starts
    # A few characters typed later the window is the same text (the caches see the same document).
    again = document_view(document, cursor + 3, 20_000)
    assert again.text == view.text
    whole = document_view(document, cursor, 10**9)
    assert not whole.windowed and whole.text == document.source


@pytest.mark.parametrize("encoding, units", [("utf-16", 5), ("utf-8", 8), ("utf-32", 4)])
def test_positions_in_each_encoding(encoding: str, units: int) -> None:
    from pygls.workspace.position_codec import PositionCodec

    document = SyncedDocument(URI, "x\x0cé😀\r\nnext", position_codec=PositionCodec(encoding))
    end = types.Position(line=0, character=units)  # the end of "x\x0cé😀": \x0c breaks no line
    assert document.offset_at(end) == 4
    assert document.position_at(4) == end
    assert document.offset_at(types.Position(line=0, character=10**6)) == 4  # the line's end
    assert document.offset_at(types.Position(line=1, character=0)) == 6
    assert document.offset_at(types.Position(line=2, character=0)) is None
    assert View.whole(document.source, encoding).offset(end) == 4
