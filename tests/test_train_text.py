"""Tokenizer (round trip on any text and bytes, special tokens), FIM layouts, chunking and packing.

Training text: the fixture sources under ``tests/data/train/``.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from glm5_lsp.train.data import Batches, chunk_text, encode_documents, pack
from glm5_lsp.train.fim import FimConfig, document_ids, plan_document, psm_ids, split_points, spm_ids
from glm5_lsp.train.tokenizer import (
    SPECIAL_TOKENS,
    SpecialIds,
    load_tokenizer_json,
    save_tokenizer,
    special_ids,
    token_bytes,
    train_tokenizer,
)

DATA = Path(__file__).parent / "data" / "train"


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [p.read_text(encoding="utf-8") for p in sorted(DATA.rglob("*.py"))]


@pytest.fixture(scope="module")
def tokenizer(texts: list[str]):
    return train_tokenizer(texts * 4, vocab_size=400, min_frequency=1)


def _random_text(rng: random.Random, n: int) -> str:
    """Any code points but lone surrogates (which no UTF-8 text can hold)."""
    out = []
    for _ in range(n):
        pick = rng.random()
        if pick < 0.5:
            out.append(chr(rng.randint(0, 0x7F)))
        elif pick < 0.8:
            out.append(chr(rng.randint(0x80, 0xD7FF)))
        else:
            out.append(chr(rng.choice([rng.randint(0xE000, 0xFFFF), rng.randint(0x10000, 0x10FFFF)])))
    return "".join(out)


def test_special_tokens_have_fixed_low_ids(tokenizer) -> None:
    assert special_ids(tokenizer) == SpecialIds(eos=0, prefix=1, suffix=2, middle=3)
    assert [tokenizer.id_to_token(i) for i in range(4)] == list(SPECIAL_TOKENS)
    assert tokenizer.get_vocab_size() == 400


def test_round_trip_random_unicode(tokenizer) -> None:
    rng = random.Random(0)
    table = token_bytes(tokenizer)
    for _ in range(200):
        text = _random_text(rng, rng.randint(0, 80))
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        assert tokenizer.decode(ids, skip_special_tokens=False) == text
        assert b"".join(table[i] for i in ids) == text.encode("utf-8")


def test_every_byte_sequence_is_representable(tokenizer) -> None:
    """Any bytes, valid UTF-8 or not, map to single-byte tokens whose bytes join back exactly."""
    table = token_bytes(tokenizer)
    by_bytes = {b: i for i, b in enumerate(table)}
    assert all(bytes([b]) in by_bytes for b in range(256))
    rng = random.Random(1)
    for _ in range(50):
        raw = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        ids = [by_bytes[bytes([b])] for b in raw]
        assert b"".join(table[i] for i in ids) == raw


def test_save_and_load(tokenizer, tmp_path: Path) -> None:
    path = save_tokenizer(tokenizer, tmp_path)
    again = load_tokenizer_json(tmp_path)
    assert path.name == "tokenizer.json"
    text = "def f(x):\n    return x  # naïve ✓\n"
    assert again.encode(text).ids == tokenizer.encode(text).ids
    with pytest.raises(FileNotFoundError):
        load_tokenizer_json(tmp_path / "nowhere")


def test_vocab_below_bytes_refused() -> None:
    with pytest.raises(ValueError, match="byte and special"):
        train_tokenizer(["x"], vocab_size=100)


SPECIAL = SpecialIds(eos=0, prefix=1, suffix=2, middle=3)


def test_psm_matches_runtime_prompt_layout() -> None:
    # fim_prompt_ids(prefix, suffix) = <|code_prefix|> prefix <|code_suffix|> suffix <|code_middle|>
    assert psm_ids([10, 11], [20], [30, 31], SPECIAL) == [1, 10, 11, 2, 20, 3, 30, 31, 0]
    assert spm_ids([10, 11], [20], [30, 31], SPECIAL) == [1, 2, 20, 3, 10, 11, 30, 31, 0]


def test_line_level_splits_fall_on_line_starts() -> None:
    text = "a = 1\nb = 2\nc = 3\n"
    rng = random.Random(0)
    for _ in range(50):
        a, b = split_points(text, rng, line_level=True)
        assert a <= b and all(i == 0 or i == len(text) or text[i - 1] == "\n" for i in (a, b))


def test_fim_rate_and_layouts_cover_the_document() -> None:
    text = "def f(x):\n    y = x + 1\n    return y\n"
    rng = random.Random(0)
    plans = [plan_document(text, FimConfig(rate=0.5), rng) for _ in range(400)]
    share = sum(p.layout != "plain" for p in plans) / len(plans)
    assert 0.4 < share < 0.6
    assert {p.layout for p in plans} == {"plain", "psm", "spm"}
    for plan in plans:
        assert (
            "".join(plan.pieces) == text
            if plan.layout == "plain"
            else plan.pieces[0] + plan.pieces[1] + plan.pieces[2] == text
        )
    encode = lambda s: [ord(c) + 10 for c in s]
    ids = document_ids(text, encode, SPECIAL, FimConfig(rate=1.0, spm_rate=0.0), random.Random(5))
    assert ids[0] == 1 and ids[-1] == 0 and ids.count(2) == 1 and ids.count(3) == 1
    prefix, rest = ids[1 : ids.index(2)], ids[ids.index(2) + 1 : -1]
    suffix, middle = rest[: rest.index(3)], rest[rest.index(3) + 1 :]
    decode = lambda xs: "".join(chr(i - 10) for i in xs)
    assert decode(prefix) + decode(middle) + decode(suffix) == text


def test_bad_fim_config_refused() -> None:
    with pytest.raises(ValueError, match="rate"):
        FimConfig(rate=1.5)


def test_chunk_text_keeps_lines_and_bound() -> None:
    text = "".join(f"line {i}\n" for i in range(100)) + "x" * 50
    chunks = chunk_text(text, 40)
    assert "".join(chunks) == text and all(len(c) <= 40 for c in chunks)
    assert all(c.endswith("\n") for c in chunks[:-2])


def test_encode_documents_is_deterministic_and_keeps_special_text_plain(tokenizer, texts: list[str]) -> None:
    docs = texts + ['MARK = "<|endoftext|>"\n']
    a = encode_documents(docs, tokenizer, FimConfig(rate=0.5), seed=7, chunk_chars=120)
    b = encode_documents(docs, tokenizer, FimConfig(rate=0.5), seed=7, chunk_chars=120)
    c = encode_documents(docs, tokenizer, FimConfig(rate=0.5), seed=8, chunk_chars=120)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    plain = encode_documents(docs, tokenizer, FimConfig(rate=0.0), seed=7, chunk_chars=10)
    assert int((plain == 0).sum()) == len(
        [d for d in docs if d.strip()]
    )  # one <|endoftext|> per document: plain ones are never cut
    assert not tokenizer.encode_special_tokens


def test_pack_and_batches() -> None:
    stream = np.arange(103, dtype=np.int32)
    rows = pack(stream, seq_len=9)
    assert rows.shape == (10, 10) and rows[1, 0] == 10
    batches = Batches(rows, batch_size=3, seed=1)
    assert batches.steps_per_epoch == 3
    assert np.array_equal(batches.batch(4), Batches(rows, 3, seed=1).batch(4))
    epoch = np.concatenate([batches.batch(s) for s in range(3)])
    assert len({int(r[0]) for r in epoch}) == 9  # no row twice within an epoch
    with pytest.raises(ValueError, match="packed sequences"):
        Batches(rows[:2], batch_size=3)


def test_fim_documents_become_one_example_per_chunk(tokenizer) -> None:
    doc = "".join(f"value_{i} = {i}\n" for i in range(40))
    ids = encode_documents([doc], tokenizer, FimConfig(rate=1.0), seed=0, chunk_chars=100)
    assert int((ids == 0).sum()) == len(chunk_text(doc, 100)) > 1  # each chunk ends in <|endoftext|>
    assert int((ids == 3).sum()) == len(chunk_text(doc, 100))  # and has one <|code_middle|>
