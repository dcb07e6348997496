"""Completion latency, side by side: glm5-lsp's inline completion vs jedi-language-server's completion.

Both servers run as subprocesses over stdio, driven by the same client, on the same documents and
the same cursor positions: real standard-library modules (``argparse.py``, about 2,600 lines, among
them). At each position the line is cut at the cursor, 2 characters into an identifier, as if the user
were typing it; both servers get the same ``didChange`` and then one request each, one after the
other (never concurrently, so they do not compete for the CPU), each server's diagnostics of the
change waited for before the next is asked (``--quiet``: so one's background work does not land on
the other's request). A few warm-up requests per server are not measured. glm5-lsp runs with its
default settings and the default model unless ``--model``.

    python benchmarks/lsp_latency.py                      # default model, 3 files x 20 positions
    python benchmarks/lsp_latency.py --model PATH --positions 40 --timeout 5
    python benchmarks/lsp_latency.py --settings '{"repair": {"monitor": false, "maxRounds": 1}}'
    python benchmarks/lsp_latency.py --typing 4   # and then 4 keystrokes typed at each position
    python benchmarks/lsp_latency.py --details requests.jsonl   # every measured request's answer and time
    python benchmarks/lsp_latency.py --versus /tmp/before   # and a second glm5-lsp from another checkout
    python benchmarks/lsp_latency.py --first 5 --versus /tmp/before   # a session's first request, 5 starts

``--versus DIR`` runs a second glm5-lsp from the checkout in DIR (``git worktree add DIR REV``) on the
same positions in the same run, one request after the other like the rest: a change measured
before and after on the same noisy machine.

Besides latency and the share of non-empty answers, "right word" is the share of requests whose
answer finishes the cut identifier exactly as the file has it: for glm5-lsp the inline text starts
with the identifier's rest and the name ends there; for jedi-language-server the identifier is one
of its items (any rank, so its figure is an upper bound on what a user would pick).

``--first N`` measures what a user waits for at the start of a session instead: N fresh starts of each
server, the file opened right after ``initialized`` (as an editor opens its files while the server
starts and loads the model), then, once the model is loaded and the workspace indexed and a
``--settle`` pause, one request at a seeded position, then a second at another: the first and the
second request's times, the medians over the starts.

With ``--typing N`` every position is followed by N keystrokes that type the line's own next
characters, each one a whole-document change and a request to both servers, as an editor sends
them while the user types (no debounce on the client side: every keystroke is measured).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.lsp.client import LanguageClient

REPO = Path(__file__).resolve().parents[1]
STDLIB = Path(sysconfig.get_paths()["stdlib"])
FILES = ("argparse.py", "json/decoder.py", "textwrap.py")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")


@dataclass
class Tally:
    """Latencies and outcomes of one server's measured requests."""

    seconds: list[float] = field(default_factory=list)
    errors: int = 0
    timeouts: int = 0
    non_empty: int = 0
    right_word: int = 0  # answers that finish the cut identifier exactly as the file has it
    requests: int = 0

    def row(self, name: str) -> str:
        ms = sorted(s * 1000 for s in self.seconds) or [float("nan")]
        p50 = statistics.median(ms)
        p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
        share = self.non_empty / max(self.requests, 1)
        right = self.right_word / max(self.requests, 1)
        return (f"{name:<22} {p50:8.1f} {p95:8.1f} {statistics.fmean(ms):8.1f} {self.errors:7d} "
                f"{self.timeouts:9d} {share:10.1%} {right:11.1%} {self.requests:9d}")

    def p50(self) -> float:
        return statistics.median(self.seconds) if self.seconds else float("nan")


