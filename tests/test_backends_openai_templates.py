"""The ``openai`` backend sends each family's infilling prompt and stop strings (``backends/fim.py``) to
``/v1/completions``, against a local vLLM stand-in that checks the body and streams in vLLM's
format (``tests/native_fakes.py``); chat stays chat. And the factory makes every backend by name.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator

import pytest
from native_fakes import Fake, Script, vllm_app

from glm5_lsp.backends.base import BackendError, CompletionRequest
from glm5_lsp.backends.factory import (
    KINDS,
    add_backend_arguments,
    backend_from_args,
    backend_spec,
    create_backend,
)
from glm5_lsp.backends.fim import TEMPLATES
from glm5_lsp.backends.llamacpp_infill import LlamaCppInfillBackend
from glm5_lsp.backends.ollama import OllamaBackend
from glm5_lsp.backends.openai_http import OpenAIHTTPBackend
from glm5_lsp.serve_model import create_app, serve_in_thread
from glm5_lsp.spans import Prompt

QWEN = "Qwen/Qwen2.5-Coder-1.5B"


class FilesPrompt(Prompt):
    """A prompt that carries other files' snippets, as ``FimInput.from_prompt`` reads them."""

    def __init__(self, prefix: str, suffix: str, path: str, files: list[tuple[str, str]]) -> None:
        super().__init__(prefix, suffix)
        self.path, self.files = path, files


@pytest.fixture()
def vllm() -> Iterator[tuple[Fake, str]]:
    fake = Fake(script=Script(pieces=["    return", " a + b"]))
    with serve_in_thread(vllm_app(fake)) as url:
        yield fake, url


def wait_for(condition, seconds: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_a_qwen_model_gets_qwens_repository_prompt_and_stops(vllm: tuple[Fake, str]) -> None:
    fake, url = vllm
    backend = OpenAIHTTPBackend(url + "/v1", QWEN, timeout=10)
    pieces: list[str] = []
    prompt = FilesPrompt("def add(a, b):\n", "\n\nprint(add(1, 2))\n", "calc.py", [("util.py", "ONE = 1\n")])
    done = backend.complete(CompletionRequest(prompt, max_tokens=16, stop=["\n\n"], on_text=pieces.append))
    body = fake.bodies[0]
    assert fake.paths == ["/v1/completions"] and "suffix" not in body and body["model"] == QWEN
    assert body["prompt"] == ("<|repo_name|>repository\n<|file_sep|>util.py\nONE = 1\n\n<|file_sep|>calc.py\n"
                              "<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\n\nprint(add(1, 2))\n<|fim_middle|>")
    assert body["stop"] == ["\n\n", *TEMPLATES["qwen2.5-coder"].stop]  # the request's first, then the family's
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True} and body["max_tokens"] == 16
    assert done.text == "    return a + b" and "".join(pieces) == done.text and done.finish_reason == "stop"
    assert (done.prompt_tokens, done.completion_tokens, done.cached_tokens) == (31, 5, 16)  # vLLM's usage chunk


def test_a_family_token_the_server_does_not_stop_at_ends_generation(vllm: tuple[Fake, str]) -> None:
    fake, url = vllm
    fake.script.pieces = ["x = 1", "<|file_sep|>", "other.py\nnever shown"]
    fake.script.endless = True  # only the stop string can end this stream
    pieces: list[str] = []
    done = OpenAIHTTPBackend(url, QWEN, timeout=10).complete(CompletionRequest(Prompt("a", "b"), on_text=pieces.append))
    assert done.text == "x = 1" and "".join(pieces) == "x = 1" and done.finish_reason == "stop"
    assert wait_for(lambda: fake.hang_ups == 1)  # the stream was closed at the stop string


