"""``glm5-lsp batch IN.jsonl -o OUT.jsonl``: resumable headless generation through the pipeline.

Each input line is one task with a unique ``id`` and a ``kind``:

- ``complete``: ``prefix``, ``suffix`` (optional ``path``, ``language``, ``multiline``): the text for the cursor;
- ``generate``: ``prompt`` (a signature plus docstring, or an instruction; optional ``language``);
- ``fix``: ``code`` (optional ``diagnostics``: objects with ``message`` and a 0-based ``line``; optional
  ``path``, ``language``): the whole fixed code.

Each result is appended to the output as one JSON line as soon as it finishes: one ``os.write`` of
the whole line on an ``O_APPEND`` descriptor, then ``fsync``. Rerunning the same command skips every
id already in the output, so a killed run (even ``kill -9``) loses only the tasks in flight, and a
line torn by a crash mid-write is cut off before new lines are added. A task that fails is recorded
with its ``error``; bad input lines (no id, a repeated id, not JSON) are reported, never fatal.
``--retry-errors`` reruns the tasks whose recorded result is an error (a dead server, a model that
would not load): their records are taken out of the output first (rewritten whole, then renamed
over it), every other record kept as it was.

A result is ``clean`` only when its text passed the checks and does some work: text that is only
comments, ``pass``, ``...`` or a bare ``return`` compiles, so the checkers pass it, and a small
model writes it (``unclean_reason`` then says so).

One run at a time per output: a run holds an exclusive lock (``flock``) on ``OUT.lock`` for its
whole life, and a second run on the same output refuses at once, naming the first one's pid. The
lock goes with the process, even after ``kill -9``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import (
    FIRST_COMPLETED,
    Executor,
    Future,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    wait,
)
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from glm5_lsp.pipeline import Pipeline, PipelineResult, PipelineSettings, idle_result
from glm5_lsp.pipeline.session import capabilities

log = logging.getLogger(__name__)

KINDS: tuple[str, ...] = ("complete", "generate", "fix")


@dataclass
class BatchSummary:
    total: int = 0  # valid tasks in the input
    skipped: int = 0  # already in the output (resumed)
    done: int = 0  # finished in this run
    errors: int = 0  # finished with an error in this run
    retried: int = 0  # recorded as errors before, run again (``retry_errors``)
    problems: list[str] = field(default_factory=list)  # input lines that could not be tasks
    seconds: float = 0.0


# ---- input ------------------------------------------------------------------------------------


def read_tasks(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Valid-looking tasks (a JSON object with a fresh string/int id) and one message per bad line."""
    tasks: list[dict[str, Any]] = []
    problems: list[str] = []
    seen: set[str] = set()
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                task = json.loads(line)
            except json.JSONDecodeError as error:
                problems.append(f"line {number}: not JSON ({error.msg})")
                continue
            if not isinstance(task, dict):
                problems.append(f"line {number}: not a JSON object")
                continue
            task_id = task.get("id")
            if not isinstance(task_id, (str, int)) or isinstance(task_id, bool) or task_id == "":
                problems.append(f"line {number}: missing or invalid id")
                continue
            key = str(task_id)
            if key in seen:
                problems.append(f"line {number}: duplicate id {task_id!r} (first one kept)")
                continue
            seen.add(key)
            tasks.append(task)
    return tasks, problems


# ---- output -----------------------------------------------------------------------------------


def finished_ids(path: Path) -> set[str]:
    """Ids already in the output; a torn last line (a crash mid-write) is cut off the file first."""
    return set(_finished(path))


def _finished(path: Path) -> dict[str, bool]:
    """Each recorded id and whether its (last) record is an error; a torn last line is cut off first."""
    if not path.exists():
        return {}
    data = path.read_bytes()
    complete_end = data.rfind(b"\n") + 1
    if complete_end < len(data):
        log.warning("%s: dropping a torn last line (%d bytes) left by an interrupted run", path, len(data) - complete_end)
        os.truncate(path, complete_end)
        data = data[:complete_end]
    ids: dict[str, bool] = {}
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            ids[str(record["id"])] = record.get("error") is not None
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            log.warning("%s line %d: unreadable, ignored (its task will run again)", path, number)
    return ids


