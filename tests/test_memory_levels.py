"""The shorter suffixes' estimates beside the longest match (``memory.shorterSuffixes``): which
suffixes, what followed them, the level gate's weights and mixture, its fit, and the setting that
turns it on (off by default)."""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from glm5_lsp.memory.align import TextMatcher, shorter_lengths
from glm5_lsp.memory.fit import Scores, fit, fit_gate, perplexity
from glm5_lsp.memory.mixing import (
    COMPONENTS,
    COUNT_EDGES,
    LENGTH_EDGES,
    SHARE_EDGES,
    Interpolation,
    LevelGate,
    MemoryProcessor,
    component_features,
    mix_levels,
)
from glm5_lsp.memory.workspace import MemorySettings, WorkspaceMemory
from glm5_lsp.model import load_tokenizer
from glm5_lsp.pipeline.memory import SessionMemory
from tests.test_memory_mixing import estimate

CODE = "".join(f"def f{i}(a, b):\n    total = a + b * {i}\n    return total - {i % 3}\n\n" for i in range(12))


def test_the_shorter_slots_are_distinct_lengths_under_the_longest() -> None:
    assert shorter_lengths(10) == [9, 8, 5, 4, 2, 1]
    assert shorter_lengths(8) == [7, 6, 4, 0, 2, 1]  # half of 8 is 4: the fixed 4 is taken already
    assert shorter_lengths(3) == [2, 1, 0, 0, 0, 0]
    assert shorter_lengths(1) == [0] * 6 and shorter_lengths(0) == [0] * 6
    for length in range(40):
        slots = [n for n in shorter_lengths(length) if n]
        assert len(slots) == len(set(slots)) and all(0 < n < length for n in slots)
    assert len(shorter_lengths(5)) == COMPONENTS - 1


def test_each_slot_holds_what_followed_that_suffix(tiny_checkpoint: Path) -> None:
    tokenizer = load_tokenizer(tiny_checkpoint)
    memory = WorkspaceMemory(tokenizer, MemorySettings(libraries=False, stdlib=False))
    memory.update("/ws/sums.py", CODE)
    ids = tokenizer.encode(CODE)
    text = TextMatcher(memory.matcher(), tokenizer)
    code = "def g(a, b):\n    total = a + b * 7\n    return total"
    text.bind(code)
    written = " - "
    ids_settled, pending = text.split(written)
    context = ids_settled + (tokenizer.encode(pending) if pending else [])
    longest = text.matcher.sync(context).length
    slots = text.shorter(written)
    assert len(slots) == COMPONENTS - 1 and longest >= 3
    checked = 0
    for wanted, found in zip(shorter_lengths(longest), slots):
        if not wanted:
            assert found is None
            continue
        suffix = context[-wanted:]
        following = Counter(ids[i + wanted] for i in range(len(ids) - wanted) if ids[i:i + wanted] == suffix)
        assert found is not None and found.match.length == wanted
        got = dict(zip(found.ids.tolist(), found.probs.tolist()))
        total = sum(following.values())
        assert got.keys() == following.keys()
        assert all(math.isclose(got[k], v / total) for k, v in following.items())
        checked += 1
    assert checked >= 2
    assert text.shorter(written) is slots  # remembered for the draft's verification steps


def gate(memory: list[list[float]] | None = None, model: tuple[float, float] = (0.0, 0.0)) -> LevelGate:
    weights = np.zeros((COMPONENTS, 4)) if memory is None else np.asarray(memory, dtype=np.float64)
    return LevelGate(weights, np.asarray(model, dtype=np.float64))