def cursor_cases(text: str, count: int, rng: random.Random) -> list[tuple[str, int, int]]:
    """``count`` (document, line, column) cases: a line cut 2 characters into one of its identifiers.
    The identifier is the one at the column in the original line (``word_at``)."""
    lines = text.split("\n")
    candidates = []
    for number, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", '"', "'")):
            continue
        matches = [m for m in _IDENTIFIER.finditer(line) if m.start() >= len(line) - len(line.lstrip())]
        if matches:
            candidates.append((number, matches))
    cases = []
    for number, matches in rng.sample(candidates, min(count, len(candidates))):
        match = rng.choice(matches)
        column = match.start() + 2
        edited = lines[:number] + [lines[number][:column]] + lines[number + 1:]
        cases.append(("\n".join(edited), number, column))
    return cases


def word_start(line: str, column: int) -> int:
    """Where the identifier that reaches ``column`` of ``line`` starts."""
    start = column
    while start > 0 and (line[start - 1].isalnum() or line[start - 1] == "_"):
        start -= 1
    return start


def word_at(line: str, column: int) -> str:
    """The identifier that the cut at ``column`` of the original ``line`` went into (its whole text)."""
    start = word_start(line, column)
    end = column
    while end < len(line) and (line[end].isalnum() or line[end] == "_"):
        end += 1
    return line[start:end]


def finishes_word(answer: str, rest: str) -> bool:
    """An inline answer finishes the identifier when it starts with the identifier's rest and the
    name ends there (``rgs`` or ``rgs == X`` for ``na|rgs``, not ``rgsx``)."""
    return answer.startswith(rest) and not (answer[len(rest):len(rest) + 1].isalnum() or answer[len(rest):len(rest) + 1] == "_")


def native_built(checkout: Path) -> bool:
    """Whether ``checkout`` holds the compiled ``glm5_lsp._native`` (built by its install, in place)."""
    return any(p.suffix in (".so", ".pyd") for p in (Path(checkout) / "glm5_lsp").glob("_native*"))


def same_paths(checkout: Path) -> bool:
    """Build ``checkout``'s ``glm5_lsp._native`` in place where this repository has its own built and
    that checkout has the source but not the module (a ``git worktree`` holds no build outputs):
    else its server runs the TorchScript step and the numpy memory searches, and a comparison of
    two checkouts measures those paths, not the change. True when both sides run the same paths."""
    checkout = Path(checkout)
    if native_built(checkout) or not native_built(REPO) or not (checkout / "glm5_lsp" / "native.c").is_file():
        return native_built(checkout) == native_built(REPO)
    print(f"building {checkout}'s native module in place (as its install would), so both sides run it", flush=True)
    built = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=checkout,
                           capture_output=True, text=True, check=False)
    if not native_built(checkout):
        print(f"warning: {checkout}'s native module did not build ({built.stderr.strip()[-300:]}): "
              "it runs the scripted paths, this checkout the compiled ones", flush=True)
        return False
    return True


def glm5_server(name: str, checkout: Path, threads: int, init_options: Any | None) -> Server:
    """``glm5-lsp serve`` running the code (and the embedded weights) of ``checkout``: the folder on
    PYTHONPATH and the server's working directory. ``python -m`` puts the working directory ahead of
    PYTHONPATH on ``sys.path``, so a server started from inside another checkout would import that
    checkout's package instead, and a comparison of two checkouts would compare one with itself."""
    checkout = Path(checkout).resolve()
    if checkout != REPO.resolve():
        same_paths(checkout)
    command = [sys.executable, "-m", "glm5_lsp.cli", "serve", "--threads", str(threads)]
    return Server(name, command, {**os.environ, "PYTHONPATH": str(checkout)}, init_options, cwd=str(checkout))


