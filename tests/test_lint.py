"""The project's own code passes ruff's error-class rules, so a newcomer's first `ruff check` is clean.

Only rule families whose meaning does not move between ruff releases are enforced here (syntax errors,
pyflakes, import order); `ruff check .` with the project's settings was clean too when this was written.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STABLE_RULES = "E9,F,I"


def test_project_code_passes_ruff_error_rules() -> None:
    pytest.importorskip("ruff")  # a test dependency; skip rather than fail where it is not installed
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", STABLE_RULES, "--output-format", "concise",
         "glm5_lsp", "benchmarks", "tests", "scripts"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
