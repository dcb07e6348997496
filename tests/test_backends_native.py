"""llama.cpp's ``/infill`` and Ollama's ``/api/generate`` clients against local servers in the real formats.

The fakes (``tests/native_fakes.py``) refuse a body the real server would refuse and replay the
recorded streams in ``tests/data/native/``. ``test_llamacpp_server.py`` runs the real llama.cpp
server on the exported embedded model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from native_fakes import Fake, Script, llamacpp_app, ollama_app

from glm5_lsp.backends.base import BackendError, BackendUnavailable, CompletionRequest
from glm5_lsp.backends.fim import TEMPLATES
from glm5_lsp.backends.llamacpp_infill import LlamaCppInfillBackend
from glm5_lsp.backends.ollama import OllamaBackend
from glm5_lsp.backends.served import create_native_backend
from glm5_lsp.serve_model import serve_in_thread
from glm5_lsp.spans import Prompt


class FilesPrompt(Prompt):
    """A prompt that carries other files' snippets, as ``FimInput.from_prompt`` reads them."""

    def __init__(self, prefix: str, suffix: str, path: str, files: list[tuple[str, str]]) -> None:
        super().__init__(prefix, suffix)
        self.path, self.files = path, files


@pytest.fixture()
def llama() -> Iterator[tuple[Fake, LlamaCppInfillBackend]]:
    fake = Fake()
    with serve_in_thread(llamacpp_app(fake)) as url:
        backend = LlamaCppInfillBackend(url, timeout=10, backoff=0.01)
        yield fake, backend
        backend.close()


@pytest.fixture()
def ollama() -> Iterator[tuple[Fake, str]]:
    fake = Fake(script=Script(pieces=["\n  if", " a", " == 0:"]))
    with serve_in_thread(ollama_app(fake)) as url:
        yield fake, url


