"""The infilling template table against each family's published prompt.

Cases: ``tests/data/fim/published.json`` (each names where its format is published; the file-level
ones are the publishers' own examples, verbatim).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glm5_lsp.backends.fim import (
    FAMILIES,
    TEMPLATES,
    FileChunk,
    FimInput,
    custom_template,
    cut_at_stop,
    detect_family,
    template_for,
)
from glm5_lsp.model.tokenizer import load_tokenizer
from glm5_lsp.spans import Prompt

CASES = json.loads((Path(__file__).parent / "data" / "fim" / "published.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", CASES, ids=[f"{c['family']}-{i}" for i, c in enumerate(CASES)])
def test_template_renders_the_published_prompt(case: dict) -> None:
    fim = FimInput(case["prefix"], case["suffix"], path=case.get("path", ""), repo=case.get("repo", ""),
                   language=case.get("language", ""), files=tuple(FileChunk(p, t) for p, t in case.get("files", [])))
    assert TEMPLATES[case["family"]](fim) == case["expected"], case["source"]


def test_every_family_has_a_published_case_and_repo_level_ones_a_repo_case() -> None:
    assert {c["family"] for c in CASES} == set(TEMPLATES)
    for name, template in TEMPLATES.items():
        if template.repo_level:
            assert any(c["family"] == name and c.get("files") for c in CASES), name


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_stop_strings_cover_the_family_control_tokens(name: str) -> None:
    template = TEMPLATES[name]
    assert template.tokens and set(template.tokens) <= set(template.stop), name
    # A model that writes its end-of-text or runs on into another hole stops there.
    rendered = template(FimInput("a = ", "\n"))
    for stop in template.stop:
        text, stopped = cut_at_stop("x + 1" + stop + rendered, template.stop)
        assert (text, stopped) == ("x + 1", True), (name, stop)


def test_glm_template_is_what_the_embedded_tokenizer_builds() -> None:
    tok = load_tokenizer(Path(__file__).parents[1] / "glm5_lsp" / "weights" / "glm5-code-tiny")
    prefix, suffix = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"
    text = TEMPLATES["glm"].prompt(prefix, suffix)
    assert tok._tok.encode(text, add_special_tokens=False).ids == tok.fim_prompt_ids(prefix, suffix)


@pytest.mark.parametrize(("name", "family"), [
    ("Qwen/Qwen2.5-Coder-7B", "qwen2.5-coder"), ("qwen2.5-coder:1.5b-base", "qwen2.5-coder"),
    ("deepseek-ai/deepseek-coder-6.7b-base", "deepseek-coder"), ("deepseek-coder:1.3b-base", "deepseek-coder"),
    ("bigcode/starcoder2-15b", "starcoder2"), ("starcoder2:3b", "starcoder2"), ("bigcode/starcoderbase-1b", "starcoder"),
    ("bigcode/santacoder", "santacoder"), ("codellama:7b-code", "codellama"), ("meta-llama/CodeLlama-7b-hf", "codellama"),
    ("codestral:22b", "codestral"), ("mistralai/Codestral-22B-v0.1", "codestral"), ("THUDM/codegeex4-all-9b", "codegeex4"),
    ("codegeex4:9b", "codegeex4"), ("glm5-code-tiny", "glm"), ("glm-5", "glm"), ("THUDM/glm-4-9b-chat", None),
    ("llama3.2", None), ("mistral", None), ("gpt-4o", None), ("qwen2.5:7b", None), ("deepseek-v3", None),
])
def test_detection_from_served_model_names(name: str, family: str | None) -> None:
    assert detect_family(name) == family


def test_template_for_auto_named_custom_and_errors() -> None:
    assert template_for("auto", "qwen2.5-coder:7b").name == "qwen2.5-coder"
    assert template_for("auto", "llama3.2").name == "glm"  # undetected: this project's own layout
    assert template_for("StarCoder2").name == "starcoder2"
    with pytest.raises(ValueError, match="unknown infilling template 'qwen'.*codellama"):
        template_for("qwen")
    with pytest.raises(ValueError, match="fimTemplate"):
        template_for("custom")
    assert set(FAMILIES) == {*TEMPLATES, "custom"}


def test_custom_template_substitutes_once_and_keeps_other_braces() -> None:
    template = custom_template("<PRE>{prefix}<SUF>{suffix}<MID>// {path} {not_a_field}", stop=["<EOT>", ""])
    out = template(FimInput("f({suffix})", "{prefix}", path="a.js"))
    assert out == "<PRE>f({suffix})<SUF>{prefix}<MID>// a.js {not_a_field}" and template.stop == ("<EOT>",)
    files = custom_template("{files}\n{prefix}|{suffix}")(FimInput("p", "s", files=(FileChunk("u.py", "X"),)))
    assert files == "u.py\nX\np|s"
    for bad in ("{prefix} only", "{prefix}{suffix}{prefix}", "no placeholders"):
        with pytest.raises(ValueError, match="exactly once"):
            custom_template(bad)


def test_fim_input_from_a_prompt_with_and_without_files() -> None:
    plain = FimInput.from_prompt(Prompt("a", "b"))
    assert (plain.prefix, plain.suffix, plain.files, plain.path) == ("a", "b", (), "")

    class WithFiles(Prompt):
        pass

    prompt = WithFiles("a", "b")
    prompt.files, prompt.path = [("u.py", "X")], "m.py"  # type: ignore[attr-defined]
    rich = FimInput.from_prompt(prompt)
    assert rich.files == (FileChunk("u.py", "X"),) and rich.path == "m.py"
