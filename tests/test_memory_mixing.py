"""Decoding with the memory: the mixture, its order with the decoding monitor, the fitted weights,
and drafts verified in one pass giving the same greedy text sooner (and the same distribution when
sampling)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from glm5_lsp.backends.base import CompletionRequest
from glm5_lsp.backends.local import LocalBackend
from glm5_lsp.memory.align import Estimate
from glm5_lsp.memory.fit import Scores, best_weight, fit, perplexity
from glm5_lsp.memory.index import Counts
from glm5_lsp.memory.matcher import Match
from glm5_lsp.memory.mixing import (
    COUNT_EDGES,
    LENGTH_EDGES,
    SHARE_EDGES,
    DraftSettings,
    Interpolation,
    MemoryProcessor,
    ProcessorFactory,
    mix,
)
from glm5_lsp.memory.workspace import MemorySettings, WorkspaceMemory
from glm5_lsp.model import GenerationConfig, Generator, load_model, load_tokenizer
from glm5_lsp.model.generate import sample_with_draft
from glm5_lsp.spans import Prompt

REPEATED = "".join(
    f"    def handle_{name}(self, event):\n        self.log.append(('{name}', event.value, event.time))\n"
    f"        return self.dispatch(event, priority={i})\n\n"
    for i, name in enumerate(["open", "close", "save", "rename", "delete", "create", "move", "copy"])
)


def estimate(ids: list[int], counts: list[int], length: int) -> Estimate:
    c = np.asarray(counts, dtype=np.float64)
    return Estimate(np.asarray(ids), c / c.sum(), Match(length, Counts(np.asarray(ids), np.asarray(counts), int(c.sum()))))


def strong(weight: float = 0.95) -> Interpolation:
    return Interpolation([[[weight] * len(SHARE_EDGES) for _ in COUNT_EDGES] for _ in LENGTH_EDGES], "test")


def test_the_mixture_is_a_distribution_and_weight_zero_changes_nothing() -> None:
    logits = torch.randn(50)
    e = estimate([3, 7], [3, 1], 5)
    out = mix(logits, e, 0.4)
    p = torch.softmax(logits, -1)
    assert torch.allclose(out.exp().sum(), torch.tensor(1.0), atol=1e-5)
    assert math.isclose(float(out[3].exp()), 0.6 * float(p[3]) + 0.4 * 0.75, rel_tol=1e-5)
    assert math.isclose(float(out[10].exp()), 0.6 * float(p[10]), rel_tol=1e-5)
    assert mix(logits, e, 0.0) is logits


def test_the_monitor_runs_after_the_mixing_and_still_masks() -> None:
    class Memory:
        def sync(self, ids):
            return Match(9, Counts(np.asarray([5]), np.asarray([10]), 10))

    class Text:
        def estimate(self, written, within_piece=False):
            return estimate([5], [10], 9)

    seen = []

    def monitor(ids, logits):  # masks the memory's favourite, as an invalid name would be
        seen.append(float(logits[5]))
        logits = logits.clone()
        logits[5] = float("-inf")
        return logits

    class Tok:
        def decode(self, ids):
            return ""

    processor = MemoryProcessor.__new__(MemoryProcessor)
    processor.__dict__.update(text=Text(), tokenizer=Tok(), interpolation=strong(), then=monitor,
                              drafts=DraftSettings(), draft_stop="", bound=True, steps=0, mixed_steps=0)
    out = processor([], torch.zeros(8))
    assert seen and seen[0] > math.log(0.9)  # the monitor saw the mixed scores
    assert out[5] == float("-inf")


def test_an_estimate_merges_repeated_ids_and_keeps_distinct_ones_as_they_are() -> None:
    """The estimate from next ids and weights (``TextMatcher._estimate``): repeated ids summed, in
    order; ids distinct and in order already (a match's own counts) kept as they are: the same
    distribution either way."""
    from glm5_lsp.memory.align import TextMatcher

    match = Match(3, Counts(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), 0))
    ids, weights = np.array([4, 9, 17, 30]), np.array([1.0, 3.0, 2.0, 2.0])
    plain = TextMatcher._estimate(ids, weights, match)
    assert plain.ids.tolist() == [4, 9, 17, 30] and plain.probs.tolist() == [0.125, 0.375, 0.25, 0.25]
    shuffled = TextMatcher._estimate(ids[[2, 0, 3, 1]], weights[[2, 0, 3, 1]], match)
    assert shuffled.ids.tolist() == plain.ids.tolist() and np.allclose(shuffled.probs, plain.probs)
    split = TextMatcher._estimate(np.array([9, 4, 9, 30, 17]), np.array([1.0, 1.0, 2.0, 2.0, 2.0]), match)
    assert split.ids.tolist() == plain.ids.tolist() and np.allclose(split.probs, plain.probs)
    assert TextMatcher._estimate(np.array([5]), np.array([0.0]), match).empty


def test_the_interpolation_prior_grows_with_the_match() -> None:
    prior = Interpolation.prior()
    weights = [prior.table[i][2][3] for i in range(len(LENGTH_EDGES))]
    assert weights == sorted(weights) and weights[0] < 0.2 < weights[-1]
    assert Interpolation.default().weight(estimate([1], [1], 0)) == 0.0


def test_best_weight_recovers_a_known_mixture() -> None:
    rng = np.random.default_rng(0)
    n, lam = 4000, 0.7
    from_memory = rng.random(n) < lam  # a token the memory called, or one the model did
    p_memory = np.where(from_memory, rng.uniform(0.6, 1.0, n), rng.uniform(0.0, 0.05, n))
    p_model = np.where(from_memory, rng.uniform(0.0, 0.1, n), rng.uniform(0.2, 0.6, n))
    fitted = best_weight(p_memory, p_model)
    assert 0.55 < fitted < 0.85
    scores = Scores(list(p_model), list(p_memory), [(5, 2, 3)] * n)
    table = fit(scores, "synthetic")
    assert math.isclose(table.table[5][2][3], fitted)
    assert perplexity(scores, table) < perplexity(scores, None)


def test_sampling_with_a_draft_keeps_the_distribution() -> None:
    logits = torch.tensor([1.0, 0.5, -0.3, 2.0, 0.0])
    target = torch.softmax(logits / 0.8, -1).numpy()
    rng = torch.Generator().manual_seed(0)
    draws = [sample_with_draft(logits, 3, 0.8, 1.0, rng) for _ in range(20000)]
    freq = np.bincount(draws, minlength=5) / len(draws)
    assert np.abs(freq - target).max() < 0.015
    assert sample_with_draft(logits, 1, 0.0, 1.0, rng) == 3  # greedy: the argmax, whatever was proposed


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint: Path):
    tokenizer = load_tokenizer(tiny_checkpoint)
    memory = WorkspaceMemory(tokenizer, MemorySettings(libraries=False, stdlib=False))
    memory.update("/ws/events.py", "class Handler:\n" + REPEATED)
    return load_model(tiny_checkpoint), tokenizer, memory


def test_drafts_give_the_same_greedy_text_in_fewer_model_calls(tiny) -> None:
    model, tokenizer, memory = tiny
    prompt = "class Other:\n" + REPEATED[: REPEATED.index("handle_close")] + "handle_cl"
    ids = tokenizer.encode(prompt)
    results = {}
    for drafts in (False, True):
        processor = MemoryProcessor(memory.matcher(), tokenizer, strong(),
                                    drafts=DraftSettings(enabled=drafts, min_length=4, min_share=0.5))
        processor.bind_prompt(ids)
        generator = Generator(model, tokenizer)
        results[drafts] = generator.generate(ids, GenerationConfig(max_new_tokens=60, stop_at_eos=False),
                                             logits_processor=processor,
                                             drafter=processor.propose if drafts else None)
    plain, drafted = results[False], results[True]
    assert drafted.text == plain.text and drafted.token_ids == plain.token_ids
    assert "self.log.append(('close', event.value" in plain.text  # the mixture followed the memory
    assert drafted.accepted_tokens > 20 and drafted.forward_calls < plain.forward_calls / 2


def test_the_local_backend_binds_the_prompt_and_drafts(tiny, tiny_checkpoint: Path) -> None:
    _, tokenizer, memory = tiny
    factory = ProcessorFactory(memory, tokenizer, strong(), DraftSettings(min_length=4, min_share=0.5))
    document = "class Other:\n" + REPEATED[: REPEATED.index("handle_save")] + "    def handle_sa"
    texts = {}
    for drafts in (False, True):
        backend = LocalBackend(tiny_checkpoint, drafts=drafts)
        processor = factory("/ws/other.py", document, len(document) - 2)
        request = CompletionRequest(Prompt(prefix=document[:-2]), max_tokens=40, stop=["\n"],
                                    logits_processor=processor, forced_prefix="sa")
        texts[drafts] = backend.complete(request).text
        assert processor.bound and processor.steps > 0
    assert texts[True] == texts[False]
    assert texts[True].startswith("save(self, event):")