def test_the_gate_weighs_present_components_only_and_sums_to_one() -> None:
    estimates = [estimate([3, 7], [3, 1], 6), None, estimate([3, 9], [1, 1], 4)] + [None] * (COMPONENTS - 3)
    features = component_features(estimates)
    assert features[0].tolist() == [6, 4, 0.75] and features[1].tolist() == [0, 0, 0]
    weights = gate().weights(features[None], np.asarray([0.5]))[0]
    assert np.allclose(weights, [1 / 3, 1 / 3, 0, 1 / 3] + [0] * (COMPONENTS - 3))
    # a longer match scores higher where the gate says so
    memory = [[0.0, 1.0, 0.0, 0.0]] * COMPONENTS
    weights = gate(memory).weights(features[None], np.asarray([0.5]))[0]
    assert weights[1] > weights[3] > weights[0]


def test_mixing_levels_is_the_weighted_sum_of_the_distributions() -> None:
    torch.manual_seed(0)
    logits = torch.randn(20)
    estimates = [estimate([3, 7], [3, 1], 6), estimate([3, 12], [1, 1], 5)] + [None] * (COMPONENTS - 2)
    g = gate()  # equal scores: a third each
    out, mixed = mix_levels(logits, estimates, g)
    p = torch.softmax(logits, -1)
    assert mixed and torch.allclose(out.exp().sum(), torch.tensor(1.0), atol=1e-5)
    assert math.isclose(float(out[3].exp()), p[3] / 3 + 0.75 / 3 + 0.5 / 3, rel_tol=1e-5)
    assert math.isclose(float(out[7].exp()), p[7] / 3 + 0.25 / 3, rel_tol=1e-5)
    assert math.isclose(float(out[12].exp()), p[12] / 3 + 0.5 / 3, rel_tol=1e-5)
    assert math.isclose(float(out[5].exp()), p[5] / 3, rel_tol=1e-5)
    past = [estimate([3, 30], [1, 1], 5)] + [None] * (COMPONENTS - 1)  # an id past the vocabulary: left out
    out, _ = mix_levels(logits, past, g)
    assert math.isclose(float(out[3].exp()), p[3] / 2 + 0.25, rel_tol=1e-5)
    same, mixed = mix_levels(logits, [None] * COMPONENTS, g)
    assert same is logits and not mixed


def synthetic_scores(n: int = 3000) -> Scores:
    """Tokens where the longest match is sure but wrong half the time and the first shorter slot holds
    the real token then: a mixture that weighs the shorter slot does better than the table can."""
    rng = np.random.default_rng(0)
    scores = Scores()
    for i in range(n):
        longest_right = i % 2 == 0
        p_model = float(rng.uniform(0.01, 0.2))
        levels = np.zeros((COMPONENTS, 4))
        levels[0] = (0.9 if longest_right else 0.0, 12, 3, 0.9)
        levels[1] = (0.4 if longest_right else 0.6, 11, 40, 0.5)
        scores.model.append(p_model)
        scores.memory.append(levels[0, 0])
        scores.cells.append((8, 2, 2))
        scores.model_top.append(float(rng.uniform(0.2, 0.9)))
        scores.levels.append(levels)
    return scores


def test_the_fitted_gate_beats_the_table_where_shorter_suffixes_know_more() -> None:
    scores = synthetic_scores()
    fitted = fit(scores, "synthetic")
    assert fitted.gate is not None
    table_only = Interpolation(fitted.table, fitted.source)
    alone, by_table, by_gate = perplexity(scores, None), perplexity(scores, table_only), perplexity(scores, fitted)
    assert by_gate < by_table < alone
    # the likelihood it maximised is the one ``LevelGate.weights`` gives (the same formula)
    model_top, probs, features = scores.level_arrays()
    w = fitted.gate.weights(features, model_top)
    p = w[:, 0] * np.asarray(scores.model) + (w[:, 1:] * probs).sum(1)
    assert math.isclose(float(np.exp(-np.log(p).mean())), by_gate, rel_tol=1e-9)
    assert by_gate < perplexity(scores, Interpolation(fitted.table, "", fit_gate(scores, iterations=1)))


