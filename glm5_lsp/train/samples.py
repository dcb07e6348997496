"""A few greedy completions through the runtime's own ``Generator``, shown in the model card as they are."""

from __future__ import annotations

from dataclasses import dataclass

from glm5_lsp.model import GenerationConfig, Generator, GlmMoeDsaForCausalLM, Tokenizer

# (prefix, suffix): an empty suffix is left-to-right completion, otherwise fill-in-the-middle.
PROMPTS: tuple[tuple[str, str], ...] = (
    ("import os\n\n\ndef read_lines(path):\n    ", ""),
    ("class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n", ""),
    ("def is_even(n: int) -> bool:\n    return ", ""),
    ("for i in range(10):\n    if i % 2 == 0:\n", ""),
    ("def add(a, b):\n    ", "\n\n\nprint(add(1, 2))\n"),
)


@dataclass(frozen=True)
class Sample:
    prefix: str
    suffix: str
    completion: str


def greedy_samples(
    model: GlmMoeDsaForCausalLM, tokenizer: Tokenizer, max_new_tokens: int = 48
) -> list[Sample]:
    """Complete each prompt greedily (DSA attention, the default inference path)."""
    model.eval()
    out = []
    for prefix, suffix in PROMPTS:
        generator = Generator(model, tokenizer)
        ids = tokenizer.fim_prompt_ids(prefix, suffix) if suffix else tokenizer.encode(prefix)
        result = generator.generate(ids, GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0))
        out.append(Sample(prefix, suffix, result.text))
    return out
