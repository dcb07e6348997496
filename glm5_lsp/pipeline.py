"""The one pipeline every front end calls: context -> backend -> post-processing -> repair.

The language server, ``glm5-lsp batch`` and ``glm5-lsp eval`` all go through :class:`Pipeline`, so
a change to prompt building, post-processing or repair lands everywhere at once. Three requests:

- :meth:`Pipeline.complete`: text to insert at a cursor in a document (single- or multi-line);
- :meth:`Pipeline.generate`: code for a signature plus docstring, or for an instruction;
- :meth:`Pipeline.fix`: the whole code, rewritten so its diagnostics go away.

The context engine (``glm5_lsp.context``) and the repair loop (``glm5_lsp.repair``) are used when
given (or importable); without them the prompt is the code around the cursor and candidates are
checked once with Python's own compiler.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Callable, Protocol

from glm5_lsp.backends.base import Backend, Completion, CompletionRequest
from glm5_lsp.spans import Prompt, Span

log = logging.getLogger(__name__)

# Special token strings of the GLM-5 code tokenizer; none of them may reach the user.
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>")
_SPECIAL_RE = re.compile(r"<\|[A-Za-z0-9_]+\|>")
# Top-level starts that end a generated Python function body (the usual HumanEval stops).
PYTHON_BODY_STOPS: tuple[str, ...] = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")
_EXTENSIONS = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".mjs": "javascript", ".ts": "typescript",
    ".tsx": "typescript", ".go": "go", ".rs": "rust", ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp",
    ".hpp": "cpp", ".java": "java",
}
_BRACES = {"(": ")", "[": "]", "{": "}"}


@dataclass
class PipelineSettings:
    """Knobs shared by every front end (the server maps its LSP settings onto these)."""

    max_tokens: int = 64  # single-line completions
    multiline_max_tokens: int = 256  # multi-line completions, generate and fix
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    max_prefix_chars: int = 6000  # plain prompt: code kept before the cursor
    max_suffix_chars: int = 2000  # plain prompt: code kept after the cursor
    use_attention_policy: bool = True
    repair: bool = True  # check (and, with the repair loop, regenerate) before returning
    return_unclean: bool = True  # return the best candidate even when it adds diagnostics


@dataclass
class PipelineResult:
    """What a front end gets back: the text plus how it was checked and what it cost."""

    text: str
    clean: bool  # True when the text adds no diagnostic to the document
    diagnostics_before: list[dict[str, Any]] = field(default_factory=list)
    diagnostics_after: list[dict[str, Any]] = field(default_factory=list)
    rounds: int = 1
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    finish_reason: str = "stop"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class PromptBuilder(Protocol):
    """The part of ``glm5_lsp.context.ContextEngine`` the pipeline uses."""

    def build_prompt(self, text: str, offset: int, *, path: str | None = None, language: str | None = None) -> Prompt: ...


DiagnoseFn = Callable[[str, str], list[dict[str, Any]]]


# --------------------------------------------------------------------------------------------
# Post-processing shared by all front ends
# --------------------------------------------------------------------------------------------


def strip_special_tokens(text: str) -> str:
    """Cut at the first end-of-text or FIM token and drop any other ``<|...|>`` special token."""
    cut = len(text)
    for token in SPECIAL_TOKENS:
        at = text.find(token)
        if at != -1:
            cut = min(cut, at)
    return _SPECIAL_RE.sub("", text[:cut])


def first_line(text: str) -> str:
    """A single-line completion: everything before the first newline."""
    return text.split("\n", 1)[0].rstrip("\r")


def block_indent(prefix: str) -> int:
    """Indentation (columns) of the block the cursor writes into, judged from the text before it."""
    lines = prefix.split("\n")
    current = lines[-1]
    if current.strip():
        return len(current) - len(current.lstrip())
    for line in reversed(lines[:-1]):
        if line.strip():
            indent = len(line) - len(line.lstrip())
            if line.rstrip().endswith((":", "{", "(", "[")):
                return max(len(current), indent + 1)
            return max(len(current), indent) if current else indent
    return len(current)


def cut_at_block_end(text: str, prefix: str, language: str) -> str:
    """Cut a multi-line completion where it leaves the cursor's block.

    Indentation languages (Python): at the first non-blank line, after the cursor's line, indented
    less than the block. Brace languages: where a closing brace would close a block opened before
    the cursor.
    """
    if language == "python" or language not in {"javascript", "typescript", "go", "rust", "c", "cpp", "java"}:
        indent = block_indent(prefix)
        pieces = text.split("\n")
        kept = [pieces[0]]
        for line in pieces[1:]:
            if line.strip() and len(line) - len(line.lstrip()) < indent:
                break
            kept.append(line)
        return "\n".join(kept).rstrip() if len(kept) < len(pieces) else "\n".join(kept)
    depth = 0
    for at, char in enumerate(text):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth < 0:
                return text[:at].rstrip()
    return text


def _bracket_depth(text: str) -> int:
    depth = 0
    for char in text:
        if char in _BRACES:
            depth += 1
        elif char in _BRACES.values():
            depth -= 1
    return depth


def strip_suffix_overlap(text: str, suffix: str) -> str:
    """Remove what the completion repeats of the code after the cursor.

    Two cases: the completion re-types the closing characters already after the cursor (``foo(x)``
    with ``)`` after the cursor: only stripped when the completion closes more brackets than it
    opens), and a multi-line completion that runs into the suffix's first non-blank line.
    """
    if not suffix or not text:
        return text
    rest_of_line = suffix.split("\n", 1)[0]
    if rest_of_line.strip() and _bracket_depth(text) < 0:
        for k in range(min(len(rest_of_line), len(text)), 0, -1):
            if text.endswith(rest_of_line[:k]):
                text = text[:-k]
                break
    next_line = next((line.strip() for line in suffix.split("\n")[1:] if line.strip()), None)
    if rest_of_line.strip() == "" and suffix.strip():
        next_line = next((line.strip() for line in suffix.split("\n") if line.strip()), None)
    if next_line and "\n" in text:
        lines = text.split("\n")
        for index in range(1, len(lines)):
            if lines[index].strip() == next_line:
                return "\n".join(lines[:index]).rstrip()
    return text


def infer_multiline(prefix: str, suffix: str) -> bool:
    """Multi-line when the cursor sits on an otherwise empty line (e.g. a fresh block body)."""
    before = prefix.rsplit("\n", 1)[-1]
    after = suffix.split("\n", 1)[0]
    return not before.strip() and not after.strip()


def guess_language(path: str | None, default: str = "python") -> str:
    if not path:
        return default
    for extension, language in _EXTENSIONS.items():
        if path.endswith(extension):
            return language
    return "text"


# --------------------------------------------------------------------------------------------
# Diagnostics (the repair package's providers when present; Python's compiler otherwise)
# --------------------------------------------------------------------------------------------


def compile_diagnostics(code: str, language: str) -> list[dict[str, Any]]:
    """Python's own compiler: at most one syntax error, as a JSON-friendly dict."""
    if language != "python":
        return []
    try:
        compile(code, "<candidate>", "exec", dont_inherit=True)
    except SyntaxError as error:
        return [{
            "line": error.lineno or 1, "column": error.offset or 1, "message": error.msg,
            "source": "compile", "severity": "error",
        }]
    except (ValueError, RecursionError) as error:  # null bytes, absurd nesting
        return [{"line": 1, "column": 1, "message": str(error), "source": "compile", "severity": "error"}]
    return []