def test_each_family_and_a_custom_template_reach_the_server(vllm: tuple[Fake, str]) -> None:
    fake, url = vllm
    prompt = Prompt("def f(x):\n    ", "\n")
    for name, family in [("deepseek-ai/deepseek-coder-1.3b-base", "deepseek-coder"), ("bigcode/starcoder2-3b", "starcoder2"),
                         ("codellama/CodeLlama-7b-hf", "codellama"), ("mistralai/Codestral-22B-v0.1", "codestral")]:
        fake.bodies.clear()
        with serve_in_thread(vllm_app(fake, served=name)) as served:
            OpenAIHTTPBackend(served, name, timeout=10).complete(CompletionRequest(prompt, max_tokens=4))
        assert fake.bodies[0]["prompt"] == TEMPLATES[family].prompt(prompt.prefix, prompt.suffix), name
        assert fake.bodies[0]["stop"] == list(TEMPLATES[family].stop) and fake.bodies[0]["stream"] is False
    fake.bodies.clear()
    forced = OpenAIHTTPBackend(url, QWEN, fim="starcoder", timeout=10)  # the setting wins over the name
    forced.complete(CompletionRequest(prompt, max_tokens=4))
    assert fake.bodies[-1]["prompt"] == "<fim_prefix>def f(x):\n    <fim_suffix>\n<fim_middle>"
    custom = OpenAIHTTPBackend(url, QWEN, fim="custom", fim_template="<A>{prefix}<B>{suffix}<C>", fim_stop=["<D>"], timeout=10)
    custom.complete(CompletionRequest(prompt, max_tokens=4, stop=["\n\n"]))
    assert fake.bodies[-1]["prompt"] == "<A>def f(x):\n    <B>\n<C>" and fake.bodies[-1]["stop"] == ["\n\n", "<D>"]
    plain = OpenAIHTTPBackend(url, QWEN, timeout=10)
    plain.complete(CompletionRequest(Prompt("import os\n"), max_tokens=4, stop=["\n\n"]))
    assert fake.bodies[-1]["prompt"] == "import os\n" and fake.bodies[-1]["stop"] == ["\n\n"]  # no hole, no template
    OpenAIHTTPBackend(url, QWEN, fim=False, timeout=10).complete(CompletionRequest(prompt, max_tokens=4))
    assert fake.bodies[-1]["prompt"] == "def f(x):\n    " and "stop" not in fake.bodies[-1]


def test_server_mode_sends_the_suffix_field_which_vllm_refuses_and_serve_model_takes(vllm: tuple[Fake, str]) -> None:
    fake, url = vllm
    with pytest.raises(BackendError, match="400.*suffix is not currently supported"):
        OpenAIHTTPBackend(url, QWEN, fim="server", timeout=10).complete(CompletionRequest(Prompt("a = (", ")\n")))
    assert fake.bodies[0]["prompt"] == "a = (" and fake.bodies[0]["suffix"] == ")\n"
    seen: list[Prompt] = []

    class Recording:
        name, supports_internals = "recording", False

        def complete(self, request: CompletionRequest):  # type: ignore[no-untyped-def]
            from glm5_lsp.backends.base import Completion

            seen.append(request.prompt)
            return Completion(text="1", finish_reason="stop")

    with serve_in_thread(create_app(Recording(), "glm5-code-tiny")) as served:
        done = OpenAIHTTPBackend(served, "glm5-code-tiny", fim="server", timeout=10).complete(
            CompletionRequest(Prompt("a = (", ")\n")))
    assert done.text == "1" and (seen[0].prefix, seen[0].suffix) == ("a = (", ")\n")


def test_chat_stays_chat_whatever_the_family(vllm: tuple[Fake, str]) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    bodies: list[dict] = []

    async def chat(request: Request) -> JSONResponse:
        bodies.append(json.loads(await request.body()))
        return JSONResponse({"choices": [{"index": 0, "message": {"role": "assistant", "content": "```python\nx + 1\n```"},
                                          "finish_reason": "stop"}], "usage": {"prompt_tokens": 9, "completion_tokens": 3}})

    with serve_in_thread(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])) as url:
        done = OpenAIHTTPBackend(url, QWEN, chat=True, timeout=10).complete(CompletionRequest(Prompt("y = ", "\n"), stop=["\n\n"]))
    assert done.text == "x + 1" and bodies[0]["stop"] == ["\n\n"]  # no family stops on chat
    content = bodies[0]["messages"][-1]["content"]
    assert "<CURSOR>" in content and "<|fim_prefix|>" not in content and "prompt" not in bodies[0]


def test_an_unknown_family_is_refused_when_the_backend_is_made() -> None:
    with pytest.raises(ValueError, match="unknown infilling template 'qwen3'"):
        OpenAIHTTPBackend("http://127.0.0.1:9", "m", fim="qwen3")
    with pytest.raises(ValueError, match="fimTemplate"):
        OpenAIHTTPBackend("http://127.0.0.1:9", "m", fim="custom")
    assert OpenAIHTTPBackend("http://127.0.0.1:9", "glm5-code-tiny").template is TEMPLATES["glm"]
    assert OpenAIHTTPBackend("http://127.0.0.1:9", "some-model").template is TEMPLATES["glm"]  # auto, unknown: GLM's own
    assert OpenAIHTTPBackend("http://127.0.0.1:9", "m", fim="server").template is None


