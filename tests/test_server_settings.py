"""Settings parsing: camelCase client JSON onto nested dataclasses, invalid values reported and ignored."""

from __future__ import annotations

import pytest

from glm5_lsp.server.settings import Settings, camel, parse_settings, snake, to_json


def test_defaults_are_complete_and_match_the_attention_config() -> None:
    settings, problems = parse_settings(None)
    assert problems == []
    assert settings == Settings()
    attention = settings.attention
    assert (attention.global_sparsity, attention.syntax_aware, attention.api_focus, attention.error_context,
            attention.indent_flow) == (0.4, True, 0.7, 0.9, 0.5)


def test_camel_case_values_are_applied_nested() -> None:
    settings, problems = parse_settings({
        "model": {"backend": "openai", "url": "http://127.0.0.1:8000", "timeoutSeconds": 5},
        "attention": {"globalSparsity": 0.25, "syntaxAware": False},
        "completion": {"lines": "multi", "maxTokens": 12, "debounceMs": 0},
        "features": {"codeActions": False},
        "logLevel": "debug",
    })
    assert problems == []
    assert settings.model.backend == "openai" and settings.model.timeout_seconds == 5.0
    assert isinstance(settings.model.timeout_seconds, float)
    assert settings.attention.global_sparsity == 0.25 and settings.attention.syntax_aware is False
    assert (settings.completion.lines, settings.completion.max_tokens, settings.completion.debounce_ms) == ("multi", 12, 0)
    assert settings.features.code_actions is False and settings.features.inline_completion is True
    assert settings.log_level == "debug"


def test_a_glm5_section_is_unwrapped() -> None:
    settings, problems = parse_settings({"glm5": {"completion": {"maxTokens": 7}}})
    assert problems == [] and settings.completion.max_tokens == 7


@pytest.mark.parametrize(
    "raw, path, expected_field",
    [
        ({"completion": {"maxTokens": "lots"}}, "completion.maxTokens", "an integer"),
        ({"completion": {"maxTokens": True}}, "completion.maxTokens", "an integer"),
        ({"completion": {"maxTokens": 0}}, "completion.maxTokens", "[1, 4096]"),
        ({"completion": {"lines": "three"}}, "completion.lines", "one of"),
        ({"attention": {"apiFocus": 1.5}}, "attention.apiFocus", "[0.0, 1.0]"),
        ({"attention": {"apiFocus": float("nan")}}, "attention.apiFocus", "a number"),
        ({"features": {"completion": "yes"}}, "features.completion", "true or false"),
        ({"model": {"backend": "gpt"}}, "model.backend", "one of"),
        ({"model": 3}, "model", "an object"),
        ({"noSuchThing": 1}, "noSuchThing", "unknown setting"),
    ],
)
def test_an_invalid_value_is_reported_and_the_default_kept(raw: dict, path: str, expected_field: str) -> None:
    settings, problems = parse_settings(raw)
    assert len(problems) == 1
    assert problems[0].startswith(path + ":") and expected_field in problems[0]
    assert settings == Settings()


def test_valid_values_survive_beside_invalid_ones_and_the_base_is_not_mutated() -> None:
    base, _ = parse_settings({"completion": {"maxTokens": 20}})
    settings, problems = parse_settings({"completion": {"maxTokens": -1, "debounceMs": 5}}, base)
    assert len(problems) == 1
    assert settings.completion.max_tokens == 20 and settings.completion.debounce_ms == 5
    assert base.completion.debounce_ms == Settings().completion.debounce_ms


def test_not_an_object_is_rejected_whole() -> None:
    settings, problems = parse_settings(["completion"])
    assert settings == Settings() and problems and "expected an object" in problems[0]


def test_to_json_round_trips() -> None:
    custom, _ = parse_settings({"attention": {"indentFlow": 0.1}, "repair": {"maxRounds": 4}})
    again, problems = parse_settings(to_json(custom))
    assert problems == [] and again == custom


@pytest.mark.parametrize("name", ["multiline_max_tokens", "api_key_env", "log_level", "rounds"])
def test_camel_and_snake_are_inverse(name: str) -> None:
    assert snake(camel(name)) == name
