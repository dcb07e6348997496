"""``serve-model`` answers as OpenAI does (issue 25, point 4), checked through the official ``openai`` client.

An unknown ``model`` is OpenAI's 404; ``logprobs`` and ``echo`` on ``/v1/completions`` (and chat's
``logprobs``/``top_logprobs``) carry the runtime's own token log-probabilities, streamed and not;
the address is logged only once the server accepts connections, a busy port fails at once with a
clear message, and the server binds 127.0.0.1 unless told otherwise.

The runtime tests serve a random tiny checkpoint (``tiny_checkpoint``), so what they check is that
the numbers are the model's (a forward pass over a text agrees with the step-by-step decoding that
wrote it), not that they are good; one test serves the embedded model to score candidates by text.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from glm5_lsp.backends.base import BackendError, CompletionRequest
from glm5_lsp.backends.local import LocalBackend
from glm5_lsp.backends.openai_http import OpenAIHTTPBackend
from glm5_lsp.backends.scoring import Detokenizer, RuntimeScorer, TokenScore, fit_to_text
from glm5_lsp.serve_model import BindError, add_arguments, bind_socket, create_app, serve_in_thread
from glm5_lsp.spans import Prompt

ROOT = Path(__file__).parents[1]
DATA = Path(__file__).parent / "data" / "serve_model"
_spec = importlib.util.spec_from_file_location("slow_backend", DATA / "slow_backend.py")
assert _spec and _spec.loader
doubles = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(doubles)

CODE = "def add(a, b):\n    return"


def client_for(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=60)


# ---- an unknown model ------------------------------------------------------------------------


def test_an_unknown_model_is_a_404_as_openai_answers_it() -> None:
    backend = doubles.SlowBackend(pieces=2, interval=0)
    with serve_in_thread(create_app(backend, "glm5-code-tiny")) as url:
        chat = [{"role": "user", "content": "x"}]
        for path, body in [("/v1/completions", {"model": "gpt-4", "prompt": "x"}),
                           ("/v1/completions", {"model": "gpt-4", "prompt": "x", "stream": True}),
                           ("/v1/chat/completions", {"model": "gpt-4", "messages": chat})]:
            response = httpx.post(url + path, json=body, timeout=10)
            assert response.status_code == 404 and response.headers["content-type"] == "application/json"
            assert response.json() == {"error": {
                "message": "The model `gpt-4` does not exist or you do not have access to it. "
                           "This server serves `glm5-code-tiny` (GET /v1/models).",
                "type": "invalid_request_error", "param": None, "code": "model_not_found"}}
        client = client_for(url)
        with pytest.raises(openai.NotFoundError) as raised:
            client.completions.create(model="gpt-4", prompt="x")
        assert raised.value.code == "model_not_found" and "`gpt-4` does not exist" in raised.value.message
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="glm5", messages=chat, stream=True)  # close is not the same
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("gpt-4")
        assert client.models.retrieve("glm5-code-tiny").id == "glm5-code-tiny"
        with pytest.raises(BackendError, match="404.*`glm-5` does not exist.*serves `glm5-code-tiny`"):
            OpenAIHTTPBackend(url, "glm-5", max_retries=0).complete(CompletionRequest(Prompt("x")))
        assert backend.started == []  # none of them reached the model
        assert client.completions.create(model="glm5-code-tiny", prompt="x", max_tokens=2).choices[0].text == "xx"
        no_name = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
        assert no_name.json()["choices"][0]["text"] == "xx"  # a request that names no model gets the one served


# ---- echo without token probabilities (any backend) ------------------------------------------


def test_echo_puts_the_prompt_before_the_completion_on_any_backend() -> None:
    backend = doubles.SlowBackend(pieces=3, interval=0)
    with serve_in_thread(create_app(backend, "m")) as url:
        client = client_for(url)
        done = client.completions.create(model="m", prompt="ab", echo=True, max_tokens=3)
        assert done.choices[0].text == "abxxx" and done.choices[0].logprobs is None
        only = client.completions.create(model="m", prompt="ab", echo=True, max_tokens=0)
        assert only.choices[0].text == "ab" and only.choices[0].finish_reason == "length"
        assert len(backend.started) == 1  # max_tokens 0 generated nothing
        streamed = [c.choices[0].text for c in client.completions.create(model="m", prompt="ab", echo=True,
                                                                         max_tokens=3, stream=True)]
        assert streamed[0] == "ab" and "".join(streamed) == "abxxx"
        with pytest.raises(openai.BadRequestError, match="does not give them"):  # never silently ignored
            client.completions.create(model="m", prompt="ab", logprobs=2)


# ---- the runtime's token probabilities -------------------------------------------------------


@pytest.fixture(scope="module")
def runtime(tiny_checkpoint: Path) -> Iterator[tuple[str, RuntimeScorer]]:
    backend = LocalBackend(tiny_checkpoint)
    backend.load()
    with serve_in_thread(create_app(backend, "tiny")) as url:
        yield url, RuntimeScorer(backend)


def offsets_of(tokens: list[str], start: int = 0) -> list[int]:
    return list(itertools.accumulate([len(token) for token in tokens[:-1]], initial=start))


def test_logprobs_are_the_models_own(runtime: tuple[str, RuntimeScorer]) -> None:
    url, scorer = runtime
    done = client_for(url).completions.create(model="tiny", prompt=CODE, max_tokens=10, temperature=0, logprobs=3)
    choice = done.choices[0]
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens and "".join(logprobs.tokens) == choice.text
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == done.usage.completion_tokens
    assert logprobs.text_offset == offsets_of(logprobs.tokens)
    for chosen, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert chosen < 0 and 1 <= len(top) <= 4 and all(value <= 0 for value in top.values())
        assert max(top.values()) == pytest.approx(chosen)  # greedy: the chosen token is the most likely one
    # The same generation through the scorer gives the ids; one forward pass over prompt + those ids
    # (teacher forcing, a different code path from the step-by-step decoding) scores them the same.
    completion, scores = scorer.generate(CompletionRequest(Prompt(CODE), max_tokens=10), top=3)
    assert completion.text == choice.text
    assert [score.logprob for score in scores] == pytest.approx(logprobs.token_logprobs, abs=1e-6)
    ids = scorer.prompt_ids(Prompt(CODE)) + [score.token_id for score in scores]
    rescored = scorer.score_ids(ids, 3)[-len(scores):]
    assert [score.token_id for score in rescored] == [score.token_id for score in scores]
    assert [score.logprob for score in rescored] == pytest.approx([score.logprob for score in scores], abs=1e-4)
    assert completion.logprob == pytest.approx(sum(score.logprob or 0.0 for score in scores), abs=1e-4)


def test_scoring_is_cancellable_and_chunked(runtime: tuple[str, RuntimeScorer]) -> None:
    _, scorer = runtime
    scores: list[TokenScore] = []
    completion, kept = scorer.generate(CompletionRequest(Prompt(CODE), max_tokens=500, should_cancel=lambda: len(scores) >= 3),
                                       top=1, on_scores=scores.extend)
    assert completion.finish_reason == "cancelled" and 3 <= len(kept) <= 4  # a client that hangs up stops it
    ids = scorer.prompt_ids(Prompt(CODE * 3))
    whole = scorer.score_ids(ids, 2)
    chunked = RuntimeScorer(scorer.backend)
    chunked.ROWS_AT_ONCE = 4  # the log-softmax in pieces, as a large vocabulary needs
    assert [s.logprob for s in chunked.score_ids(ids, 2)] == [s.logprob for s in whole] and whole[0].logprob is None
    assert [s.top for s in chunked.score_ids(ids, 2)] == [s.top for s in whole]


def test_logprobs_do_not_change_what_is_generated(runtime: tuple[str, RuntimeScorer]) -> None:
    url, _ = runtime
    client = client_for(url)
    for temperature, seed in ((0.0, None), (1.0, 11), (0.8, 12345)):
        plain = client.completions.create(model="tiny", prompt=CODE, max_tokens=12, temperature=temperature, seed=seed)
        scored = client.completions.create(model="tiny", prompt=CODE, max_tokens=12, temperature=temperature,
                                           seed=seed, logprobs=1)
        assert scored.choices[0].text == plain.choices[0].text, (temperature, seed)
    stopped = client.completions.create(model="tiny", prompt=CODE, max_tokens=12, temperature=0, logprobs=1)
    text = stopped.choices[0].text
    cut = client.completions.create(model="tiny", prompt=CODE, max_tokens=12, temperature=0, logprobs=1,
                                    stop=[text[3:5]])  # a stop string that ends it inside the text
    assert cut.choices[0].text == text[:text.find(text[3:5])]
    assert "".join(cut.choices[0].logprobs.tokens) == cut.choices[0].text  # the tokens past the stop are gone


def test_echo_scores_the_prompt(runtime: tuple[str, RuntimeScorer]) -> None:
    url, _ = runtime
    client = client_for(url)
    scored = client.completions.create(model="tiny", prompt=CODE, max_tokens=0, echo=True, logprobs=2)
    choice = scored.choices[0]
    logprobs = choice.logprobs
    assert choice.text == CODE and "".join(logprobs.tokens) == CODE and choice.finish_reason == "length"
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None  # nothing precedes the first
    assert all(value < 0 for value in logprobs.token_logprobs[1:]) and all(len(top) <= 3 for top in logprobs.top_logprobs[1:])
    assert logprobs.text_offset == offsets_of(logprobs.tokens)
    assert scored.usage.prompt_tokens == len(logprobs.tokens) and scored.usage.completion_tokens == 0
    made = client.completions.create(model="tiny", prompt=CODE, max_tokens=6, temperature=0, logprobs=2).choices[0]
    both = client.completions.create(model="tiny", prompt=CODE, max_tokens=6, temperature=0, logprobs=2,
                                     echo=True).choices[0]
    n = len(logprobs.tokens)
    assert both.text == CODE + made.text and both.logprobs.tokens == logprobs.tokens + made.logprobs.tokens
    assert both.logprobs.token_logprobs[1:n] == pytest.approx(logprobs.token_logprobs[1:], abs=1e-6)
    assert both.logprobs.token_logprobs[n:] == pytest.approx(made.logprobs.token_logprobs, abs=1e-6)
    assert both.logprobs.text_offset == offsets_of(both.logprobs.tokens)  # the completion's continue past the prompt
    fim = "<|code_prefix|>def f(<|code_suffix|>):\n    pass\n<|code_middle|>"
    infill = client.completions.create(model="tiny", prompt=fim, max_tokens=0, echo=True, logprobs=0).choices[0]
    assert infill.text == fim and infill.logprobs.tokens[0] == "<|code_prefix|>" and "".join(infill.logprobs.tokens) == fim
    assert infill.logprobs.tokens[-1] == "<|code_middle|>"


def test_streamed_logprobs_come_with_their_chunks(runtime: tuple[str, RuntimeScorer]) -> None:
    url, _ = runtime
    client = client_for(url)
    plain = client.completions.create(model="tiny", prompt=CODE, max_tokens=10, temperature=0, logprobs=2).choices[0]
    for echo in (False, True):
        chunks = [c.choices[0] for c in client.completions.create(
            model="tiny", prompt=CODE, max_tokens=10, temperature=0, logprobs=2, echo=echo, stream=True) if c.choices]
        text = ""
        tokens: list[str] = []
        values: list[float | None] = []
        for chunk in chunks:
            if chunk.logprobs is not None:
                assert "".join(chunk.logprobs.tokens) == chunk.text  # each chunk carries exactly its own tokens
                assert chunk.logprobs.text_offset == offsets_of(chunk.logprobs.tokens, len(text))
                tokens += chunk.logprobs.tokens
                values += chunk.logprobs.token_logprobs
            text += chunk.text
        assert chunks[-1].finish_reason == "length"
        if echo:
            assert chunks[0].text == CODE and chunks[0].logprobs.token_logprobs[0] is None
            n = len(chunks[0].logprobs.tokens)
            tokens, values, text = tokens[n:], values[n:], text[len(CODE):]
        assert text == plain.text and tokens == plain.logprobs.tokens
        assert values == pytest.approx(plain.logprobs.token_logprobs, abs=1e-6)
        assert sum(1 for chunk in chunks if chunk.text) > 2  # streamed, not one chunk at the end


def test_chat_logprobs_and_top_logprobs(runtime: tuple[str, RuntimeScorer]) -> None:
    url, _ = runtime
    client = client_for(url)
    messages = [{"role": "user", "content": CODE}]
    done = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0,
                                          logprobs=True, top_logprobs=2)
    content = done.choices[0].logprobs.content
    assert "".join(entry.token for entry in content) == done.choices[0].message.content and len(content) == 8
    for entry in content:
        assert entry.logprob < 0 and len(entry.top_logprobs) == 2 and entry.bytes == list(entry.token.encode())
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)  # greedy: the chosen is the best
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
    bare = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0, logprobs=True)
    assert all(entry.top_logprobs == [] for entry in bare.choices[0].logprobs.content)
    assert [e.logprob for e in bare.choices[0].logprobs.content] == pytest.approx([e.logprob for e in content], abs=1e-6)
    streamed = [c.choices[0] for c in client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2, stream=True)
        if c.choices]
    entries = [entry for c in streamed if c.logprobs is not None for entry in c.logprobs.content]
    assert [e.token for e in entries] == [e.token for e in content]
    assert "".join(c.delta.content or "" for c in streamed) == done.choices[0].message.content


def test_echo_scores_a_candidate_as_the_model_would_have_written_it() -> None:
    """A main model scoring a light model's candidate by its text: the embedded model's own greedy
    completions, sent back as echoed text, get the log-probabilities they were generated with."""
    compared = 0
    with serve_in_thread(create_app(LocalBackend(), "glm5-code-tiny")) as url:
        client = client_for(url)
        for prompt in ("def add(a, b):\n    return", "import os\n\n\ndef read(path):\n    with open(path) as f:\n",
                       "for i in range(10):\n    print("):
            made = client.completions.create(model="glm5-code-tiny", prompt=prompt, max_tokens=12, temperature=0,
                                             logprobs=0).choices[0]
            alone = client.completions.create(model="glm5-code-tiny", prompt=prompt, max_tokens=0, echo=True,
                                              logprobs=0).choices[0]
            scored = client.completions.create(model="glm5-code-tiny", prompt=prompt + made.text, max_tokens=0,
                                               echo=True, logprobs=0).choices[0]
            n = len(alone.logprobs.tokens)
            if scored.logprobs.tokens[:n] != alone.logprobs.tokens or scored.logprobs.tokens[n:] != made.logprobs.tokens:
                # BPE merged the prompt's last token with the candidate's first ("\n" + "   " -> "\n   "),
                # or the model wrote its text in other tokens than the tokenizer cuts it into ('"' + '{'
                # where the tokenizer has '"{'): the text read back is other tokens, so its scores are
                # another question
                assert "".join(scored.logprobs.tokens) == prompt + made.text, prompt
                continue
            assert scored.logprobs.token_logprobs[n:] == pytest.approx(made.logprobs.token_logprobs, abs=1e-3)
            compared += 1
    assert compared >= 1, "every candidate merged with its prompt at the boundary: nothing was compared"


# ---- the pieces ------------------------------------------------------------------------------


def test_detokenizer_pieces_join_to_the_text_across_split_characters(tiny_checkpoint: Path) -> None:
    from glm5_lsp.model import load_tokenizer

    tokenizer = load_tokenizer(tiny_checkpoint)
    text = "naïve = '日本語' → 🐍\n"
    ids = tokenizer.encode(text)
    detokenizer = Detokenizer(tokenizer.decode)
    pieces = [detokenizer.push(token_id) for token_id in ids]
    assert "".join(pieces) == text and "" in pieces  # a byte-level tokenizer splits a character across tokens
    assert all("\ufffd" not in piece for piece in pieces)


def test_fit_to_text_drops_what_a_stop_string_cut() -> None:
    scores = [TokenScore(token, -1.0) for token in ("ab", "", "cd", "ef")]
    assert [s.token for s in fit_to_text(scores, "abcdef")] == ["ab", "", "cd", "ef"]
    assert [s.token for s in fit_to_text(scores, "abc")] == ["ab", "", "c"]  # cut inside a token
    assert [s.token for s in fit_to_text(scores, "ab")] == ["ab"]
    assert fit_to_text(scores, "") == []
    assert [s.token for s in fit_to_text(scores[:1], "ab\ufffd")] == ["ab\ufffd"]  # text the pieces did not reach


# ---- the address -----------------------------------------------------------------------------


def outward_address() -> str | None:
    """This machine's address on its default route (no packet is sent), unless it is loopback only."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere real
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def read_until(stream: Any, pattern: str, seconds: float) -> tuple[str, re.Match[str] | None]:
    """Lines from ``stream`` until one matches ``pattern`` or it ends (the process exited)."""
    seen = ""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        seen += line
        match = re.search(pattern, line)
        if match:
            return seen, match
    return seen, None


