"""The rest of a line, side by side: the model alone, the workspace memory alone, the two mixed, the
copy baseline, and jedi-language-server, on installed packages no one here wrote.

Each package of ``BENCHMARK_REPORT`` (never trained on, never tuned on) is copied into its own
workspace folder. Cursors are seeded two characters into an identifier of a code line (``--at space``:
right after a space that follows code, ``return |``), the rest of that line cut off and the lines below
kept (``glm5_lsp.memory.heldout``). At each cursor, one after
the other (never concurrently; after each answer, and after the file is restored, the benchmark waits
for that server's diagnostics of the change, ``--quiet``, so one server's background work does not
land on the next one's request: without it, whichever was asked second was about 30 ms slower):

- **model** : ``glm5-lsp serve`` (a subprocess, this repository's code) with the workspace memory
  turned off (``memory.enabled`` false), everything else at its defaults, asked for an inline
  completion over LSP after a ``didChange`` to the cut document;
- **memory**: the memory's own greedy longest-match continuation (no model), the memory holding the
  workspace, the libraries it imports and the standard library, the cursor's line excluded;
- **mixed** : what ships: ``glm5-lsp serve`` with its default settings (the memory on: built for the
  workspace folder when the server starts, mixed into decoding around the decoding monitor, drafts
  on), asked the same way, once its memory is built;
- **copy**  : the most frequent rest among the workspace's other lines that start with the typed
  line (indentation aside);
- **jedi**  : jedi-language-server's first completion item (a word only: no rest of line);
- **baseline** (with ``--baseline CHECKOUT``): what ships at another checkout of this repository
  (its ``glm5-lsp serve`` at its defaults, its own code and weights), asked right before or right
  after **mixed** (alternating cursor by cursor): a change measured through the language server, the
  paired median of the two latencies and the answers they share printed beside the table.

Figures: shown (a non-empty first line), exact (the first line equals the real rest of the line,
trailing spaces aside), right word (the answer finishes the cut identifier as the file has it; after a
space, it begins with the line's next word or symbol run), edit similarity (1 - Levenshtein / longer
length, 0 for nothing shown, averaged over all cursors),
precision (exact / shown), latency p50/p95 (ms, this process's wall clock around each answer).
A file is opened in every system before its first cursor (``didOpen``; for the in-process pipeline
what the server does then: the context engine, its imports' API docs, jedi; the memory's first
tokenization of it), untimed, and ``--settle`` seconds pass before the first request. The first
``--warmup`` cursors of each package are asked of every system and not counted. The in-process
model runs on one torch thread, as ``glm5-lsp serve`` does by default.

    python benchmarks/lines.py                          # 8 packages x 10 cursors
    python benchmarks/lines.py --packages tqdm wrapt --positions 20 --details rows.jsonl
    git worktree add /tmp/before HEAD~3 && python benchmarks/lines.py --systems mixed jedi --baseline /tmp/before
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from lsp_latency import Server, _model_ready, glm5_server, print_unsettled, quiet

from glm5_lsp.gate.labels import label
from glm5_lsp.memory.heldout import CURSORS, Case, copy_package, seeded_cases
from glm5_lsp.train.corpus import BENCHMARK_FIT, BENCHMARK_REPORT

SYSTEMS = ("model", "memory", "mixed", "baseline", "copy", "jedi")


def edit_similarity(a: str, b: str) -> float:
    if not a and not b:
        return 1.0
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return 1 - previous[-1] / max(len(a), len(b))


@dataclass
class Tally:
    shown: int = 0
    exact: int = 0
    right_word: int = 0
    similarity: float = 0.0
    count: int = 0
    seconds: list[float] = field(default_factory=list)

    def add(self, answer: str, case: Case, seconds: float, word_only: bool = False, right: bool | None = None) -> dict:
        line = answer.split("\n", 1)[0].rstrip()
        self.count += 1
        self.seconds.append(seconds)
        shown = bool(line.strip())
        exact = not word_only and shown and line == case.rest
        right = label(line, case.rest, case.word, case.word[:case.typed]).right_word if right is None else right
        self.shown += shown
        self.exact += exact
        self.right_word += bool(shown and right)
        if not word_only:
            self.similarity += edit_similarity(line, case.rest) if shown else 0.0
        return {"answer": line, "exact": exact, "right_word": bool(shown and right), "ms": round(seconds * 1000, 1)}

    def row(self, name: str, word_only: bool = False) -> str:
        n = max(self.count, 1)
        ms = sorted(s * 1000 for s in self.seconds) or [float("nan")]
        p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
        exact = "—" if word_only else f"{self.exact / n:.1%}"
        sim = "—" if word_only else f"{self.similarity / n:.2f}"
        precision = "—" if word_only else (f"{self.exact / self.shown:.1%}" if self.shown else "n/a")
        return (f"| {name} | {self.shown / n:.1%} | {exact} | {self.right_word / n:.1%} | {sim} | {precision} | "
                f"{statistics.median(ms):.0f} | {p95:.0f} |")


COLUMNS = ("system", "shown", "exact rest of line", "right word", "edit similarity", "precision", "p50 ms", "p95 ms")


def table_head(*extra: str) -> str:
    """The table's two header lines for :meth:`Tally.row`'s columns, then ``extra`` ones."""
    names = (*COLUMNS, *extra)
    return "| " + " | ".join(names) + " |\n" + "|---" * len(names) + "|"


def copy_baseline(case: Case, lines_by_file: dict[Path, list[str]]) -> str:
    typed = case.document[:case.offset].rsplit("\n", 1)[-1].lstrip()
    counts: collections.Counter[str] = collections.Counter()
    for path, lines in lines_by_file.items():
        for number, line in enumerate(lines):
            if path == case.path and number == case.line:
                continue
            stripped = line.lstrip()
            if stripped.startswith(typed) and len(stripped) > len(typed):
                counts[stripped[len(typed):].rstrip()] += 1
    return counts.most_common(1)[0][0] if counts else ""


async def run_package(name: str, args: argparse.Namespace, tokenizer: Any, tallies: dict[str, Tally],
                      details: list[dict], unsettled: collections.Counter) -> None:
    from glm5_lsp.memory.mixing import continuation_text
    from glm5_lsp.memory.workspace import WorkspaceMemory, as_key

    workdir = Path(tempfile.mkdtemp(prefix=f"lines-{name}-"))
    root = copy_package(name, workdir)
    cases = seeded_cases(root, args.positions + args.warmup, seed=args.seed, at=args.at)
    memory = WorkspaceMemory(tokenizer)
    started = time.perf_counter()
    stats = memory.index_folder(root)
    print(f"{name}: {stats.files} files, {stats.tokens} tokens, libraries {stats.libraries} "
          f"({stats.library_tokens} tokens), memory built in {time.perf_counter() - started:.1f} s; "
          f"{len(cases)} cursors", flush=True)
    lines_by_file = {p: p.read_text(encoding="utf-8").split("\n") for p in root.rglob("*.py")}
    originals = {c.path: c.path.read_text(encoding="utf-8") for c in cases}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    servers = {}
    if "model" in args.systems:
        servers["model"] = glm5_server("glm5-lsp", REPO, 1, {"memory": {"enabled": False}})
    if "mixed" in args.systems:  # what ships: the default settings
        options = json.loads(args.mixed_options) if args.mixed_options else {}
        if args.no_drafts:
            options.setdefault("memory", {})["drafts"] = False
        servers["mixed"] = glm5_server("glm5-lsp", REPO, 1, options)
    if args.baseline:  # what ships at another checkout: its own code (and weights), its defaults
        servers["baseline"] = glm5_server("glm5-lsp", Path(args.baseline), 1, {})
    if "jedi" in args.systems:
        servers["jedi"] = Server("jedi-language-server",
                                 [sys.executable, "-c", "from jedi_language_server.cli import cli; cli()"], env, None)
    for server in servers.values():
        await server.start(root)
    try:
        for key in ("model", "mixed", "baseline"):
            if key in servers and not await _model_ready(servers[key], args.load_timeout):
                raise RuntimeError(f"glm5-lsp serve ({key}) did not get ready")
        for key in ("mixed", "baseline"):
            if key in servers and not await _memory_ready(servers[key], args.load_timeout):
                raise RuntimeError(f"glm5-lsp serve ({key}) did not build its workspace memory")
        opened: set[Path] = set()
        for number, case in enumerate(cases):
            warming = number < args.warmup  # asked, not counted: each system's first requests start things up
            uri = case.path.as_uri()
            row: dict[str, Any] = {"package": name, "path": str(case.path.relative_to(root)), "line": case.line,
                                   "typed": case.document[:case.offset].rsplit("\n", 1)[-1], "rest": case.rest}
            line_text = case.document[:case.offset].rsplit("\n", 1)[-1]
            column = len(line_text)
            if case.path not in opened:  # opened first, as an editor does, before any timing
                for server in servers.values():
                    server.open(uri, originals[case.path])
                memory.update(as_key(case.path), originals[case.path])
                await asyncio.sleep(args.settle)  # the servers' own warm-up of a document they open
            tally = {k: Tally() for k in SYSTEMS} if warming else tallies
            order = list(servers)
            if number % 2 and "mixed" in servers and "baseline" in servers:  # each first on every other cursor
                i, j = order.index("mixed"), order.index("baseline")
                order[i], order[j] = order[j], order[i]
            row["first"] = next((key for key in order if key in ("mixed", "baseline")), None)
            for key in order:
                server = servers[key]
                published = server.published_count(uri)
                server.replace(uri, case.document)
                started = time.perf_counter()
                try:
                    answer = await asyncio.wait_for(_ask(server, uri, case.line, column), args.timeout)
                except (asyncio.TimeoutError, Exception) as error:  # noqa: BLE001 - counts as nothing shown
                    answer = ""
                    row[f"{key}_error"] = type(error).__name__
                seconds = time.perf_counter() - started
                # What the change started in the background (its diagnostics) ends before the next
                # system is asked: else whichever is asked second pays for it (about 30 ms here).
                await quiet(server, uri, published, args.quiet, unsettled, case.document)
                if key == "jedi":
                    row[key] = tally[key].add(answer, case, seconds, word_only=True, right=answer == case.word)
                else:
                    row[key] = tally[key].add(answer, case, seconds)
            opened.add(case.path)
            if "memory" in args.systems:
                started = time.perf_counter()
                answer = continuation_text(memory, tokenizer, as_key(case.path), case.document, case.offset)
                row["memory"] = tally["memory"].add(answer, case, time.perf_counter() - started)
            if "copy" in args.systems:
                started = time.perf_counter()
                answer = copy_baseline(case, lines_by_file)
                row["copy"] = tally["copy"].add(answer, case, time.perf_counter() - started)
            memory.update(as_key(case.path), originals[case.path])  # the file as it was, for the next cursor
            published = {key: server.published_count(uri) for key, server in servers.items()}
            for server in servers.values():
                server.replace(uri, originals[case.path])
            await asyncio.gather(*(quiet(server, uri, published[key], args.quiet, unsettled, originals[case.path])
                                   for key, server in servers.items()))
            if warming:
                continue
            details.append(row)
            if args.verbose:
                print(f"  {number}: {row['typed'].strip()[-40:]!r} -> {case.rest!r}: " + ", ".join(
                    f"{k}={row[k]['answer']!r}" for k in SYSTEMS if k in row), flush=True)
    finally:
        for server in servers.values():
            await server.stop()


async def _memory_ready(server: Server, seconds: float) -> bool:
    """Wait until glm5-lsp's workspace memory is built (its log line)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for message in server.logs:
            if "workspace memory:" in message:
                print(f"  {server.name}: {message.split(': ', 1)[-1]}", flush=True)
                return True
            if "workspace memory of" in message and "could not be built" in message:
                print(f"  {server.name}: {message}", flush=True)
                return False
        await asyncio.sleep(0.2)
    return False


