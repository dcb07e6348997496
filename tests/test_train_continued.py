"""Continued training: the corpus stream resumes anywhere, a killed run resumes to the same weights,
broken checkpoints are named, and promotion ships only better weights (and records where it stopped)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from glm5_lsp.model import load_model, save_model
from glm5_lsp.model.loading import CheckpointError
from glm5_lsp.train.continued import ContinueConfig, RunLimits, read_state, start_run, train
from glm5_lsp.train.corpus import Corpus, CorpusConfig, Document, _manifest
from glm5_lsp.train.presets import get_preset
from glm5_lsp.train.stream import CorpusStream, Position, StreamDoc
from glm5_lsp.train.tokenizer import save_tokenizer, train_tokenizer
from tests.tiny import tiny_model, training_texts

REPO = Path(__file__).resolve().parents[1]


def _doc(path: Path, package: str = "glm5_lsp") -> Document:
    text = path.read_text(encoding="utf-8")
    digest = hashlib.sha256(text.replace("\r\n", "\n").encode("utf-8")).hexdigest()
    return Document(package, package, path.name, path, digest, path.stat().st_size)


@pytest.fixture(scope="module")
def init_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model folder with a real 512-token tokenizer (what a continued run starts from)."""
    folder = tmp_path_factory.mktemp("init")
    save_model(tiny_model(seed=3), folder)
    save_tokenizer(train_tokenizer(training_texts(20), vocab_size=512), folder)
    return folder


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    files = sorted((REPO / "glm5_lsp" / "train").glob("*.py"))
    held = sorted((REPO / "glm5_lsp" / "model").glob("*.py"))
    train, heldout = [_doc(p) for p in files], [_doc(p, "heldout") for p in held]
    return Corpus(train, heldout, _manifest(train, heldout, [], Counter(), {}, CorpusConfig()))


def _config(init: Path, **overrides) -> ContinueConfig:
    values = {"init": str(init), "seq_len": 32, "batch_size": 2, "lr": 3e-3, "indexer_lr": 3e-3,
              "warmup_steps": 2, "sparse_every": 3, "shard_bytes": 20_000, "ema_decay": 0.9}
    return ContinueConfig(**{**values, **overrides})


def _new_run(tmp: Path, name: str, init: Path, corpus: Corpus, **overrides) -> Path:
    run = tmp / name
    start_run(run, _config(init, **overrides), corpus)
    return run


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "checkpoint" / "model.safetensors"))


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name, value in a.items():
        torch.testing.assert_close(value, b[name], rtol=0, atol=1e-6, msg=name)


def test_the_stream_resumes_from_any_position(init_model: Path, corpus: Corpus) -> None:
    from glm5_lsp.train.tokenizer import load_tokenizer_json

    small = sorted(corpus.train, key=lambda d: d.size)[:8]
    docs = [StreamDoc(d.package, d.relpath, str(d.path), d.digest, d.size) for d in small]
    stream = CorpusStream(docs, load_tokenizer_json(init_model), seq_len=32, batch_size=2, shard_bytes=3_000)
    seen = []
    for rows, after in stream.batches(Position()):
        seen.append((rows, after))
        if len(seen) == 400:  # past several shards and into the second epoch
            break
    assert len({after.shard_start for _, after in seen}) > 3
    assert seen[-1][1].epoch >= 1, "the walk should reach the second epoch"
    for k in (0, 1, 57, 133, 250, 398):
        rows, _ = next(stream.batches(seen[k][1]))
        np.testing.assert_array_equal(rows, seen[k + 1][0])


def test_a_run_resumed_in_pieces_reaches_the_same_weights(tmp_path: Path, init_model: Path, corpus: Corpus) -> None:
    whole = _new_run(tmp_path, "whole", init_model, corpus)
    train(whole, RunLimits(steps=9), stop_on_signals=False)
    pieces = _new_run(tmp_path, "pieces", init_model, corpus)
    train(pieces, RunLimits(steps=4), stop_on_signals=False)
    train(pieces, RunLimits(steps=2), stop_on_signals=False)
    state = train(pieces, RunLimits(until_step=9), stop_on_signals=False)
    assert state.run_step == 9
    _assert_same(_weights(whole), _weights(pieces))
    assert read_state(whole / "checkpoint").position == state.position
    for name in ("ema.safetensors", "ema_slow.safetensors", "optimizer.safetensors"):
        _assert_same(load_file(str(whole / "checkpoint" / name)), load_file(str(pieces / "checkpoint" / name)))
    steps = [r for r in map(json.loads, (pieces / "train_log.jsonl").read_text().splitlines()) if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 10)), "the log continues across resumes"
    assert {r["stage"] for r in steps} == {"dense", "sparse"}
    assert load_model(pieces / "checkpoint")  # a checkpoint is a loadable model folder


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "glm5_lsp.cli", "train", *args, "--threads", "1"]


