"""Code actions in the editor: the model-free fixes offered, preferred and applied, and their time.

The real ``glm5-lsp serve`` over stdio (``lsp_latency.Server``), its default settings and model,
on copies of real files: the ``BENCHMARK_REPORT`` packages (``--set report``, the figures to record)
or ``BENCHMARK_FIT`` (``--set fit``). Each case breaks one line of a file in one way:

- ``colon``: the ``:`` ending a ``def``/``if``/``for``/``while``/``class`` line deleted;
- ``paren``: the last ``)`` of a line whose brackets balance deleted;
- ``local``: one use of a function's local name (assigned in it, used later) misspelled (two
  neighbouring letters swapped);
- ``class``: one use of a class the file defines misspelled the same way;
- ``import``: the ``import X`` line of a module the file uses deleted.

Every name case is one pyflakes reports as an undefined name on the asked line (the first use, for
an import); every syntax case one that does not compile.

For each case the client opens the broken file, asks ``textDocument/codeAction`` on the broken
line (timed: the model-free fixes are found then, within 300 ms), resolves the preferred action
that is not "Fix with GLM-5" (timed) and applies its edits. The client resolves edits (as VS Code
and Neovim do). Files over ``limits.windowChars`` (100,000 characters) are read as a window, where
no model-free fix is offered (a fix is judged on the whole text): they are left out. Fixed: the result compiles and
pyflakes reports nothing the original file does not (messages without line numbers). Side by side
in the same run, the time of a ``textDocument/hover``-free baseline: the server's answer to a
code-action request on a clean line of the same file (the diagnostics it runs anyway).

    python benchmarks/code_actions.py                 # report set, 6 cases a class a package
    python benchmarks/code_actions.py --set fit --cases 3
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
import tokenize
from pathlib import Path
from typing import Any

from lsprotocol import types

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from completion_list import PURELIB, package_files
from lsp_latency import Server, _drain, _model_ready

REPO = Path(__file__).resolve().parents[1]
CLASSES = ("colon", "paren", "local", "class", "import")


def _swap(name: str, rng: random.Random) -> str | None:
    spots = [i for i in range(1, len(name) - 1) if name[i] != name[i + 1] and name[i].isalpha() and name[i + 1].isalpha()]
    if not spots:
        return None
    i = rng.choice(spots)
    return name[:i] + name[i + 1] + name[i] + name[i + 2:]


def mutations(text: str, kind: str, rng: random.Random, count: int) -> list[tuple[str, int]]:
    """Up to ``count`` (broken text, 0-based line) cases of ``kind``."""
    lines = text.split("\n")
    found: list[tuple[str, int]] = []
    order = list(range(len(lines)))
    rng.shuffle(order)
    defined = set(re.findall(r"^class (\w+)", text, re.MULTILINE))
    code_names = _name_tokens(text)  # (line, column) of every NAME token: code, not docstrings
    for index in order:
        if len(found) >= count:
            break
        line = lines[index]
        new = None
        if (kind == "colon" and _colon_line(line)) or (kind == "paren" and _paren_line(line)):
            new = line.rstrip()[:-1]
        elif kind == "class":
            uses = [m for m in re.finditer(r"\b(\w+)\b", line) if m.group(1) in defined
                    and (index, m.start()) in code_names and not line.lstrip().startswith("class ")]
            if uses and "#" not in line:
                use = rng.choice(uses)
                wrong = _swap(use.group(1), rng)
                if wrong and wrong not in text:
                    new = line[:use.start()] + wrong + line[use.end():]
        elif kind == "import":
            match = re.match(r"^import (\w+)$", line)
            if match:
                broken = "\n".join(lines[:index] + lines[index + 1:])
                where = _undefined_line(broken, match.group(1))
                if where is not None:
                    found.append((broken, where))
                continue
        elif kind == "local":
            new = _local(lines, index, rng, text, code_names)
        if new is not None and new != line:
            broken = "\n".join(lines[:index] + [new] + lines[index + 1:])
            if _compiles(broken) != (kind in ("local", "class")):
                continue  # a syntax case must break the parse; a name case must not
            if kind in ("local", "class") and _undefined_line(broken, None) != index:
                continue  # the misspelling must be what pyflakes reports, there
            found.append((broken, index))
    return found


def _undefined_line(text: str, name: str | None) -> int | None:
    """The first line (0-based) where pyflakes reports an undefined name (``name``, or any)."""
    from pyflakes.api import check
    from pyflakes.reporter import Reporter

    out = io.StringIO()
    check(text, "case.py", Reporter(out, out))
    for row in out.getvalue().splitlines():
        parts = row.split(":", 3)
        if len(parts) == 4 and "undefined name" in parts[3] and (name is None or f"'{name}'" in parts[3]):
            return int(parts[1]) - 1
    return None


def _compiles(text: str) -> bool:
    try:
        compile(text, "x.py", "exec")
    except SyntaxError:
        return False
    return True


def _colon_line(line: str) -> bool:
    return bool(re.match(r"\s*(def|if|for|while|class)\b.*:\s*$", line)) and "#" not in line


def _paren_line(line: str) -> bool:
    return line.rstrip().endswith(")") and line.count("(") == line.count(")") and "#" not in line \
        and '"' not in line and "'" not in line


def _name_tokens(text: str) -> set[tuple[int, int]]:
    found = set()
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.NAME:
                found.add((token.start[0] - 1, token.start[1]))
    except (tokenize.TokenError, SyntaxError):
        pass
    return found


def _local(lines: list[str], index: int, rng: random.Random, text: str, code_names: set[tuple[int, int]]) -> str | None:
    """A use on ``lines[index]`` of a name assigned on an earlier line of the same function, misspelled."""
    line = lines[index]
    if not line.startswith("        ") or "#" in line:
        return None
    start = index
    while start > 0 and not re.match(r"\s*def ", lines[start]):
        start -= 1
    assigned = set()
    for earlier in lines[start + 1:index]:
        match = re.match(r"\s+(\w+) = ", earlier)
        if match:
            assigned.add(match.group(1))
    uses = [m for m in re.finditer(r"\b(\w+)\b", line) if m.group(1) in assigned and len(m.group(1)) >= 4
            and (index, m.start()) in code_names and not line[m.end():].lstrip().startswith("=")]
    if not uses:
        return None
    use = rng.choice(uses)
    wrong = _swap(use.group(1), rng)
    if not wrong or wrong in text:
        return None
    return line[:use.start()] + wrong + line[use.end():]


class EditorServer(Server):
    """``lsp_latency.Server`` with a code-action client like VS Code's and Neovim's: it resolves
    an action's edits with ``codeAction/resolve`` (so the model's fix is not computed up front)."""

    async def start(self, root: Path) -> None:
        await self.client.start_io(*self.command, env=self.env)
        stderr = self.client._server.stderr if self.client._server else None
        if stderr is not None:
            self._drain = asyncio.create_task(_drain(stderr))
        caps = types.ClientCapabilities(text_document=types.TextDocumentClientCapabilities(
            code_action=types.CodeActionClientCapabilities(
                code_action_literal_support=types.ClientCodeActionLiteralOptions(
                    code_action_kind=types.ClientCodeActionKindOptions(value_set=["quickfix", "refactor"])),
                is_preferred_support=True, data_support=True,
                resolve_support=types.ClientCodeActionResolveOptions(properties=["edit"])),
        ))
        await self.client.initialize_async(types.InitializeParams(
            capabilities=caps, root_uri=root.as_uri(), initialization_options=self.init_options))
        self.client.initialized(types.InitializedParams())


def pyflakes_messages(text: str) -> set[str]:
    from pyflakes.api import check
    from pyflakes.reporter import Reporter

    out = io.StringIO()
    check(text, "case.py", Reporter(out, out))
    return {row.split(":", 3)[-1].strip() for row in out.getvalue().splitlines()}


def apply(text: str, edits: list[types.TextEdit]) -> str:
    lines = text.split("\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)

    def offset(p: types.Position) -> int:
        return starts[p.line] + p.character

    for edit in sorted(edits, key=lambda e: offset(e.range.start), reverse=True):
        text = text[: offset(edit.range.start)] + edit.new_text + text[offset(edit.range.end):]
    return text


async def actions(server: Server, uri: str, line: int, timeout: float) -> list[types.CodeAction] | None:
    at = types.Position(line=line, character=0)
    try:
        found = await asyncio.wait_for(server.client.text_document_code_action_async(types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), range=types.Range(start=at, end=at),
            context=types.CodeActionContext(diagnostics=[]))), timeout)
    except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - a failed request is a miss
        return None
    return [a for a in found or [] if isinstance(a, types.CodeAction)]


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
    rows: dict[str, dict[str, list[Any]]] = {kind: {"offered": [], "fixed": [], "list_ms": [], "resolve_ms": []}
                                             for kind in CLASSES}
    baseline: list[float] = []
    rng = random.Random(args.seed)
    print(f"set: {args.set} ({', '.join(packages)}); up to {args.cases} cases a class a package; "
          f"settings: {args.settings or 'defaults'}")
    details = []
    for name in packages:
        root = Path(tempfile.mkdtemp(prefix=f"code-actions-{name}-"))
        for source in package_files(name, everything=True):
            copy = root / source.relative_to(PURELIB)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, copy)
        server = EditorServer("glm5-lsp", [sys.executable, "-m", "glm5_lsp.cli", "serve", "--threads", "1"], env,
                              options)
        await server.start(root)
        try:
            if not await _model_ready(server, 180):
                raise SystemExit("glm5-lsp did not load its model")
            files = [root / f.relative_to(PURELIB) for f in package_files(name)
                     if f.stat().st_size < 100_000][:4]
            for path in files:
                original = path.read_text(encoding="utf-8")
                uri = path.as_uri()
                server.open(uri, original)
                started = time.perf_counter()  # the baseline: a clean line's actions
                await actions(server, uri, 0, args.timeout)
                baseline.append((time.perf_counter() - started) * 1000)
                for kind in CLASSES:
                    for broken, line in mutations(original, kind, rng, max(1, args.cases // len(files[:4]) + 1)):
                        if len(rows[kind]["offered"]) >= args.cases * (packages.index(name) + 1):
                            break
                        server.replace(uri, broken)
                        started = time.perf_counter()
                        offered = await actions(server, uri, line, args.timeout)
                        listed = (time.perf_counter() - started) * 1000
                        quick = [a for a in offered or [] if a.title != "Fix with GLM-5"]
                        preferred = next((a for a in quick if a.is_preferred), None)
                        fixed = False
                        resolve_ms = None
                        if preferred is not None:
                            started = time.perf_counter()
                            try:
                                resolved = await asyncio.wait_for(server.client.code_action_resolve_async(preferred),
                                                                  args.timeout)
                            except Exception:  # noqa: BLE001 - a failed resolve is a miss
                                resolved = preferred
                            resolve_ms = (time.perf_counter() - started) * 1000
                            if resolved.edit is not None and resolved.edit.changes:
                                result = apply(broken, list(resolved.edit.changes.get(uri, [])))
                                try:
                                    compile(result, "x.py", "exec")
                                    fixed = pyflakes_messages(result) <= pyflakes_messages(original)
                                except SyntaxError:
                                    fixed = False
                        row = rows[kind]
                        row["offered"].append(preferred is not None)
                        row["fixed"].append(fixed)
                        row["list_ms"].append(listed)
                        if resolve_ms is not None:
                            row["resolve_ms"].append(resolve_ms)
                        details.append({"package": name, "file": path.name, "kind": kind, "line": line,
                                        "titles": [a.title for a in offered or []], "fixed": fixed,
                                        "list_ms": round(listed, 1)})
                server.replace(uri, original)
            print(f"  {name}: {sum(1 for d in details if d['package'] == name)} cases")
        finally:
            await server.stop()
            shutil.rmtree(root, ignore_errors=True)
    if args.details:
        Path(args.details).write_text("".join(json.dumps(d) + "\n" for d in details), encoding="utf-8")
    print()
    print(f"{'class':<8} {'cases':>6} {'offered':>8} {'fixed':>7} {'list p50':>9} {'list p95':>9} "
          f"{'resolve p50':>12} {'resolve p95':>12}")
    every: list[float] = []
    for kind, row in rows.items():
        count = len(row["offered"])
        every += row["list_ms"]
        print(f"{kind:<8} {count:>6} {100 * sum(row['offered']) / max(1, count):>7.1f}% "
              f"{100 * sum(row['fixed']) / max(1, count):>6.1f}% {statistics.median(row['list_ms']) if count else 0:>9.0f} "
              f"{percentile(row['list_ms'], 0.95):>9.0f} "
              f"{statistics.median(row['resolve_ms']) if row['resolve_ms'] else 0:>12.0f} "
              f"{percentile(row['resolve_ms'], 0.95):>12.0f}")
    clean = statistics.median(baseline) if baseline else float("nan")
    print(f"\ncode actions on a clean line (the diagnostics alone): p50 {clean:.0f} ms; "
          f"broken lines, all classes: p50 {statistics.median(every):.0f} ms, p95 {percentile(every, 0.95):.0f} ms "
          f"(p50 ratio {statistics.median(every) / clean:.2f})")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", choices=("report", "fit"), default="report")
    parser.add_argument("--packages", default="")
    parser.add_argument("--cases", type=int, default=6, help="cases a class a package")
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--settings", default="")
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--details", default="")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
