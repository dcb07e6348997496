"""Server settings: nested dataclasses with complete defaults, parsed from camelCase client JSON.

Clients send settings in ``initializationOptions`` and ``workspace/didChangeConfiguration``
(either bare or wrapped in a ``"glm5"`` section). :func:`parse_settings` applies every valid value
on top of a base, keeps the base for each invalid or unknown one, and returns the problems so the
server can show them to the user; it never raises on bad input.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_type_hints


def _range(low: float, high: float) -> dict[str, Any]:
    return {"range": (low, high)}


def _choices(*options: str) -> dict[str, Any]:
    return {"choices": options}


def _embedded_min_quality() -> float:
    """The embedded model's gate threshold (``weights/glm5-code-tiny/gate/gate.json``), to 3 places; 0.5
    where the file is missing or unreadable."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "weights" / "glm5-code-tiny" / "gate" / "gate.json"
    try:
        value = float(json.loads(path.read_text(encoding="utf-8"))["threshold"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.5
    return round(value, 3) if 0.0 <= value <= 1.0 else 0.5


EMBEDDED_MIN_QUALITY = _embedded_min_quality()

# The infilling layouts ``model.fim`` accepts: ``glm5_lsp.backends.fim.FAMILIES`` between ``auto`` and
# ``server`` (a front end does not import the backends; tests/test_server_settings.py keeps the two equal).
FIM_LAYOUTS: tuple[str, ...] = (
    "auto", "glm", "codegeex4", "qwen2.5-coder", "deepseek-coder", "starcoder", "starcoder2", "santacoder",
    "codellama", "codestral", "custom", "server",
)


@dataclass
class ModelSettings:
    """Which generator serves requests: the in-process runtime or a served model (the CLI's ``--backend``)."""

    # local: the in-process runtime; openai: an OpenAI-compatible server (vLLM, SGLang, llama.cpp's
    # server, LM Studio, serve-model); llamacpp: llama.cpp's native /infill; ollama: Ollama's /api/generate
    backend: str = field(default="local", metadata=_choices("local", "openai", "llamacpp", "ollama"))
    path: str = ""  # local: checkpoint folder; "" is the embedded default model
    device: str = "cpu"  # local: torch device
    # served: the server's base URL, e.g. http://host:8000/v1; empty: llamacpp http://127.0.0.1:8080,
    # ollama http://127.0.0.1:11434 (openai needs one)
    url: str = ""
    # served: the model's name as the server knows it ("glm-5" when empty for openai; ollama needs one,
    # e.g. qwen2.5-coder:1.5b-base); model.fim "auto" reads the infilling layout from it
    name: str = ""
    api_key_env: str = "GLM5_API_KEY"  # served: environment variable holding the key (never logged)
    chat: bool = False  # openai: /v1/chat/completions instead of /v1/completions
    # served: the most one request may take, retries and waits included (an as-you-type completion
    # also ends at budgets.completionMs)
    timeout_seconds: float = field(default=30.0, metadata=_range(0.1, 600.0))
    # served: the infilling prompt layout. auto: the family the model's name says, else glm; a family
    # forces its layout; custom: model.fimTemplate; server: the server lays it out (OpenAI's suffix
    # field, llama.cpp's /infill from the GGUF, Ollama's model template)
    fim: str = field(default="auto", metadata=_choices(*FIM_LAYOUTS))
    # with model.fim "custom": the prompt, {prefix} and {suffix} once each; optionally {path}, {repo},
    # {language} and {files} (other files' snippets)
    fim_template: str = ""
    # with model.fim "custom": the strings that end generation (the model's end-of-text, its FIM tokens)
    fim_stop: list[str] = field(default_factory=list)


@dataclass
class AttentionSettings:
    """The attention policy knobs (the runtime's ``AttentionConfig``)."""

    global_sparsity: float = field(default=0.4, metadata=_range(0.0, 0.99))  # 1.0 would leave top-k nothing
    syntax_aware: bool = True
    api_focus: float = field(default=0.7, metadata=_range(0.0, 1.0))
    error_context: float = field(default=0.9, metadata=_range(0.0, 1.0))
    indent_flow: float = field(default=0.5, metadata=_range(0.0, 1.0))




@dataclass
class BudgetSettings:
    """How much the prompt may hold and how long a request may take."""

    # 0: fit the model, the context it was trained at less the multi-line generation budget
    # (the checkpoint's metrics.json ``seq_len``), else DEFAULT_CONTEXT_TOKENS
    context_tokens: int = field(default=0, metadata=_range(0, 131072))
    # A single-line completion's prompt (inline and list completions); 0: half the budget above, and
    # no more than half the model's DSA top-k (the prompt and its line then never run the indexer).
    # Its prefill is the largest part of an as-you-type request, and one line needs the code near it
    # most (the workspace memory reads the rest of the file).
    line_context_tokens: int = field(default=0, metadata=_range(0, 131072))
    api_doc_tokens: int = field(default=256, metadata=_range(0, 65536))
    symbol_tokens: int = field(default=256, metadata=_range(0, 65536))
    # Snippets of other open or recently edited files most like the code at the cursor (and the
    # workspace memory's longest match), their own role in the prompt; at most a fifth of a prompt,
    # none below 48 tokens (so not in a single line's prompt at the default budgets).
    snippet_tokens: int = field(default=128, metadata=_range(0, 65536))
    request_timeout_ms: int = field(default=5000, metadata=_range(50, 600000))
    # As-you-type completions (inline and list): no repair round starts after this, and the
    # generation running then is cut there (its text still judged); ghost text that comes later
    # than this has usually been typed over. 450 ms: what is judged after the deadline (the candidate,
    # its first word) brings a request to about 600 ms at the 95th percentile on 2 cores.
    completion_ms: int = field(default=450, metadata=_range(50, 600000))
    fix_timeout_ms: int = field(default=60000, metadata=_range(100, 3600000))


@dataclass
class CompletionSettings:
    """Inline and list completion behaviour."""

    lines: str = field(default="auto", metadata=_choices("auto", "single", "multi"))
    max_tokens: int = field(default=32, metadata=_range(1, 4096))  # single-line completions
    multiline_max_tokens: int = field(default=96, metadata=_range(1, 8192))
    # Single-line completions end at a token the model gives less than this probability, cut back to
    # where the last word or bracket ended: the tail it is unsure of is mostly wrong and costs a
    # decoding step a token. 0: off.
    min_token_prob: float = field(default=0.1, metadata=_range(0.0, 0.99))
    # 0: a newer keystroke cancels the running completion between tokens anyway (``jobs.Supersession``),
    # and a wait here is latency every request pays
    debounce_ms: int = field(default=0, metadata=_range(0, 5000))
    cache_size: int = field(default=64, metadata=_range(0, 100000))
    temperature: float = field(default=0.0, metadata=_range(0.0, 2.0))
    # The completion gate: an as-you-type candidate that passes the checks is shown only when the gate
    # beside the model (LightGBM, ``<model>/gate``) gives it at least this probability of being kept. The
    # default is the embedded model's gate's own threshold (its gate.json, chosen on held-out code); left
    # at it, another model's gate uses its own. 0 shows every candidate; a model without a gate shows all.
    min_quality: float = field(default=EMBEDDED_MIN_QUALITY, metadata=_range(0.0, 1.0))
    # A gate folder to use instead of the one beside the model ("": ``<model>/gate``; a served model has
    # none unless named here, and then the gate reads only what the server returns)
    gate_path: str = ""
    # Record which shown inline suggestions were kept (accepted and not undone within 30 s) in the
    # user's data folder (``glm5-lsp/acceptance.jsonl``): local, never sent anywhere, numbers only (no
    # code); what ``glm5-lsp gate train --log`` updates the gate from. Off: nothing is written.
    acceptance_log: bool = True


@dataclass
class RepairSettings:
    """The regenerate-from-diagnostics loop."""

    max_rounds: int = field(default=2, metadata=_range(1, 16))  # generations in all, the first included
    return_unclean: bool = False
    monitor: bool = True  # check generated names against the symbol table while decoding


@dataclass
class MemorySettings:
    """The workspace memory: the workspace's files and the libraries they import as the model's
    token ids, whose longest matches are mixed into decoding and proposed as drafts. With no
    workspace folder from the editor (a file opened on its own), the files beside the first file
    opened, not those of the folders below it."""

    enabled: bool = True  # built for the workspace folder when the model loads; updated as documents change
    libraries: bool = True  # the installed distributions the workspace imports (cached on disk, shared)
    stdlib: bool = True  # and the standard library
    max_files: int = field(default=5000, metadata=_range(0, 1_000_000))  # workspace files indexed, in path order
    # library code held, in the model's tokens (about 6 bytes of memory a token)
    max_library_tokens: int = field(default=16_000_000, metadata=_range(0, 500_000_000))
    # the memory's long, confident continuations verified by the model in one pass (the same text, sooner)
    drafts: bool = True
    # what followed shorter suffixes of the context mixed into decoding beside the longest match's (lower
    # held-out perplexity, the same one-line answers, slower: BENCHMARKS.md, "Shorter suffixes")
    shorter_suffixes: bool = False


@dataclass
class FeatureSettings:
    """Which features are on."""

    inline_completion: bool = True
    completion: bool = True
    code_actions: bool = True
    generate_body: bool = True
    diagnostics: bool = True  # publish our own compiler diagnostics


@dataclass
class LimitSettings:
    """What one message and one document may cost."""

    # A message body over this many MiB is refused (an error with "id": null) without being read.
    max_message_mb: int = field(default=64, metadata=_range(1, 2048))
    # The model, the checks and the indexes read at most this many characters of a document: a
    # longer one is read as its head (the imports) and a window around the cursor, and its own
    # diagnostics are not published (a log line says so once per document).
    window_chars: int = field(default=100_000, metadata=_range(1000, 100_000_000))


@dataclass
class Settings:
    """Everything the server can be told; every field has a working default."""

    model: ModelSettings = field(default_factory=ModelSettings)
    attention: AttentionSettings = field(default_factory=AttentionSettings)
    budgets: BudgetSettings = field(default_factory=BudgetSettings)
    completion: CompletionSettings = field(default_factory=CompletionSettings)
    repair: RepairSettings = field(default_factory=RepairSettings)
    features: FeatureSettings = field(default_factory=FeatureSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    memory: MemorySettings = field(default_factory=MemorySettings)
    log_level: str = field(default="info", metadata=_choices("error", "warning", "info", "debug"))


def camel(name: str) -> str:
    """``multiline_max_tokens`` -> ``multilineMaxTokens``."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def snake(name: str) -> str:
    """``multilineMaxTokens`` -> ``multiline_max_tokens`` (snake_case input is accepted as is)."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def parse_settings(raw: Any, base: Settings | None = None) -> tuple[Settings, list[str]]:
    """Apply client JSON on a copy of ``base`` (defaults when None); return it and the problems found.

    Each invalid value leaves that one setting at its base value and adds a message naming the
    camelCase path, the value and what was expected. ``None`` and ``{}`` change nothing.
    """
    settings = _deep_copy(base if base is not None else Settings())
    problems: list[str] = []
    if raw is None:
        return settings, problems
    if isinstance(raw, Mapping) and set(raw) == {"glm5"}:
        raw = raw["glm5"]
    if raw is None:
        return settings, problems
    if not isinstance(raw, Mapping):
        return settings, [f"settings: expected an object, got {_show(raw)}"]
    _apply(settings, raw, "", problems)
    return settings, problems


def to_json(settings: Any) -> dict[str, Any]:
    """The camelCase JSON form (what a client would send to get these settings)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        out[camel(f.name)] = to_json(value) if dataclasses.is_dataclass(value) else value
    return out


def _deep_copy(obj: Any) -> Any:
    changes = {
        f.name: _deep_copy(getattr(obj, f.name))
        for f in dataclasses.fields(obj)
        if dataclasses.is_dataclass(getattr(obj, f.name))
    }
    return dataclasses.replace(obj, **changes)


def _apply(target: Any, raw: Mapping[str, Any], path: str, problems: list[str]) -> None:
    hints = get_type_hints(type(target))
    fields = {f.name: f for f in dataclasses.fields(target)}
    for key, value in raw.items():
        where = f"{path}{key}"
        name = snake(str(key))
        if name not in fields:
            problems.append(f"{where}: unknown setting (ignored)")
            continue
        current = getattr(target, name)
        if dataclasses.is_dataclass(current):
            if value is None:
                continue
            if not isinstance(value, Mapping):
                problems.append(f"{where}: expected an object, got {_show(value)}; kept the defaults")
                continue
            _apply(current, value, f"{where}.", problems)
            continue
        error = _check(value, hints[name], fields[name].metadata)
        if error:
            problems.append(f"{where}: {error}; kept {_show(current)}")
            continue
        setattr(target, name, float(value) if hints[name] is float else list(value) if isinstance(value, list) else value)


def _check(value: Any, kind: Any, meta: Mapping[str, Any]) -> str | None:
    """Why ``value`` cannot be stored in a field of type ``kind``, or None when it can."""
    if kind is bool:
        if not isinstance(value, bool):
            return f"expected true or false, got {_show(value)}"
        return None
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        return f"expected an integer, got {_show(value)}"
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value)):
        return f"expected a number, got {_show(value)}"
    if kind is str and not isinstance(value, str):
        return f"expected a string, got {_show(value)}"
    if kind == list[str] and (not isinstance(value, list) or not all(isinstance(item, str) for item in value)):
        return f"expected a list of strings, got {_show(value)}"
    if "range" in meta:
        low, high = meta["range"]
        if not low <= value <= high:
            return f"expected a value in [{low}, {high}], got {_show(value)}"
    if "choices" in meta and value not in meta["choices"]:
        return f"expected one of {', '.join(map(repr, meta['choices']))}, got {_show(value)}"
    return None


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
