"""A real engine: the embedded model exported to GGUF and served by llama.cpp's ``llama-server``.

Checks that llama.cpp's ``glm-dsa`` runs this project's model as this runtime does (greedy text
equal on the same prompt), that the editor's completion works through ``/infill``
(``LlamaCppInfillBackend``) and through ``/v1/completions`` (the ``openai`` backend), and that
cancelling closes llama.cpp's stream. Needs the ``llama-server`` binary (``tests/llama_server.py``
says where it is looked for; ``scripts/build_llama_server.sh`` builds it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from llama_server import find_llama_server, llama_server

from glm5_lsp.backends.base import CompletionRequest
from glm5_lsp.backends.llamacpp_infill import LlamaCppInfillBackend
from glm5_lsp.backends.openai_http import OpenAIHTTPBackend
from glm5_lsp.gguf_export import export
from glm5_lsp.model import GenerationConfig, Generator, default_model_path, load_model, load_tokenizer
from glm5_lsp.pipeline import Pipeline
from glm5_lsp.spans import Prompt

pytestmark = pytest.mark.slow

BINARY = find_llama_server()
PREFIX = "import os\n\n\ndef read_lines(path):\n    with open(path) as handle:\n        return "
SUFFIX = "\n\n\ndef count(path):\n    return len(read_lines(path))\n"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if BINARY is None:
        pytest.skip("no llama-server: set $GLM5_LLAMA_SERVER, put it on PATH, or run scripts/build_llama_server.sh")
    folder = tmp_path_factory.mktemp("gguf")
    gguf = export(default_model_path(), folder / "glm5-code-tiny.gguf")
    with llama_server(BINARY, gguf, log=folder / "server.log") as url:
        yield url


def ours(prefix: str, suffix: str, tokens: int) -> str:
    path = default_model_path()
    tokenizer = load_tokenizer(path)
    generator = Generator(load_model(path).eval(), tokenizer)
    return generator.generate(tokenizer.fim_prompt_ids(prefix, suffix), GenerationConfig(max_new_tokens=tokens)).text


def test_llamacpp_infill_writes_what_our_runtime_writes(served: str) -> None:
    backend = LlamaCppInfillBackend(served, timeout=60)
    done = backend.complete(CompletionRequest(Prompt(PREFIX, SUFFIX), max_tokens=24, temperature=0.0))
    assert done.text and done.prompt_tokens > 20 and done.completion_tokens > 0
    assert done.text == ours(PREFIX, SUFFIX, done.completion_tokens)


def test_editor_completion_through_infill_and_v1_completions(served: str) -> None:
    document, offset = PREFIX + SUFFIX, len(PREFIX)
    infill = Pipeline(LlamaCppInfillBackend(served, timeout=60)).complete(document, offset)
    openai = Pipeline(OpenAIHTTPBackend(served + "/v1", "glm5-code-tiny", timeout=60)).complete(document, offset)
    assert infill.prompt_tokens > 0 and openai.prompt_tokens > 0
    # One model, one greedy decoder, one prompt layout (llama.cpp's /infill builds the GLM tokens the
    # openai backend sends as text): the same answer either way.
    assert infill.text == openai.text and infill.clean == openai.clean


def test_cancelling_closes_llamacpp_stream(served: str) -> None:
    backend = LlamaCppInfillBackend(served, timeout=60)
    plain = backend.request_body
    backend.request_body = lambda request: (plain(request)[0], {**plain(request)[1], "ignore_eos": True})  # type: ignore[method-assign]
    pieces: list[str] = []
    done = backend.complete(CompletionRequest(Prompt(PREFIX, SUFFIX), max_tokens=3000, on_text=pieces.append,
                                              should_cancel=lambda: len(pieces) >= 3))
    assert done.finish_reason == "cancelled" and len(pieces) >= 3
    # 3,000 tokens would keep the slot busy for many seconds; the closed stream stopped it.
    deadline = time.monotonic() + 3
    while httpx.get(served + "/slots", timeout=10).json()[0]["is_processing"]:
        assert time.monotonic() < deadline, "llama-server kept generating after the stream was closed"
        time.sleep(0.05)
    again = backend.complete(CompletionRequest(Prompt(PREFIX, SUFFIX), max_tokens=4))
    assert again.completion_tokens > 0


def test_recorded_stream_shape_is_llamacpp_s(served: str) -> None:
    """The fakes replay ``tests/data/native/llamacpp_infill_stream.txt``; the real stream has its fields."""
    fields = set()
    with httpx.stream("POST", served + "/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 4,
                                                         "stream": True}, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                fields.add(frozenset(json.loads(line[6:])))
    recorded = Path(__file__).parent / "data" / "native" / "llamacpp_infill_stream.txt"
    expected = {frozenset(json.loads(line[6:])) for line in recorded.read_text().splitlines() if line.startswith("data: ")}
    assert expected <= fields, (expected - fields, fields)
