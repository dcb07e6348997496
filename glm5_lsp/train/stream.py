"""The whole corpus as a stream of batches that a run can stop and resume anywhere, across sessions.

Continued training reads far more than fits a sample: every permissively licensed file, in an order
fixed by the seed. Each document gets a key, a hash of (seed, epoch, content digest); an epoch reads
the documents in key order, in *shards* of about ``shard_bytes`` of text. A shard is tokenised on its
own (``data.encode_documents``, with FIM decided from the shard's own seed), cut into rows, the rows
permuted, and served as batches.

A position is ``(epoch, shard_start, batch)``: the key after which the shard's documents start, and
how many of its batches were used. That is all a checkpoint needs to put the stream back where it
was, and all the shipped model needs to record so that the next session reads documents it has not
seen: a document added to the machine later, with a key below the position, waits for the next
epoch. The document list itself is written into the run folder once, so a resumed run reads exactly
what an uninterrupted one would have.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from glm5_lsp.train.data import encode_documents, pack
from glm5_lsp.train.fim import FimConfig

log = logging.getLogger(__name__)


def doc_key(seed: int, epoch: int, digest: str) -> int:
    """A document's place in an epoch's order: 64 bits of a hash, so orders differ by seed and epoch."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{epoch}:{digest}".encode()).digest()[:8], "big")


@dataclass(frozen=True)
class StreamDoc:
    """One training file as the stream knows it (a ``corpus.Document`` without the licence detail)."""

    package: str
    relpath: str
    path: str
    digest: str
    size: int


@dataclass(frozen=True)
class Position:
    """Where the stream stands: the next batch is batch ``batch`` of the shard after ``shard_start``."""

    epoch: int = 0
    shard_start: int = -1  # keys are >= 0: -1 starts the epoch at its first document
    batch: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Position:
        try:
            return cls(int(data["epoch"]), int(data["shard_start"]), int(data["batch"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a stream position: {data!r} ({exc})") from None


@dataclass
class Shard:
    epoch: int
    start: int  # the key after which its documents begin
    end: int  # the key of its last document: the next shard's start
    rows: np.ndarray  # [N, seq_len + 1], already permuted
    batches: int
    documents: int
    last_of_epoch: bool


class CorpusStream:
    """Batches of ``[batch_size, seq_len + 1]`` token rows over ``docs``, resumable from a :class:`Position`."""

    def __init__(
        self,
        docs: list[StreamDoc],
        tokenizer: Tokenizer,
        *,
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        fim: FimConfig | None = None,
        shard_bytes: int = 2_000_000,
    ) -> None:
        if not docs:
            raise ValueError("the corpus stream has no documents")
        if shard_bytes <= 0 or seq_len <= 0 or batch_size <= 0:
            raise ValueError("shard_bytes, seq_len and batch_size must be positive")
        self.docs = docs
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.fim = fim or FimConfig()
        self.shard_bytes = shard_bytes
        self._orders: dict[int, list[tuple[int, StreamDoc]]] = {}

    def order(self, epoch: int) -> list[tuple[int, StreamDoc]]:
        if epoch not in self._orders:
            self._orders = {epoch: sorted(((doc_key(self.seed, epoch, d.digest), d) for d in self.docs),
                                          key=lambda kd: kd[0])}
        return self._orders[epoch]

    def _keys(self, epoch: int) -> list[int]:
        return [k for k, _ in self.order(epoch)]

    def shard(self, epoch: int, start: int) -> Shard:
        """The shard of ``epoch`` whose documents have keys after ``start`` (tokenised now)."""
        order = self.order(epoch)
        i = bisect.bisect_right(self._keys(epoch), start)
        picked: list[StreamDoc] = []
        texts: list[str] = []
        size = 0
        end = start
        while i < len(order) and (size < self.shard_bytes or not texts):
            key, doc = order[i]
            i += 1
            end = key
            text = _read(doc)
            if text is None:
                continue
            picked.append(doc)
            texts.append(text)
            size += len(text)
        shard_seed = doc_key(self.seed, epoch, f"shard:{start}") % (2**31)
        stream = encode_documents(texts, self.tokenizer, self.fim, shard_seed, chunk_chars=self.seq_len * 3)
        rows = pack(stream, self.seq_len)
        rows = rows[np.random.default_rng(shard_seed).permutation(len(rows))]
        return Shard(epoch, start, end, rows, len(rows) // self.batch_size, len(picked), i >= len(order))

    def batches(self, position: Position) -> Iterator[tuple[np.ndarray, Position]]:
        """Each batch and the position right after it (what a checkpoint taken then records)."""
        epoch, start, skip = position.epoch, position.shard_start, position.batch
        empty_shards = 0
        while True:
            shard = self.shard(epoch, start)
            empty_shards = 0 if shard.batches else empty_shards + 1
            if empty_shards > len(self.docs):
                raise ValueError(f"the corpus gives no batch of {self.batch_size} rows of {self.seq_len + 1} tokens")
            for b in range(skip, shard.batches):
                rows = shard.rows[b * self.batch_size : (b + 1) * self.batch_size]
                after = Position(epoch, start, b + 1)
                if b + 1 == shard.batches:  # the shard is used up: the next one starts after its end
                    after = Position(epoch + 1, -1, 0) if shard.last_of_epoch else Position(epoch, shard.end, 0)
                yield rows, after
            skip = 0
            if shard.last_of_epoch:
                epoch, start = epoch + 1, -1
            else:
                start = shard.end


def _read(doc: StreamDoc) -> str | None:
    """The file's text, or None (with a log line) where it is gone or changed since the run began."""
    try:
        text = Path(doc.path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("corpus file %s is unreadable now (%s); skipped", doc.path, exc)
        return None
    digest = hashlib.sha256(text.replace("\r\n", "\n").encode("utf-8")).hexdigest()
    if digest != doc.digest:
        log.warning("corpus file %s changed since the run began; skipped", doc.path)
        return None
    return text


def save_docs(docs: list[StreamDoc], path: Path) -> None:
    path.write_text(json.dumps([asdict(d) for d in docs]) + "\n", encoding="utf-8")


def load_docs(path: Path) -> list[StreamDoc]:
    try:
        return [StreamDoc(**row) for row in json.loads(path.read_text(encoding="utf-8"))]
    except (OSError, json.JSONDecodeError, TypeError) as exc:
        raise ValueError(f"{path}: not a corpus document list ({exc})") from None
