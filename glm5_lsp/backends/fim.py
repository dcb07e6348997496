"""Fill-in-the-middle prompts per model family: one table, each entry the family's published format.

A served model only infills well when it sees the exact layout it was trained on. A backend that
sends prompt *text* (``/v1/completions``, Ollama's ``raw`` mode) renders it with a
:class:`FimTemplate` from :data:`TEMPLATES`, chosen by :func:`template_for` from the ``model.fim``
setting or, where the served model's name says so unambiguously, by :func:`detect_family`.

Each template also carries the family's stop strings (its end-of-text and its own control tokens,
which a model that ran past the hole writes next) and, where the family publishes one, the
repository-level form that puts other files' snippets before the current file (Qwen2.5-Coder's
``<|repo_name|>``/``<|file_sep|>``, StarCoder2's ``<repo_name>``/``<file_sep>``, CodeGeeX4's
``###REFERENCE:``, DeepSeek-Coder's path comments).

Where each format is published (the tests quote these):

- ``glm``: this project's own GLM-5 checkpoints (``glm5-lsp serve-model``), prefix-suffix-middle with
  GLM's code tokens: ``Tokenizer.fim_prompt_ids`` in ``glm5_lsp/model/tokenizer.py``.
- ``codegeex4``: THUDM/CodeGeeX4, ``guides/Infilling_guideline.md`` (suffix first, inside one
  ``<|user|>`` turn, with ``###PATH:``/``###LANGUAGE:``/``###MODE:`` and ``###REFERENCE:`` blocks).
- ``qwen2.5-coder``: QwenLM/Qwen2.5-Coder ``README.md`` ("File-Level Code Completion" and
  "Repository-Level Code Completion"); the repository-level infilling layout is the Qwen2.5-Coder
  technical report's (arXiv:2409.12186), which llama.cpp's ``/infill`` also follows.
- ``deepseek-coder``: deepseek-ai/DeepSeek-Coder ``README.md`` ("Code Insertion", "Repository Level
  Code Completion": each file headed by a comment with its path).
- ``starcoder``: bigcode/starcoder's model card (``<fim_prefix>``/``<fim_suffix>``/``<fim_middle>``).
- ``starcoder2``: the same tokens; the repository layout is the StarCoder2 paper's (arXiv:2402.19173,
  section 5.1): ``<repo_name>r<file_sep>path0\\ncode0<file_sep><fim_prefix>path1\\ncode1_pre<fim_suffix>...``.
- ``santacoder``: bigcode/santacoder's model card: hyphens, ``<fim-prefix>``, not underscores.
- ``codellama``: meta-llama/codellama ``llama/generation.py`` (``infilling_prompt_tokens``: format
  as ``"<PRE> {pre} <SUF>{suf} <MID>"``), the form Ollama's ``codellama:code`` template sends.
- ``codestral``: mistral-common ``InstructTokenizerV2.encode_fim``: ``[SUFFIX]`` suffix ``[PREFIX]``
  prefix (the beginning-of-text token is the server's to add, like every family's).
- ``custom``: ``{prefix}``/``{suffix}`` (and optionally ``{path}``, ``{repo}``, ``{files}``) in a
  template from the settings, with its own stop strings (:func:`custom_template`).

No template writes a beginning-of-text token: vLLM, SGLang, llama.cpp and Ollama add the model's own
when they tokenize a prompt.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

# A language's line-comment leader, for families whose repository format heads each file with a
# comment naming it (DeepSeek-Coder). Languages not listed use "#".
_COMMENT = {
    "c": "//", "cpp": "//", "c++": "//", "csharp": "//", "go": "//", "java": "//", "javascript": "//",
    "typescript": "//", "typescriptreact": "//", "javascriptreact": "//", "rust": "//", "kotlin": "//",
    "swift": "//", "scala": "//", "dart": "//", "php": "//", "lua": "--", "sql": "--", "haskell": "--",
}


@dataclass(frozen=True)
class FileChunk:
    """Another file's snippet, shown to the model before the current file."""

    path: str  # relative to the repository root
    text: str