# ---- the factory -------------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_backend_arguments(parser)
    return parser.parse_args(argv)


def test_the_factory_makes_every_kind_by_name() -> None:
    assert KINDS == ("local", "openai", "llamacpp", "ollama")
    llama = create_backend("llamacpp", model="qwen2.5-coder-1.5b-q8_0.gguf", timeout=5, base_url=None)
    assert isinstance(llama, LlamaCppInfillBackend) and llama.base_url == "http://127.0.0.1:8080"
    assert "<|file_sep|>" in llama.extra_stop and llama.timeout == 5
    ollama = create_backend("ollama", model="deepseek-coder:1.3b-base", base_url="http://box:11434")
    assert isinstance(ollama, OllamaBackend) and ollama.template is TEMPLATES["deepseek-coder"]
    served = create_backend("openai", base_url="http://box:8000/v1", model=QWEN, fim="auto", fim_stop=None)
    assert isinstance(served, OpenAIHTTPBackend) and served.template is TEMPLATES["qwen2.5-coder"]
    assert served.base_url == "http://box:8000"
    with pytest.raises(ValueError, match="needs base_url"):
        create_backend("openai", model=QWEN)
    with pytest.raises(ValueError, match="unknown backend 'tgi'"):
        create_backend("tgi")


def test_command_line_backends() -> None:
    kind, options = backend_spec(parse(["--backend", "ollama", "--model", "qwen2.5-coder:7b", "--fim", "server",
                                        "--request-timeout", "9"]))
    assert kind == "ollama" and options["fim"] == "server" and options["timeout"] == 9.0
    backend = backend_from_args(parse(["--backend", "ollama", "--model", "qwen2.5-coder:7b", "--fim", "server"]))
    assert isinstance(backend, OllamaBackend) and backend.template is None
    llama = backend_from_args(parse(["--backend", "llamacpp", "--base-url", "http://gpu:8080"]))
    assert isinstance(llama, LlamaCppInfillBackend) and llama.base_url == "http://gpu:8080"
    custom = backend_from_args(parse(["--backend", "openai", "--base-url", "http://x:8000", "--model", "m", "--fim", "custom",
                                      "--fim-template", "<P>{prefix}<S>{suffix}<M>", "--fim-stop", "<E>", "--fim-stop", "<F>"]))
    assert isinstance(custom, OpenAIHTTPBackend) and custom.template is not None and custom.template.stop == ("<E>", "<F>")
    assert custom.api_key_env == "GLM5_API_KEY"  # the openai default when --api-key-env is not given
    with pytest.raises(ValueError, match="--backend ollama needs --model"):
        backend_spec(parse(["--backend", "ollama"]))
    with pytest.raises(ValueError, match="--chat is for --backend openai"):
        backend_spec(parse(["--backend", "llamacpp", "--chat"]))
    with pytest.raises(ValueError, match="needs --base-url"):
        backend_spec(parse(["--backend", "openai"]))
    with pytest.raises(SystemExit):
        parse(["--backend", "llamacpp", "--fim", "qwen3"])  # argparse names the choices


def test_streamed_text_is_held_back_only_where_it_could_begin_a_stop_string(vllm: tuple[Fake, str]) -> None:
    from glm5_lsp.backends.http_stream import held_back

    assert held_back("x = 1<|fi", ["<|file_sep|>", "<|fim_pad|>"]) == 4
    assert held_back("    return", TEMPLATES["qwen2.5-coder"].stop) == 0
    assert held_back("a\n", ["\n\n"]) == 1
    fake, url = vllm
    fake.script.endless, fake.script.delay = True, 0.05
    pieces: list[str] = []
    done = OpenAIHTTPBackend(url, QWEN, timeout=10).complete(  # the family's 9 stops: the first piece is not held
        CompletionRequest(Prompt("a", "b"), on_text=pieces.append, should_cancel=lambda: bool(pieces)))
    assert done.finish_reason == "cancelled" and pieces[0] == "    return"
    assert wait_for(lambda: fake.hang_ups == 1)
