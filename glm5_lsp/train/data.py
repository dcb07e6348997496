"""From documents to batches: chunking, FIM, tokenisation, packing, deterministic shuffling.

Documents are shuffled with the seed. A document drawn for fill-in-the-middle (``fim.py``) is cut
at line boundaries into chunks of at most ``chunk_chars``, each its own infilling example (so one
mostly fits a training sequence); any other document stays whole, one ``text <|endoftext|>``, so
long files keep their long-range context. Everything is tokenised in parallel batches, joined into one stream and cut into rows of ``seq_len + 1`` tokens
(inputs and the targets shifted by one). Batches are drawn by step number from a per-epoch
permutation, so a run is reproducible and resumable from its step alone.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from glm5_lsp.train.fim import FimConfig, FimPlan, assemble, plan_fim
from glm5_lsp.train.tokenizer import special_ids


def chunk_text(text: str, max_chars: int) -> list[str]:
    """Cut ``text`` into pieces of at most ``max_chars`` at line ends (an overlong line is cut anywhere)."""
    if max_chars <= 0:
        raise ValueError(f"max_chars must be positive, got {max_chars}")
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for line in text.splitlines(keepends=True):
        while len(line) > max_chars:
            if current:
                chunks.append("".join(current))
                current, size = [], 0
            chunks.append(line[:max_chars])
            line = line[max_chars:]
        if size + len(line) > max_chars and current:
            chunks.append("".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line)
    if current:
        chunks.append("".join(current))
    return chunks


def encode_documents(
    texts: Iterable[str],
    tokenizer: Tokenizer,
    fim: FimConfig,
    seed: int,
    chunk_chars: int,
    batch_docs: int = 512,
) -> np.ndarray:
    """Tokenise documents into one stream of ids (order and FIM decisions fixed by ``seed``).

    Special-token text inside a document (``"<|endoftext|>"`` in a string literal) is encoded as
    plain text, never as the special token.
    """
    special = special_ids(tokenizer)
    rng = random.Random(seed)
    docs = list(texts)
    rng.shuffle(docs)
    plans: list[FimPlan] = []
    for doc in docs:
        if not doc.strip():
            continue
        if rng.random() < fim.rate:
            plans.extend(plan_fim(chunk, fim, rng) for chunk in chunk_text(doc, chunk_chars) if chunk.strip())
        else:
            plans.append(FimPlan("plain", (doc,)))
    previous = tokenizer.encode_special_tokens
    tokenizer.encode_special_tokens = True
    try:
        parts: list[np.ndarray] = []
        for start in range(0, len(plans), batch_docs):
            group = plans[start : start + batch_docs]
            pieces = [piece for plan in group for piece in plan.pieces]
            encoded = [e.ids for e in tokenizer.encode_batch(pieces, add_special_tokens=False)]
            cursor = 0
            for plan in group:
                n = len(plan.pieces)
                parts.append(
                    np.asarray(assemble(plan, encoded[cursor : cursor + n], special), dtype=np.int32)
                )
                cursor += n
    finally:
        tokenizer.encode_special_tokens = previous
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def pack(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """Cut a token stream into rows of ``seq_len + 1`` (the tail that does not fill a row is dropped)."""
    rows = len(stream) // (seq_len + 1)
    return np.ascontiguousarray(stream[: rows * (seq_len + 1)].reshape(rows, seq_len + 1))


@dataclass(frozen=True)
class Batches:
    """Packed rows served as batches: step ``s`` always gets the same rows for a given seed."""

    rows: np.ndarray  # [N, seq_len + 1] int32
    batch_size: int
    seed: int = 0

    def __post_init__(self) -> None:
        if len(self.rows) < self.batch_size:
            raise ValueError(
                f"only {len(self.rows)} packed sequences for a batch of {self.batch_size}: more data or a smaller batch"
            )

    @property
    def steps_per_epoch(self) -> int:
        return len(self.rows) // self.batch_size

    def batch(self, step: int) -> np.ndarray:
        """The rows of one step: ``[batch_size, seq_len + 1]``."""
        epoch, index = divmod(step, self.steps_per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))
        picked = order[index * self.batch_size : (index + 1) * self.batch_size]
        return self.rows[np.sort(picked)]

    def __iter__(self) -> Iterator[np.ndarray]:
        step = 0
        while True:
            yield self.batch(step)
            step += 1