def wait_for(condition, seconds: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


# ---- llama.cpp /infill ----------------------------------------------------------------------


def test_infill_sends_prefix_suffix_and_other_files_and_streams(llama: tuple[Fake, LlamaCppInfillBackend]) -> None:
    fake, backend = llama
    pieces: list[str] = []
    prompt = FilesPrompt("def add(a, b):\n    ", "\n\nprint(add(1, 2))\n", "calc.py", [("util.py", "def one():\n    return 1\n")])
    done = backend.complete(CompletionRequest(prompt, max_tokens=8, seed=3, stop=["\n\n"], on_text=pieces.append))
    assert fake.paths == ["/infill"]
    body = fake.bodies[0]
    assert body["input_prefix"] == "def add(a, b):\n    " and body["input_suffix"] == "\n\nprint(add(1, 2))\n"
    assert body["input_extra"] == [{"filename": "util.py", "text": "def one():\n    return 1\n"}]
    assert body["cache_prompt"] is True and body["stream"] is True and body["n_predict"] == 8
    assert body["seed"] == 3 and body["stop"] == ["\n\n"] and body["temperature"] == 0.0
    assert done.text == "return a + b" and "".join(pieces) == done.text and done.finish_reason == "stop"
    assert (done.prompt_tokens, done.completion_tokens, done.cached_tokens) == (14, 2, 16)  # the recorded counts


def test_a_request_without_suffix_goes_to_completion(llama: tuple[Fake, LlamaCppInfillBackend]) -> None:
    fake, backend = llama
    assert backend.complete(CompletionRequest(Prompt("def f():\n    "), max_tokens=4)).text == "return a + b"
    assert fake.paths == ["/completion"] and fake.bodies[0]["prompt"] == "def f():\n    "


def test_infill_limit_is_length_and_plain_json_answer(llama: tuple[Fake, LlamaCppInfillBackend]) -> None:
    fake, backend = llama
    fake.script.final = {"stop_type": "limit"}
    assert backend.complete(CompletionRequest(Prompt("a", "b"), max_tokens=2)).finish_reason == "length"


def test_infill_stop_strings_end_generation_even_when_the_server_ignores_them(llama: tuple[Fake, LlamaCppInfillBackend]) -> None:
    fake, backend = llama
    fake.script.pieces = ["x = 1", "<|fim_pad|>", "garbage that must not show", "more"]
    fake.script.endless = True  # only the stop string can end this stream
    backend.extra_stop = TEMPLATES["qwen2.5-coder"].stop
    pieces: list[str] = []
    started = time.monotonic()
    done = backend.complete(CompletionRequest(Prompt("a", "b"), on_text=pieces.append))
    assert done.text == "x = 1" and done.finish_reason == "stop" and "".join(pieces) == "x = 1"
    assert "<|fim_pad|>" in fake.bodies[0]["stop"] and time.monotonic() - started < 5
    assert wait_for(lambda: fake.hang_ups == 1)  # ending at the stop string closed the stream


def test_infill_cancellation_closes_the_stream(llama: tuple[Fake, LlamaCppInfillBackend]) -> None:
    fake, backend = llama
    fake.script.endless, fake.script.delay = True, 0.05
    pieces: list[str] = []
    started = time.monotonic()
    done = backend.complete(CompletionRequest(Prompt("a", "b"), on_text=pieces.append, should_cancel=lambda: len(pieces) >= 2))
    assert done.finish_reason == "cancelled" and done.text.startswith("return a + b") and time.monotonic() - started < 5
    assert wait_for(lambda: fake.hang_ups == 1)  # the server saw the connection close


def test_infill_model_without_fim_tokens_is_a_clear_error(llama: tuple[Fake, LlamaCppInfillBackend]) -> None:
    fake, backend = llama
    fake.script.error_status = 501
    fake.script.error_message = "Infill is not supported by this model: prefix token is missing. "
    with pytest.raises(BackendError, match="501.*Infill is not supported by this model"):
        backend.complete(CompletionRequest(Prompt("a", "b")))
    assert len(fake.bodies) == 1  # not retried


def test_infill_retries_a_loading_server_then_answers(llama: tuple[Fake, LlamaCppInfillBackend]) -> None:
    fake, backend = llama
    fake.script.failures = [503, 503]
    assert backend.complete(CompletionRequest(Prompt("a", "b"))).text == "return a + b"
    assert len(fake.bodies) == 3


def test_infill_error_in_the_stream_after_text_is_unavailable(llama: tuple[Fake, LlamaCppInfillBackend]) -> None:
    fake, backend = llama
    fake.script.error_after_pieces = True
    with pytest.raises(BackendUnavailable, match="stream broke"):
        backend.complete(CompletionRequest(Prompt("a", "b"), on_text=lambda piece: None))


def test_infill_deadline_on_a_silent_server(llama: tuple[Fake, LlamaCppInfillBackend]) -> None:
    """Headers and keep-alives but no text: slower than the caller's budget is a cancelled (empty)
    answer, not an outage; no text for the backend's whole timeout is one."""
    fake, backend = llama
    fake.script.pieces, fake.script.delay, fake.script.endless = [""], 0.2, True  # keep-alive only, no text
    started = time.monotonic()
    done = backend.complete(CompletionRequest(Prompt("a", "b"), deadline=time.monotonic() + 0.5))
    assert done.finish_reason == "cancelled" and done.text == "" and time.monotonic() - started < 3
    assert backend.breaker.consecutive == 0  # the server answers: nothing counted against it
    impatient = LlamaCppInfillBackend(backend.base_url, timeout=0.5, max_retries=0)
    with pytest.raises(BackendUnavailable, match=r"no text in 0\.\d+s, by the backend's deadline"):
        impatient.complete(CompletionRequest(Prompt("a", "b"), on_text=lambda piece: None))
    assert time.monotonic() - started < 5 and impatient.breaker.consecutive == 1
    impatient.close()


def test_unreachable_llamacpp_server_is_unavailable() -> None:
    backend = LlamaCppInfillBackend("http://127.0.0.1:9", timeout=2, max_retries=1, backoff=0.01)
    with pytest.raises(BackendUnavailable, match="giving up after 2 attempts"):
        backend.complete(CompletionRequest(Prompt("a", "b")))


# ---- Ollama /api/generate -------------------------------------------------------------------


def test_ollama_suffix_mode_leaves_the_layout_to_the_model_template(ollama: tuple[Fake, str]) -> None:
    fake, url = ollama
    backend = OllamaBackend(url, model="codellama:7b-code", keep_alive="10m", timeout=10)
    pieces: list[str] = []
    done = backend.complete(CompletionRequest(Prompt("def compute_gcd(a, b):", "    return result"), max_tokens=16,
                                              seed=5, on_text=pieces.append))
    body = fake.bodies[0]
    assert body["prompt"] == "def compute_gcd(a, b):" and body["suffix"] == "    return result"
    assert "raw" not in body and body["stream"] is True and body["keep_alive"] == "10m"
    assert body["options"] == {"num_predict": 16, "temperature": 0.0, "top_p": 1.0, "seed": 5}
    assert done.text == "\n  if a == 0:" and "".join(pieces) == done.text and done.finish_reason == "stop"
    assert (done.prompt_tokens, done.completion_tokens) == (17, 63)


def test_ollama_raw_mode_renders_the_family_template_with_other_files(ollama: tuple[Fake, str]) -> None:
    fake, url = ollama
    template = TEMPLATES["qwen2.5-coder"]
    fake.script.pieces = ["    return a + b\n", "<|file_sep|>", "util.py\nnever shown"]
    fake.script.endless = True
    backend = OllamaBackend(url, model="qwen2.5-coder:1.5b-base", template=template, timeout=10)
    prompt = FilesPrompt("def add(a, b):\n", "\n", "calc.py", [("util.py", "ONE = 1\n")])
    done = backend.complete(CompletionRequest(prompt, stop=["\n\n"]))
    body = fake.bodies[0]
    assert body["raw"] is True and "suffix" not in body
    assert body["prompt"] == (
        "<|repo_name|>repository\n<|file_sep|>util.py\nONE = 1\n\n<|file_sep|>calc.py\n"
        "<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\n<|fim_middle|>")
    assert body["options"]["stop"][0] == "\n\n" and "<|file_sep|>" in body["options"]["stop"]
    assert done.text == "    return a + b\n" and done.finish_reason == "stop"
    assert wait_for(lambda: fake.hang_ups == 1)


def test_ollama_plain_continuation_is_raw(ollama: tuple[Fake, str]) -> None:
    fake, url = ollama
    OllamaBackend(url, model="starcoder2:3b", timeout=10).complete(CompletionRequest(Prompt("import os\n")))
    assert fake.bodies[0]["raw"] is True and fake.bodies[0]["prompt"] == "import os\n"


def test_ollama_unknown_model_is_a_clear_error(ollama: tuple[Fake, str]) -> None:
    fake, url = ollama
    fake.script.error_status, fake.script.error_message = 404, "model 'qwen9-coder' not found, try pulling it first"
    with pytest.raises(BackendError, match="404.*model 'qwen9-coder' not found"):
        OllamaBackend(url, model="qwen9-coder", timeout=10).complete(CompletionRequest(Prompt("a", "b")))


def test_ollama_load_has_the_server_load_the_model(ollama: tuple[Fake, str]) -> None:
    """A cold Ollama model takes seconds to load, longer than an as-you-type budget: ``load`` (the
    server calls it before the first request) asks Ollama to load it, generating nothing."""
    fake, url = ollama
    backend = OllamaBackend(url, model="qwen2.5-coder:1.5b-base", keep_alive="30m", timeout=10)
    backend.load()
    assert fake.paths == ["/api/generate"]
    assert fake.bodies == [{"model": "qwen2.5-coder:1.5b-base", "stream": False, "keep_alive": "30m"}]
    assert backend.complete(CompletionRequest(Prompt("a", "b"))).text == "\n  if a == 0:"
    backend.close()


def test_ollama_load_names_a_model_the_server_lacks(ollama: tuple[Fake, str]) -> None:
    fake, url = ollama
    fake.script.error_status, fake.script.error_message = 404, "model 'qwen9-coder' not found, try pulling it first"
    backend = OllamaBackend(url, model="qwen9-coder", timeout=10)
    with pytest.raises(BackendError, match=r"no model 'qwen9-coder'.*ollama pull qwen9-coder"):
        backend.load()
    backend.close()


def test_ollama_load_leaves_a_server_that_is_not_up_to_the_first_request(caplog: pytest.LogCaptureFixture) -> None:
    backend = OllamaBackend("http://127.0.0.1:9", model="qwen2.5-coder:1.5b-base", timeout=2, max_retries=0)
    with caplog.at_level(logging.WARNING):
        backend.load()  # no exception: the editor keeps running and reports the outage per request
    assert "could not load qwen2.5-coder:1.5b-base ahead of the first request" in caplog.text
    with pytest.raises(BackendUnavailable):
        backend.complete(CompletionRequest(Prompt("a", "b")))
    backend.close()


def test_ollama_length_cancellation_and_stream_errors(ollama: tuple[Fake, str]) -> None:
    fake, url = ollama
    backend = OllamaBackend(url, model="deepseek-coder:1.3b-base", timeout=10)
    fake.script.final = {"done_reason": "length"}
    assert backend.complete(CompletionRequest(Prompt("a", "b"))).finish_reason == "length"
    fake.script.endless, fake.script.delay = True, 0.05
    pieces: list[str] = []
    done = backend.complete(CompletionRequest(Prompt("a", "b"), on_text=pieces.append, should_cancel=lambda: len(pieces) >= 2))
    assert done.finish_reason == "cancelled" and wait_for(lambda: fake.hang_ups == 1)
    fake.script.endless, fake.script.error_after_pieces = False, True
    with pytest.raises(BackendUnavailable, match="stream broke"):
        backend.complete(CompletionRequest(Prompt("a", "b"), on_text=lambda piece: None))


def test_ollama_needs_a_model_name() -> None:
    with pytest.raises(ValueError, match="model name"):
        OllamaBackend("http://127.0.0.1:11434", model="")


# ---- by name, as the factory makes them ------------------------------------------------------


def test_create_native_backend_picks_the_template_by_model_name() -> None:
    qwen = create_native_backend("ollama", model="qwen2.5-coder:1.5b-base")
    assert isinstance(qwen, OllamaBackend) and qwen.template is TEMPLATES["qwen2.5-coder"]
    assert qwen.base_url == "http://127.0.0.1:11434"
    assert create_native_backend("ollama", model="llama3.2").template is None  # unknown family: Ollama's own
    assert create_native_backend("ollama", model="qwen2.5-coder:7b", fim="server").template is None
    assert create_native_backend("ollama", model="mystery", fim="codellama").template is TEMPLATES["codellama"]
    custom = create_native_backend("ollama", model="m", fim="custom", fim_template="<A>{prefix}<B>{suffix}<C>", fim_stop=["<D>"])
    assert custom.template is not None and custom.template.stop == ("<D>",)
    llama = create_native_backend("llamacpp", "http://127.0.0.1:8080/v1", model="starcoder2-3b.gguf", timeout=3)
    assert isinstance(llama, LlamaCppInfillBackend) and "<file_sep>" in llama.extra_stop
    assert llama.base_url == "http://127.0.0.1:8080" and llama.timeout == 3
    with pytest.raises(ValueError, match="unknown native backend"):
        create_native_backend("tgi")
    with pytest.raises(ValueError, match="fimTemplate"):
        create_native_backend("ollama", model="m", fim="custom")
