"""Running an external checker: a temporary file when it needs one, a timeout always."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ProcessOutput:
    returncode: int
    stdout: str
    stderr: str


class Submitted(Generic[T]):
    """A check sent to a helper process: calling it waits for the answer (``fn``, called the first
    time; its result or error is kept for any later call), so whatever the check holds until its
    answer is in (the helper, its lock) is let go exactly once."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._fn: Callable[[], T] | None = fn
        self._outcome: tuple[bool, object] | None = None  # (raised, result or error)

    def __call__(self) -> T:
        if self._fn is not None:
            fn, self._fn = self._fn, None
            try:
                self._outcome = (False, fn())
            except BaseException as error:  # noqa: BLE001 -- kept and raised to every caller
                self._outcome = (True, error)
        assert self._outcome is not None
        raised, value = self._outcome
        if raised:
            raise value  # type: ignore[misc]
        return value  # type: ignore[return-value]


def run_checker(argv: list[str], stdin: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                cwd: str | None = None) -> ProcessOutput:
    """Run ``argv``; raises ``subprocess.TimeoutExpired`` past ``timeout_s`` (the runner skips the provider)."""
    done = subprocess.run(argv, check=False, input=stdin, capture_output=True, text=True, timeout=timeout_s, cwd=cwd,
                          env={**os.environ, "LC_ALL": "C"})
    return ProcessOutput(done.returncode, done.stdout, done.stderr)


def write_temp_source(folder: str, path: str, text: str, default_suffix: str) -> Path:
    """Write ``text`` to a file in ``folder`` named like ``path`` (its suffix matters to compilers)."""
    name = Path(path).name if path else ""
    if not name or Path(name).suffix == "":
        name = f"candidate{default_suffix}"
    target = Path(folder) / name
    target.write_text(text, encoding="utf-8")
    return target


def temp_folder() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="glm5-lsp-check-")


def end_process(process: subprocess.Popen[bytes], grace_s: float = 0.0) -> int | None:
    """Stop a helper process: given ``grace_s`` to exit by itself (so a crash reports its own
    status), then killed; its pipes closed. Returns its exit status (None if it would not die)."""
    status = None
    try:
        status = process.wait(timeout=grace_s) if grace_s > 0 else process.poll()
    except subprocess.TimeoutExpired:
        pass
    if status is None:
        if process.poll() is None:
            process.kill()
        try:
            status = process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    for stream in (process.stdin, process.stdout):
        if stream is not None:
            stream.close()
    return status


def kill_if_running(process: subprocess.Popen[bytes] | None) -> None:
    """For ``__del__``: a dropped owner does not leave its helper process behind."""
    if process is not None and process.poll() is None:
        process.kill()