class Server:
    """One language server under test, with a client that drains its stderr. ``cwd``: the folder it
    runs in (None: this process's)."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], init_options: Any | None,
                 cwd: str | None = None) -> None:
        self.name = name
        self.command = command
        self.env = env
        self.init_options = init_options
        self.cwd = cwd
        self.client = LanguageClient("lsp-latency", "1")
        self.versions: dict[str, int] = {}
        self.logs: list[str] = []
        self.errors: list[str] = []
        self.published: dict[str, tuple[int, int | None]] = {}  # uri -> (diagnostics published, last version)
        self._drain: asyncio.Task[None] | None = None

        @self.client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def diagnostics(params: types.PublishDiagnosticsParams) -> None:
            count, _ = self.published.get(params.uri, (0, None))
            self.published[params.uri] = (count + 1, params.version)

        @self.client.feature(types.WINDOW_LOG_MESSAGE)
        def log_message(params: types.LogMessageParams) -> None:
            self.logs.append(params.message)

        @self.client.feature(types.WINDOW_SHOW_MESSAGE)
        def show_message(params: types.ShowMessageParams) -> None:
            if params.type == types.MessageType.Error:
                self.errors.append(params.message)

    async def start(self, root: Path) -> None:
        await self.client.start_io(*self.command, env=self.env, cwd=self.cwd)
        stderr = self.client._server.stderr if self.client._server else None
        if stderr is not None:
            self._drain = asyncio.create_task(_drain(stderr))
        caps = types.ClientCapabilities(text_document=types.TextDocumentClientCapabilities(
            completion=types.CompletionClientCapabilities(),
            inline_completion=types.InlineCompletionClientCapabilities(),
        ))
        await self.client.initialize_async(types.InitializeParams(
            capabilities=caps, root_uri=root.as_uri(), initialization_options=self.init_options))
        self.client.initialized(types.InitializedParams())

    def open(self, uri: str, text: str) -> None:
        self.versions[uri] = 1
        self.client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))

    def replace(self, uri: str, text: str) -> None:
        self.versions[uri] += 1
        self.client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=self.versions[uri]),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)]))

    def published_count(self, uri: str) -> int:
        return self.published.get(uri, (0, None))[0]

    async def settled(self, uri: str, after: int, seconds: float) -> bool:
        """Wait until the server has published diagnostics for ``uri`` since it had published
        ``after`` times (of the current version, where it says which): the work a change starts in
        the background is done. False after ``seconds`` (a server that publishes nothing for it)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            count, version = self.published.get(uri, (0, None))
            if count > after and version in (None, self.versions.get(uri)):
                return True
            await asyncio.sleep(0.02)
        return False

    async def request(self, uri: str, line: int, column: int, word: str, typed: int) -> tuple[bool, bool, str]:
        """One completion request: (the answer is non-empty, it finishes ``word`` of which ``typed``
        characters are typed, what was answered). Ours: the inline answer. jedi-language-server:
        ``word`` among its items."""
        position = types.Position(line=line, character=column)
        document = types.TextDocumentIdentifier(uri=uri)
        if self.name.startswith("glm5-lsp"):
            result = await self.client.text_document_inline_completion_async(types.InlineCompletionParams(
                context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
                text_document=document, position=position))
            items = result.items if isinstance(result, types.InlineCompletionList) else (result or [])
            texts = [str(getattr(item, "insert_text", "")) for item in items]
            shown = next((t for t in texts if t.strip()), "")
            return bool(shown), any(finishes_word(t, word[typed:]) for t in texts if t.strip()), shown
        result = await self.client.text_document_completion_async(
            types.CompletionParams(text_document=document, position=position))
        items = result.items if isinstance(result, types.CompletionList) else (result or [])
        labels = ", ".join(item.label for item in items[:5]) + (f", ... ({len(items)})" if len(items) > 5 else "")
        return bool(items), any(item.label == word or (item.insert_text or "") == word for item in items), labels

    async def stop(self) -> None:
        try:
            await asyncio.wait_for(self.client.shutdown_async(None), 10)
            self.client.exit(None)
            await asyncio.wait_for(self.client.stop(), 10)
        except Exception:  # noqa: BLE001 - a wedged server is killed; the figures are printed anyway
            if self.client._server is not None and self.client._server.returncode is None:
                self.client._server.kill()
        if self._drain is not None:
            self._drain.cancel()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


