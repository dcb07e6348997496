"""The tokenizer: a ``tokenizer.json`` read by the ``tokenizers`` library, with GLM's code-infilling tokens."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

EOS_TOKEN = "<|endoftext|>"
FIM_PREFIX = "<|code_prefix|>"
FIM_SUFFIX = "<|code_suffix|>"
FIM_MIDDLE = "<|code_middle|>"
SPECIAL_TOKENS = (EOS_TOKEN, FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE)


class Tokenizer:
    """Encode/decode text; knows the end-of-text and infilling token ids (None where absent)."""

    def __init__(self, tokenizer: HFTokenizer, eos_token: str = EOS_TOKEN) -> None:
        self._tok = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.eos_token_id = tokenizer.token_to_id(eos_token)
        self.fim_prefix_id = tokenizer.token_to_id(FIM_PREFIX)
        self.fim_suffix_id = tokenizer.token_to_id(FIM_SUFFIX)
        self.fim_middle_id = tokenizer.token_to_id(FIM_MIDDLE)
        self.special_ids = frozenset(
            i for i in (tok.content for tok in tokenizer.get_added_tokens_decoder().values()) for i in [tokenizer.token_to_id(i)] if i is not None
        )
        self._token_strings: list[str] | None = None

    @property
    def has_fim(self) -> bool:
        return None not in (self.fim_prefix_id, self.fim_suffix_id, self.fim_middle_id)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and each token's ``(start, end)`` character offsets into ``text``."""
        enc = self._tok.encode(text, add_special_tokens=False)
        return enc.ids, [tuple(o) for o in enc.offsets]  # type: ignore[misc]

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)

    def token_strings(self) -> list[str]:
        """Each id's own decoded text ('' for special tokens); cached."""
        if self._token_strings is None:
            self._token_strings = [
                "" if i in self.special_ids else self._tok.decode([i], skip_special_tokens=True) for i in range(self.vocab_size)
            ]
        return self._token_strings

    def fim_prompt_ids(self, prefix: str, suffix: str) -> list[int]:
        """Prefix-suffix-middle layout: ``<|code_prefix|>`` prefix ``<|code_suffix|>`` suffix ``<|code_middle|>``."""
        if not self.has_fim:
            raise ValueError("this tokenizer has no infilling tokens (<|code_prefix|>, <|code_suffix|>, <|code_middle|>)")
        return [self.fim_prefix_id, *self.encode(prefix), self.fim_suffix_id, *self.encode(suffix), self.fim_middle_id]

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        out = folder / "tokenizer.json"
        self._tok.save(str(out))
        return out


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load ``tokenizer.json`` from a file or a model folder."""
    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {file}")
    try:
        return Tokenizer(HFTokenizer.from_file(str(file)))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception subclass on malformed JSON
        raise ValueError(f"{file} is not a valid tokenizer.json: {exc}") from None
