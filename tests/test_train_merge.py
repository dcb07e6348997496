"""Two runs of one model averaged now and then (``train/merge.py``): a clone reads its own stream,
a merge writes the mean of both into each, both resume from it, and what cannot be merged is named."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from glm5_lsp.model.loading import CheckpointError
from glm5_lsp.train.continued import RunLimits, read_state, train
from glm5_lsp.train.merge import RunBusy, clone_run, merge_runs
from tests.test_train_continued import _new_run, corpus, init_model  # noqa: F401 - fixtures

NAMES = ("model.safetensors", "ema.safetensors", "ema_slow.safetensors")


def _tensors(run: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {name: load_file(str(run / "checkpoint" / name)) for name in NAMES}


def test_a_clone_reads_its_own_stream_and_a_merge_averages_both_into_each(
        tmp_path: Path, init_model: Path, corpus) -> None:  # noqa: F811
    first = _new_run(tmp_path, "a", init_model, corpus)
    train(first, RunLimits(steps=3), stop_on_signals=False)
    second = clone_run(first, tmp_path / "b")
    assert json.loads((second / "run.json").read_text())["seed"] == 1
    start = read_state(first / "checkpoint").tokens_total
    train(first, RunLimits(steps=3), stop_on_signals=False)
    train(second, RunLimits(steps=3), stop_on_signals=False)
    a, b = _tensors(first), _tensors(second)
    rows = {name: [r for r in map(json.loads, (run / "train_log.jsonl").read_text().splitlines())
                   if r["kind"] == "step"][-1] for name, run in (("a", first), ("b", second))}
    assert rows["a"]["loss"] != rows["b"]["loss"], "the clone reads other batches"
    weight = "model.layers.0.self_attn.o_proj.weight"
    assert not torch.equal(a["model.safetensors"][weight], b["model.safetensors"][weight])

    own = [read_state(run / "checkpoint").tokens_total for run in (first, second)]
    merged = merge_runs([first, second])
    assert merged.tokens_total == start + (own[0] - start) + (own[1] - start)
    for run in (first, second):
        after = _tensors(run)
        for name in NAMES:
            for key, value in after[name].items():
                if value.is_floating_point():
                    torch.testing.assert_close(value, (a[name][key] + b[name][key]) / 2, rtol=0, atol=1e-6,
                                               msg=f"{run.name} {name} {key}")
        state = read_state(run / "checkpoint")
        assert state.tokens_total == merged.tokens_total == state.merge_base
    assert read_state(first / "checkpoint").position != read_state(second / "checkpoint").position
    train(first, RunLimits(steps=1), stop_on_signals=False)  # each resumes from the mean, its optimizer kept
    assert read_state(first / "checkpoint").tokens_total > merged.tokens_total
    assert [r["kind"] for r in map(json.loads, (second / "train_log.jsonl").read_text().splitlines())][-1] == "merge"


def test_what_cannot_be_merged_is_refused_with_its_reason(tmp_path: Path, init_model: Path, corpus) -> None:  # noqa: F811
    first = _new_run(tmp_path, "a", init_model, corpus)
    train(first, RunLimits(steps=1), stop_on_signals=False)
    stranger = _new_run(tmp_path, "c", init_model, corpus)
    train(stranger, RunLimits(steps=1), stop_on_signals=False)
    with pytest.raises(ValueError, match="not cloned from one another"):
        merge_runs([first, stranger])
    with pytest.raises(ValueError, match="two or more different runs"):
        merge_runs([first, first])
    with pytest.raises(FileExistsError):
        clone_run(first, stranger)
    second = clone_run(first, tmp_path / "b")
    (second / "train.pid").write_text(str(os.getpid()))  # this process: alive, as a training run would be
    with pytest.raises(RunBusy, match="is training"):
        merge_runs([first, second])
    (second / "train.pid").unlink()
    (second / "checkpoint" / "ema.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="ema.safetensors"):
        merge_runs([first, second])
