"""Token healing's cut (``glm5_lsp.healing``): what is cut off the prompt at the cursor, and that the
cut falls where the embedded model's tokenizer begins a token, so the prompt ends as the text the
model trained on did."""

from __future__ import annotations

from pathlib import Path

import pytest

from glm5_lsp.healing import healed_text, healed_word, partial_word, space_run
from glm5_lsp.model import default_model_path, load_tokenizer


@pytest.mark.parametrize(("before", "after", "healed"), [
    ("f(a, va", ")", "va"),  # inside a word: the word
    ("x = valu", "e + 1", ""),  # the word goes on after the cursor
    ("    return ", "", " return "),  # after a space: the token before it, with its own space
    ("        total = ", "", " = "),
    ("f(a, ", "b)", ", "),
    ("def ", "", "def "),  # the line's first token has no space of its own
    ("x = self.size() ", "", "() "),
    ("x = 10 ", "", " 10 "),
    ("    ", "", ""),  # indentation only
    ("x =  ", "", ""),  # two spaces: nothing the tokenizer would have joined
    ("x = " + "a" * 40 + " ", "", ""),  # too long to be worth writing again
    ("x = self._lock ", "", "lock "),  # ``._`` is one piece for the tokenizer
    ("the model's ", "", "'s "),
    ("x = " + "y " * 300, "", " y "),  # a long line is read from near its end
    ("", "", ""),
])
def test_what_is_healed(before: str, after: str, healed: str) -> None:
    assert healed_text(before, after) == healed


def test_only_a_healed_word_is_a_word_being_typed() -> None:
    assert healed_word("va") == "va" and healed_word(" = ") == "" and healed_word("") == ""
    assert partial_word("return ", "") == "" and space_run("return va") == ""


def test_the_cut_is_where_the_tokenizer_begins_a_token() -> None:
    """Over this package's own code, at every cursor after a space: the text before the healed run
    ends a token of the line as the tokenizer reads it whole, and the run begins one (special tokens
    such as ``<|endoftext|>``, matched before the pre-tokenizer, aside)."""
    tokenizer = load_tokenizer(default_model_path())
    lines = [line for path in sorted(Path(__file__).resolve().parents[1].joinpath("glm5_lsp", "pipeline").glob("*.py"))
             for line in path.read_text(encoding="utf-8").splitlines() if line.strip() and "<|" not in line]
    checked = 0
    for line in lines:
        for column in range(1, len(line)):
            if line[column - 1] != " ":
                continue
            healed = space_run(line[:column])
            if not healed:
                continue
            cut = column - len(healed)
            _, offsets = tokenizer.encode_with_offsets(line)
            starts = {start for start, _ in offsets}
            assert cut in starts, (line, column, healed)
            checked += 1
    assert checked > 500