async def measure(server: Server, uri: str, line: int, column: int, word: tuple[str, int], tally: Tally | None,
                  timeout: float, details: list[dict[str, Any]] | None = None) -> None:
    started = time.perf_counter()
    try:
        non_empty, right, shown = await asyncio.wait_for(server.request(uri, line, column, *word), timeout)
    except asyncio.TimeoutError:
        if tally is not None:
            tally.requests += 1
            tally.timeouts += 1
        return
    except Exception as error:  # noqa: BLE001 - an error answer counts; the run goes on
        if tally is not None:
            tally.requests += 1
            tally.errors += 1
            print(f"  {server.name} error: {error}", file=sys.stderr)
        return
    if tally is not None:
        tally.requests += 1
        tally.seconds.append(time.perf_counter() - started)
        tally.non_empty += int(non_empty)
        tally.right_word += int(right)
        if details is not None:
            details.append({"server": server.name, "uri": uri, "line": line, "column": column, "word": word[0],
                            "ms": round((time.perf_counter() - started) * 1000, 1), "non_empty": non_empty,
                            "right_word": right, "answer": shown})


async def ask_in_turn(servers: list[Server], uri: str, text: str, line: int, column: int, word: tuple[str, int],
                      tallies: dict[str, Tally] | None, args: argparse.Namespace,
                      details: list[dict[str, Any]] | None, unsettled: collections.Counter) -> None:
    """Each server in turn gets the change to ``text`` and one request, timed; then, before the next
    one is asked, its diagnostics of that change are waited for (``args.quiet`` seconds at most; the
    waits that run out counted in ``unsettled``): the work a change starts in the background (the
    checks, the document's warm-up) would otherwise land on the next server's request, and whichever
    was asked second paid about 30 ms for it (``benchmarks/lines.py``, BENCHMARKS.md "Latency pairs").
    With ``--typing`` too: a server's keystrokes are apart by the other's request anyway."""
    for server in servers:
        published = server.published_count(uri)
        server.replace(uri, text)
        await measure(server, uri, line, column, word, tallies[server.name] if tallies is not None else None,
                      args.timeout, details)
        await quiet(server, uri, published, args.quiet, unsettled, text)


def publishes_for(server: Server, text: str) -> bool:
    """Whether ``server`` publishes diagnostics for a document of ``text``: glm5-lsp reads one longer than
    its window (``limits.windowChars``) as a window and checks none of it (its wait would run out: the
    8 in the REPORT run at b5a5c81 were pygls's 121 KB ``lsp/_capabilities.py``, 2 cursors x 4 servers)."""
    from glm5_lsp.server.settings import parse_settings

    if not server.name.startswith("glm5-lsp"):
        return True
    return len(text) <= parse_settings(server.init_options or {})[0].limits.window_chars


async def quiet(server: Server, uri: str, published: int, seconds: float, unsettled: collections.Counter,
                text: str) -> None:
    """Wait (up to ``seconds``; 0: not at all) for ``server``'s diagnostics of its latest change of
    ``uri`` to ``text`` (it had published ``published`` times before it): its background work for that
    change is over; no wait where it publishes none for such a text (:func:`publishes_for`). Counts
    the waits that ran out in ``unsettled``, by server."""
    if seconds > 0 and publishes_for(server, text) and not await server.settled(uri, published, seconds):
        unsettled[server.name] += 1


def print_unsettled(unsettled: collections.Counter, seconds: float) -> None:
    """The waits for a server's diagnostics that ran out (:func:`quiet`), where any did."""
    if unsettled:
        print(f"waits for a server's diagnostics that ran out (--quiet {seconds:g} s): "
              + ", ".join(f"{k} {v}" for k, v in sorted(unsettled.items())))


