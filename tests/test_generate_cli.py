"""``glm5-lsp generate``: a final newline, a non-zero exit and a message on stderr when no text passes the
checks or does any work, ``--allow-unclean``, ``--raw`` (issue 21, point 4).

Most tests answer from the scripted double (``tests/data/batch/scripted_backend.py``) in place of the
model; the last runs the real command on a tiny checkpoint.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from glm5_lsp.cli import main
from glm5_lsp.pipeline import session as factory  # the front ends take the backend factory from here

_spec = importlib.util.spec_from_file_location(
    "scripted_backend", Path(__file__).parent / "data" / "batch" / "scripted_backend.py")
assert _spec and _spec.loader
scripted = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scripted)

DOCSTRING = 'def add(a, b):\n    """Return the sum of a and b."""\n'
PREFIX = ["--prefix", "def area(r):\n    return ", "--suffix", "\n"]


def generate(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], answer: str,
             *args: str) -> tuple[int, str, str]:
    backend = scripted.ScriptedBackend(answer)
    monkeypatch.setattr(factory, "backend_from_args", lambda parsed: backend)
    code = main(["generate", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_clean_answer_is_printed_with_a_final_newline(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert generate(monkeypatch, capsys, "3.14 * r * r", *PREFIX) == (0, "3.14 * r * r\n", "")
    code, out, err = generate(monkeypatch, capsys, "    return a + b", "--prompt", DOCSTRING)
    assert (code, out, err) == (0, "    return a + b\n", "")


def test_nothing_is_an_error_on_stderr(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = generate(monkeypatch, capsys, "", "--prompt", DOCSTRING)  # the docstring prompt
    assert code == 1 and out == "" and "the model wrote nothing usable" in err


def test_text_that_fails_the_checks_is_refused_or_printed_with_a_warning(monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = generate(monkeypatch, capsys, "radius * 2", *PREFIX, "--repair-rounds", "1")
    assert code == 1 and out == ""
    assert "no text passed the checks (1 round)" in err and "line 2: Undefined name `radius`" in err
    assert "--allow-unclean" in err
    code, out, err = generate(monkeypatch, capsys, "radius * 2", *PREFIX, "--repair-rounds", "1", "--allow-unclean")
    assert code == 1 and out == "radius * 2\n" and "warning: the text above does not pass the checks" in err


@pytest.mark.parametrize("answer", ["# the area, later", "...", "pass"])
def test_text_that_does_nothing_is_not_an_answer(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                 answer: str) -> None:
    prefix = ["--prefix", "def area(r):\n    ", "--suffix", "\n"]
    code, out, err = generate(monkeypatch, capsys, answer, *prefix, "--repair-rounds", "1")
    assert code == 1 and out == "" and "does nothing" in err


def test_raw_prints_the_models_text_unchecked(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert generate(monkeypatch, capsys, "3.14 * (r", *PREFIX, "--raw") == (0, "3.14 * (r\n", "")
    assert generate(monkeypatch, capsys, "a\nb", "--prompt", "x", "--raw", "--stream") == (0, "a\nb\n", "")
    assert generate(monkeypatch, capsys, "a, b\n", "--prompt", "x", "--raw", "--stop", ",") == (0, "a\n", "")
    code, out, err = generate(monkeypatch, capsys, "", "--prompt", "x", "--raw")
    assert code == 1 and out == "" and "the model wrote nothing" in err


def test_bad_arguments(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = generate(monkeypatch, capsys, "x", "--prompt", "x", "--stream")
    assert code == 2 and "add --raw" in err
    code, _, err = generate(monkeypatch, capsys, "x", "--prompt", "   ")
    assert code == 2 and "the prompt is empty" in err
    code, _, err = generate(monkeypatch, capsys, "x", "--prompt", "x", "--suffix", ")")
    assert code == 2 and "--suffix goes with --prefix" in err


def test_the_command_on_a_checkpoint(tiny_checkpoint: Path) -> None:
    from glm5_lsp.model import GenerationConfig, Generator, load_model, load_tokenizer

    prompt = "def add(a, b):\n    return"
    args = [sys.executable, "-m", "glm5_lsp.cli", "generate", "--model", str(tiny_checkpoint)]
    raw = subprocess.run(args + ["--prompt", prompt, "--max-new-tokens", "5", "--raw"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert raw.returncode == 0, raw.stderr
    gen = Generator(load_model(tiny_checkpoint), load_tokenizer(tiny_checkpoint))
    expected = gen.generate(gen.tokenizer.encode(prompt), GenerationConfig(max_new_tokens=5)).text
    assert raw.stdout == expected + ("" if expected.endswith("\n") else "\n")
    checked = subprocess.run(args + ["--prefix", "x = ", "--suffix", "\n", "--max-new-tokens", "3",
                                     "--repair-rounds", "1"], capture_output=True, text=True, timeout=120, check=False)
    assert (checked.returncode, checked.stdout.endswith("\n")) in {(0, True), (1, False)}, checked
    assert checked.returncode == 0 or "no text passed the checks" in checked.stderr or "nothing" in checked.stderr
    bad = subprocess.run(args[:4] + ["--model", str(tiny_checkpoint.parent / "nope"), "--prompt", "x"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2 and "no checkpoint at" in bad.stderr


def test_the_model_runs_on_one_torch_thread_unless_told(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """torch's default (a thread a core) made the embedded model 8x slower where another program held
    a core; the front ends run it on one thread unless ``--threads`` says otherwise."""
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert generate(monkeypatch, capsys, "3.14 * r * r", *PREFIX)[0] == 0
        assert torch.get_num_threads() == 1
        assert generate(monkeypatch, capsys, "3.14 * r * r", *PREFIX, "--threads", "2")[0] == 0
        assert torch.get_num_threads() == 2
        code, _, err = generate(monkeypatch, capsys, "x", *PREFIX, "--threads", "0")
        assert code == 2 and "--threads must be at least 1" in err
    finally:
        torch.set_num_threads(before)