def test_the_gate_round_trips_and_a_bad_one_is_refused(tmp_path: Path, monkeypatch, caplog) -> None:
    from glm5_lsp.memory import mixing

    table = [[[0.5] * len(SHARE_EDGES) for _ in COUNT_EDGES] for _ in LENGTH_EDGES]
    saved = Interpolation(table, "test", gate([[0.1, 0.2, 0.3, 0.4]] * COMPONENTS, (1.0, -2.0)))
    path = tmp_path / "interpolation.json"
    saved.save(path)
    monkeypatch.setattr(mixing, "TABLE_FILE", path)
    assert Interpolation.default().gate is None  # the option is off unless asked for
    loaded = Interpolation.default(levels=True)
    assert loaded.table == table and loaded.gate is not None
    assert np.allclose(loaded.gate.memory, saved.gate.memory) and np.allclose(loaded.gate.model, [1.0, -2.0])

    data = json.loads(path.read_text())
    data["gate"]["memory"] = data["gate"]["memory"][:-1]
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="glm5_lsp.memory.mixing"):
        fallback = Interpolation.default(levels=True)
    assert fallback.gate is None and fallback.source == "prior"
    assert str(path) in caplog.text and "level gate needs memory" in caplog.text


def test_the_setting_gives_the_processor_the_gate(tiny_checkpoint: Path) -> None:
    tokenizer = load_tokenizer(tiny_checkpoint)
    settings = MemorySettings(libraries=False, stdlib=False)
    assert SessionMemory(tokenizer, settings).factory.interpolation.gate is None
    on = SessionMemory(tokenizer, MemorySettings(libraries=False, stdlib=False, shorter_suffixes=True))
    assert on.factory.interpolation.gate is not None  # the shipped file carries one
    on.memory.update("/ws/sums.py", CODE)
    processor = on.factory(None, None, None)
    assert isinstance(processor, MemoryProcessor)
    ids = tokenizer.encode("def g(a, b):\n    total = a + b * 7\n    return total")
    processor.bind_prompt(ids)
    logits = torch.zeros(tokenizer.vocab_size)
    out = processor([], logits)
    assert processor.mixed_steps == 1
    estimates = [processor.text.estimate("", within_piece=True), *processor.text.shorter("")]
    expected, _ = mix_levels(logits, estimates, on.factory.interpolation.gate)
    assert torch.allclose(out, expected)


@pytest.mark.parametrize("levels", [False, True])
def test_the_shipped_file_loads(levels: bool) -> None:
    loaded = Interpolation.default(levels=levels)
    assert loaded.source.startswith("fitted on") and (loaded.gate is not None) == levels


def test_score_package_details_name_each_token_and_its_estimate(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """``details``: each scored token's file and index, and the longest match's whole estimate, line up
    with the probabilities scored (``benchmarks/memory.py neighbours`` reads them so)."""
    from glm5_lsp.memory.fit import score_package
    from glm5_lsp.model import load_model

    pytest.importorskip("iniconfig")  # installed with pytest: a small real package to copy
    tokenizer = load_tokenizer(tiny_checkpoint)
    model = load_model(tiny_checkpoint).eval()
    scores = score_package("iniconfig", model, tokenizer, tmp_path, 64, 400, libraries=False,
                           log=lambda _: None, above=True, details=True)
    assert len(scores.model) == len(scores.positions) == len(scores.estimates) > 300
    ids_of: dict[str, list[int]] = {}
    matched = 0
    for (key, t), kept, p_memory in zip(scores.positions, scores.estimates, scores.memory):
        ids = ids_of.setdefault(key, tokenizer.encode(Path(key).read_text(encoding="utf-8")))
        if kept is None:
            assert p_memory == 0.0
            continue
        found = dict(zip(kept[0].tolist(), kept[1].tolist()))
        assert math.isclose(found.get(ids[t], 0.0), p_memory)
        matched += p_memory > 0
    assert matched > 20
