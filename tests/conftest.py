"""Shared fixtures. Checkpoints are made here, on the spot: tests never download weights."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
# One thread, as every front end runs the model (glm5_lsp/threads.py): with two, a test run beside the
# background training (which holds a core) stalled: the promotion test took 290 s alone, 5 s on one.
torch.set_num_threads(1)
# The servers the tests start keep an acceptance log in the user's data folder (on by default): not the
# user's own. Set before any server starts, so the ones started as subprocesses inherit it too.
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="glm5-tests-data-")

from tiny import make_checkpoint

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny GLM-5 checkpoint with a trained byte-level BPE tokenizer (special tokens included)."""
    return make_checkpoint(tmp_path_factory.mktemp("tiny_checkpoint"))


@pytest.fixture(scope="session")
def shared_benchmarks() -> Path:
    path = SHARED / "benchmarks"
    if not path.is_dir():
        pytest.skip("../shared/benchmarks is not present")
    return path