def test_serving_is_logged_once_bound_on_loopback_by_default() -> None:
    args = add_arguments_parsed([])
    assert args.host == "127.0.0.1"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, str(DATA / "slow_backend.py"), "0"], env=env, text=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        seen, match = read_until(process.stderr, r"serving slow at (http://127\.0\.0\.1:(\d+)/v1)", 60)
        assert match, seen
        port = int(match.group(2))
        assert port != 0  # the port the system picked, not the 0 asked for
        # The line comes once the server accepts: the very next request is answered, not refused.
        assert httpx.get(match.group(1) + "/models", timeout=5).status_code == 200
        outward = outward_address()
        if outward is not None:  # and only on loopback: this machine's other address is not served
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"http://{outward}:{port}/v1/models", timeout=5)
    finally:
        process.terminate()
        process.wait(timeout=30)


def add_arguments_parsed(argv: list[str]) -> Any:
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_a_busy_port_fails_at_once_with_a_clear_message_and_no_serving_line(tiny_checkpoint: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(BindError, match=rf"cannot listen on 127\.0\.0\.1:{port}: the address is already in use"):
            bind_socket("127.0.0.1", port)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        begun = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "glm5_lsp.cli", "serve-model", "--model", str(tiny_checkpoint),
                               "--port", str(port)], env=env, capture_output=True, text=True, timeout=120, check=False)
        # The port is tried before the model is loaded: a missing checkpoint is not what it reports.
        first = subprocess.run([sys.executable, "-m", "glm5_lsp.cli", "serve-model", "--model",
                                str(tiny_checkpoint / "missing"), "--port", str(port)],
                               env=env, capture_output=True, text=True, timeout=120, check=False)
        seconds = time.monotonic() - begun
    for run in (done, first):
        assert run.returncode == 2, run.stderr
        assert f"cannot listen on 127.0.0.1:{port}: the address is already in use" in run.stderr
        assert "serving" not in run.stderr and "Traceback" not in run.stderr
    assert "checkpoint" not in first.stderr
    assert seconds < 100
    with pytest.raises(BindError, match="cannot listen on no-such-host.invalid:80"):
        bind_socket("no-such-host.invalid", 80)
