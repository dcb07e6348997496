"""The benchmarks' language servers run the checkout they are asked for (``benchmarks/lsp_latency.py``)."""

from __future__ import annotations

import argparse
import asyncio
import collections
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from lsp_latency import glm5_server


def test_a_server_for_another_checkout_imports_that_checkout_even_when_started_inside_this_one(tmp_path: Path) -> None:
    """``python -m`` puts the working directory ahead of PYTHONPATH: a server for another checkout,
    started from this repository's root (as the benchmarks' docstrings run them), imported this
    repository's package, and ``lines.py --baseline`` / ``lsp_latency.py --versus`` compared a checkout
    with itself."""
    other = tmp_path / "other"
    (other / "glm5_lsp").mkdir(parents=True)
    (other / "glm5_lsp" / "__init__.py").write_text("", encoding="utf-8")
    server = glm5_server("glm5-lsp@other", other, 1, {})
    assert server.command[1:4] == ["-m", "glm5_lsp.cli", "serve"]
    found = subprocess.run([sys.executable, "-c", "import glm5_lsp; print(glm5_lsp.__file__)"], env=server.env,
                           cwd=server.cwd or str(ROOT), capture_output=True, text=True, check=True).stdout.strip()
    assert Path(found).resolve() == (other / "glm5_lsp" / "__init__.py").resolve()


