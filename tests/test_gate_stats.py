"""The gate's decoding statistics: a logits processor that observes every step without changing it,
placed in front of the pipeline's decoding monitor (``glm5_lsp.gate.stats``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from glm5_lsp.gate.stats import DecodeRecorder, DecodeStats, StepObserver, end_token_ids
from glm5_lsp.model import GenerationConfig, Generator, load_model, load_tokenizer

PROMPT = "def add(a, b):\n    return"


@pytest.fixture(scope="module")
def gen(tiny_checkpoint: Path) -> Generator:
    return Generator(load_model(tiny_checkpoint), load_tokenizer(tiny_checkpoint))


def test_the_observer_records_every_step_and_changes_nothing(gen: Generator) -> None:
    ids = gen.tokenizer.encode(PROMPT)
    config = GenerationConfig(max_new_tokens=7, stop_at_eos=False)
    plain = gen.generate(ids, config)
    strings = gen.tokenizer.token_strings()
    observer = StepObserver(strings, end_token_ids(strings))
    seen = gen.generate(ids, config, logits_processor=observer)
    stats = observer.finish()
    assert seen.token_ids == plain.token_ids
    assert stats.steps == len(stats.logprobs) == len(stats.chars) == 7
    # the chosen tokens' log-probabilities are the generator's own (it sums them under the model)
    assert math.isclose(sum(stats.logprobs), plain.logprob, rel_tol=1e-4, abs_tol=1e-4)
    assert stats.chars == [len(strings[t]) for t in plain.token_ids]
    assert all(e >= 0 for e in stats.entropies)
    assert all(0 <= p <= 1 for p in stats.end_probs + stats.top_probs)
    assert all(m >= 0 for m in stats.margins)
    greedy = [math.log(p) for p in stats.top_probs]  # greedy: the chosen token is the likeliest
    assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(stats.logprobs, greedy))


def test_the_observer_sees_the_models_logits_before_the_monitor_changes_them(gen: Generator) -> None:
    ids = gen.tokenizer.encode(PROMPT)
    strings = gen.tokenizer.token_strings()
    plain = gen.generate(ids, GenerationConfig(max_new_tokens=1, stop_at_eos=False))
    banned = plain.token_ids[0]

    def ban(generated: list[int], logits: torch.Tensor) -> torch.Tensor:
        logits[banned] = float("-inf")
        return logits

    observer = StepObserver(strings, end_token_ids(strings), inner=ban)
    out = gen.generate(ids, GenerationConfig(max_new_tokens=1, stop_at_eos=False), logits_processor=observer)
    stats = observer.finish()
    assert out.token_ids[0] != banned
    assert stats.top_probs[0] > math.exp(stats.logprobs[0])  # the model's favourite was banned, not chosen
    assert math.isclose(stats.logprobs[0], out.logprob, abs_tol=1e-4)


class Monitor:
    """The decoding monitor's attributes the repair loop sets and calls."""

    def __init__(self) -> None:
        self.time_left = lambda: 1.0
        self.words: list[str] = []

    def __call__(self, generated: list[int], logits: torch.Tensor) -> torch.Tensor:
        return logits

    def expect_word(self, word: str) -> None:
        self.words.append(word)


def test_the_observer_passes_the_monitors_attributes_through() -> None:
    inner = Monitor()
    observer = StepObserver(["a", "\n", ""], [1, 2], inner=inner)
    observer.expect_word("va")
    observer.time_left = lambda: 0.25
    assert inner.words == ["va"] and inner.time_left() == 0.25
    assert not hasattr(observer, "bind_prompt")  # the local backend must not take it for a memory processor
    assert not hasattr(StepObserver([], []), "expect_word")


def test_the_observer_closes_the_last_step_with_the_likeliest_token_once() -> None:
    observer = StepObserver(["ab", "c", "\n"], [2])
    observer([], torch.tensor([0.0, 3.0, 0.0]))
    observer([1], torch.tensor([5.0, 0.0, 0.0]))
    stats = observer.finish()
    assert stats.chars == [1, 2] and observer.finish() is stats and len(stats.logprobs) == 2
    assert stats.end_probs[0] == pytest.approx(math.exp(0) / (2 + math.exp(3)))


def test_steps_are_placed_in_the_text() -> None:
    stats = DecodeStats(entropies=[0.0] * 4, chars=[2, 3, 1, 4])  # "ab" "cde" "f" "ghij"
    assert [stats.steps_within(n) for n in (0, 1, 2, 5, 6, 7, 10)] == [0, 1, 1, 2, 3, 4, 4]
    assert [stats.steps_ending_within(n) for n in (0, 1, 2, 5, 6, 9, 10)] == [0, 0, 1, 2, 3, 3, 4]
    assert stats.text_end(1) == 5


def test_the_recorder_keeps_each_requests_generations(tiny_checkpoint: Path) -> None:
    from glm5_lsp.backends.local import LocalBackend
    from glm5_lsp.pipeline import Pipeline, PipelineSettings

    backend = LocalBackend(tiny_checkpoint)
    pipeline = Pipeline(backend, PipelineSettings(max_tokens=4))
    recorder = DecodeRecorder(backend.tokenizer.token_strings())
    recorder.install(pipeline)
    recorder.begin()
    assert recorder.last() is None
    pipeline.complete("count = 1\ntotal = ", len("count = 1\ntotal = "))
    generations = recorder.generations()
    assert generations and all(isinstance(g, DecodeStats) for g in generations)
    last = recorder.last()
    assert last is generations[-1] and 1 <= last.steps <= 4
    recorder.begin()
    assert recorder.last() is None


def test_a_long_generation_is_summarised_for_its_first_steps_only() -> None:
    from glm5_lsp.gate.stats import MAX_STEPS

    strings = ["a", "bb", "\n"]
    observer = StepObserver(strings, [2])
    for i in range(MAX_STEPS + 6):
        observer([1] * i, torch.tensor([0.0, 1.0, 0.0]))
    stats = observer.finish()
    assert len(stats.entropies) == len(stats.logprobs) == MAX_STEPS
    assert len(stats.chars) == MAX_STEPS + 6 and set(stats.chars) == {2}


def test_steps_are_placed_by_bisection_as_by_walking_the_tokens() -> None:
    """``steps_within``/``steps_ending_within`` read cumulative lengths (kept per list) and agree with a
    walk over the tokens, empty tokens included, and follow a list that grows."""
    import random

    def walk_within(chars: list[int], length: int) -> int:
        written = 0
        for n, size in enumerate(chars):
            if written >= length:
                return n
            written += size
        return len(chars)

    def walk_ending(chars: list[int], length: int) -> int:
        written = 0
        for n, size in enumerate(chars):
            written += size
            if written > length:
                return n
        return len(chars)

    rng = random.Random(7)
    for _ in range(300):
        stats = DecodeStats(chars=[rng.choice([0, 1, 1, 2, 3, 5]) for _ in range(rng.randrange(0, 12))])
        for _ in range(2):
            for length in range(-1, sum(stats.chars) + 3):
                assert stats.steps_within(length) == walk_within(stats.chars, length)
                assert stats.steps_ending_within(length) == walk_ending(stats.chars, length)
            stats.chars.append(rng.randrange(0, 4))  # the same list, one step longer