@dataclass(frozen=True)
class FimInput:
    """Everything a template may use. Only ``prefix`` and ``suffix`` are needed; the rest enables the
    repository-level forms (``files``) and the families' file headers (``path``, ``language``)."""

    prefix: str
    suffix: str
    path: str = ""  # the current file, relative to the repository root
    repo: str = ""  # the repository's name
    language: str = ""  # an LSP language id: python, rust, typescript, ...
    files: tuple[FileChunk, ...] = ()

    @classmethod
    def from_prompt(cls, prompt: object) -> FimInput:
        """From a :class:`glm5_lsp.spans.Prompt`: its prefix and suffix, and the optional ``path``,
        ``repo``, ``language`` and ``files`` (``(path, text)`` pairs or :class:`FileChunk`) where the
        prompt carries them."""
        files = tuple(
            item if isinstance(item, FileChunk) else FileChunk(str(item[0]), str(item[1]))
            for item in (getattr(prompt, "files", None) or ())
        )
        return cls(
            prefix=str(getattr(prompt, "prefix", "")), suffix=str(getattr(prompt, "suffix", "")),
            path=str(getattr(prompt, "path", "") or ""), repo=str(getattr(prompt, "repo", "") or ""),
            language=str(getattr(prompt, "language", "") or ""), files=files,
        )


@dataclass(frozen=True)
class FimTemplate:
    """One family's infilling layout: ``render(FimInput) -> prompt text`` and its stop strings."""

    name: str
    render: Callable[[FimInput], str]
    stop: tuple[str, ...]
    source: str  # where the format is published
    repo_level: bool = False  # renders ``FimInput.files`` in the family's repository format
    tokens: tuple[str, ...] = field(default=())  # the control tokens the layout uses

    def __call__(self, fim: FimInput) -> str:
        return self.render(fim)

    def prompt(self, prefix: str, suffix: str, *, path: str = "", repo: str = "", language: str = "",
               files: Sequence[tuple[str, str]] = ()) -> str:
        """Shorthand: ``template.prompt(prefix, suffix, path="main.py", files=[("util.py", text)])``."""
        chunks = tuple(FileChunk(name, text) for name, text in files)
        return self.render(FimInput(prefix, suffix, path=path, repo=repo, language=language, files=chunks))


# ---- the families ---------------------------------------------------------------------------


def _glm(fim: FimInput) -> str:
    return f"<|code_prefix|>{fim.prefix}<|code_suffix|>{fim.suffix}<|code_middle|>"


_GEEX_LANGUAGES = {
    "python": "Python", "javascript": "JavaScript", "typescript": "TypeScript", "java": "Java",
    "c": "C", "cpp": "C++", "csharp": "C#", "go": "Go", "rust": "Rust", "php": "PHP", "ruby": "Ruby",
    "shellscript": "Shell", "kotlin": "Kotlin", "swift": "Swift", "lua": "Lua", "sql": "SQL",
    "html": "HTML", "css": "CSS", "markdown": "Markdown", "scala": "Scala", "dart": "Dart",
}


def _codegeex4(fim: FimInput) -> str:
    refs = "".join(f"###REFERENCE:\n###PATH:{chunk.path}\n{chunk.text}\n" for chunk in fim.files)
    language = _GEEX_LANGUAGES.get(fim.language.lower(), fim.language)
    # BLOCK is the guideline's default mode; the editor decides itself where a single line ends.
    return (f"<|user|>\n{refs}###PATH:{fim.path}\n###LANGUAGE:{language}\n###MODE:BLOCK\n"
            f"<|code_suffix|>{fim.suffix}<|code_prefix|>{fim.prefix}<|code_middle|><|assistant|>\n")


def _qwen(fim: FimInput) -> str:
    body = f"<|fim_prefix|>{fim.prefix}<|fim_suffix|>{fim.suffix}<|fim_middle|>"
    if not fim.files:
        return body
    files = "".join(f"<|file_sep|>{chunk.path}\n{chunk.text}\n" for chunk in fim.files)
    return f"<|repo_name|>{fim.repo or 'repository'}\n{files}<|file_sep|>{fim.path or 'current'}\n{body}"


