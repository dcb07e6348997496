"""Settings parsing: camelCase client JSON onto nested dataclasses, invalid values reported and ignored."""

from __future__ import annotations

import re

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


# ---- served models (the model section) --------------------------------------------------------


def test_the_model_section_offers_the_command_lines_backends_and_layouts() -> None:
    import dataclasses

    from glm5_lsp.backends.factory import FIM_CHOICES, KINDS
    from glm5_lsp.server.settings import FIM_LAYOUTS, ModelSettings

    fields = {f.name: f for f in dataclasses.fields(ModelSettings)}
    assert fields["backend"].metadata["choices"] == KINDS
    assert FIM_LAYOUTS == FIM_CHOICES and fields["fim"].metadata["choices"] == FIM_CHOICES


def test_served_model_settings_parse() -> None:
    settings, problems = parse_settings({"model": {"backend": "ollama", "name": "qwen2.5-coder:1.5b-base",
                                                   "fim": "custom", "fimTemplate": "<p>{prefix}<s>{suffix}<m>",
                                                   "fimStop": ["<eot>", "<p>"]}})
    assert problems == []
    model = settings.model
    assert (model.backend, model.fim, model.fim_template, model.fim_stop) == (
        "ollama", "custom", "<p>{prefix}<s>{suffix}<m>", ["<eot>", "<p>"])
    assert to_json(settings)["model"]["fimStop"] == ["<eot>", "<p>"]
    again, problems = parse_settings(to_json(settings))
    assert problems == [] and again == settings


@pytest.mark.parametrize("raw, expected", [
    ({"fim": "gpt"}, "model.fim: expected one of 'auto', 'glm'"),
    ({"fimStop": "<eot>"}, "model.fimStop: expected a list of strings, got '<eot>'"),
    ({"fimStop": ["<eot>", 3]}, "model.fimStop: expected a list of strings"),
    ({"backend": "vllm"}, "model.backend: expected one of 'local', 'openai', 'llamacpp', 'ollama'"),
])
def test_bad_served_model_values_are_reported(raw: dict, expected: str) -> None:
    settings, problems = parse_settings({"model": raw})
    assert len(problems) == 1 and problems[0].startswith(expected), problems
    assert settings == Settings()


def _backend(model: dict) -> object:
    from glm5_lsp.backends.factory import create_backend
    from glm5_lsp.server.loader import backend_options

    settings, problems = parse_settings({"model": model})
    assert problems == []
    kind, options = backend_options(settings)
    return create_backend(kind, **options)


def test_each_backend_kind_is_made_from_the_settings() -> None:
    from glm5_lsp.backends.fim import TEMPLATES
    from glm5_lsp.backends.llamacpp_infill import LlamaCppInfillBackend
    from glm5_lsp.backends.ollama import OllamaBackend
    from glm5_lsp.backends.openai_http import OpenAIHTTPBackend

    openai = _backend({"backend": "openai", "url": "http://gpu:8000/v1", "name": "Qwen/Qwen2.5-Coder-7B",
                       "timeoutSeconds": 7, "apiKeyEnv": "MY_KEY"})
    assert isinstance(openai, OpenAIHTTPBackend) and openai.template is TEMPLATES["qwen2.5-coder"]
    assert (openai.base_url, openai.timeout, openai.api_key_env) == ("http://gpu:8000", 7.0, "MY_KEY")
    assert _backend({"backend": "openai", "url": "http://gpu:8000", "fim": "server"}).template is None
    forced = _backend({"backend": "openai", "url": "http://gpu:8000", "name": "Qwen/Qwen2.5-Coder-7B", "fim": "codestral"})
    assert forced.template is TEMPLATES["codestral"]  # the setting wins over the name
    custom = _backend({"backend": "openai", "url": "http://gpu:8000", "fim": "custom",
                       "fimTemplate": "<p>{prefix}<s>{suffix}<m>", "fimStop": ["<eot>"]})
    assert custom.template.prompt("a", "b") == "<p>a<s>b<m>" and custom.template.stop == ("<eot>",)
    llama = _backend({"backend": "llamacpp", "fim": "starcoder2"})
    assert isinstance(llama, LlamaCppInfillBackend) and llama.base_url == "http://127.0.0.1:8080"
    assert llama.extra_stop == TEMPLATES["starcoder2"].stop
    ollama = _backend({"backend": "ollama", "name": "deepseek-coder:6.7b-base", "url": "http://box:11434"})
    assert isinstance(ollama, OllamaBackend) and ollama.template is TEMPLATES["deepseek-coder"]
    assert ollama.base_url == "http://box:11434" and ollama.model == "deepseek-coder:6.7b-base"
    assert _backend({"backend": "ollama", "name": "llama3"}).template is None  # no family in the name: Ollama's own


@pytest.mark.parametrize("model, message", [
    ({"backend": "openai"}, "needs model.url"),
    ({"backend": "ollama"}, "needs model.name"),
    ({"backend": "llamacpp", "chat": True}, "model.chat is for model.backend 'openai'"),
    ({"backend": "openai", "url": "http://gpu:8000", "fim": "custom"}, "model.fimTemplate is empty"),
    ({"backend": "openai", "url": "http://gpu:8000", "fim": "custom", "fimTemplate": "{prefix}"}, "{suffix} exactly once"),
])
def test_contradicting_model_settings_are_a_clear_error(model: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        _backend(model)


@pytest.mark.parametrize("backend, monitors", [("local", True), ("openai", False), ("llamacpp", False), ("ollama", False)])
def test_only_the_in_process_model_runs_the_name_monitor(backend: str, monitors: bool) -> None:
    """A served model gives no logits to mask: loading it must not warm jedi up for the monitor."""
    from glm5_lsp.server.loader import Engine

    settings, problems = parse_settings({"model": {"backend": backend}})
    assert problems == [] and Engine(settings).monitors_names is monitors
