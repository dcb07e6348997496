"""The editor reaches every served model the command line can: ``model.backend`` ``openai``,
``llamacpp`` and ``ollama`` with ``model.fim`` (a family, detected from ``model.name``, ``custom`` or
``server``), through the real ``glm5-lsp serve`` to local stand-ins of vLLM, llama.cpp's server and
Ollama that check each request body (``tests/native_fakes.py``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from lsp_raw import RawServer
from native_fakes import Fake, Script, llamacpp_app, ollama_app, vllm_app

from glm5_lsp.backends.fim import TEMPLATES, FimTemplate, custom_template
from glm5_lsp.serve_model import serve_in_thread

URI = "file:///tmp/glm5_served/demo.py"
DOCUMENT = "x = 1\nfast = \n"
CUSTOM = "<in>{prefix}<hole>{suffix}<out>"


def layout(template: FimTemplate, prompt: str) -> tuple[str, str]:
    """The prefix and suffix ``template`` laid ``prompt`` out from (AssertionError if it did not)."""
    pattern = re.escape(template.prompt("\x00P", "\x00S")).replace("\x00P", "(?P<p>.*)").replace("\x00S", "(?P<s>.*)")
    match = re.fullmatch(pattern, prompt, re.DOTALL)
    assert match, (template.name, prompt)
    return match["p"], match["s"]


def _openai(fake: Fake, served: str) -> Any:
    return vllm_app(fake, served=served)


# (id, the app, the model settings, a check of the one body the server got)
CASES: list[tuple[str, Callable[[Fake], Any], dict[str, Any], Callable[[str, dict[str, Any]], None]]] = []


def case(name: str, app: Callable[[Fake], Any], model: dict[str, Any]) -> Callable[[Callable[..., None]], None]:
    def register(check: Callable[[str, dict[str, Any]], None]) -> None:
        CASES.append((name, app, model, check))
    return register


@case("openai-qwen-detected", lambda fake: _openai(fake, "Qwen/Qwen2.5-Coder-1.5B"),
      {"backend": "openai", "name": "Qwen/Qwen2.5-Coder-1.5B"})
def _qwen(path: str, body: dict[str, Any]) -> None:
    assert path == "/v1/completions" and "suffix" not in body
    prefix, suffix = layout(TEMPLATES["qwen2.5-coder"], body["prompt"])
    assert prefix.endswith(DOCUMENT[:13]) and suffix.startswith("\n")
    assert set(TEMPLATES["qwen2.5-coder"].stop) <= set(body["stop"])


@case("openai-custom", lambda fake: _openai(fake, "my-coder"),
      {"backend": "openai", "name": "my-coder", "fim": "custom", "fimTemplate": CUSTOM, "fimStop": ["<eot>"]})
def _custom(path: str, body: dict[str, Any]) -> None:
    prefix, suffix = layout(custom_template(CUSTOM), body["prompt"])
    assert prefix.endswith(DOCUMENT[:13]) and suffix.startswith("\n") and "<eot>" in body["stop"]


@case("llamacpp-starcoder2", llamacpp_app, {"backend": "llamacpp", "fim": "starcoder2"})
def _llamacpp(path: str, body: dict[str, Any]) -> None:
    assert path == "/infill"  # the server lays the prompt out from the GGUF; the family adds its stops
    assert body["input_prefix"].endswith(DOCUMENT[:13]) and body["input_suffix"].startswith("\n")
    assert set(TEMPLATES["starcoder2"].stop) <= set(body["stop"])


@case("ollama-deepseek-detected", ollama_app, {"backend": "ollama", "name": "deepseek-coder:1.3b-base"})
def _ollama_raw(path: str, body: dict[str, Any]) -> None:
    assert path == "/api/generate" and body["raw"] is True and body["model"] == "deepseek-coder:1.3b-base"
    prefix, suffix = layout(TEMPLATES["deepseek-coder"], body["prompt"])
    assert prefix.endswith(DOCUMENT[:13]) and suffix.startswith("\n")
    assert set(TEMPLATES["deepseek-coder"].stop) <= set(body["options"]["stop"])


@case("ollama-server-layout", ollama_app, {"backend": "ollama", "name": "codellama:7b-code", "fim": "server"})
def _ollama_server(path: str, body: dict[str, Any]) -> None:
    assert "raw" not in body and body["prompt"].endswith(DOCUMENT[:13]) and body["suffix"].startswith("\n")


@pytest.mark.parametrize("name, app, model, check", CASES, ids=[c[0] for c in CASES])
def test_each_served_backend_from_the_settings_gets_its_familys_prompt(
        name: str, app: Callable[[Fake], Any], model: dict[str, Any],
        check: Callable[[str, dict[str, Any]], None], tmp_path: Path) -> None:
    fake = Fake(script=Script(pieces=["'qu", "ick'"]))
    with serve_in_thread(app(fake)) as url:
        server = RawServer(stderr_path=tmp_path / "stderr.txt")
        try:
            server.initialize({"model": {**model, "url": url, "timeoutSeconds": 20},
                               "completion": {"debounceMs": 0},
                               "budgets": {"completionMs": 20000, "requestTimeoutMs": 20000}})
            server.wait_ready()
            assert not any("could not be loaded" in line for line in server.log_lines()), server.log_lines()
            server.open(URI, DOCUMENT)
            reply = server.call("textDocument/inlineCompletion", {
                "textDocument": {"uri": URI}, "position": {"line": 1, "character": 7}, "context": {"triggerKind": 1}})
            assert [item["insertText"] for item in reply["result"]["items"]] == ["'quick'"], (reply, fake.bodies)
            if model["backend"] == "ollama":  # loading the engine had Ollama load the model first
                assert fake.bodies[0] == {"model": model["name"], "stream": False}, fake.bodies
                del fake.bodies[0], fake.paths[0]
            assert fake.bodies, "the server was never asked"
            check(fake.paths[0], fake.bodies[0])
            assert server.finish() == 0
        finally:
            server.close()


def test_contradicting_model_settings_are_shown_as_the_reason_it_could_not_load(tmp_path: Path) -> None:
    server = RawServer(stderr_path=tmp_path / "stderr.txt")
    try:
        server.initialize({"model": {"backend": "ollama"}}, capabilities={"window": {"showMessage": {}}})

        def shown() -> list[str]:
            return [n["params"]["message"] for n in server.notifications if n.get("method") == "window/showMessage"]

        server.wait_until(lambda: any("could not be loaded" in m for m in shown()))
        assert any("model.backend 'ollama' needs model.name" in m for m in shown()), shown()
        assert server.finish() == 0
    finally:
        server.close()


# ---- a real engine: the embedded model exported to GGUF in llama.cpp's llama-server ------------

REAL_PREFIX = "import os\n\n\ndef read_lines(path):\n    with open(path) as handle:\n        return "
REAL_SUFFIX = "\n\n\ndef count(path):\n    return len(read_lines(path))\n"


@pytest.fixture(scope="module")
def llama_served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from llama_server import find_llama_server, llama_server

    from glm5_lsp.gguf_export import export
    from glm5_lsp.model import default_model_path

    binary = find_llama_server()
    if binary is None:
        pytest.skip("no llama-server: set $GLM5_LLAMA_SERVER, put it on PATH, or run scripts/build_llama_server.sh")
    folder = tmp_path_factory.mktemp("gguf")
    log = folder / "server.log"
    with llama_server(binary, export(default_model_path(), folder / "glm5-code-tiny.gguf"), log=log) as url:
        yield url, log


@pytest.mark.slow
@pytest.mark.parametrize("model", [{"backend": "llamacpp"}, {"backend": "openai", "name": "glm5-code-tiny"}],
                         ids=["infill", "v1-completions"])
def test_the_editor_completes_through_a_real_llama_server(llama_served: Any, model: dict[str, Any],
                                                          tmp_path: Path) -> None:
    url, log = llama_served
    server = RawServer(stderr_path=tmp_path / "stderr.txt")
    try:
        # the memory off: here its two views agree on the line (``len(read_lines(path))``) and would
        # answer without asking the served model, which is what this test is about
        server.initialize({"model": {**model, "url": url if model["backend"] == "llamacpp" else url + "/v1"},
                           "completion": {"debounceMs": 0}, "memory": {"enabled": False},
                           "budgets": {"completionMs": 30000, "requestTimeoutMs": 30000}})
        server.wait_ready()
        uri = "file:///tmp/glm5_served/lines.py"
        server.open(uri, REAL_PREFIX + REAL_SUFFIX)
        before = log.read_text(errors="replace").count("total time =")  # one per task llama-server ran
        reply = server.call("textDocument/inlineCompletion", {
            "textDocument": {"uri": uri}, "position": {"line": 5, "character": 15}, "context": {"triggerKind": 1}},
            timeout=60)
        assert "result" in reply, reply
        served = log.read_text(errors="replace")
        assert served.count("total time =") > before, served[-2000:]  # the model ran in llama.cpp
        items = reply["result"]["items"]
        assert items and items[0]["insertText"].strip(), (reply, server.log_lines()[-8:])
        assert server.finish() == 0
    finally:
        server.close()