def checkout_commit(path: str) -> str:
    out = subprocess.run(["git", "-C", path, "log", "-1", "--format=%h"], capture_output=True, text=True, check=False)
    return out.stdout.strip()


def weights_commit() -> str:
    out = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h", "--", "glm5_lsp/weights"],
                         capture_output=True, text=True, check=False)
    return out.stdout.strip()


async def _ask(server: Server, uri: str, line: int, column: int) -> str:
    from lsprotocol import types

    position = types.Position(line=line, character=column)
    document = types.TextDocumentIdentifier(uri=uri)
    if server.name == "glm5-lsp":
        result = await server.client.text_document_inline_completion_async(types.InlineCompletionParams(
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
            text_document=document, position=position))
        items = result.items if isinstance(result, types.InlineCompletionList) else (result or [])
        texts = [str(getattr(item, "insert_text", "")) for item in items]
        return next((t for t in texts if t.strip()), "")
    result = await server.client.text_document_completion_async(
        types.CompletionParams(text_document=document, position=position))
    items = result.items if isinstance(result, types.CompletionList) else (result or [])
    return items[0].label if items else ""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", nargs="+", default=list(BENCHMARK_REPORT))
    parser.add_argument("--positions", type=int, default=10, help="measured cursors per package")
    parser.add_argument("--warmup", type=int, default=2, help="cursors per package asked first, not counted")
    parser.add_argument("--systems", nargs="+", default=[s for s in SYSTEMS if s != "baseline"], choices=SYSTEMS,
                        help="which to ask (default: all but baseline, which --baseline adds)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--at", choices=CURSORS, default="word",
                        help="where cursors sit: two characters into an identifier, or right after a space")
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--load-timeout", type=float, default=300.0)
    parser.add_argument("--no-drafts", action="store_true", help="the mixed run without drafts")
    parser.add_argument("--mixed-options", default="", help="initializationOptions (JSON) of the mixed server "
                        "(default: none, what ships); for tuning on --fit packages only")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds after a document opens before its first request")
    parser.add_argument("--quiet", type=float, default=3.0,
                        help="after each answer and each restored file, wait up to this long for the "
                             "server's diagnostics of that change, so no system's background work "
                             "lands on the next one's request (0: do not wait)")
    parser.add_argument("--details", default="", help="write each cursor's answers to this JSON-lines file")
    parser.add_argument("--fit", action="store_true", help="allow BENCHMARK_FIT packages (for tuning; never report them)")
    parser.add_argument("--baseline", default="", metavar="CHECKOUT",
                        help="also ask what ships at this other checkout of the repository (alternating with mixed)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.baseline:
        if not (Path(args.baseline) / "glm5_lsp" / "__init__.py").is_file():
            parser.error(f"--baseline {args.baseline}: not a checkout of this repository")
        args.baseline = str(Path(args.baseline).resolve())
        args.systems = [*args.systems, "baseline"] if "baseline" not in args.systems else args.systems
    elif "baseline" in args.systems:
        parser.error("the baseline system needs --baseline CHECKOUT")
    return args


async def main(args: argparse.Namespace) -> int:
    logging.getLogger("pygls").setLevel(logging.CRITICAL)
    allowed = set(BENCHMARK_REPORT) | (set(BENCHMARK_FIT) if args.fit else set())
    unknown = sorted(set(args.packages) - allowed)
    if unknown:
        print(f"not a benchmark package: {', '.join(unknown)} (BENCHMARK_REPORT, or BENCHMARK_FIT with --fit)")
        return 2
    from glm5_lsp.model import default_model_path, load_tokenizer

    tokenizer = load_tokenizer(default_model_path())
    commit = weights_commit()
    print(f"packages: {', '.join(args.packages)}; {args.positions} cursors each (seed {args.seed}, "
          f"at {args.at}); "
          f"weights from commit {commit or '?'}; drafts {'off' if args.no_drafts else 'on'}")
    tallies = {name: Tally() for name in SYSTEMS}
    details: list[dict] = []
    unsettled: collections.Counter[str] = collections.Counter()
    for name in args.packages:
        await run_package(name, args, tokenizer, tallies, details, unsettled)
    print_unsettled(unsettled, args.quiet)
    if args.details:
        Path(args.details).write_text("".join(json.dumps(r) + "\n" for r in details), encoding="utf-8")
    print()
    print(table_head())
    labels = {"model": "model alone (glm5-lsp serve, memory.enabled false)", "memory": "memory alone (no model)",
              "mixed": "model + memory (glm5-lsp serve, defaults: what ships)", "copy": "copy baseline",
              "jedi": "jedi-language-server (first item, word)",
              "baseline": f"what ships at {args.baseline} ({checkout_commit(args.baseline) or '?'})"}
    for name in SYSTEMS:
        if name in args.systems:
            print(tallies[name].row(labels[name], word_only=name == "jedi"))
    copy = tallies["copy"].exact
    if copy and "mixed" in args.systems:
        print(f"\nmixed exact / copy exact = {tallies['mixed'].exact / copy:.2f}; "
              f"mixed exact / memory exact = {tallies['mixed'].exact / max(tallies['memory'].exact, 1):.2f}")
    if "jedi" in args.systems and "mixed" in args.systems:
        for name in ("mixed", "baseline"):
            if name in args.systems:
                ratio = statistics.median(tallies[name].seconds) / statistics.median(tallies["jedi"].seconds)
                print(f"{name} p50 / jedi-language-server p50 = {ratio:.2f}")
    if "baseline" in args.systems and "mixed" in args.systems:
        pairs = [(r["baseline"], r["mixed"]) for r in details if "baseline" in r and "mixed" in r]
        if pairs:
            # Cursors answered without the model take about as long on either side: the slower half
            # (at or above the baseline's median) is where the model runs and where the p50 lies.
            gaps = [b["ms"] - m["ms"] for b, m in pairs]
            middle = statistics.median(b["ms"] for b, _ in pairs)
            upper = [b["ms"] - m["ms"] for b, m in pairs if b["ms"] >= middle]
            same = sum(b["answer"] == m["answer"] for b, m in pairs)
            print(f"baseline - mixed, paired: median {statistics.median(gaps):+.1f} ms, mean {statistics.mean(gaps):+.1f} ms, "
                  f"median over the baseline's slower half {statistics.median(upper):+.1f} ms; "
                  f"the same answer at {same} of {len(pairs)} cursors")
            # Each asked first at every other cursor: where the order itself costs time, the gaps
            # fall in two groups and their median lands in either; the mean of the two groups'
            # medians cancels the order's cost (a crossover design).
            by_first = {first: [r["baseline"]["ms"] - r["mixed"]["ms"] for r in details
                                if "baseline" in r and "mixed" in r and r.get("first") == first]
                        for first in ("mixed", "baseline")}
            if all(by_first.values()):
                medians = {first: statistics.median(g) for first, g in by_first.items()}
                print(f"baseline - mixed by order: median {medians['mixed']:+.1f} ms where mixed was asked first, "
                      f"{medians['baseline']:+.1f} ms where the baseline was; their mean "
                      f"{statistics.mean(medians.values()):+.1f} ms (the order's own cost "
                      f"{(medians['mixed'] - medians['baseline']) / 2:+.1f} ms for the one asked second)")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