async def first_requests(args: argparse.Namespace, servers: list[Server]) -> int:
    """``--first N``: each server started N times on a fresh workspace, the file opened at once; the
    first and second request of each start timed (see the module's docstring)."""
    name = args.files[0]
    text = (STDLIB / name).read_text(encoding="utf-8")
    rng = random.Random(args.seed)
    times: dict[str, list[tuple[float, float]]] = {server.name: [] for server in servers}
    print(f"file: {name} (stdlib {STDLIB}), {text.count(chr(10)) + 1} lines; {args.first} starts of each server; "
          f"{args.settle}s after the model is ready; torch threads for glm5-lsp: {args.threads}")
    for start in range(args.first):
        cases = cursor_cases(text, 2, rng)
        for server in servers:
            fresh = Server(server.name, server.command, server.env, server.init_options, cwd=server.cwd)
            root = Path(tempfile.mkdtemp(prefix="lsp-first-"))
            path = root / name.replace("/", "_")
            path.write_text(text, encoding="utf-8")
            uri = path.as_uri()
            await fresh.start(root)
            try:
                fresh.open(uri, text)  # at once, while the model loads
                if fresh.name.startswith("glm5-lsp") and not await _model_ready(fresh, args.load_timeout):
                    print(f"{fresh.name} did not load its model")
                    return 2
                await asyncio.sleep(args.settle)
                pair = []
                for document, line, column in cases:
                    fresh.replace(uri, document)
                    started = time.perf_counter()
                    await asyncio.wait_for(fresh.request(uri, line, column, word_at(document.split("\n")[line], column),
                                                         0), args.timeout)
                    pair.append((time.perf_counter() - started) * 1000)
                times[fresh.name].append((pair[0], pair[1]))
                print(f"  start {start + 1}, {fresh.name}: first {pair[0]:.0f} ms, second {pair[1]:.0f} ms", flush=True)
            finally:
                await fresh.stop()
                shutil.rmtree(root, ignore_errors=True)
    print()
    print(f"{'server':<22} {'first ms (median)':>18} {'second ms (median)':>19}")
    for server_name, pairs in times.items():
        print(f"{server_name:<22} {statistics.median(p[0] for p in pairs):>18.0f} "
              f"{statistics.median(p[1] for p in pairs):>19.0f}")
    return 0


