"""Two continued runs of one model, each on its own core, averaged now and then (local SGD).

The machine has two cores and a run trains on one. A second run of the same model that reads the
stream in another order (another ``seed``: ``stream.doc_key``) and is averaged with the first from
time to time trains one model on both cores: each run takes its own steps on its own data, and
:func:`merge_runs` replaces both runs' weights, buffers and moving averages with their mean (the
optimizers' moments stay each run's own, as in local SGD). Averaging works while the runs stay near
each other: the more often, the better. A 32-expert fork and the main run, 17M tokens apart on the
same data, measured 10.898 and 10.813 held-out perplexity alone and 10.780 averaged (BENCHMARKS.md).

    glm5-lsp train --clone runs/continued --out runs/continued-b   # the second run, once
    glm5-lsp train --merge runs/continued runs/continued-b                  # with both stopped

``scripts/cpu_train.sh`` runs a pair and merges it (``GLM5_PAIR``). Tokens: a merged model has seen
what both runs read since their last merge, so each run's ``tokens_total`` becomes the sum (the
``merge_base`` of its state remembers where the runs last agreed).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from glm5_lsp.model.loading import CheckpointError, load_model, save_model
from glm5_lsp.train.continued import (
    CHECKPOINT,
    SLOW_EMA,
    ContinueConfig,
    TrainState,
    _load_ema,
    read_state,
    swap_in,
    write_state,
)
from glm5_lsp.train.runlog import RunLog

AVERAGES = ("ema.safetensors", SLOW_EMA)


class RunBusy(RuntimeError):
    """A run to merge or clone is training now."""


@dataclass
class Merged:
    runs: list[str]
    tokens_total: int  # what the merged weights have seen
    tensors: int  # weights and buffers averaged (each moving average as many again)


def clone_run(source: Path, target: Path, seed: int | None = None) -> Path:
    """A second run of ``source``'s model in ``target``: its checkpoint, documents and tokenizer,
    settings with ``seed`` (default: the source's plus one; so it reads the stream in its own order,
    from the start of the same epoch), and a fresh log. Returns ``target``."""
    _idle(source)
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(f"{target} is not empty")
    config = ContinueConfig.from_dict(json.loads((source / "run.json").read_text(encoding="utf-8")))
    seed = config.seed + 1 if seed is None else seed
    if seed == config.seed:
        raise ValueError(f"seed {seed} is {source}'s own: the two runs would read the same stream")
    state = read_state(source / CHECKPOINT)
    target.mkdir(parents=True, exist_ok=True)
    for name in ("corpus_files.json", "heldout_files.json", "corpus_manifest.json", "tokenizer.json"):
        shutil.copy2(source / name, target / name)
    shutil.copytree(source / CHECKPOINT, target / CHECKPOINT)
    config = replace(config, seed=seed)
    (target / "run.json").write_text(json.dumps(config.to_dict(), indent=1) + "\n", encoding="utf-8")
    position = {**state.position, "shard_start": -1, "batch": 0}  # the epoch again, in this seed's order
    base = state.tokens_total
    write_state(target / CHECKPOINT, TrainState(**{**asdict(state), "position": position, "merge_base": base}))
    write_state(source / CHECKPOINT, TrainState(**{**asdict(state), "merge_base": base}))
    log = RunLog(target / "train_log.jsonl")
    log.write("clone", source=str(source), seed=seed, tokens_total=base, position=position)
    log.close()
    return target


def merge_runs(runs: Sequence[Path]) -> Merged:
    """Average the checkpoints of ``runs`` (the same model, none of them training) into each of them."""
    runs = [Path(r) for r in runs]
    if len(runs) < 2 or len({r.resolve() for r in runs}) != len(runs):
        raise ValueError("merging needs two or more different runs")
    for run in runs:
        _idle(run)
    states = [read_state(run / CHECKPOINT) for run in runs]
    bases = {s.merge_base for s in states}
    if len(bases) != 1 or None in bases:
        raise ValueError("these runs were not cloned from one another (their merge_base differs: "
                         f"{[s.merge_base for s in states]}); start the second one with --clone")
    base = states[0].merge_base
    assert base is not None
    total = base + sum(max(0, s.tokens_total - base) for s in states)
    models = [load_model(run / CHECKPOINT) for run in runs]
    weights = _mean([m.state_dict() for m in models], [str(run / CHECKPOINT) for run in runs])
    averages = {}
    for name in AVERAGES:
        files = [run / CHECKPOINT / name for run in runs]
        present = [f.is_file() for f in files]
        if any(present) and not all(present):
            raise CheckpointError(f"{name} is in some of the checkpoints only: {[str(f) for f, p in zip(files, present)]}")
        if all(present):
            averages[name] = _mean([_load_ema(m, f) for m, f in zip(models, files)], [str(f) for f in files])
    models[0].load_state_dict(weights)
    for run, state in zip(runs, states):
        merged = TrainState(**{**asdict(state), "tokens_total": total, "merge_base": total})
        _swap_in(run, models[0], averages, merged)
        log = RunLog(run / "train_log.jsonl")
        log.write("merge", runs=[str(r) for r in runs], tokens_total=total, own_tokens=state.tokens_total)
        log.close()
    return Merged([str(r) for r in runs], total, len(weights))


def _idle(run: Path) -> None:
    if not (run / CHECKPOINT / "state.json").is_file():
        raise FileNotFoundError(f"{run} has no checkpoint: not a continued run")
    pid_file = run / "train.pid"
    if pid_file.is_file():
        try:
            pid = int(pid_file.read_text().strip())
            os.kill(pid, 0)
        except (ValueError, ProcessLookupError):
            return
        except PermissionError:
            pass
        raise RunBusy(f"{run} is training (pid {pid_file.read_text().strip()}): stop it first "
                      f"(GLM5_RUN={run} scripts/cpu_train.sh --stop)")


def _mean(dicts: list[dict[str, torch.Tensor]], names: list[str]) -> dict[str, torch.Tensor]:
    """The element-wise mean of tensors with the same names and shapes (integer ones must agree)."""
    first = dicts[0]
    for other, name in zip(dicts[1:], names[1:]):
        if other.keys() != first.keys():
            odd = sorted(set(other) ^ set(first))
            raise CheckpointError(f"{name} does not hold the same tensors as {names[0]} ({', '.join(odd[:5])})")
    out = {}
    for key, tensor in first.items():
        group = [d[key] for d in dicts]
        for t, name in zip(group, names):
            if t.shape != tensor.shape:
                raise CheckpointError(f"{name}: tensor {key!r} has shape {list(t.shape)}, "
                                      f"{names[0]} has {list(tensor.shape)}")
        if tensor.is_floating_point():
            out[key] = torch.stack([t.double() for t in group]).mean(dim=0).to(tensor.dtype)
        elif all(torch.equal(t, tensor) for t in group):
            out[key] = tensor.clone()
        else:
            raise CheckpointError(f"tensor {key!r} ({tensor.dtype}) differs between the runs and cannot be averaged")
    return out


def _swap_in(run: Path, model: torch.nn.Module, averages: dict[str, dict[str, torch.Tensor]],
             state: TrainState) -> None:
    """The merged tensors into ``run``'s checkpoint (its optimizer kept), written beside it and swapped in."""
    checkpoint = run / CHECKPOINT
    fresh = run / (CHECKPOINT + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    save_model(model, fresh, max_shard_bytes=1 << 40)
    for name in ("tokenizer.json", "optimizer.safetensors"):
        shutil.copy2(checkpoint / name, fresh / name)
    for name, tensors in averages.items():
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(fresh / name))
    write_state(fresh, state)
    swap_in(run)
