"""``glm5-lsp batch``: each task kind, bad input, resume, a torn line and a ``kill -9`` mid-run.

Data: ``tests/data/batch/tasks.jsonl``; the backend is the scripted double in
``tests/data/batch/scripted_backend.py`` (the model is not what these tests are about).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from glm5_lsp import batch
from glm5_lsp.backends.base import CompletionRequest
from glm5_lsp.pipeline import Pipeline

DATA = Path(__file__).parent / "data" / "batch"
ROOT = Path(__file__).parents[1]
_spec = importlib.util.spec_from_file_location("scripted_backend", DATA / "scripted_backend.py")
assert _spec and _spec.loader
scripted = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scripted)


def answer(request: CompletionRequest) -> str:
    prefix = request.prompt.prefix
    if prefix.endswith("max("):
        return "a, b)"
    if "Fixed version" in prefix:
        return "    return x / 2\n"
    if prefix.startswith("# Write"):
        return "def reverse(s):\n    return s[::-1]\n"
    return "return 3.14 * r * r\n"


def read_output(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_kind_with_errors_recorded(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    summary = batch.run_batch(DATA / "tasks.jsonl", out, lambda: Pipeline(scripted.ScriptedBackend(answer)),
                              progress=False)
    records = {record["id"]: record for record in read_output(out)}
    assert sorted(records) == ["bad-kind", "c1", "c2", "f1", "f2", "g1", "g2", "no-prefix"]
    assert summary.done == 8 and summary.errors == 2 and len(summary.problems) == 3
    assert records["c1"]["text"] == "return 3.14 * r * r" and records["c1"]["error"] is None
    assert records["c2"]["text"] == "a, b"  # the ")" after the cursor is not repeated
    assert records["g2"]["text"].startswith("def reverse(s):")
    fixed = records["f1"]
    assert fixed["text"] == "def half(x):\n    return x / 2\n"
    assert fixed["diagnostics_before"] and not fixed["diagnostics_after"] and fixed["clean"]
    assert records["f2"]["diagnostics_before"] == [{"line": 1, "message": "should add one"}]
    assert "unknown kind 'translate'" in records["bad-kind"]["error"]
    assert "missing 'prefix'" in records["no-prefix"]["error"]
    for record in records.values():
        assert {"text", "rounds", "prompt_tokens", "completion_tokens", "seconds"} <= record.keys() or record["error"]
    assert any("duplicate id 'g1'" in p for p in summary.problems)
    assert any("missing or invalid id" in p for p in summary.problems)
    assert any("not JSON" in p for p in summary.problems)


def test_rerun_skips_finished_ids(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    backend = scripted.ScriptedBackend(answer)
    batch.run_batch(DATA / "tasks.jsonl", out, lambda: Pipeline(backend), progress=False)
    calls = len(backend.requests)
    again = batch.run_batch(DATA / "tasks.jsonl", out, lambda: Pipeline(backend), progress=False)
    assert again.done == 0 and again.skipped == 8 and len(backend.requests) == calls
    assert len(read_output(out)) == 8


def test_torn_last_line_is_cut_and_its_task_rerun(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    good = json.dumps({"id": "c1", "kind": "complete", "text": "kept", "error": None})
    out.write_text(good + "\n" + '{"id": "c2", "kind": "compl')  # a crash mid-write
    batch.run_batch(DATA / "tasks.jsonl", out, lambda: Pipeline(scripted.ScriptedBackend(answer)), progress=False)
    records = read_output(out)  # every line parses
    ids = [record["id"] for record in records]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 8
    assert records[0]["text"] == "kept"  # the finished line before the torn one is untouched


def _write_tasks(path: Path, count: int) -> list[str]:
    ids = [f"t{n:03d}" for n in range(count)]
    with open(path, "w") as handle:
        handle.writelines(json.dumps({"id": task_id, "kind": "generate", "prompt": f"def f_{task_id}():\n"}) + "\n" for task_id in ids)
    return ids


def _children(pid: int) -> list[int]:
    """Ids of the processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_kill_9_mid_run_then_resume_loses_and_duplicates_nothing(tmp_path: Path, processes: bool) -> None:
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "out.jsonl"
    ids = _write_tasks(tasks, 60)
    command = [sys.executable, str(DATA / "scripted_backend.py"), str(tasks), str(out), "--workers", "2",
               "--delay", "0.05"] + (["--processes"] if processes else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if out.exists() and out.read_bytes().count(b"\n") >= 10:
            break
        time.sleep(0.02)
    workers = _children(child.pid)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL
    before = read_output(out)
    assert 10 <= len(before) < 60, "the run must be killed mid-way for this test to mean anything"
    resumed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert resumed.returncode == 0, resumed.stderr
    assert f"skipped={len(before)}" in resumed.stdout
    records = read_output(out)
    assert sorted(record["id"] for record in records) == ids  # none lost, none duplicated
    assert records[: len(before)] == before  # lines written before the kill are untouched
    assert all(record["error"] is None and record["text"] for record in records)
    if processes:  # orphaned worker processes notice their parent is gone and exit
        assert workers
        deadline = time.monotonic() + 20
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in workers)