def _this_checkout_built(tmp_path: Path, monkeypatch):
    """``lsp_latency`` with a stand-in for this checkout that has its native module built."""
    import lsp_latency

    here = tmp_path / "here"
    (here / "glm5_lsp").mkdir(parents=True)
    (here / "glm5_lsp" / "_native.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    monkeypatch.setattr(lsp_latency, "REPO", here)
    return lsp_latency


def test_a_worktree_without_the_native_module_gets_it_built_before_its_server_runs(tmp_path: Path, monkeypatch) -> None:
    """A ``git worktree`` holds no build outputs: its server ran the scripted step and the numpy
    memory searches beside this checkout's compiled ones, and ``lines.py --baseline`` put about 25 ms
    of p50 between two identical checkouts. Its module is now built in place first (here by a
    stand-in ``setup.py``)."""
    lsp_latency = _this_checkout_built(tmp_path, monkeypatch)
    other = tmp_path / "other"
    (other / "glm5_lsp").mkdir(parents=True)
    (other / "glm5_lsp" / "__init__.py").write_text("", encoding="utf-8")
    (other / "glm5_lsp" / "native.c").write_text("", encoding="utf-8")
    (other / "setup.py").write_text(
        "import sys, pathlib\n"
        "assert sys.argv[1:3] == ['build_ext', '--inplace'], sys.argv\n"
        "pathlib.Path('glm5_lsp/_native.cpython-311-x86_64-linux-gnu.so').write_bytes(b'')\n", encoding="utf-8")
    assert not lsp_latency.native_built(other)
    glm5_server("glm5-lsp@other", other, 1, {})
    assert lsp_latency.native_built(other)
    assert lsp_latency.same_paths(other)


def test_a_checkout_from_before_the_native_module_is_left_as_it_is(tmp_path: Path, monkeypatch) -> None:
    lsp_latency = _this_checkout_built(tmp_path, monkeypatch)
    old = tmp_path / "old"
    (old / "glm5_lsp").mkdir(parents=True)
    assert not lsp_latency.same_paths(old)  # nothing to build: the two differ, and say so by returning False
    assert not lsp_latency.native_built(old)


def test_lines_default_command_parses_and_asks_the_baseline_only_with_a_checkout() -> None:
    """``python benchmarks/lines.py`` (its docstring's first command) stopped at "the baseline
    system needs --baseline CHECKOUT": the default systems held the baseline."""
    import lines

    default = lines.parse_args([])
    assert "baseline" not in default.systems and {"mixed", "memory", "copy", "jedi", "model"} <= set(default.systems)
    with_baseline = lines.parse_args(["--baseline", str(ROOT), "--systems", "mixed"])
    assert with_baseline.systems == ["mixed", "baseline"]


class _Stand:
    """A stand-in ``lsp_latency.Server``: answers at once, its diagnostics published ``late`` seconds
    after each change (the background work a change starts), what happens written to ``events``."""

    def __init__(self, name: str, events: list, late: float) -> None:
        self.name, self.events, self.late = name, events, late
        self.count, self.changed = 0, 0.0

    def published_count(self, uri: str) -> int:
        return self.count

    def replace(self, uri: str, text: str) -> None:
        self.changed = time.monotonic()
        self.events.append((self.name, "change"))

    async def request(self, uri, line, column, word, typed):
        self.events.append((self.name, "request"))
        return True, True, "x"

    async def settled(self, uri: str, after: int, seconds: float) -> bool:
        wait = self.changed + self.late - time.monotonic()
        if wait > seconds:
            await asyncio.sleep(seconds)
            return False
        await asyncio.sleep(max(0.0, wait))
        self.count += 1
        self.events.append((self.name, "published"))
        return True


def test_latency_waits_for_each_servers_diagnostics_before_asking_the_next() -> None:
    """``lsp_latency.py`` asked glm5-lsp, then jedi-language-server at once: jedi's request paid for
    the work glm5-lsp's change started (the ~30 ms ``lines.py`` traced). Each server's diagnostics of
    the change now come before the next server is asked; a wait that runs out is counted."""
    import lsp_latency

    events: list = []
    servers = [_Stand("ours", events, 0.05), _Stand("jedi", events, 0.0)]
    tallies = {s.name: lsp_latency.Tally() for s in servers}
    unsettled: collections.Counter[str] = collections.Counter()
    args = argparse.Namespace(timeout=1.0, quiet=1.0)
    asyncio.run(lsp_latency.ask_in_turn(servers, "file:///x.py", "x", 0, 1, ("xy", 1), tallies, args, None, unsettled))
    assert events == [("ours", "change"), ("ours", "request"), ("ours", "published"),
                      ("jedi", "change"), ("jedi", "request"), ("jedi", "published")]
    assert all(t.requests == 1 for t in tallies.values()) and not unsettled
    events.clear()
    short = argparse.Namespace(timeout=1.0, quiet=0.01)
    asyncio.run(lsp_latency.ask_in_turn(servers, "file:///x.py", "x", 0, 1, ("xy", 1), None, short, None, unsettled))
    assert unsettled == {"ours": 1}
    assert lsp_latency.parse_args([]).quiet == 3.0


def test_no_wait_for_diagnostics_glm5_lsp_does_not_publish_for_a_document_past_its_window() -> None:
    """glm5-lsp reads a document longer than ``limits.windowChars`` as a window and publishes no
    diagnostics for it: each wait for them ran out (8 in a REPORT run, pygls's 121 KB
    ``_capabilities.py``). Its wait is skipped there, jedi-language-server's kept."""
    import lsp_latency

    events: list = []
    ours, jedi = _Stand("glm5-lsp mixed", events, 5.0), _Stand("jedi-language-server", events, 0.0)
    ours.init_options = jedi.init_options = None
    unsettled: collections.Counter[str] = collections.Counter()
    args = argparse.Namespace(timeout=1.0, quiet=0.05)
    big = "x = 1\n" * 20_000  # 120,000 characters: past the default window of 100,000
    asyncio.run(lsp_latency.ask_in_turn([ours, jedi], "file:///x.py", big, 0, 1, ("xy", 1), None, args, None, unsettled))
    assert ("jedi-language-server", "published") in events and not unsettled
    asyncio.run(lsp_latency.ask_in_turn([ours], "file:///x.py", "x = 1\n", 0, 1, ("xy", 1), None, args, None, unsettled))
    assert unsettled == {"glm5-lsp mixed": 1}  # a document it checks: waited for (and here, ran out)
    ours.init_options = {"glm5": {"limits": {"windowChars": 200_000}}}
    asyncio.run(lsp_latency.ask_in_turn([ours], "file:///x.py", big, 0, 1, ("xy", 1), None, args, None, unsettled))
    assert unsettled == {"glm5-lsp mixed": 2}  # a wider window: that one it checks too