def drop_records(path: Path, ids: set[str]) -> int:
    """Rewrite ``path`` without the records of ``ids`` (every other line kept byte for byte): written to
    a temporary file beside it, flushed to disk, then renamed over it, so a crash leaves one or the
    other whole. Returns how many lines were dropped."""
    kept: list[bytes] = []
    dropped = 0
    for line in path.read_bytes().splitlines(keepends=True):
        try:
            record_id = str(json.loads(line)["id"])
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
            record_id = None
        if record_id is not None and record_id in ids:
            dropped += 1
        else:
            kept.append(line)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as handle:
        handle.writelines(kept)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    with contextlib.suppress(OSError):  # the rename itself, made durable
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    return dropped


class OutputLocked(RuntimeError):
    """Another run is writing the same output."""


class OutputLock:
    """An exclusive ``flock`` on ``OUT.lock`` for one run, with the holder's pid written in it.

    Taken with ``LOCK_NB``: a second run fails at once with :class:`OutputLocked` naming the first.
    The lock dies with its process (even ``kill -9``); the file is removed on release, and a run
    that locked a file someone removed meanwhile takes the new one instead (so two runs never hold
    two different files).
    """

    def __init__(self, output: Path) -> None:
        self.path = output.with_name(output.name + ".lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        import fcntl

        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 4096).decode("utf-8", errors="replace").strip() or "a run that is starting"
                os.close(fd)
                raise OutputLocked(holder) from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the file was removed between our open and our lock: lock the new one
        os.ftruncate(fd, 0)
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # while still locked: a waiting run then takes a fresh file
        os.close(self._fd)
        self._fd = None


@contextlib.contextmanager
def locked_output(output: Path) -> Iterator[OutputLock]:
    """``OutputLock(output)`` held for the ``with`` block."""
    lock = OutputLock(output)
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()