def _wait_for_step(run: Path, at_least: int, proc: subprocess.Popen, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            step = read_state(run / "checkpoint").run_step
            if step >= at_least:
                return step
        except CheckpointError:
            pass
        assert proc.poll() is None, "the run ended before it was interrupted"
        time.sleep(0.05)
    raise AssertionError("no checkpoint appeared in time")


def test_a_killed_run_resumes_to_the_weights_of_an_uninterrupted_one(
    tmp_path: Path, init_model: Path, corpus: Corpus
) -> None:
    killed = _new_run(tmp_path, "killed", init_model, corpus)
    proc = subprocess.Popen(_cli("--resume", str(killed), "--checkpoint-steps", "3", "--until-step", "100000"),
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_step(killed, 6, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    done = read_state(killed / "checkpoint").run_step  # what survived the kill: a whole checkpoint
    assert done >= 6 and done % 3 == 0
    target = done + 4
    subprocess.run(_cli("--resume", str(killed), "--until-step", str(target)), cwd=REPO, check=True,
                   capture_output=True)
    whole = _new_run(tmp_path, "whole", init_model, corpus)  # the same thread count as the killed run
    subprocess.run(_cli("--resume", str(whole), "--until-step", str(target)), cwd=REPO, check=True,
                   capture_output=True)
    _assert_same(_weights(whole), _weights(killed))


def test_sigterm_stops_the_run_cleanly_with_a_checkpoint(tmp_path: Path, init_model: Path, corpus: Corpus) -> None:
    run = _new_run(tmp_path, "run", init_model, corpus)
    proc = subprocess.Popen(_cli("--resume", str(run), "--checkpoint-steps", "2"), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_step(run, 2, proc)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and time.monotonic() - sent < 10
    records = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    assert records[-1]["kind"] == "stop" and records[-1]["reason"] == "SIGTERM"
    assert read_state(run / "checkpoint").run_step == records[-1]["step"], "the last step is in the checkpoint"
    assert "tokens seen in all" in out


def test_broken_checkpoints_name_the_file_or_tensor(tmp_path: Path, init_model: Path, corpus: Corpus) -> None:
    run = _new_run(tmp_path, "run", init_model, corpus)
    train(run, RunLimits(steps=2), stop_on_signals=False)
    ckpt = run / "checkpoint"
    pristine = tmp_path / "pristine"
    shutil.copytree(ckpt, pristine)

    def broken(mutate) -> str:
        shutil.rmtree(ckpt)
        shutil.copytree(pristine, ckpt)
        mutate()
        with pytest.raises((CheckpointError, ValueError)) as err:
            train(run, RunLimits(steps=1), stop_on_signals=False)
        return str(err.value)

    optimizer = ckpt / "optimizer.safetensors"
    assert "optimizer.safetensors" in broken(lambda: optimizer.write_bytes(optimizer.read_bytes()[:100]))
    assert "state.json" in broken(lambda: (ckpt / "state.json").unlink())
    assert "state.json" in broken(lambda: (ckpt / "state.json").write_text("{not json"))

    def bad_shape() -> None:
        ema = load_file(str(ckpt / "ema.safetensors"))
        name = next(iter(ema))
        ema[name] = torch.zeros(3, 3)
        save_file(ema, str(ckpt / "ema.safetensors"))

    message = broken(bad_shape)
    assert "ema.safetensors" in message and "shape" in message
    assert "model.safetensors" in broken(lambda: (ckpt / "model.safetensors").write_bytes(b"\x00" * 64))


def test_promotion_ships_better_weights_and_the_next_run_reads_on(
    tmp_path: Path, init_model: Path, corpus: Corpus
) -> None:
    from glm5_lsp.train.command import _start_continued
    from glm5_lsp.train.promote import promote

    target = tmp_path / "shipped"
    shutil.copytree(init_model, target)
    metrics = json.loads((REPO / "glm5_lsp" / "weights" / "glm5-code-tiny" / "metrics.json").read_text())
    metrics["preset"] = get_preset("tiny").to_dict()  # evaluate at the tiny preset's lengths
    (target / "metrics.json").write_text(json.dumps(metrics))  # a real first run's metrics, beside tiny weights
    (target / "train_log.jsonl").write_text(json.dumps({"kind": "step", "stage": "dense", "tokens": 10,
                                                         "loss": 6.0, "indexer_kl": 0.0}) + "\n")
    run = _new_run(tmp_path, "run", target, corpus, start_tokens=metrics["tokens_seen"])
    train(run, RunLimits(steps=30, log_every=1), stop_on_signals=False)
    result = promote(run, target)
    assert result.promoted, result.message
    assert [c.label for c in result.candidates] == [
        "weights", "moving average", "slow moving average", "shipped weights and moving average, half each"]
    assert min(c.ppl_64 for c in result.candidates) < result.shipped.ppl_64
    written = json.loads((target / "metrics.json").read_text())
    state = read_state(run / "checkpoint")
    assert written["tokens_seen"] == state.tokens_total == metrics["tokens_seen"] + 30 * 2 * 32
    assert written["continued"]["position"] == state.position
    before = max(len(metrics.get("history", [])), 1)  # the shipped card's promotions so far (the first run at least)
    assert written["history"][0]["weights"] == "first run" and len(written["history"]) == before + 1
    assert written["config"]["hidden_size"] == 64, "the card describes the weights it ships"
    card = (target / "MODEL_CARD.md").read_text()
    assert f"{state.tokens_total:,}" in card and "Promotions" in card
    log_steps = [json.loads(line) for line in (target / "train_log.jsonl").read_text().splitlines()]
    assert log_steps[0]["tokens"] == 10 and any(r.get("stage") == "continued" for r in log_steps)
    again = promote(run, target)  # the same run again: at most the average across promotions moves on
    assert not again.promoted or again.chosen == "shipped weights and moving average, half each", again.message

    args = argparse.Namespace(
        continue_from=target, out=tmp_path / "next", guard_file=None,
        benchmarks=REPO / "tests" / "data" / "train" / "benchmarks", stdlib=REPO / "glm5_lsp" / "train",
        site_dir=[tmp_path / "no-site"], holdout=None, workers=1, seed=0, shard_bytes=None, lr=None,
        batch_size=None, seq_len=None, fim_rate=0.5,
    )
    _start_continued(args)
    config = json.loads((tmp_path / "next" / "run.json").read_text())
    assert config["start_position"] == state.position and config["start_tokens"] == state.tokens_total
    assert config["start_schedule_step"] == state.schedule_step
    assert os.path.samefile(config["init"], target)


def test_the_slow_average_is_kept_started_from_the_short_one_and_averaged_across_promotions(
    tmp_path: Path, init_model: Path, corpus: Corpus
) -> None:
    from glm5_lsp.train.continued import SLOW_EMA
    from glm5_lsp.train.promote import halfway

    run = _new_run(tmp_path, "run", init_model, corpus, slow_ema_decay=0.5)
    train(run, RunLimits(steps=3), stop_on_signals=False)
    ckpt = run / "checkpoint"
    slow, short = load_file(str(ckpt / SLOW_EMA)), load_file(str(ckpt / "ema.safetensors"))
    weights = _weights(run)
    name = next(n for n in weights if not torch.equal(weights[n], short[n]))
    assert not torch.equal(slow[name], short[name])  # its own average (decay 0.5 against 0.9)
    (ckpt / SLOW_EMA).unlink()  # a checkpoint from before the slow average
    train(run, RunLimits(steps=1), stop_on_signals=False)
    assert (ckpt / SLOW_EMA).is_file()

    a, b = load_model(init_model), load_model(ckpt)
    mean = halfway(a, b)
    assert mean is not None
    for (n, p), q, r in zip(mean.named_parameters(), a.parameters(), b.parameters()):
        torch.testing.assert_close(p, (q + r) / 2, msg=n)
    assert halfway(tiny_model(seed=1, hidden_size=32), b) is None  # other shapes: no average