def diagnostic_dict(diagnostic: Any) -> dict[str, Any]:
    """Any diagnostic object (dataclass, mapping or plain object) as a JSON-friendly dict."""
    if isinstance(diagnostic, dict):
        return dict(diagnostic)
    if is_dataclass(diagnostic) and not isinstance(diagnostic, type):
        data = asdict(diagnostic)
    else:
        data = {k: v for k, v in vars(diagnostic).items() if not k.startswith("_")}
    return {k: (v if isinstance(v, (str, int, float, bool, type(None))) else str(v)) for k, v in data.items()}


def introduced(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Diagnostics of ``after`` not already in ``before`` (compared by source and message, as lines move)."""
    remaining: dict[tuple[str, str], int] = {}
    for item in before:
        key = (str(item.get("source", "")), str(item.get("message", "")))
        remaining[key] = remaining.get(key, 0) + 1
    new = []
    for item in after:
        key = (str(item.get("source", "")), str(item.get("message", "")))
        if remaining.get(key, 0) > 0:
            remaining[key] -= 1
        else:
            new.append(item)
    return new


# --------------------------------------------------------------------------------------------
# The pipeline
# --------------------------------------------------------------------------------------------


@dataclass
class _Task:
    """One request, reduced to what every mode shares."""

    prompt: Prompt
    document: str  # the document the candidate is spliced into ...
    insert_at: int  # ... at this character offset
    language: str
    multiline: bool
    stop: list[str]
    max_tokens: int
    suffix: str  # code after the insertion point, for overlap stripping
    block_prefix: str  # text whose last line sets the block indentation
    check: bool = True  # diagnose the spliced candidate (fix diagnoses the whole rewrite itself)
    wrap: Callable[[str], str] = staticmethod(lambda text: text)  # type: ignore[assignment]


class Pipeline:
    """Context -> backend -> post-processing -> diagnostics/repair, for one request at a time.

    Thread-safe as long as the backend is (the local backend holds one lock around the model).
    """

    def __init__(
        self,
        backend: Backend,
        settings: PipelineSettings | None = None,
        context: PromptBuilder | None = None,
        repair: Any | None = None,
        diagnose: DiagnoseFn | None = None,
    ) -> None:
        self.backend = backend
        self.settings = settings or PipelineSettings()
        self.context = context
        self.repair = repair
        self._diagnose = diagnose or compile_diagnostics

    # ---- public requests -----------------------------------------------------------------

    def complete(
        self,
        text: str,
        offset: int,
        *,
        path: str | None = None,
        language: str | None = None,
        multiline: bool | None = None,
        on_text: Callable[[str], None] | None = None,
        should_cancel: Callable[[], bool] | None = None,
    ) -> PipelineResult:
        """The text to insert at character ``offset`` of the document ``text``."""
        if not 0 <= offset <= len(text):
            raise ValueError(f"offset {offset} outside the document (length {len(text)})")
        language = language or guess_language(path)
        before, after = text[:offset], text[offset:]
        if multiline is None:
            multiline = infer_multiline(before, after)
        prompt = self._build_prompt(text, offset, path=path, language=language)
        settings = self.settings
        task = _Task(
            prompt=prompt, document=text, insert_at=offset, language=language, multiline=multiline,
            stop=[] if multiline else ["\n"],
            max_tokens=settings.multiline_max_tokens if multiline else settings.max_tokens,
            suffix=after, block_prefix=before,
        )
        return self._run(task, on_text=on_text, should_cancel=should_cancel)

    def generate(
        self,
        prompt: str,
        *,
        language: str = "python",
        on_text: Callable[[str], None] | None = None,
        should_cancel: Callable[[], bool] | None = None,
    ) -> PipelineResult:
        """Code for a prompt.

        A code prompt (a signature plus docstring) is continued: the result is the body that follows
        it. An instruction in prose is turned into a docstring-led prompt: the result is the whole
        code.
        """
        if looks_like_code(prompt, language):
            document = prompt if prompt.endswith("\n") else prompt + "\n"
            task = _Task(
                prompt=Prompt(prefix=document), document=document, insert_at=len(document),
                language=language, multiline=True,
                stop=list(PYTHON_BODY_STOPS) if language == "python" else [],
                max_tokens=self.settings.multiline_max_tokens, suffix="", block_prefix=document,
            )
            return self._run(task, on_text=on_text, should_cancel=should_cancel)
        header = instruction_header(prompt, language)
        task = _Task(
            prompt=Prompt(prefix=header), document=header, insert_at=len(header), language=language,
            multiline=True, stop=[], max_tokens=self.settings.multiline_max_tokens, suffix="",
            block_prefix="", wrap=lambda text: text.strip("\n") + "\n",
        )
        result = self._run(task, on_text=on_text, should_cancel=should_cancel)
        return result

    def fix(
        self,
        code: str,
        *,
        diagnostics: list[Any] | None = None,
        path: str | None = None,
        language: str | None = None,
        on_text: Callable[[str], None] | None = None,
        should_cancel: Callable[[], bool] | None = None,
    ) -> PipelineResult:
        """The whole of ``code``, rewritten by the model with its diagnostics as hints.

        The first line (the declaration) is kept and the model writes the rest; when the result is
        no better than the input (more diagnostics), the input is returned unchanged and marked so.
        """
        language = language or guess_language(path)
        found = [diagnostic_dict(d) for d in diagnostics] if diagnostics else self._diagnose(code, language)
        header = fix_header(code, found, language)
        declaration, _ = split_declaration(code)
        prefix = header + declaration
        task = _Task(
            prompt=Prompt(prefix=prefix, spans=error_spans(code, found, offset=header.index(code.rstrip("\n")))),
            document=prefix, insert_at=len(prefix), language=language, multiline=True,
            stop=list(PYTHON_BODY_STOPS) if language == "python" else [],
            max_tokens=self.settings.multiline_max_tokens, suffix="", block_prefix=prefix, check=False,
        )
        result = self._run(task, on_text=on_text, should_cancel=should_cancel)
        _, rest = split_declaration(code)
        old_body = cut_at_block_end(rest, declaration, language) if declaration else rest
        trailing = rest[len(old_body):] if declaration else ""  # code after the first block, kept
        fixed = declaration + result.text.rstrip("\n") + "\n" + trailing.lstrip("\n")
        if trailing.strip():
            fixed = declaration + result.text.rstrip("\n") + "\n\n" + trailing.lstrip("\n")
        if not fixed.endswith("\n"):
            fixed += "\n"
        after = self._diagnose(fixed, language)
        if len(after) > len(found):  # the rewrite made things worse: keep the user's code
            log.info("fix: rewrite adds diagnostics (%d > %d); returning the input", len(after), len(found))
            fixed, after = code, found
        result.text = fixed
        result.diagnostics_before = found
        result.diagnostics_after = after
        result.clean = not after
        return result

    # ---- internals --------------------------------------------------------------------------

    def _build_prompt(self, text: str, offset: int, *, path: str | None, language: str) -> Prompt:
        if self.context is not None:
            try:
                return self.context.build_prompt(text, offset, path=path, language=language)
            except Exception:  # the context engine must never cost the user a completion
                log.exception("context engine failed; using the plain prompt")
        return plain_prompt(text, offset, self.settings.max_prefix_chars, self.settings.max_suffix_chars)

    def _request(self, task: _Task, on_text: Callable[[str], None] | None,
                 should_cancel: Callable[[], bool] | None) -> tuple[Completion, str, bool]:
        """One backend call; stops early (as a cancel) once the streamed text leaves the block."""
        streamed: list[str] = []
        block_done = [False]

        def watch(piece: str) -> None:
            streamed.append(piece)
            if on_text is not None:
                on_text(piece)
            text = "".join(streamed)
            if task.multiline and "\n" in text.lstrip("\n"):
                cut = cut_at_block_end(strip_special_tokens(text), task.block_prefix, task.language)
                if len(cut) < len(text.rstrip()):
                    block_done[0] = True

        def cancel() -> bool:
            return block_done[0] or (should_cancel is not None and should_cancel())

        settings = self.settings
        request = CompletionRequest(
            prompt=task.prompt, max_tokens=task.max_tokens, temperature=settings.temperature,
            top_p=settings.top_p, seed=settings.seed, stop=list(task.stop),
            use_attention_policy=settings.use_attention_policy, on_text=watch, should_cancel=cancel,
        )
        completion = self.backend.complete(request)
        return completion, self.postprocess(completion.text, task), block_done[0]

    def postprocess(self, text: str, task: _Task) -> str:
        text = strip_special_tokens(text)
        for stop in task.stop:
            at = text.find(stop)
            if at != -1:
                text = text[:at]
        if task.multiline:  # the line break after the block is the document's, not the completion's
            text = cut_at_block_end(text, task.block_prefix, task.language).rstrip()
        else:
            text = first_line(text)
        text = strip_suffix_overlap(text, task.suffix)
        return task.wrap(text)

    def _run(self, task: _Task, *, on_text: Callable[[str], None] | None,
             should_cancel: Callable[[], bool] | None) -> PipelineResult:
        started = time.perf_counter()
        completion, text, block_done = self._request(task, on_text, should_cancel)
        finish = "stop" if block_done else completion.finish_reason
        before: list[dict[str, Any]] = []
        after: list[dict[str, Any]] = []
        clean = True
        if task.check and self.settings.repair and finish != "cancelled":
            before = self._diagnose(task.document, task.language)
            spliced = task.document[: task.insert_at] + text + task.document[task.insert_at:]
            after = self._diagnose(spliced, task.language)
            clean = not introduced(before, after)
        return PipelineResult(
            text=text, clean=clean, diagnostics_before=before, diagnostics_after=after, rounds=1,
            prompt_tokens=completion.prompt_tokens, completion_tokens=completion.completion_tokens,
            seconds=time.perf_counter() - started, finish_reason=finish,
        )


# --------------------------------------------------------------------------------------------
# Prompts used without the context engine
# --------------------------------------------------------------------------------------------


def plain_prompt(text: str, offset: int, max_prefix_chars: int, max_suffix_chars: int) -> Prompt:
    """The code around the cursor, cut at line boundaries, with the cursor's block marked."""
    start = max(0, offset - max_prefix_chars)
    if start > 0:
        newline = text.find("\n", start, offset)
        start = newline + 1 if newline != -1 else start
    end = min(len(text), offset + max_suffix_chars)
    if end < len(text):
        newline = text.rfind("\n", offset, end)
        end = newline + 1 if newline != -1 else end
    prefix, suffix = text[start:offset], text[offset:end]
    block_start = _top_level_start(prefix)
    spans = [Span(block_start, len(prefix), "current_block")] if block_start < len(prefix) else []
    return Prompt(prefix=prefix, suffix=suffix, spans=spans)


def _top_level_start(prefix: str) -> int:
    """Offset of the last line starting at column 0 (the statement the cursor is inside)."""
    at = len(prefix)
    while at > 0:
        line_start = prefix.rfind("\n", 0, at - 1) + 1
        line = prefix[line_start:at]
        if line.strip() and not line[0].isspace():
            return line_start
        if line_start == 0:
            return 0
        at = line_start
    return 0


def looks_like_code(prompt: str, language: str) -> bool:
    """A signature plus docstring (continue it) rather than a prose instruction (write from it)."""
    if language != "python":
        return bool(re.search(r"[{};]|\bfunction\b|\bfn\b|\bfunc\b", prompt))
    return bool(re.search(r"^\s*(def|class|async def|import|from)\b", prompt, re.MULTILINE))


def instruction_header(instruction: str, language: str) -> str:
    """A prose instruction as a comment block that a code model continues with code."""
    marker = "#" if language == "python" else "//"
    lines = [f"{marker} {line}".rstrip() for line in instruction.strip().splitlines()]
    return "\n".join(lines) + "\n"


def split_declaration(code: str) -> tuple[str, str]:
    """The code up to and including the first ``def``/``class`` line (imports kept), and the rest."""
    match = re.search(r"^(async\s+def|def|class)\b.*:[ \t]*(#.*)?$", code, re.MULTILINE)
    if match is None:
        return "", code
    end = match.end() + 1
    return code[:end], code[end:]


def error_spans(code: str, diagnostics: list[dict[str, Any]], offset: int = 0) -> list[Span]:
    """``error_context`` spans over the lines the diagnostics point at (1-based ``line``)."""
    starts = [0]
    for line in code.split("\n"):
        starts.append(starts[-1] + len(line) + 1)
    spans = []
    for item in diagnostics:
        line = item.get("line")
        if isinstance(line, int) and 1 <= line < len(starts):
            end = min(starts[line] - 1, len(code))
            spans.append(Span(offset + starts[line - 1], offset + max(end, starts[line - 1]), "error_context"))
    return spans


def fix_header(code: str, diagnostics: list[dict[str, Any]], language: str) -> str:
    """The buggy code shown to the model, with the diagnostics as comments and a "fixed" marker."""
    marker = "#" if language == "python" else "//"
    lines = [f"{marker} Buggy version:", code.rstrip("\n")]
    for item in diagnostics[:8]:
        lines.append(f"{marker} line {item.get('line', '?')}: {item.get('message', '')}")
    lines.append(f"{marker} Fixed version:")
    return "\n".join(lines) + "\n"
