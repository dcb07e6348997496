"""The server's document copies, side by side: pygls' ``TextDocument`` (what ``glm5-lsp serve`` kept
before issue 19) and ``glm5_lsp.server.text.SyncedDocument``, on the same edits.

1. Small edits on a large document: N single-character insertions at random lines of a document of
   each size (real Python: ``argparse.py`` repeated), the time for all of them; the ratio is what a
   keystroke costs the event loop with one copy against the other.
2. Staying in step: random incremental edits (UTF-16 ranges, non-BMP characters, the line-break-like
   characters ``str.splitlines`` breaks at and LSP does not), each applied by a reference editor
   (the text split with one regular expression) and by each copy; how many edits leave the copy
   different from the editor's text.

    python benchmarks/lsp_documents.py                       # 200 edits; 100 KB, 1 MB, 10 MB; 1,000 sync edits
    python benchmarks/lsp_documents.py --edits 50 --sizes 1000000 --sync 300
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import sysconfig
import time
from pathlib import Path

from lsprotocol import types
from pygls.workspace import TextDocument

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from glm5_lsp.server.text import SyncedDocument

URI = "file:///tmp/bench/doc.py"
PIECES = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\n", "\r\n", "\r",
          "a", "def f():", "    ", "é", "😀", "x = 1"]


def _change(line: int, character: int, end_line: int, end_character: int, text: str) -> types.TextDocumentContentChangePartial:
    return types.TextDocumentContentChangePartial(
        range=types.Range(start=types.Position(line=line, character=character),
                          end=types.Position(line=end_line, character=end_character)), text=text)


def edits_seconds(kind: type, text: str, edits: int, seed: int = 1) -> float:
    document = kind(URI, text)
    lines = text.count("\n")
    rng = random.Random(seed)
    started = time.perf_counter()
    for _ in range(edits):
        line = rng.randrange(lines)
        document.apply_change(_change(line, 4, line, 4, "x"))
    return time.perf_counter() - started


class Editor:
    """The client's text, by LSP's rules, positions in UTF-16 units."""

    def __init__(self, text: str) -> None:
        self.text = text

    def spans(self) -> list[tuple[int, int]]:
        spans, start = [], 0
        for match in re.finditer(r"\r\n|\r|\n", self.text):
            spans.append((start, match.start()))
            start = match.end()
        return [*spans, (start, len(self.text))]

    def position(self, rng: random.Random) -> tuple[int, int, int]:
        spans = self.spans()
        line = rng.randrange(len(spans))
        start, end = spans[line]
        offset = rng.randint(start, end)
        return line, sum(2 if ord(c) > 0xFFFF else 1 for c in self.text[start:offset]), offset


def out_of_step(kind: type, count: int, seed: int = 19) -> int:
    rng = random.Random(seed)
    initial = "".join(rng.choice(PIECES) for _ in range(400))
    editor, document = Editor(initial), kind(URI, initial)
    wrong = 0
    for _ in range(count):
        (line, units, a), (end_line, end_units, b) = sorted([editor.position(rng), editor.position(rng)],
                                                            key=lambda p: p[2])
        new = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 5)))
        editor.text = editor.text[:a] + new + editor.text[b:]
        document.apply_change(_change(line, units, end_line, end_units, new))
        if document.source != editor.text:
            wrong += 1
            document = kind(URI, editor.text)  # back in step, so each edit is counted on its own
    return wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--edits", type=int, default=200)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--sync", type=int, default=1000)
    args = parser.parse_args()
    source = (Path(sysconfig.get_paths()["stdlib"]) / "argparse.py").read_text(encoding="utf-8")
    print(f"{args.edits} one-character edits at random lines")
    print("| document | pygls TextDocument | SyncedDocument | ratio |")
    print("| --- | --- | --- | --- |")
    for size in args.sizes:
        text = (source * (size // len(source) + 1))[:size]
        theirs = edits_seconds(TextDocument, text, args.edits)
        ours = min(edits_seconds(SyncedDocument, text, args.edits) for _ in range(3))
        print(f"| {size / 1e6:g} MB | {theirs * 1000:.0f} ms | {ours * 1000:.1f} ms | {theirs / ours:.0f}x |")
    print(f"\n{args.sync} random edits with line-break-like characters: edits after which the copy differs "
          "from the editor's text")
    print(f"pygls TextDocument: {out_of_step(TextDocument, args.sync)}; SyncedDocument: {out_of_step(SyncedDocument, args.sync)}")


if __name__ == "__main__":
    main()