def _deepseek(fim: FimInput) -> str:
    body = f"<｜fim▁begin｜>{fim.prefix}<｜fim▁hole｜>{fim.suffix}<｜fim▁end｜>"
    if not fim.files:
        return body
    lead = _COMMENT.get(fim.language.lower(), "#")
    files = "".join(f"{lead} {chunk.path}\n{chunk.text}\n\n" for chunk in fim.files)
    current = f"{lead} {fim.path}\n" if fim.path else ""
    return f"<｜fim▁begin｜>{files}{current}{fim.prefix}<｜fim▁hole｜>{fim.suffix}<｜fim▁end｜>"


def _starcoder(fim: FimInput) -> str:
    return f"<fim_prefix>{fim.prefix}<fim_suffix>{fim.suffix}<fim_middle>"


def _starcoder2(fim: FimInput) -> str:
    if not fim.files:
        return _starcoder(fim)
    files = "".join(f"<file_sep>{chunk.path}\n{chunk.text}" for chunk in fim.files)
    return (f"<repo_name>{fim.repo or 'repository'}{files}"
            f"<file_sep><fim_prefix>{fim.path or 'current'}\n{fim.prefix}<fim_suffix>{fim.suffix}<fim_middle>")


def _santacoder(fim: FimInput) -> str:
    return f"<fim-prefix>{fim.prefix}<fim-suffix>{fim.suffix}<fim-middle>"


def _codellama(fim: FimInput) -> str:
    return f"<PRE> {fim.prefix} <SUF>{fim.suffix} <MID>"


def _codestral(fim: FimInput) -> str:
    return f"[SUFFIX]{fim.suffix}[PREFIX]{fim.prefix}"


