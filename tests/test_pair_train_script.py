"""scripts/pair_train.sh on a new checkout: the first run has no checkpoint yet, so the second run
(a clone of it) is made by the merging loop once the first checkpoint is written. A stand-in for
Python plays the training runs, so nothing here trains."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "pair_train.sh"

FAKE_PYTHON = """#!/usr/bin/env bash
# -m glm5_lsp.cli train ...: a run that writes its checkpoint after a second and stops on TERM
if [[ "$1" == "-c" ]]; then exec "{python}" "$@"; fi
shift 3
echo "$*" >> "{calls}"
case "$1" in
    --clone)
        mkdir -p "$4"; echo '{{}}' > "$4/run.json"; exit 0 ;;
    --continue-from) run="$4" ;;
    --resume) run="$2" ;;
esac
trap 'exit 0' TERM
sleep 1
mkdir -p "$run/checkpoint"; echo '{{}}' > "$run/checkpoint/state.json"; echo '{{}}' > "$run/run.json"
while true; do sleep 0.1; done
"""


def _group_nice(pid: str) -> int | None:
    """The nice value of process ``pid``'s autogroup (None where the kernel has none)."""
    try:
        return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pidfile: Path) -> bool:
    if not pidfile.is_file():
        return False
    try:
        os.kill(int(pidfile.read_text()), 0)
    except (ProcessLookupError, ValueError):
        return False
    return True


@pytest.mark.skipif(sys.platform != "linux", reason="the scripts are for Linux (setsid, /proc)")
def test_a_new_checkout_starts_the_first_run_and_clones_the_second_once_it_has_a_checkpoint(tmp_path):
    fake = tmp_path / "python"
    calls = tmp_path / "calls.txt"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable, calls=calls))
    fake.chmod(0o755)
    first, second = tmp_path / "first", tmp_path / "second"
    env = {**os.environ, "PYTHON": str(fake), "GLM5_RUN": str(first), "GLM5_PAIR_RUN": str(second),
           "GLM5_PAIR_POLL": "0.2", "GLM5_EXTRA_SITE": str(tmp_path / "none"), "GLM5_GROUP_NICE": "7"}

    def script(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(SCRIPT), *args], check=False, env=env, capture_output=True, text=True, timeout=60)

    own_group = _group_nice("self")
    try:
        started = script()
        assert started.returncode == 0, started.stderr
        assert _alive(first / "train.pid") and not (second / "run.json").exists()
        if own_group is not None:  # the run's own scheduling group is reniced, never the caller's
            run = (first / "train.pid").read_text().strip()
            deadline = time.monotonic() + 10  # (set by the run itself, once its session has begun)
            while time.monotonic() < deadline and _group_nice(run) != 7:
                time.sleep(0.1)
            assert _group_nice(run) == 7
            assert _group_nice("self") == own_group
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _alive(second / "train.pid"):
            time.sleep(0.2)
        assert _alive(second / "train.pid"), (first / "pair.log").read_text()
        assert _alive(first / "train.pid")  # stopped for the clone, then started again
        # A run's pid file is written as it is spawned; the stand-in writes its call once it runs (on
        # a loaded machine, a moment later): read the calls once all four are there
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(calls.read_text().splitlines()) < 4:
            time.sleep(0.2)
        lines = calls.read_text().splitlines()
        assert [line.split()[0] for line in lines] == ["--continue-from", "--clone", "--resume", "--resume"]
    finally:
        stopped = script("--stop")
    assert stopped.returncode == 0, stopped.stderr
    assert not _alive(first / "train.pid") and not _alive(second / "train.pid")
    assert not _alive(first / "pair.pid")
