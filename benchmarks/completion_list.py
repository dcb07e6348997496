"""List completion, side by side: is the file's real name in glm5-lsp's top 5 vs jedi-language-server's?

Both servers run as subprocesses over stdio, driven by the same client (``lsp_latency.Server``), on
the same documents and cursor positions: each package of a set (``--set report``: the
``BENCHMARK_REPORT`` packages, the only figures to record; ``--set fit``: ``BENCHMARK_FIT``, for
tuning ``glm5_lsp/server/ranking.py``'s weights) copied as its own workspace. At each position
the line is cut two characters into one of the file's identifiers (a NAME token of 4+ characters,
not a keyword), as if the user were typing it (:func:`identifier_cases`); both servers get the same ``didChange`` and one
``textDocument/completion`` each, one after the other. A client's view of the answer: items
ordered by ``sortText`` (else the label), kept where the label or ``filterText`` starts with the
typed characters (any case), the first five. A hit: an item whose label or inserted text is the
file's identifier (for a longer text, the identifier followed by a non-identifier character).
glm5-lsp runs with its default settings and model unless ``--settings``/``--model``.

    python benchmarks/completion_list.py                     # report set, 25 positions a package
    python benchmarks/completion_list.py --set fit --positions 15
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import keyword
import logging
import os
import random
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
import tokenize
from pathlib import Path
from typing import Any

from lsprotocol import types

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lsp_latency import Server, _model_ready

REPO = Path(__file__).resolve().parents[1]
PURELIB = Path(sysconfig.get_paths()["purelib"])


def package_files(name: str, everything: bool = False) -> list[Path]:
    """The distribution's Python files: all of them (``everything``), or those positions are taken
    from (tests and files under 2 kB left out), largest first."""
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(f"{name} is not installed") from None
    files = [Path(str(dist.locate_file(f))) for f in dist.files or [] if f.suffix == ".py"]
    files = [f for f in files if f.is_file() and PURELIB in f.parents]
    if everything:
        return files
    files = [f for f in files if "test" not in str(f.relative_to(PURELIB)).lower() and f.stat().st_size > 2000]
    return sorted(files, key=lambda f: -f.stat().st_size)


def identifier_cases(text: str, count: int, rng: random.Random) -> list[tuple[str, int, int, str]]:
    """``count`` (document, line, column, name) cases: a line cut two characters into one of the
    file's identifiers (a NAME token of four or more characters, not a keyword: code, never a word
    of a docstring or comment), as if the user were typing it."""
    names = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.NAME and len(token.string) >= 4 and not keyword.iskeyword(token.string) \
                    and not keyword.issoftkeyword(token.string):
                names.append(token)
    except (tokenize.TokenError, SyntaxError):
        return []
    lines = text.split("\n")
    cases = []
    for token in rng.sample(names, min(count, len(names))):
        row, column = token.start[0] - 1, token.start[1] + 2
        edited = lines[:row] + [lines[row][:column]] + lines[row + 1:]
        cases.append(("\n".join(edited), row, column, token.string))
    return cases


def top5(items: list[types.CompletionItem], typed: str) -> list[types.CompletionItem]:
    ordered = sorted(items, key=lambda item: (item.sort_text or item.label, item.label))
    wanted = typed.lower()
    kept = [item for item in ordered
            if item.label.lower().startswith(wanted) or (item.filter_text or "").lower().startswith(wanted)]
    return kept[:5]


def inserted(item: types.CompletionItem) -> str:
    edit = item.text_edit
    if isinstance(edit, types.TextEdit):
        return edit.new_text
    if isinstance(edit, types.InsertReplaceEdit):
        return edit.new_text
    return item.insert_text or item.label


def is_hit(item: types.CompletionItem, word: str) -> bool:
    for text in (item.label, inserted(item)):
        text = text.strip()
        if text == word:
            return True
        if text.startswith(word) and not (text[len(word):len(word) + 1].isalnum() or text[len(word):len(word) + 1] == "_"):
            return True
    return False


async def ask(server: Server, uri: str, line: int, column: int, timeout: float) -> list[types.CompletionItem] | None:
    position = types.Position(line=line, character=column)
    try:
        result = await asyncio.wait_for(server.client.text_document_completion_async(
            types.CompletionParams(text_document=types.TextDocumentIdentifier(uri=uri), position=position)), timeout)
    except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - a failed request is a miss; the run goes on
        return None
    return list(result.items if isinstance(result, types.CompletionList) else (result or []))


async def run_package(name: str, args: argparse.Namespace, rng: random.Random, rows: dict[str, dict[str, list[Any]]],
                      env: dict[str, str], options: dict[str, Any]) -> None:
    root = Path(tempfile.mkdtemp(prefix=f"completion-list-{name}-"))
    for source in package_files(name, everything=True):  # the workspace: the package's files where they were
        copy = root / source.relative_to(PURELIB)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, copy)
    files = [root / source.relative_to(PURELIB) for source in package_files(name)]
    ours = Server("glm5-lsp", [sys.executable, "-m", "glm5_lsp.cli", "serve", "--threads", "1"], env, options)
    jedi = Server("jedi-language-server", [sys.executable, "-c", "from jedi_language_server.cli import cli; cli()"],
                  env, None)
    await ours.start(root)
    await jedi.start(root)
    try:
        if not await _model_ready(ours, args.load_timeout):
            raise SystemExit("glm5-lsp did not load its model")
        per_file = max(1, args.positions // min(len(files), 3))
        done = 0
        for path in files[:3]:
            text = path.read_text(encoding="utf-8")
            uri = path.as_uri()
            for server in (ours, jedi):
                server.open(uri, text)
            for document, line, column, word in identifier_cases(text, per_file, rng):
                if done >= args.positions:
                    break
                typed = word[:2]
                for server in (ours, jedi):
                    server.replace(uri, document)
                    started = time.perf_counter()
                    items = await ask(server, uri, line, column, args.timeout)
                    seconds = time.perf_counter() - started
                    shown = top5(items or [], typed)
                    row = rows[server.name]
                    row["hit"].append(any(is_hit(item, word) for item in shown))
                    row["any"].append(any(is_hit(item, word) for item in items or []))
                    row["ms"].append(seconds * 1000)
                    row["failed"].append(items is None)
                    if args.details is not None:
                        args.details.append({"package": name, "server": server.name, "word": word, "typed": typed,
                                             "top5": [item.label for item in shown], "ms": round(seconds * 1000, 1)})
                done += 1
        print(f"  {name}: {done} positions in {len(files[:3])} file(s)")
    finally:
        await ours.stop()
        await jedi.stop()
        shutil.rmtree(root, ignore_errors=True)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


async def main(args: argparse.Namespace) -> int:
    logging.getLogger("pygls").setLevel(logging.CRITICAL)
    from glm5_lsp.train.corpus import BENCHMARK_FIT, BENCHMARK_REPORT

    packages = list(BENCHMARK_REPORT if args.set == "report" else BENCHMARK_FIT)
    if args.packages:
        packages = [p for p in packages if p in args.packages.split(",")]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    options: dict[str, Any] = json.loads(args.settings) if args.settings else {}
    if args.model:
        options.setdefault("model", {})["path"] = args.model
    rows = {name: {"hit": [], "any": [], "ms": [], "failed": []} for name in ("glm5-lsp", "jedi-language-server")}
    args.details = [] if args.details_path else None
    rng = random.Random(args.seed)
    print(f"set: {args.set} ({', '.join(packages)}); {args.positions} positions a package; timeout {args.timeout}s; "
          f"model: {args.model or 'default'}; settings: {args.settings or 'defaults'}")
    for name in packages:
        await run_package(name, args, rng, rows, env, options)
    if args.details_path:
        Path(args.details_path).write_text("".join(json.dumps(r) + "\n" for r in args.details), encoding="utf-8")
    print()
    print(f"{'server':<22} {'top-5 hit':>10} {'anywhere':>9} {'p50 ms':>8} {'p95 ms':>8} {'failed':>7} {'positions':>10}")
    for name, row in rows.items():
        count = len(row["hit"])
        print(f"{name:<22} {100 * sum(row['hit']) / max(1, count):>9.1f}% {100 * sum(row['any']) / max(1, count):>8.1f}% "
              f"{statistics.median(row['ms']) if row['ms'] else float('nan'):>8.0f} {percentile(row['ms'], 0.95):>8.0f} "
              f"{sum(row['failed']):>7} {count:>10}")
    ours, theirs = rows["glm5-lsp"]["hit"], rows["jedi-language-server"]["hit"]
    both = sum(a and b for a, b in zip(ours, theirs, strict=True))
    only_ours = sum(a and not b for a, b in zip(ours, theirs, strict=True))
    only_theirs = sum(b and not a for a, b in zip(ours, theirs, strict=True))
    print(f"\nsame positions: both {both}, only glm5-lsp {only_ours}, only jedi-language-server {only_theirs}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", choices=("report", "fit"), default="report")
    parser.add_argument("--packages", default="", help="a comma-separated subset of the set's packages")
    parser.add_argument("--positions", type=int, default=25, help="positions a package")
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--load-timeout", type=float, default=180.0)
    parser.add_argument("--model", default="")
    parser.add_argument("--settings", default="", help="glm5-lsp initialization options (JSON)")
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--details", dest="details_path", default="", help="write each position's top 5 here (JSONL)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