class AppendLog:
    """Whole-line appends: one ``os.write`` per line on an ``O_APPEND`` descriptor, then ``fsync``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def append(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        with self._lock:
            written = os.write(self._fd, line)
            while written < len(line):  # only on a full disk or a signal; keep the line whole
                written += os.write(self._fd, line[written:])
            os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


# ---- running ----------------------------------------------------------------------------------


def run_task(pipeline: Pipeline, task: dict[str, Any]) -> PipelineResult:
    """One task through the pipeline; raises ``ValueError`` for a malformed task."""
    kind = task.get("kind")
    language = task.get("language")
    if kind == "complete":
        prefix, suffix = _text(task, "prefix"), _text(task, "suffix", required=False)
        return pipeline.complete(prefix + suffix, len(prefix), path=task.get("path"), language=language,
                                 multiline=task.get("multiline"))
    if kind == "generate":
        return pipeline.generate(_text(task, "prompt"), language=language or "python")
    if kind == "fix":
        diagnostics = task.get("diagnostics")
        if diagnostics is not None and not isinstance(diagnostics, list):
            raise TypeError("'diagnostics' must be a list")
        return pipeline.fix(_text(task, "code"), diagnostics=diagnostics, path=task.get("path"), language=language)
    raise ValueError(f"unknown kind {kind!r}; expected one of {KINDS}")


def rooted(task: dict[str, Any], workspace: Path | None) -> dict[str, Any]:
    """``task`` with a relative ``path`` read from the ``workspace`` folder (as the editor names a
    workspace file: the memory and the context engine then know it as theirs)."""
    path = task.get("path")
    if workspace is None or not isinstance(path, str) or not path or os.path.isabs(path):
        return task
    return {**task, "path": str(workspace / path)}


def _text(task: dict[str, Any], key: str, required: bool = True) -> str:
    value = task.get(key, None if required else "")
    if not isinstance(value, str):
        raise TypeError(f"{key!r} must be a string" if key in task else f"missing {key!r}")
    return value


def _record(task: dict[str, Any], result: PipelineResult | None, error: str | None, seconds: float) -> dict[str, Any]:
    record: dict[str, Any] = {"id": task["id"], "kind": task.get("kind")}
    if result is not None:
        record.update(result.to_dict())
        idle = idle_result(task, result)
        if idle is not None:
            record["clean"] = False
            record["unclean_reason"] = idle
    record["seconds"] = round(seconds, 4)
    record["error"] = error
    return record


def execute(pipeline_factory: Callable[[], Pipeline], holder: dict[str, Pipeline], task: dict[str, Any]) -> dict[str, Any]:
    """One task's output record; the worker's pipeline is made on first use and kept in ``holder``."""
    begun = time.perf_counter()
    try:
        if "pipeline" not in holder:
            holder["pipeline"] = pipeline_factory()
        result = run_task(holder["pipeline"], task)
        return _record(task, result, None, time.perf_counter() - begun)
    except Exception as error:
        log.debug("task %r failed", task["id"], exc_info=True)
        return _record(task, None, f"{type(error).__name__}: {error}", time.perf_counter() - begun)


# Worker processes: each builds its own pipeline (and model) once, from a picklable factory.
_process_state: dict[str, Any] = {}


def _init_process(pipeline_factory: Callable[[], Pipeline], torch_threads: int | None, parent: int) -> None:
    _exit_with_parent(parent)
    _process_state["factory"] = pipeline_factory
    _process_state["holder"] = holder = {}
    if torch_threads is not None:
        import torch

        torch.set_num_threads(torch_threads)
    try:  # load the model now, in every worker at once; a failure is reported by each task instead
        holder["pipeline"] = pipeline = pipeline_factory()
        load = capabilities(pipeline.backend).load
        if load is not None:
            load()
    except Exception:
        log.warning("worker %d could not prepare its pipeline", os.getpid(), exc_info=True)
        holder.clear()


def _exit_with_parent(parent: int) -> None:
    """End this worker when the batch process dies, even by ``kill -9`` (no orphans keep running)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass

    def watch() -> None:  # elsewhere (and for a parent gone before prctl): poll for re-parenting
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _process_task(task: dict[str, Any]) -> dict[str, Any]:
    return execute(_process_state["factory"], _process_state["holder"], task)


def run_batch(
    input_path: Path,
    output_path: Path,
    pipeline_factory: Callable[[], Pipeline],
    workers: int = 1,
    progress: bool = True,
    processes: bool = False,
    torch_threads: int | None = None,
    retry_errors: bool = False,
    workspace: Path | None = None,
) -> BatchSummary:
    """Run every task of ``input_path`` not yet in ``output_path`` (with ``retry_errors``, also those
    recorded with an error, whose records are dropped first).

    Raises :class:`OutputLocked` at once when another run holds the output.

    Each worker has its own pipeline from ``pipeline_factory``. Workers are threads by default; with
    ``processes`` they are spawned processes (true parallelism, and nothing shared that is not
    thread-safe, such as jedi), which needs a picklable factory. ``torch_threads`` is set in each
    worker process, or in this process for thread workers. A task's relative ``path`` is read from
    ``workspace`` where one is given. Only this process writes the output.
    """
    if workers < 1:
        raise ValueError("--workers must be at least 1")
    with locked_output(output_path):  # before the output is read: a torn-line cut must not race a writer
        return _run_locked(input_path, output_path, pipeline_factory, workers, progress, processes, torch_threads,
                           retry_errors, workspace)


