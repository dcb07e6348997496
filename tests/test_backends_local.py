"""The in-process backend on a real (random, tiny) checkpoint, and ``serve-model`` serving it.

Uses the ``tiny_checkpoint`` fixture (``tests/conftest.py``): real runtime, real tokenizer, random
weights, so the tests check plumbing (FIM layout, roles, stops, streaming, cancellation, cache reuse,
thread safety, the OpenAI API), not the quality of the text.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import openai
import pytest
import torch

from glm5_lsp.backends.base import BackendError, CompletionRequest
from glm5_lsp.backends.factory import create_backend
from glm5_lsp.backends.local import LocalBackend, token_roles
from glm5_lsp.backends.openai_http import OpenAIHTTPBackend
from glm5_lsp.serve_model import create_app, serve_in_thread
from glm5_lsp.spans import ROLE_NAMES, Prompt, Span

CODE = "import os\n\ndef join(a, b):\n    return os.path.join(a, b)\n"


@pytest.fixture(scope="module")
def backend(tiny_checkpoint: Path) -> LocalBackend:
    local = create_backend("local", model_path=tiny_checkpoint)
    assert isinstance(local, LocalBackend)
    local.load()
    return local


def test_token_roles_follow_character_spans() -> None:
    prompt = Prompt("abcdef", "gh", spans=[Span(2, 4, "api_doc"), Span(5, 7, "error_context")])
    offsets = [(0, 2), (2, 4), (4, 6), (0, 1), (1, 2)]  # last two are suffix tokens (shift 6)
    roles = token_roles(prompt, offsets[:3]) + token_roles(prompt, offsets[3:], shift=6)
    names = [ROLE_NAMES[r] for r in roles]
    assert names == ["code", "api_doc", "error_context", "error_context", "code"]


def test_fim_prompt_layout_and_roles(backend: LocalBackend) -> None:
    tokenizer = backend.tokenizer
    prompt = Prompt(CODE[:30], CODE[30:], spans=[Span(0, 9, "api_doc"), Span(31, 40, "error_context")])
    ids, roles = backend.encode_prompt(prompt)
    assert ids == tokenizer.fim_prompt_ids(prompt.prefix, prompt.suffix)
    assert ids[0] == tokenizer.fim_prefix_id and ids[-1] == tokenizer.fim_middle_id and len(roles) == len(ids)
    assert roles[1] == ROLE_NAMES.index("api_doc") and ROLE_NAMES.index("error_context") in roles
    plain_ids, plain_roles = backend.encode_prompt(Prompt(CODE))
    assert plain_ids == tokenizer.encode(CODE) and set(plain_roles) == {0}
    # the end of a file: a blank suffix is no reason for the FIM form
    assert backend.encode_prompt(Prompt(CODE, "\n\n"))[0] == plain_ids


def test_generates_with_stops_streaming_and_cache_reuse(backend: LocalBackend) -> None:
    pieces: list[str] = []
    first = backend.complete(CompletionRequest(Prompt(CODE), max_tokens=12, on_text=pieces.append))
    assert first.completion_tokens > 0 and "".join(pieces) == first.text and first.prompt_tokens > 0
    assert "<|" not in first.text
    again = backend.complete(CompletionRequest(Prompt(CODE + "\n"), max_tokens=4))
    assert again.cached_tokens > 0  # the shared prefix came from the cache
    stop = first.text[2:4]
    if stop.strip():
        stopped = backend.complete(CompletionRequest(Prompt(CODE), max_tokens=12, stop=[stop]))
        assert stopped.text == first.text[: first.text.find(stop)] and stopped.finish_reason == "stop"


def test_logits_processor_and_cancellation(backend: LocalBackend) -> None:
    target = backend.tokenizer.encode("x")[0]

    def force_x(generated: object, logits: torch.Tensor) -> torch.Tensor:
        forced = torch.full_like(logits, -1e9)
        forced[target] = 0.0
        return forced

    forced = backend.complete(CompletionRequest(Prompt("y = "), max_tokens=5, logits_processor=force_x))
    assert forced.text == "xxxxx" and forced.finish_reason == "length"
    seen: list[str] = []
    cancelled = backend.complete(CompletionRequest(Prompt("y = "), max_tokens=50, logits_processor=force_x,
                                                   on_text=seen.append, should_cancel=lambda: len(seen) >= 2))
    assert cancelled.finish_reason == "cancelled" and cancelled.completion_tokens <= 3


def test_threads_share_one_model_safely(backend: LocalBackend) -> None:
    expected = backend.complete(CompletionRequest(Prompt(CODE), max_tokens=6)).text
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(
        backend.complete(CompletionRequest(Prompt(CODE), max_tokens=6)).text)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected] * 3


def test_missing_or_broken_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="no checkpoint at"):
        LocalBackend(tmp_path).complete(CompletionRequest(Prompt("x")))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(BackendError, match="cannot load the checkpoint"):
        LocalBackend(tmp_path).complete(CompletionRequest(Prompt("x")))


def test_serve_model_serves_the_runtime_to_both_clients(backend: LocalBackend) -> None:
    direct = backend.complete(CompletionRequest(Prompt(CODE), max_tokens=8)).text
    with serve_in_thread(create_app(backend, "tiny")) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        answer = client.completions.create(model="tiny", prompt=CODE, max_tokens=8, temperature=0)
        assert answer.choices[0].text == direct and answer.usage.completion_tokens > 0
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model="tiny", prompt=CODE, max_tokens=8, stream=True) if c.choices)
        assert streamed == direct
        http = OpenAIHTTPBackend(url, "tiny")
        pieces: list[str] = []
        fim = Prompt(CODE[:30], CODE[30:])
        over_http = http.complete(CompletionRequest(fim, max_tokens=6, on_text=pieces.append))
        assert over_http.text == backend.complete(CompletionRequest(fim, max_tokens=6)).text == "".join(pieces)


@pytest.mark.slow
def test_serve_model_command_starts_checks_the_key_and_stops(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """``glm5-lsp serve-model`` as a subprocess on a free loopback port, stopped by the test."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "SERVE_KEY": "k-123"}
    command = [sys.executable, "-m", "glm5_lsp.cli", "serve-model", "--model", str(tiny_checkpoint),
               "--port", str(port), "--api-key-env", "SERVE_KEY", "--model-name", "tiny"]
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                answer = httpx.get(url + "/v1/models", headers={"Authorization": "Bearer k-123"}, timeout=2)
                break
            except httpx.TransportError:
                assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
                assert time.monotonic() < deadline, "serve-model did not start"
                time.sleep(0.2)
        assert answer.json()["data"][0]["id"] == "tiny"
        assert httpx.get(url + "/v1/models", timeout=5).status_code == 401
        client = openai.OpenAI(base_url=url + "/v1", api_key="k-123", max_retries=0)
        assert client.completions.create(model="tiny", prompt="def f():", max_tokens=3).usage.completion_tokens == 3
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_serve_model_refuses_to_start_without_its_key(tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from glm5_lsp.cli import main

    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    assert main(["serve-model", "--model", str(tiny_checkpoint), "--api-key-env", "NO_SUCH_KEY_VAR"]) == 2


def test_trained_context_comes_from_the_checkpoints_metrics(tmp_path: Path, tiny_checkpoint: Path) -> None:
    assert LocalBackend(tiny_checkpoint).trained_context is None  # no metrics.json: unknown
    (tmp_path / "metrics.json").write_text('{"seq_len": 512}')
    assert LocalBackend(tmp_path).trained_context == 512
    (tmp_path / "metrics.json").write_text('{"seq_len": "long"}')
    assert LocalBackend(tmp_path).trained_context is None
    (tmp_path / "metrics.json").write_text("not json")
    assert LocalBackend(tmp_path).trained_context is None
    assert (LocalBackend().trained_context or 0) >= 256  # the embedded model's card says what it was trained at


def test_index_topk_is_the_loaded_models(tiny_checkpoint: Path) -> None:
    fresh = LocalBackend(tiny_checkpoint)
    assert fresh.index_topk is None  # not loaded yet
    fresh.load()
    assert fresh.index_topk == json.loads((tiny_checkpoint / "config.json").read_text())["index_topk"]


def test_forced_prefix_allows_only_agreeing_tokens() -> None:
    from glm5_lsp.backends.local import ForcedPrefix

    strings = ["", "v", "va", "val", "values", "x", "a", "lues"]
    forced = ForcedPrefix("va", strings)
    out = forced([], torch.zeros(len(strings)))
    assert {strings[i] for i in torch.nonzero(torch.isfinite(out)).flatten().tolist()} == {"v", "va", "val", "values"}
    out = forced([1], torch.zeros(len(strings)))  # "v" so far: "a" or anything starting with it
    assert {strings[i] for i in torch.nonzero(torch.isfinite(out)).flatten().tolist()} == {"a"}
    assert torch.equal(forced([2], torch.zeros(len(strings))), torch.zeros(len(strings)))  # covered: free
    spelled = ForcedPrefix("va", strings, boundaries=[2])  # the tokenizer writes "va" as one token
    out = spelled([], torch.zeros(len(strings)))
    assert {strings[i] for i in torch.nonzero(torch.isfinite(out)).flatten().tolist()} == {"va", "val", "values"}


def test_a_forced_space_begins_the_next_words_token() -> None:
    """A healed `` return `` is not finished by a lone space (a token the model saw almost only before
    a line break) nor by a longer space: the last space is written with the word after it."""
    from glm5_lsp.backends.local import ForcedPrefix

    strings = [" return", " ", "  ", " \n", " a", " re", " return a", "return"]
    forced = ForcedPrefix(" return ", strings)
    allowed = {strings[i] for i in torch.nonzero(torch.isfinite(forced([], torch.zeros(len(strings))))).flatten().tolist()}
    assert allowed == {" return", " ", " re", " return a"}  # a lone space may still begin it
    allowed = {strings[i] for i in torch.nonzero(torch.isfinite(forced([0], torch.zeros(len(strings))))).flatten().tolist()}
    assert allowed == {" a", " re", " return", " return a"}  # " return" so far: a word after the space
    spelled = ForcedPrefix(" return ", strings, boundaries=[7, 8])
    allowed = {strings[i] for i in torch.nonzero(torch.isfinite(spelled([], torch.zeros(len(strings))))).flatten().tolist()}
    assert allowed == {" return", " return a"}  # as the tokenizer spells it


def test_forced_prefix_on_the_runtime(tiny_checkpoint: Path) -> None:
    backend = LocalBackend(tiny_checkpoint)
    for word in ("re", "pri", "x_y"):
        completion = backend.complete(CompletionRequest(Prompt("import os\n"), max_tokens=5, forced_prefix=word))
        assert completion.text.startswith(word), completion.text


def test_a_prefetched_prompt_completes_as_one_that_was_not(backend: LocalBackend) -> None:
    """``prefetch`` starts the prompt's prefill on the C worker (where the extension is built);
    ``complete`` of the same request then prefills one token and writes the same text."""
    from glm5_lsp.model import native

    prompt = Prompt("def split(path):\n    return ")
    request = CompletionRequest(prompt, max_tokens=8, temperature=0.0)
    backend._generator.reset()
    want = backend.complete(request)
    backend._generator.reset()
    started = backend.prefetch(request)
    model = backend._generator.model
    fits = len(backend.encode_prompt(prompt)[0]) - 1 <= model.config.index_topk  # every key attended
    assert fits
    assert started == (native.get(model) is not None)
    got = backend.complete(request)
    assert got.text == want.text
    if started:
        assert got.cached_tokens == got.prompt_tokens - 1
    assert not backend.prefetch(request)  # the prompt is held already: nothing to start
