"""The shipped default model (``glm5_lsp/weights/glm5-code-tiny``) loads through the runtime and is complete.

Skips while no model is shipped (``default_model_path`` raises ``FileNotFoundError`` then).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from glm5_lsp.model import GenerationConfig, Generator, default_model_path, load_model, load_tokenizer

SHIP_LIMIT = 64 * 1024 * 1024
SHARD_LIMIT = 15_000_000


def _folder() -> Path:
    try:
        return default_model_path()
    except FileNotFoundError:
        pytest.skip("no embedded default model is shipped yet")


def test_shipped_folder_is_complete_and_small() -> None:
    folder = _folder()
    for name in (
        "config.json",
        "tokenizer.json",
        "corpus_manifest.json",
        "MODEL_CARD.md",
        "train_log.jsonl",
        "loss_curve.png",
    ):
        assert (folder / name).is_file(), name
    shards = list(folder.glob("*.safetensors"))
    assert shards and all(p.stat().st_size <= SHARD_LIMIT for p in shards)
    assert sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) <= SHIP_LIMIT
    manifest = json.loads((folder / "corpus_manifest.json").read_text())
    assert manifest["sources"] and manifest["heldout"]
    assert not {r["package"] for r in manifest["sources"]} & {r["package"] for r in manifest["heldout"]}
    card = (folder / "MODEL_CARD.md").read_text()
    assert "perplexity, DSA" in card and "indexer recall" in card
    assert ("CPU stop-gap" in card or "CPU-trained" in card) != ("one GPU" in card)  # says which it is


def test_shipped_model_loads_and_completes() -> None:
    folder = _folder()
    torch.set_num_threads(1)
    model = load_model(folder)
    tokenizer = load_tokenizer(folder)
    assert tokenizer.has_fim and tokenizer.vocab_size == model.config.vocab_size
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.config.index_topk < model.config.max_position_embeddings
    ids = tokenizer.encode("def add(a, b):\n    return a + b\n")
    with torch.no_grad():
        logits = model(torch.tensor([ids]))
    assert logits.shape == (1, len(ids), model.config.vocab_size) and torch.isfinite(logits).all()
    result = Generator(model, tokenizer).generate(
        tokenizer.encode("import os\n\n\ndef "), GenerationConfig(max_new_tokens=8, temperature=0.0)
    )
    assert result.token_ids and result.finish_reason in ("length", "stop")