def _run_locked(input_path: Path, output_path: Path, pipeline_factory: Callable[[], Pipeline], workers: int,
                progress: bool, processes: bool, torch_threads: int | None, retry_errors: bool,
                workspace: Path | None) -> BatchSummary:
    started = time.perf_counter()
    tasks, problems = read_tasks(input_path)
    for problem in problems:
        log.warning("%s %s", input_path, problem)
    recorded = _finished(output_path)
    retried: set[str] = set()
    if retry_errors:
        retried = {task_id for task_id, failed in recorded.items() if failed} & {str(t["id"]) for t in tasks}
        if retried:
            drop_records(output_path, retried)
            log.warning("%s: running %d tasks recorded with errors again", output_path, len(retried))
    done_ids = set(recorded) - retried
    pending = [rooted(task, workspace) for task in tasks if str(task["id"]) not in done_ids]
    summary = BatchSummary(total=len(tasks), skipped=len(tasks) - len(pending), problems=problems,
                           retried=len(retried))
    pool: Executor
    if processes:
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_init_process, initargs=(pipeline_factory, torch_threads, os.getpid()))
        work: Callable[[dict[str, Any]], dict[str, Any]] = _process_task
    else:
        if torch_threads is not None:  # threads share this process's torch
            import torch

            torch.set_num_threads(torch_threads)
        local = threading.local()

        def work(task: dict[str, Any]) -> dict[str, Any]:
            if not hasattr(local, "holder"):
                local.holder = {}
            return execute(pipeline_factory, local.holder, task)

        pool = ThreadPoolExecutor(max_workers=workers)
    bar = tqdm(total=len(pending), unit="task", disable=not progress, dynamic_ncols=True,
               desc=f"batch ({summary.skipped} done before)" if summary.skipped else "batch")
    out = AppendLog(output_path)
    try:
        with pool:
            for record in _completed(pool, work, pending, workers):
                out.append(record)
                summary.done += 1
                summary.errors += record["error"] is not None
                bar.update(1)
    finally:
        out.close()
        bar.close()
    summary.seconds = time.perf_counter() - started
    return summary


def _completed(pool: Executor, work: Callable[[dict[str, Any]], dict[str, Any]],
               tasks: list[dict[str, Any]], workers: int) -> Iterator[dict[str, Any]]:
    """Results as they finish, keeping at most ``2 * workers`` tasks submitted at a time."""
    queue = iter(tasks)
    running: set[Future[dict[str, Any]]] = set()
    for task in queue:
        running.add(pool.submit(work, task))
        if len(running) >= 2 * workers:
            break
    while running:
        finished, running = wait(running, return_when=FIRST_COMPLETED)
        for future in finished:
            yield future.result()
            nxt = next(queue, None)
            if nxt is not None:
                running.add(pool.submit(work, nxt))


# ---- CLI ----------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from glm5_lsp.pipeline.session import add_backend_arguments

    parser.add_argument("input", type=Path, help="tasks, one JSON object a line")
    parser.add_argument("-o", "--output", type=Path, required=True, help="results (appended; rerun to resume)")
    parser.add_argument("--workers", type=int, default=1,
                        help="tasks run at once, each in its own process with its own model copy")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per worker (default 1: a small model gains little from more, and "
                             "loses much on a busy machine; see benchmarks/batch.py)")
    parser.add_argument("--max-tokens", type=int, default=None, help="tokens per multi-line/generate/fix answer")
    parser.add_argument("--no-repair", action="store_true", help="check candidates but do not regenerate them")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--retry-errors", action="store_true",
                        help="run the tasks recorded with an error again (a rerun otherwise skips them as done)")
    parser.add_argument("--workspace", type=Path, default=None,
                        help="the project folder: its symbols and API docs go into prompts, its files and the "
                             "libraries they import into the workspace memory, and a task's relative path is "
                             "read from it")
    parser.add_argument("--no-context", action="store_true", help="plain prompts: only the code around the cursor")
    parser.add_argument("--no-memory", action="store_true",
                        help="no workspace memory (by default, as in the editor, the workspace's files and its "
                             "libraries, or the standard library without --workspace, are mixed into decoding)")
    parser.add_argument("--no-libraries", action="store_true",
                        help="the workspace memory holds the workspace's files only (no installed libraries, "
                             "no standard library)")
    add_backend_arguments(parser)


