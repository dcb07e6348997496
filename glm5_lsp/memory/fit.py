"""Fit the memory's interpolation weights on held-out packages, and measure perplexity with them.

For each package (``BENCHMARK_FIT`` by default: the packages the weights may be chosen on; never
``BENCHMARK_REPORT``), copied as its own workspace, every file is scored token by token twice: by
the model alone (windows of the model's trained context, each token seeing at least half a window
before it) and by the memory holding the rest of that package plus the libraries it imports and the
standard library (the file's own positions excluded; with ``--above`` the file's own text above each
token is in the memory, as the editor's memory holds the document being edited). Each token's cell of the
interpolation table (the match's length, occurrences and top share) then gets the weight that
maximises the held-out log-likelihood of the mixture in that cell, a one-dimensional concave problem;
cells with too few tokens take the weight of their length row. The level gate
(:class:`~glm5_lsp.memory.mixing.LevelGate`: the model, the longest match and the shorter suffixes'
estimates weighed at each token) is fitted on the same tokens by maximum likelihood (L-BFGS).

    python -m glm5_lsp.memory.fit                      # fit on BENCHMARK_FIT, write interpolation.json
    python -m glm5_lsp.memory.fit --max-tokens 20000   # fewer tokens per package
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from glm5_lsp.memory.align import TextMatcher
from glm5_lsp.memory.heldout import copy_package
from glm5_lsp.memory.matcher import Matcher, Source
from glm5_lsp.memory.mixing import (
    COMPONENTS,
    COUNT_EDGES,
    LENGTH_EDGES,
    SHARE_EDGES,
    TABLE_FILE,
    Interpolation,
    LevelGate,
    buckets,
    component_features,
)
from glm5_lsp.memory.workspace import WorkspaceMemory, as_key

MIN_CELL = 200  # tokens a cell needs for a weight of its own


@dataclass
class Scores:
    """Per scored token: the model's and the memory's probability of the real token, the table
    cell of the memory's estimate (-1 where it had none); for the level gate, the model's top
    probability and, per component (the longest match, then the shorter slots), the probability of
    the real token and the match's features (``mixing.component_features``)."""

    model: list[float] = field(default_factory=list)
    memory: list[float] = field(default_factory=list)
    cells: list[tuple[int, int, int]] = field(default_factory=list)
    model_top: list[float] = field(default_factory=list)
    levels: list[np.ndarray] = field(default_factory=list)  # each (COMPONENTS, 4): p, length, occurrences, share
    # with ``score_package(details=True)``: each token's file and index in it, and the longest match's
    # whole estimate (its ids and probabilities; None where it had none)
    positions: list[tuple[str, int]] = field(default_factory=list)
    estimates: list[tuple[np.ndarray, np.ndarray] | None] = field(default_factory=list)
    files: int = 0
    seconds_model: float = 0.0
    seconds_memory: float = 0.0

    def extend(self, other: Scores) -> None:
        self.model += other.model
        self.memory += other.memory
        self.cells += other.cells
        self.model_top += other.model_top
        self.levels += other.levels
        self.positions += other.positions
        self.estimates += other.estimates
        self.files += other.files
        self.seconds_model += other.seconds_model
        self.seconds_memory += other.seconds_memory

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (np.asarray(self.model), np.asarray(self.memory),
                np.asarray(self.cells, dtype=np.int64).reshape(-1, 3))

    def level_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The model's top probabilities ``(n,)``, the components' probabilities of the real token
        ``(n, COMPONENTS)`` and their features ``(n, COMPONENTS, 3)``."""
        levels = np.asarray(self.levels, dtype=np.float64).reshape(-1, COMPONENTS, 4)
        return np.asarray(self.model_top, dtype=np.float64), levels[..., 0], levels[..., 1:]


def windows(n: int, window: int) -> Iterator[tuple[int, int, int]]:
    """How the model reads a sequence of ``n`` tokens: ``(start, stop, first)`` for windows of
    ``window`` tokens stepping by half of one; positions ``start + first`` up to ``stop`` are the
    window's own (its second half, the first window all of it), so each is read with at least half a
    window before it."""
    half = max(1, window // 2)
    start = 0
    while True:
        yield start, min(n, start + window), 0 if start == 0 else half
        if start + window >= n:
            return
        start += half


def model_probabilities(model: object, ids: Sequence[int], window: int) -> tuple[np.ndarray, np.ndarray]:
    """``p(ids[t] | ids[max(0, ...):t])`` for t >= 1 by the model, and its top probability there, each
    position scored in the window that owns it (:func:`windows`)."""
    import torch

    n = len(ids)
    out = np.full(n, np.nan)
    top = np.full(n, np.nan)
    with torch.inference_mode():
        for start, stop, first in windows(n, window):
            chunk = torch.tensor([list(ids[start:stop])], dtype=torch.long)
            logp = torch.log_softmax(model(chunk)[0].float(), dim=-1)  # type: ignore[operator]
            best = logp.max(dim=-1).values.exp()
            for i in range(max(first, 1), chunk.shape[1]):
                out[start + i] = math.exp(float(logp[i - 1, chunk[0, i]]))
                top[start + i] = float(best[i - 1])
    return out, top


ABOVE_CHUNK = 16  # tokens scored per binding when the file's own text above counts (``above``)


def score_package(name: str, model: object, tokenizer: object, workdir: Path, window: int,
                  max_tokens: int, libraries: bool = True, log: Callable[[str], None] = print,
                  above: bool = False, model_cache: dict | None = None, details: bool = False) -> Scores:
    """Model and memory probabilities over one package's files (at most ``max_tokens`` scored).

    The memory holds the rest of the package and the libraries; the file being scored is left out,
    or with ``above`` it is in the memory as the editor's document is (its own shard, whose match
    decides: ``Source.own``) up to the token being scored: every ``ABOVE_CHUNK`` tokens the matcher
    is made again with the file from that token on excluded, so no token sees itself or what follows
    (nor the earlier tokens of its own chunk). ``model_cache``: the model's probabilities by file
    and length, kept across calls (the same package scored both ways computes them once). ``details``:
    keep each token's file and position and the longest match's whole estimate (``Scores.positions``,
    ``Scores.estimates``)."""
    root = copy_package(name, workdir)
    memory = WorkspaceMemory(tokenizer)  # type: ignore[arg-type]
    memory.index_folder(root, libraries=libraries)
    if not libraries:
        memory.libraries = None
    scores = Scores()
    base = memory.base
    assert base is not None
    for key in sorted(base.live_keys()):
        if len(scores.model) >= max_tokens:
            break
        text = Path(key).read_text(encoding="utf-8")
        doc_key = as_key(key)
        ids, offsets = tokenizer.encode_with_offsets(text)  # type: ignore[attr-defined]
        ids = ids[: max_tokens - len(scores.model) + 1]
        if len(ids) < 2:
            continue
        started = time.perf_counter()
        cache_key = (name, key[len(str(root)):], len(ids))
        cached = model_cache.get(cache_key) if model_cache is not None else None
        p_model, p_top = cached if cached is not None else model_probabilities(model, ids, window)
        if model_cache is not None:
            model_cache[cache_key] = (p_model, p_top)
        scores.seconds_model += time.perf_counter() - started
        started = time.perf_counter()
        if above:
            memory.update(doc_key, text)  # the document being edited: the hot shard, its other copies dead
        else:
            span = base.span(doc_key)
            sources = [Source(s.index, span if s.index is base else s.exclude) for s in memory.sources()]
        matcher, bound = None, 0
        for t in range(1, len(ids)):
            if above and (matcher is None or t % ABOVE_CHUNK == 0):
                bound = offsets[t][0]
                matcher = TextMatcher(memory.matcher_before(doc_key, bound), tokenizer)
                # the ids above are the memory's own tokens of the file: not encoded again each chunk
                matcher.bind(text[:bound], lambda end, need, file=doc_key, code=text:
                             memory.ids_before(file, code, end, need))
            elif matcher is None:
                matcher = TextMatcher(Matcher(sources), tokenizer)
                matcher.bind("")
            written = text[bound: offsets[t][0]]
            estimate = matcher.estimate(written, within_piece=True)  # as the mixing asks
            scores.model.append(float(p_model[t]))
            scores.model_top.append(float(p_top[t]))
            levels = _levels([estimate, *matcher.shorter(written)], ids[t])
            scores.levels.append(levels)
            scores.memory.append(float(levels[0, 0]))  # the longest match's: what the table mixes
            scores.cells.append(buckets(estimate) if levels[0, 1] else (-1, -1, -1))
            if details:
                scores.positions.append((key, t))
                scores.estimates.append((estimate.ids.copy(), estimate.probs.copy()) if levels[0, 1] else None)
        scores.seconds_memory += time.perf_counter() - started
        scores.files += 1
    log(f"{name}: {scores.files} files, {len(scores.model)} tokens "
        f"(model {scores.seconds_model:.0f} s, memory {scores.seconds_memory:.0f} s)")
    return scores


def _levels(estimates: Sequence[object], token: int) -> np.ndarray:
    """One token's row of ``Scores.levels``: each estimate's probability of ``token``, then its features."""
    out = np.zeros((COMPONENTS, 4))
    out[:, 1:] = component_features(estimates)  # type: ignore[arg-type]
    for k, estimate in enumerate(estimates):
        if estimate is None or not out[k, 1]:
            continue
        where = np.searchsorted(estimate.ids, token)  # type: ignore[attr-defined]
        if where < len(estimate.ids) and estimate.ids[where] == token:  # type: ignore[attr-defined]
            out[k, 0] = estimate.probs[where]  # type: ignore[attr-defined]
    return out


def best_weight(p_memory: np.ndarray, p_model: np.ndarray) -> float:
    """The ``lam`` in [0, 0.995] maximising ``sum(log(lam * p_memory + (1 - lam) * p_model))``."""
    lo, hi = 0.0, 0.995
    for _ in range(60):  # the derivative is decreasing in lam: bisect on its sign
        mid = (lo + hi) / 2
        grad = np.sum((p_memory - p_model) / np.maximum(mid * p_memory + (1 - mid) * p_model, 1e-30))
        if grad > 0:
            lo = mid
        else:
            hi = mid
    return round((lo + hi) / 2, 4)


def fit(scores: Scores, source: str) -> Interpolation:
    p_model, p_memory, cells = scores.arrays()
    p_model = np.maximum(p_model, 1e-12)
    table = Interpolation.prior().table
    for li in range(len(LENGTH_EDGES)):
        row = cells[:, 0] == li
        row_weight = best_weight(p_memory[row], p_model[row]) if row.sum() >= MIN_CELL else None
        for ci in range(len(COUNT_EDGES)):
            for si in range(len(SHARE_EDGES)):
                cell = row & (cells[:, 1] == ci) & (cells[:, 2] == si)
                if cell.sum() >= MIN_CELL:
                    table[li][ci][si] = best_weight(p_memory[cell], p_model[cell])
                elif row_weight is not None:
                    table[li][ci][si] = row_weight
    return Interpolation(table, source, fit_gate(scores) if scores.levels else None)


def fit_gate(scores: Scores, iterations: int = 500) -> LevelGate:
    """The :class:`LevelGate` maximising the held-out log-likelihood of its mixture over ``scores``
    (L-BFGS in torch, the same formula as ``LevelGate.weights``; a little L2 on the weights)."""
    import torch

    model_top, probs, features = scores.level_arrays()
    p_model = torch.tensor(np.maximum(np.asarray(scores.model), 1e-12))
    probs_t = torch.tensor(probs)
    present = torch.tensor(features[..., 0] > 0)
    inputs = torch.stack([torch.ones(probs_t.shape), torch.tensor(np.log1p(features[..., 0])),
                          torch.tensor(np.log1p(features[..., 1])), torch.tensor(features[..., 2])], dim=-1)
    top = torch.tensor(model_top)
    memory = torch.zeros(COMPONENTS, 4, dtype=torch.float64, requires_grad=True)
    model = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([memory, model], max_iter=iterations, line_search_fn="strong_wolfe")

    def loss_fn() -> torch.Tensor:
        optimizer.zero_grad()
        scores_ = (inputs * memory).sum(-1).masked_fill(~present, float("-inf"))
        logits = torch.cat([(model[0] + model[1] * top)[:, None], scores_], dim=1)
        weights = torch.softmax(logits, dim=1)
        mixed = weights[:, 0] * p_model + (weights[:, 1:] * probs_t).sum(1)
        loss = -torch.log(mixed).mean() + 1e-5 * ((memory ** 2).sum() + (model ** 2).sum())
        loss.backward()
        return loss

    optimizer.step(loss_fn)
    return LevelGate(memory.detach().numpy().copy(), model.detach().numpy().copy())


def perplexity(scores: Scores, interpolation: Interpolation | None) -> float:
    """exp of the mean negative log-likelihood, of the model alone or mixed with the memory."""
    p_model, p_memory, cells = scores.arrays()
    p = np.maximum(p_model, 1e-12)
    if interpolation is not None and interpolation.gate is not None and scores.levels:
        model_top, probs, features = scores.level_arrays()
        weights = interpolation.gate.weights(features, model_top)
        p = weights[:, 0] * p + (weights[:, 1:] * probs).sum(1)
    elif interpolation is not None:
        lam = table_weights(cells, interpolation)
        p = lam * p_memory + (1 - lam) * p
    return float(np.exp(-np.mean(np.log(np.maximum(p, 1e-12)))))


def table_weights(cells: np.ndarray, interpolation: Interpolation) -> np.ndarray:
    """Each scored token's weight of the longest match by ``interpolation``'s table, from its cell
    (``Scores.cells``; 0 where the memory had no estimate)."""
    lam = np.zeros(len(cells))
    has = cells[:, 0] >= 0
    table = np.asarray(interpolation.table)
    lam[has] = table[cells[has, 0], cells[has, 1], cells[has, 2]]
    return lam


def load_runtime(model_path: str | None) -> tuple[object, object, int]:
    import json

    import torch

    from glm5_lsp.model import default_model_path, load_model, load_tokenizer

    path = Path(model_path or default_model_path())
    model = load_model(path)
    model.eval()
    torch.set_num_threads(1)
    try:
        window = int(json.loads((path / "metrics.json").read_text()).get("seq_len", 512))
    except (OSError, ValueError):
        window = 512
    return model, load_tokenizer(path), window


def main(argv: Sequence[str] | None = None) -> int:
    from glm5_lsp.train.corpus import BENCHMARK_FIT, BENCHMARK_REPORT

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--packages", nargs="*", default=list(BENCHMARK_FIT))
    parser.add_argument("--max-tokens", type=int, default=30_000, help="scored tokens per package")
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", type=Path, default=TABLE_FILE)
    parser.add_argument("--above", action=argparse.BooleanOptionalAction, default=False,
                        help="the file's own text above each token in the memory, as the editor's is (lower "
                             "perplexity, but on FIT one more wrong line shown: BENCHMARKS.md, 'Shorter suffixes')")
    args = parser.parse_args(argv)
    reported = sorted(set(args.packages) & set(BENCHMARK_REPORT))
    if reported:
        parser.error(f"never fit on the packages the benchmarks report: {', '.join(reported)}")
    model, tokenizer, window = load_runtime(args.model)
    total = Scores()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.packages:
            total.extend(score_package(name, model, tokenizer, Path(tmp), window, args.max_tokens,
                                       above=args.above))
    above = ", the file above in the memory" if args.above else ""
    fitted = fit(total, f"fitted on {', '.join(args.packages)} ({len(total.model)} tokens{above})")
    table_only = Interpolation(fitted.table, fitted.source)
    before, prior = perplexity(total, None), perplexity(total, Interpolation.prior())
    after_table, after = perplexity(total, table_only), perplexity(total, fitted)
    fitted.save(args.out, perplexity={"model": round(before, 3), "prior": round(prior, 3),
                                      "table": round(after_table, 3), "fitted": round(after, 3)})
    print(f"perplexity on the fitting data: model {before:.2f}, prior table {prior:.2f}, fitted table "
          f"{after_table:.2f}, with the level gate {after:.2f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
