"""Byte-level BPE for Python source, trained with the ``tokenizers`` library.

The four special tokens take the lowest ids in a fixed order (``<|endoftext|>`` = 0,
``<|code_prefix|>`` = 1, ``<|code_suffix|>`` = 2, ``<|code_middle|>`` = 3), with GLM's names, so the
runtime's infilling path is the one used with real GLM checkpoints. The 256 byte symbols are always
in the vocabulary and there is no normaliser, so every string round-trips exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

EOS = "<|endoftext|>"
FIM_PREFIX = "<|code_prefix|>"
FIM_SUFFIX = "<|code_suffix|>"
FIM_MIDDLE = "<|code_middle|>"
SPECIAL_TOKENS: tuple[str, ...] = (EOS, FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE)
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)


@dataclass(frozen=True)
class SpecialIds:
    """The ids of the special tokens."""

    eos: int
    prefix: int
    suffix: int
    middle: int


def train_tokenizer(texts: Iterable[str], vocab_size: int = 16_384, min_frequency: int = 2) -> Tokenizer:
    """Train a byte-level BPE on ``texts``; the special tokens get ids 0-3."""
    if vocab_size < MIN_VOCAB:
        raise ValueError(f"vocab_size {vocab_size} is below the {MIN_VOCAB} byte and special tokens")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    special_ids(tokenizer)  # fails loudly if the trainer did not keep the fixed layout
    return tokenizer


def special_ids(tokenizer: Tokenizer) -> SpecialIds:
    """The special tokens' ids; raises ``ValueError`` naming any that is missing."""
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    missing = [t for t, i in ids.items() if i is None]
    if missing:
        raise ValueError(f"tokenizer lacks the special tokens {missing}")
    return SpecialIds(ids[EOS], ids[FIM_PREFIX], ids[FIM_SUFFIX], ids[FIM_MIDDLE])


def token_bytes(tokenizer: Tokenizer) -> list[bytes]:
    """Each id's raw bytes (special tokens: their UTF-8 text), undoing the byte-level alphabet."""
    unicode_to_byte = {ch: b for b, ch in enumerate(_byte_alphabet())}
    specials = set(SPECIAL_TOKENS)
    out: list[bytes] = []
    for i in range(tokenizer.get_vocab_size()):
        token = tokenizer.id_to_token(i)
        if token is None:
            raise ValueError(f"tokenizer has no token with id {i}: ids are not contiguous")
        out.append(token.encode() if token in specials else bytes(unicode_to_byte[c] for c in token))
    return out


def _byte_alphabet() -> list[str]:
    """GPT-2's reversible map from the 256 byte values to printable characters (index = byte)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def save_tokenizer(tokenizer: Tokenizer, folder: Path) -> Path:
    """Write ``tokenizer.json`` into ``folder`` and return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def load_tokenizer_json(path: Path) -> Tokenizer:
    """Read a ``tokenizer.json`` (or the one in a folder) as a ``tokenizers.Tokenizer``."""
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {path}")
    return Tokenizer.from_file(str(path))
