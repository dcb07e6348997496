"""Generation: greedy equals step-by-step argmax, sampling is seeded, stop strings, streaming, cancellation.

The ``glm5-lsp generate`` command is tested in ``test_generate_cli.py``.
"""

from __future__ import annotations

import pytest
import torch

from glm5_lsp.model import GenerationConfig, Generator, load_model, load_tokenizer

PROMPT = "def add(a, b):\n    return"


@pytest.fixture(scope="module")
def gen(tiny_checkpoint):
    return Generator(load_model(tiny_checkpoint), load_tokenizer(tiny_checkpoint))


def test_greedy_is_argmax_of_full_forward(gen) -> None:
    ids = gen.tokenizer.encode(PROMPT)
    out = gen.generate(ids, GenerationConfig(max_new_tokens=6, stop_at_eos=False))
    seq = list(ids)
    with torch.no_grad():
        for _ in range(6):
            seq.append(int(gen.model(torch.tensor([seq]))[0, -1].argmax()))
    assert out.token_ids == seq[len(ids) :]
    assert out.finish_reason == "length" and out.prompt_tokens == len(ids)


def test_sampling_is_reproducible_with_a_seed(gen) -> None:
    ids = gen.tokenizer.encode(PROMPT)
    cfg = GenerationConfig(max_new_tokens=8, temperature=1.0, top_p=0.9, seed=11, stop_at_eos=False)
    a = gen.generate(ids, cfg).token_ids
    b = gen.generate(ids, cfg).token_ids
    c = gen.generate(ids, GenerationConfig(max_new_tokens=8, temperature=1.0, seed=12, stop_at_eos=False)).token_ids
    assert a == b and a != c


def test_stop_string_cuts_and_streaming_matches(gen) -> None:
    ids = gen.tokenizer.encode(PROMPT)
    free = gen.generate(ids, GenerationConfig(max_new_tokens=12, stop_at_eos=False)).text
    stop = free[3:5]
    assert stop, "the tiny model produced too little text to test stop strings"
    pieces: list[str] = []
    out = gen.generate(ids, GenerationConfig(max_new_tokens=12, stop=[stop], stop_at_eos=False), on_text=pieces.append)
    assert out.finish_reason == "stop"
    assert out.text == free[: free.find(stop)]
    assert "".join(pieces) == out.text


def test_cancellation_between_tokens(gen) -> None:
    calls = iter(range(100))
    out = gen.generate(
        gen.tokenizer.encode(PROMPT),
        GenerationConfig(max_new_tokens=50, stop_at_eos=False),
        should_cancel=lambda: next(calls) >= 3,
    )
    assert out.finish_reason == "cancelled" and len(out.token_ids) == 3


class Scripted:
    """A logits processor that makes the model write ``pieces`` (one token each), giving the i-th
    the probability ``probs[i]`` and spreading the rest evenly over the vocabulary."""

    def __init__(self, tokenizer, pieces: list[str], probs: list[float]) -> None:
        strings = tokenizer.token_strings()
        self.ids = [strings.index(piece) for piece in pieces]
        self.probs = probs

    def __call__(self, out, scores: torch.Tensor) -> torch.Tensor:
        i = len(out)
        p = self.probs[i]
        rest = (1 - p) / (scores.numel() - 1)
        scores = torch.full_like(scores, float(torch.log(torch.tensor(rest))))
        scores[self.ids[i]] = float(torch.log(torch.tensor(p)))
        return scores


@pytest.mark.parametrize(
    ("pieces", "probs", "text", "finish"),
    [
        # unsure inside the first word: no stopping point yet; at 'x' it cuts back to where 'ab' ended
        ("ab(xy", [0.9, 0.05, 0.9, 0.05, 0.9], "ab", "unsure"),
        ("ab(xy", [0.9, 0.9, 0.9, 0.9, 0.05], "ab", "unsure"),  # never after an opener, nor inside 'xy'
        ("ab(xy", [0.9, 0.9, 0.05, 0.9, 0.9], "ab", "unsure"),  # '(' is unsure and 'ab' a finished word
        ("a(b)x", [0.9, 0.9, 0.9, 0.9, 0.05], "a(b)", "unsure"),  # a closed bracket is a stopping point
        ("ab(xy", [0.05, 0.05, 0.9, 0.9, 0.9], "ab(xy", "length"),  # no word ends where it is unsure
    ],
)
def test_an_unsure_token_cuts_the_text_back_to_its_last_stopping_point(gen, pieces, probs, text, finish) -> None:
    ids = gen.tokenizer.encode(PROMPT)
    streamed: list[str] = []
    config = GenerationConfig(max_new_tokens=5, stop_at_eos=False, min_token_prob=0.1)
    script = Scripted(gen.tokenizer, list(pieces), probs)
    out = gen.generate(ids, config, logits_processor=script, on_text=streamed.append)
    assert (out.text, out.finish_reason) == (text, finish)
    assert "".join(streamed) == out.text and gen.tokenizer.decode(out.token_ids) == out.text
    off = gen.generate(ids, GenerationConfig(max_new_tokens=5, stop_at_eos=False),
                       logits_processor=Scripted(gen.tokenizer, list(pieces), probs))
    assert (off.text, off.finish_reason) == (pieces, "length")


def test_bad_generation_settings() -> None:
    with pytest.raises(ValueError, match="top_p"):
        GenerationConfig(top_p=0)
    with pytest.raises(ValueError, match="temperature"):
        GenerationConfig(temperature=-1)
    with pytest.raises(ValueError, match="min_token_prob"):
        GenerationConfig(min_token_prob=1.0)