@dataclass
class PipelineFactory:
    """A picklable recipe for one worker's pipeline, opened as the language server opens its own
    (``pipeline.session.open_session``: the backend, the prompt budgets sized to the model, the
    context engine, the repair loop) with the workspace memory built before the first task: the
    ``workspace`` folder's files and the libraries they import, or without a folder the standard
    library alone (``libraries`` False: neither). ``memory`` False: no memory."""

    backend: str = "local"
    backend_options: dict[str, Any] = field(default_factory=dict)
    settings: PipelineSettings = field(default_factory=PipelineSettings)
    context: bool = True
    workspace: Path | None = None
    memory: bool = True
    libraries: bool = True

    def __call__(self) -> Pipeline:
        from glm5_lsp.pipeline.memory import MemorySettings
        from glm5_lsp.pipeline.session import open_session

        root = str(self.workspace) if self.workspace is not None else None
        memory = MemorySettings(libraries=self.libraries, stdlib=self.libraries) if self.memory else None
        session = open_session(self.backend, self.backend_options, self.settings, root=root, memory=memory)
        pipeline = session.pipeline
        if not self.context:
            pipeline.context = None
        if session.memory is not None:
            if root is not None:
                session.memory.index(root)
            else:
                session.memory.index_libraries()
        return pipeline


def make_pipeline_factory(args: argparse.Namespace) -> PipelineFactory:
    """The factory for ``glm5-lsp batch``'s options."""
    settings = PipelineSettings(unhurried=True)  # no deadline per task: names checked from the first one
    settings.repair.return_unclean = True  # record the best candidate with its diagnostics
    if getattr(args, "no_repair", False):
        settings.repair.max_rounds = 1
    if getattr(args, "max_tokens", None):
        settings.multiline_max_tokens = args.max_tokens
    from glm5_lsp.pipeline.session import backend_spec

    kind, options = backend_spec(args)  # ValueError: incomplete backend options
    workspace = getattr(args, "workspace", None)
    if workspace is not None:
        if not Path(workspace).is_dir():
            raise ValueError(f"--workspace {workspace}: not a folder")
        workspace = Path(workspace).resolve()
    return PipelineFactory(kind, options, settings, not getattr(args, "no_context", False), workspace,
                           memory=not getattr(args, "no_memory", False),
                           libraries=not getattr(args, "no_libraries", False))


def run(args: argparse.Namespace) -> int:
    if not args.input.is_file():
        print(f"glm5-lsp batch: no such file: {args.input}", file=sys.stderr)
        return 2
    try:
        factory = make_pipeline_factory(args)
    except ValueError as error:
        print(f"glm5-lsp batch: {error}", file=sys.stderr)
        return 2
    if args.workers < 1:
        print("glm5-lsp batch: --workers must be at least 1", file=sys.stderr)
        return 2
    if args.threads is not None and args.threads < 1:
        print("glm5-lsp batch: --threads must be at least 1", file=sys.stderr)
        return 2
    try:
        summary = run_batch(args.input, args.output, factory, workers=args.workers,
                            progress=not args.no_progress, processes=args.workers > 1,
                            torch_threads=args.threads if args.backend == "local" else None,
                            retry_errors=args.retry_errors, workspace=factory.workspace)
    except OutputLocked as held:
        print(f"glm5-lsp batch: {args.output} is being written by another batch run ({held}); "
              "wait for it to finish or stop it", file=sys.stderr)
        return 2
    for problem in summary.problems:
        print(f"{args.input}: {problem}", file=sys.stderr)
    retried = f", {summary.retried} of them run again after an error" if summary.retried else ""
    print(f"{summary.done} done ({summary.errors} with errors{retried}), {summary.skipped} already in {args.output}, "
          f"{len(summary.problems)} bad input lines, {summary.seconds:.1f}s", file=sys.stderr)
    return 0 if summary.errors == 0 and not summary.problems else 1