def test_cli_reports_a_missing_input_and_records_a_model_that_cannot_load(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from glm5_lsp.cli import main

    monkeypatch.setenv("GLM5_LSP_CACHE_DIR", str(tmp_path / "cache"))

    assert main(["batch", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "o.jsonl")]) == 2
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "out.jsonl"
    _write_tasks(tasks, 2)
    code = main(["batch", str(tasks), "-o", str(out), "--model", str(tmp_path / "no-model"), "--no-progress"])
    records = read_output(out)
    assert code == 1 and len(records) == 2
    assert all("no checkpoint at" in record["error"] for record in records)


@pytest.mark.slow
def test_cli_runs_every_kind_on_a_real_checkpoint(tiny_checkpoint: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from glm5_lsp.cli import main

    monkeypatch.setenv("GLM5_LSP_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out.jsonl"
    code = main(["batch", str(DATA / "tasks.jsonl"), "-o", str(out), "--model", str(tiny_checkpoint),
                 "--workers", "2", "--max-tokens", "12", "--no-repair", "--no-progress"])
    records = {record["id"]: record for record in read_output(out)}
    assert code == 1  # the two malformed tasks and three bad lines are reported
    assert sorted(records) == ["bad-kind", "c1", "c2", "f1", "f2", "g1", "g2", "no-prefix"]
    for task_id in ("c1", "c2", "g1", "g2", "f1", "f2"):
        record = records[task_id]
        assert record["error"] is None and record["rounds"] == 1 and record["prompt_tokens"] > 0, record
        assert "<|" not in record["text"]
    assert records["f1"]["diagnostics_before"]  # the broken input's syntax error was found


def test_cli_rejects_incomplete_options(tmp_path: Path) -> None:
    from glm5_lsp.cli import main

    tasks = tmp_path / "tasks.jsonl"
    _write_tasks(tasks, 1)
    out = tmp_path / "out.jsonl"
    assert main(["batch", str(tasks), "-o", str(out), "--backend", "openai"]) == 2
    assert main(["batch", str(tasks), "-o", str(out), "--workers", "0"]) == 2
    assert not out.exists()


# ---- one run per output, --retry-errors, clean means working code (issues 19 and 21) ----------


def test_a_second_run_on_the_same_output_refuses_at_once_naming_the_first(tmp_path: Path) -> None:
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "out.jsonl"
    ids = _write_tasks(tasks, 40)
    command = [sys.executable, str(DATA / "scripted_backend.py"), str(tasks), str(out), "--delay", "0.05"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (out.exists() and out.read_bytes().count(b"\n") >= 2) and time.monotonic() < deadline:
            time.sleep(0.02)
        begun = time.monotonic()
        with pytest.raises(batch.OutputLocked, match=f"pid {first.pid} "):
            batch.run_batch(tasks, out, lambda: Pipeline(scripted.ScriptedBackend(answer)), progress=False)
        from glm5_lsp.cli import main

        assert main(["batch", str(tasks), "-o", str(out), "--no-progress"]) == 2  # the CLI says so and stops
        assert time.monotonic() - begun < 5  # at once (no model was loaded)
        first.wait(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, first.stderr.read() if first.stderr else ""
    records = read_output(out)
    assert sorted(record["id"] for record in records) == ids  # nothing twice
    assert not (tmp_path / "out.jsonl.lock").exists()  # removed by the run that held it
    again = batch.run_batch(tasks, out, lambda: Pipeline(scripted.ScriptedBackend(answer)), progress=False)
    assert again.skipped == 40  # the lock is free again


def test_the_cli_names_the_pid_holding_the_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from glm5_lsp.cli import main

    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "out.jsonl"
    _write_tasks(tasks, 1)
    with batch.locked_output(out):
        assert main(["batch", str(tasks), "-o", str(out), "--no-progress"]) == 2
    message = capsys.readouterr().err
    assert f"pid {os.getpid()} " in message and "another batch run" in message and not out.exists()


def test_a_lock_left_by_a_killed_run_does_not_block_the_next(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from glm5_lsp.batch import OutputLock\n"
        f"OutputLock(Path({str(out)!r})).acquire(); print('held', flush=True); time.sleep(60)")],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    with pytest.raises(batch.OutputLocked, match=f"pid {holder.pid} "):
        batch.OutputLock(out).acquire()
    holder.kill()
    holder.wait()
    assert (tmp_path / "out.jsonl.lock").exists()  # kill -9: the file stays, the lock does not
    with batch.locked_output(out):
        pass


class FailingBackend:
    name = "failing"
    supports_internals = False

    def complete(self, request: CompletionRequest) -> None:
        from glm5_lsp.backends.base import BackendUnavailable

        raise BackendUnavailable("http://127.0.0.1:9: giving up after 4 attempts (ConnectError)")


def test_retry_errors_reruns_only_the_errored_tasks_and_keeps_the_rest(tmp_path: Path) -> None:
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "out.jsonl"
    ids = _write_tasks(tasks, 6)
    half = tmp_path / "half.jsonl"
    half.write_text("".join(line + "\n" for line in tasks.read_text().splitlines()[:3]))
    batch.run_batch(half, out, lambda: Pipeline(scripted.ScriptedBackend(answer)), progress=False)
    kept = out.read_bytes()
    failed = batch.run_batch(tasks, out, lambda: Pipeline(FailingBackend()), progress=False)
    assert failed.errors == 3 and failed.skipped == 3
    skipped = batch.run_batch(tasks, out, lambda: Pipeline(scripted.ScriptedBackend(answer)), progress=False)
    assert skipped.done == 0 and skipped.skipped == 6  # without the flag an error counts as done
    backend = scripted.ScriptedBackend(answer)
    retried = batch.run_batch(tasks, out, lambda: Pipeline(backend), progress=False, retry_errors=True)
    assert retried.retried == 3 and retried.done == 3 and retried.errors == 0 and retried.skipped == 3
    records = read_output(out)
    assert sorted(record["id"] for record in records) == ids  # one record each: the errors were replaced
    assert all(record["error"] is None for record in records)
    assert out.read_bytes().startswith(kept)  # the finished records untouched, byte for byte
    assert not list(tmp_path.glob(".out.jsonl.*.tmp"))


def test_retry_errors_on_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    from glm5_lsp.cli import main

    monkeypatch.setenv("GLM5_LSP_CACHE_DIR", str(tmp_path / "cache"))
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "out.jsonl"
    _write_tasks(tasks, 2)
    assert main(["batch", str(tasks), "-o", str(out), "--model", str(tmp_path / "no-model"), "--no-progress"]) == 1
    assert main(["batch", str(tasks), "-o", str(out), "--model", str(tmp_path / "no-model"), "--no-progress",
                 "--retry-errors"]) == 1
    assert "2 of them run again after an error" in capsys.readouterr().err
    assert len(read_output(out)) == 2


@pytest.mark.parametrize("text, clean", [
    ("return 3.14 * r * r\n", True),
    ("# compute the area\n", False),
    ("pass\n", False),
    ("...\n", False),
    ("return\n", False),
    ("# TODO\npass  # later\n", False),
])
def test_clean_means_the_text_does_some_work(tmp_path: Path, text: str, clean: bool) -> None:
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "out.jsonl"
    tasks.write_text(json.dumps({"id": "c", "kind": "complete", "prefix": "def area(r):\n    ", "suffix": "\n",
                                 "multiline": True}) + "\n")
    batch.run_batch(tasks, out, lambda: Pipeline(scripted.ScriptedBackend(text)), progress=False)
    (record,) = read_output(out)
    assert record["error"] is None and record["clean"] is clean, record
    assert ("unclean_reason" in record) is (not clean)  # the checks passed each: only the work rule says no


def test_a_fix_that_leaves_no_working_code_is_not_clean() -> None:
    from glm5_lsp.pipeline import PipelineResult

    code = "def f(x):\n    y = x + 1\n    return y\n"
    gutted = PipelineResult(text="def f(x):\n    pass\n", clean=True)
    assert batch.idle_result({"kind": "fix", "code": code}, gutted) is None  # the def line still works
    emptied = PipelineResult(text="# nothing\n", clean=True)
    assert "does nothing" in (batch.idle_result({"kind": "fix", "code": code}, emptied) or "")
    assert batch.idle_result({"kind": "fix", "code": code}, PipelineResult(text=code, clean=True)) is None
    assert batch.idle_result({"kind": "generate"}, PipelineResult(text="", clean=False)) is None  # unclean anyway