async def main(args: argparse.Namespace) -> int:
    logging.getLogger("pygls").setLevel(logging.CRITICAL)  # late answers to timed-out requests are expected
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    options: dict[str, Any] = json.loads(args.settings) if args.settings else {}
    if args.model:
        options.setdefault("model", {})["path"] = args.model
    root = Path(tempfile.mkdtemp(prefix="lsp-latency-"))  # a workspace holding copies of the files
    ours = glm5_server("glm5-lsp", REPO, args.threads, options)
    jedi_command = [sys.executable, "-c", "from jedi_language_server.cli import cli; cli()"]
    jedi = Server("jedi-language-server", jedi_command, env, None)
    servers = [ours, jedi]
    if args.versus:
        other = Path(args.versus).resolve()
        servers.insert(1, glm5_server(f"glm5-lsp@{other.name}", other, args.threads, options))
    if args.first:
        return await first_requests(args, servers)
    tallies = {server.name: Tally() for server in servers}
    details: list[dict[str, Any]] | None = [] if args.details else None
    unsettled: collections.Counter[str] = collections.Counter()
    rng = random.Random(args.seed)
    print(f"files: {', '.join(args.files)} (stdlib {STDLIB}); {args.positions} positions each; "
          f"timeout {args.timeout}s; model: {args.model or 'default'}; settings: {args.settings or 'defaults'}; "
          f"torch threads for glm5-lsp: {args.threads}; keystrokes typed after each position: {args.typing}")
    for server in servers:
        await server.start(root)
    try:
        for server in servers:
            if server.name.startswith("glm5-lsp") and not await _model_ready(server, args.load_timeout):
                print(f"{server.name} did not load its model (is there a default model? pass --model PATH)")
                return 2
        for name in args.files:
            text = (STDLIB / name).read_text(encoding="utf-8")
            path = root / name.replace("/", "_")
            path.write_text(text, encoding="utf-8")
            uri = path.as_uri()
            cases = cursor_cases(text, args.positions + args.warmup, rng)
            print(f"  {name}: {text.count(chr(10)) + 1} lines")
            for server in servers:
                server.open(uri, text)
            lines = text.split("\n")
            for index, (document, line, column) in enumerate(cases):
                # --typing N: then the line's next N characters, one keystroke (change + request) each
                rest = lines[line][column:column + args.typing]
                word = word_at(lines[line], column)
                for typed in range(len(rest) + 1 if args.typing else 1):
                    edited = document if not typed else "\n".join(
                        lines[:line] + [lines[line][:column + typed]] + lines[line + 1:])
                    typed_chars = column + typed - word_start(lines[line], column)
                    await ask_in_turn(servers, uri, edited, line, column + typed, (word, typed_chars),
                                      tallies if index >= args.warmup else None, args, details, unsettled)
    finally:
        for server in servers:
            await server.stop()
        shutil.rmtree(root, ignore_errors=True)
    if details is not None:
        Path(args.details).write_text("".join(json.dumps(row) + "\n" for row in details), encoding="utf-8")
        Path(args.details + ".log").write_text("".join(line + "\n" for line in ours.logs), encoding="utf-8")
        print(f"per-request details: {args.details} (glm5-lsp's log: {args.details}.log)")
    print()
    print_unsettled(unsettled, args.quiet)
    print(f"{'server':<22} {'p50 ms':>8} {'p95 ms':>8} {'mean ms':>8} {'errors':>7} {'timeouts':>9} "
          f"{'non-empty':>10} {'right word':>11} {'requests':>9}")
    for name, tally in tallies.items():
        print(tally.row(name))
    ratio = tallies[ours.name].p50() / tallies[jedi.name].p50()
    print(f"\nglm5-lsp p50 / jedi-language-server p50 = {ratio:.2f}")
    for name, tally in tallies.items():
        if name.startswith("glm5-lsp@"):
            print(f"glm5-lsp p50 / {name} p50 = {tallies[ours.name].p50() / tally.p50():.2f}")
    return 0


async def _model_ready(server: Server, seconds: float) -> bool:
    """Wait until glm5-lsp is warm: the model loaded and the workspace indexed (its log lines)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        loaded = any("model ready" in message for message in server.logs)
        indexed = any(message.startswith("glm5_lsp.server: indexed") or ("indexing" in message and "failed" in message)
                      for message in server.logs)
        if loaded and indexed:
            return True
        if server.errors:
            print(f"glm5-lsp: {server.errors[-1]}")
            return False
        await asyncio.sleep(0.2)
    return False


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the embedded default model)")
    parser.add_argument("--files", nargs="+", default=list(FILES), help="standard-library files, relative to it")
    parser.add_argument("--positions", type=int, default=20, help="measured positions per file")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured requests per file and server")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds before a request counts as timed out")
    parser.add_argument("--load-timeout", type=float, default=300.0, help="seconds to wait for the model to load")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for glm5-lsp (glm5-lsp serve --threads)")
    parser.add_argument("--settings", default="", help='glm5-lsp initializationOptions as JSON, e.g. \'{"repair": {"monitor": false}}\'')
    parser.add_argument("--typing", type=int, default=0,
                        help="after each position, type the line's next N characters, a request per keystroke")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--versus", default="", help="a second checkout whose glm5-lsp is measured beside this one")
    parser.add_argument("--first", type=int, default=0,
                        help="instead: N fresh starts of each server, the first and second request of each timed")
    parser.add_argument("--settle", type=float, default=2.0,
                        help="with --first: seconds between the model being ready and the first request")
    parser.add_argument("--details", default="", help="write each measured request (answer, ms) to this JSON-lines file")
    parser.add_argument("--quiet", type=float, default=3.0,
                        help="seconds to wait, after each answer, for that server's diagnostics of the change "
                             "before the next server is asked (0: no wait)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