TEMPLATES: dict[str, FimTemplate] = {
    template.name: template
    for template in (
        FimTemplate(
            "glm", _glm, ("<|endoftext|>", "<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>"),
            "glm5_lsp/model/tokenizer.py Tokenizer.fim_prompt_ids (this project's checkpoints)",
            tokens=("<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>"),
        ),
        FimTemplate(
            "codegeex4", _codegeex4,
            ("<|endoftext|>", "<|user|>", "<|assistant|>", "<|observation|>", "<|code_prefix|>",
             "<|code_suffix|>", "<|code_middle|>"),
            "THUDM/CodeGeeX4 guides/Infilling_guideline.md", repo_level=True,
            tokens=("<|user|>", "<|code_suffix|>", "<|code_prefix|>", "<|code_middle|>", "<|assistant|>"),
        ),
        FimTemplate(
            "qwen2.5-coder", _qwen,
            ("<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
             "<|repo_name|>", "<|file_sep|>", "<|im_start|>", "<|im_end|>"),
            "QwenLM/Qwen2.5-Coder README.md; arXiv:2409.12186 (repository-level FIM)", repo_level=True,
            tokens=("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>"),
        ),
        FimTemplate(
            "deepseek-coder", _deepseek,
            ("<｜end▁of▁sentence｜>", "<|EOT|>", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
            "deepseek-ai/DeepSeek-Coder README.md (Code Insertion; Repository Level Code Completion)",
            repo_level=True, tokens=("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
        ),
        FimTemplate(
            "starcoder", _starcoder,
            ("<|endoftext|>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>"),
            "bigcode/starcoder model card", tokens=("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
        ),
        FimTemplate(
            "starcoder2", _starcoder2,
            ("<|endoftext|>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>", "<repo_name>"),
            "StarCoder2 paper, arXiv:2402.19173 section 5.1", repo_level=True,
            tokens=("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<repo_name>", "<file_sep>"),
        ),
        FimTemplate(
            "santacoder", _santacoder, ("<|endoftext|>", "<fim-prefix>", "<fim-suffix>", "<fim-middle>"),
            "bigcode/santacoder model card", tokens=("<fim-prefix>", "<fim-suffix>", "<fim-middle>"),
        ),
        FimTemplate(
            "codellama", _codellama, ("<EOT>", "</s>", "<PRE>", "<SUF>", "<MID>"),
            "meta-llama/codellama llama/generation.py infilling_prompt_tokens",
            tokens=("<PRE>", "<SUF>", "<MID>"),
        ),
        FimTemplate(
            "codestral", _codestral, ("</s>", "[PREFIX]", "[SUFFIX]", "[MIDDLE]"),
            "mistral-common InstructTokenizerV2.encode_fim", tokens=("[SUFFIX]", "[PREFIX]"),
        ),
    )
}

FAMILIES: tuple[str, ...] = (*TEMPLATES, "custom")

# Served-model names -> family, first match wins. Only names that say which family they are: a
# plain "llama3" or "mistral" says nothing about infilling, so it is left to the setting.
_DETECT: tuple[tuple[str, str], ...] = (
    (r"codegeex", "codegeex4"),
    (r"qwen[\d.]*-?coder", "qwen2.5-coder"),
    (r"deepseek-?coder", "deepseek-coder"),
    (r"starcoder-?2", "starcoder2"),
    (r"starcoder", "starcoder"),
    (r"santacoder", "santacoder"),
    (r"code-?_?llama", "codellama"),
    (r"codestral", "codestral"),
    (r"glm-?5", "glm"),  # GLM-5 names (this project's checkpoints, glm5-code-tiny); GLM-4 chat models are not infillers
)


def detect_family(model_name: str) -> str | None:
    """The family a served model's name names unambiguously (``Qwen/Qwen2.5-Coder-7B``,
    ``qwen2.5-coder:1.5b-base``, ``deepseek-coder-6.7b-base``, ``codellama:7b-code``...), else None."""
    name = model_name.lower().replace("_", "-")
    for pattern, family in _DETECT:
        if re.search(pattern, name):
            return family
    return None


_PLACEHOLDER = re.compile(r"\{(prefix|suffix|path|repo|language|files)\}")


def custom_template(template: str, stop: Sequence[str] = ()) -> FimTemplate:
    """A template from the settings: ``{prefix}`` and ``{suffix}`` once each, and optionally ``{path}``,
    ``{repo}``, ``{language}`` and ``{files}`` (other files, each as its path, a newline and its text,
    separated by blank lines). Other braces are literal text. ``ValueError`` when the placeholders
    are missing or repeated."""
    found = _PLACEHOLDER.findall(template)
    for needed in ("prefix", "suffix"):
        count = found.count(needed)
        if count != 1:
            raise ValueError(f"a custom infilling template needs {{{needed}}} exactly once, found it {count} times: {template!r}")
    stops = tuple(s for s in stop if s)

    def render(fim: FimInput) -> str:
        values: Mapping[str, str] = {
            "prefix": fim.prefix, "suffix": fim.suffix, "path": fim.path, "repo": fim.repo,
            "language": fim.language, "files": "\n\n".join(f"{c.path}\n{c.text}" for c in fim.files),
        }
        return _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)  # one pass: inserted text is never re-read

    return FimTemplate("custom", render, stops, "the model.fimTemplate setting", repo_level="{files}" in found)


def template_for(family: str = "auto", model_name: str = "", custom: str = "", custom_stop: Sequence[str] = ()) -> FimTemplate:
    """The template to use: ``family`` by name, ``custom`` (needs ``custom``), or ``auto``: detected from
    ``model_name``, else ``glm`` (the layout this project's own served models were trained on).

    ``ValueError`` for an unknown family, naming the known ones.
    """
    family = (family or "auto").strip().lower()
    if family == "auto":
        family = detect_family(model_name) or "glm"
    if family == "custom":
        if not custom:
            raise ValueError("model.fim is 'custom' but no template is set (model.fimTemplate)")
        return custom_template(custom, custom_stop)
    try:
        return TEMPLATES[family]
    except KeyError:
        raise ValueError(f"unknown infilling template {family!r}; expected auto, custom or one of "
                         f"{', '.join(TEMPLATES)}") from None


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to the first stop string (a server that ignores ``stop`` still cannot leak past one)."""
    cut = min((at for at in (text.find(stop) for stop in stops if stop) if at != -1), default=-1)
    return (text[:cut], True) if cut != -1 else (text, False)
