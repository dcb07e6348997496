"""The GLM-5 language server: a pygls ``LanguageServer`` subclass that owns the state, and
``build_server`` that registers every feature on it with decorators.

Requests read top to bottom: locate the document and cursor (unknown documents, positions past the
end and unsupported languages answer empty), ask the cache, start a cancellable job on the model
worker (a newer request for the same document supersedes it; ``$/cancelRequest`` and the request
timeout cancel it between tokens), post-process, convert at the edge (``convert.lsp_*``).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInternalError
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from glm5_lsp import __version__
from glm5_lsp.context.languages import detect_language, supported_languages
from glm5_lsp.pipeline import Pipeline, PipelineResult
from glm5_lsp.server import convert
from glm5_lsp.server.cache import LRUCache
from glm5_lsp.server.checks import check_edit, diagnose, diff_region
from glm5_lsp.server.engine import Engine
from glm5_lsp.server.jobs import CancelToken, Supersession
from glm5_lsp.server.postprocess import clean_completion, indent_unit
from glm5_lsp.server.progress import ClientLogHandler, WorkProgress
from glm5_lsp.server.settings import Settings, parse_settings
from glm5_lsp.server.symbols import names_at, word_before
from glm5_lsp.server.syntax import empty_bodies, wants_multiline

log = logging.getLogger("glm5_lsp.server")
T = TypeVar("T")

FIX_TITLE = "Fix with GLM-5"
BODY_TITLE = "Generate body with GLM-5"
COMMANDS = ("glm5.generate", "glm5.fix", "glm5.reindex")
_COMPLETION_KINDS = {
    "function": types.CompletionItemKind.Function,
    "class": types.CompletionItemKind.Class,
    "module": types.CompletionItemKind.Module,
    "keyword": types.CompletionItemKind.Keyword,
    "instance": types.CompletionItemKind.Variable,
    "statement": types.CompletionItemKind.Variable,
    "param": types.CompletionItemKind.Variable,
    "property": types.CompletionItemKind.Property,
    "path": types.CompletionItemKind.File,
    "method": types.CompletionItemKind.Method,
    "variable": types.CompletionItemKind.Variable,
    "constant": types.CompletionItemKind.Constant,
}
_LOG_LEVELS = {"error": logging.ERROR, "warning": logging.WARNING, "info": logging.INFO, "debug": logging.DEBUG}


@dataclass(frozen=True)
class Target:
    """An open document and a cursor in it, in the project's terms (character offsets)."""

    uri: str
    text: str
    offset: int
    path: str
    language: str
    version: int | None


class Glm5Server(LanguageServer):
    """Owns the settings, the model engine, the completion cache and the in-flight jobs."""

    def __init__(self) -> None:
        super().__init__("glm5-lsp", __version__, text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        self.settings = Settings()
        self.engine = Engine(self.settings, None)
        self.cache: LRUCache[str] = LRUCache(self.settings.completion.cache_size)
        self.supersession = Supersession()
        # One model worker: the model is CPU-bound, so requests run one at a time, newest wins.
        self.model_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="glm5-model")
        self.loop: asyncio.AbstractEventLoop | None = None
        self._log_handler: ClientLogHandler | None = None
        self._diagnose_tasks: dict[str, asyncio.Task[None]] = {}

    # ---- settings ---------------------------------------------------------------------------

    def apply_settings(self, raw: Any) -> None:
        """Apply client settings; show every invalid value; reload the model when its settings change."""
        new, problems = parse_settings(raw, self.settings)
        if problems:
            self.window_show_message(
                types.ShowMessageParams(
                    type=types.MessageType.Warning,
                    message="glm5-lsp: invalid settings (defaults kept): " + "; ".join(problems),
                )
            )
            log.warning("invalid settings: %s", "; ".join(problems))
        reload = (new.model, new.attention, new.repair, new.budgets) != (
            self.settings.model, self.settings.attention, self.settings.repair, self.settings.budgets,
        )
        self.settings = new
        self.cache.clear()
        self.cache.resize(new.completion.cache_size)
        if self._log_handler is not None:
            self._log_handler.setLevel(_LOG_LEVELS[new.log_level])
        if reload and self.loop is not None:
            self.start_engine()

    def start_engine(self) -> None:
        """(Re)create the engine and load it on the model worker, reporting ``$/progress``."""
        assert self.loop is not None
        self.supersession.cancel_all("reload")
        root = self.workspace.root_path
        engine = Engine(self.settings, root)
        self.engine = engine
        progress = WorkProgress(self, self.loop, "GLM-5: loading the model")
        # Submitted now, so every request queued on the model worker after this finds it loaded.
        loading = self.loop.run_in_executor(self.model_worker, engine.load, progress.report)

        async def run() -> None:
            await progress.begin("starting")
            await loading
            if engine.error:
                progress.end("failed")
                self.window_show_message(
                    types.ShowMessageParams(
                        type=types.MessageType.Error, message=f"glm5-lsp: the model could not be loaded: {engine.error}"
                    )
                )
                return
            progress.end(f"ready in {engine.load_seconds:.1f}s")
            log.info("model ready (%s) in %.1fs", self.settings.model.backend, engine.load_seconds)
            if root and engine.context is not None:
                await self.index_workspace(engine, root)

        self.loop.create_task(run())

    async def index_workspace(self, engine: Engine, root: str) -> int:
        """Summarise the workspace and index the API docs it imports, reporting ``$/progress``."""
        assert self.loop is not None and engine.context is not None
        progress = WorkProgress(self, self.loop, "GLM-5: indexing")
        await progress.begin(root)
        started = time.perf_counter()
        try:
            count = await asyncio.to_thread(engine.context.reindex, root)
        except Exception:  # a broken file or package must not cost the user completions
            log.exception("indexing %s failed", root)
            progress.end("failed")
            return 0
        self.cache.clear()
        progress.end(f"indexed {count} files")
        log.info("indexed %d files of %s in %.1fs", count, root, time.perf_counter() - started)
        return count

    # ---- documents ----------------------------------------------------------------------------

    def locate(self, uri: str, position: types.Position | None) -> Target | None:
        """The open document and cursor, or None (unknown document, past the end, unsupported language)."""
        document = self.workspace.text_documents.get(unquote(uri))
        if document is None:
            return None
        path = to_fs_path(uri) or uri
        language = detect_language(path, document.language_id)
        if language not in supported_languages():
            return None
        text = document.source
        offset = 0
        if position is not None:
            found = convert.lsp_offset(text, position, self.encoding)
            if found is None:
                return None
            offset = found
        return Target(uri, text, offset, path, language, document.version)

    @property
    def encoding(self) -> str:
        kind = self.workspace.position_encoding
        return str(kind.value if isinstance(kind, types.PositionEncodingKind) else kind or "utf-16")

    # ---- running model work -----------------------------------------------------------------

    async def run_model(self, token: CancelToken, job: Callable[[], T], timeout_s: float) -> T:
        """Run ``job`` on the model worker; client cancellation and the timeout set ``token``."""
        loop = asyncio.get_running_loop()
        timer = loop.call_later(timeout_s, token.cancel, "timeout")
        try:
            return await loop.run_in_executor(self.model_worker, job)
        except asyncio.CancelledError:
            token.cancel("client")
            raise
        finally:
            timer.cancel()

    def current_pipeline(self) -> Pipeline | None:
        """The loaded pipeline; None when the model failed to load (that was shown to the user)."""
        return self.engine.pipeline

    async def completion_text(self, target: Target, *, multiline: bool, kind: str) -> str:
        """The post-processed completion at a cursor ("" when there is none), cached and superseding."""
        key = (hashlib.sha1(target.text.encode("utf-8", "surrogatepass")).hexdigest(), target.offset, multiline,
               target.language)
        token = self.supersession.begin((target.uri, kind))  # even a cache hit makes older requests stale
        cached = self.cache.get(key)
        if cached is not None:
            self.supersession.finish((target.uri, kind), token)
            return cached
        try:
            debounce = self.settings.completion.debounce_ms / 1000
            if debounce:
                await asyncio.sleep(debounce)
                if token.cancelled:  # a newer keystroke arrived while we waited
                    return ""

            def job() -> PipelineResult | None:
                pipeline = self.current_pipeline()
                if pipeline is None or token.cancelled:
                    return None
                return pipeline.complete(target.text, target.offset, path=target.path, language=target.language,
                                         multiline=multiline, should_cancel=token)

            result = await self.run_model(token, job, self.settings.budgets.request_timeout_ms / 1000)
        finally:
            self.supersession.finish((target.uri, kind), token)
        if result is None or token.cancelled:
            log.debug("completion at %s:%d dropped (%s)", target.path, target.offset, token.reason or "no model")
            return ""
        if not result.clean and not self.settings.repair.return_unclean:
            log.info("completion dropped: it adds diagnostics %s", result.diagnostics_after[:2])
            text = ""
        else:
            text = await self.cleaned(target, result, multiline)
        self.cache.put(key, text)
        return text

    async def cleaned(self, target: Target, result: PipelineResult, multiline: bool) -> str:
        """Post-process the pipeline's text; what changed is checked again before it is offered."""
        text = clean_completion(result.text, target.text[: target.offset], target.text[target.offset:],
                                multiline=multiline, unit=indent_unit(target.text))
        if not text or text == result.text:
            return text
        verdict = await asyncio.to_thread(check_edit, target.text, target.offset, target.offset, text,
                                          path=target.path, language=target.language)
        if verdict.ok:
            return text
        log.info("post-processed completion rejected (%s); keeping the checked one", verdict.reason())
        return result.text if result.clean else ""

    def multiline_for(self, target: Target) -> bool:
        policy = self.settings.completion.lines
        if policy != "auto":
            return policy == "multi"
        return wants_multiline(target.text, target.offset, target.language)

    # ---- diagnostics --------------------------------------------------------------------------

    def schedule_diagnostics(self, uri: str) -> None:
        """Publish our own compiler diagnostics for ``uri`` shortly after the last change."""
        if not self.settings.features.diagnostics or self.loop is None:
            return
        previous = self._diagnose_tasks.pop(uri, None)
        if previous is not None:
            previous.cancel()

        async def publish() -> None:
            await asyncio.sleep(0.15)
            target = self.locate(uri, None)
            if target is None:
                return
            found = await asyncio.to_thread(diagnose, target.text, target.path, target.language)
            current = self.locate(uri, None)
            if current is None or current.version != target.version:
                return
            self.text_document_publish_diagnostics(
                types.PublishDiagnosticsParams(
                    uri=uri, version=target.version,
                    diagnostics=[convert.lsp_diagnostic(target.text, d, self.encoding) for d in found],
                )
            )

        self._diagnose_tasks[uri] = self.loop.create_task(publish())

    # ---- code actions ---------------------------------------------------------------------------

    async def resolve_fix(self, action: types.CodeAction, target: Target) -> types.CodeAction:
        """Fill in the "Fix with GLM-5" edit: the repair loop's rewrite, offered only if it checks out."""
        diagnostics = [convert.diagnostic_from_lsp(target.text, d, self.encoding) for d in action.diagnostics or []]
        assert self.loop is not None
        progress = WorkProgress(self, self.loop, "GLM-5: fixing")
        await progress.begin(target.path)
        token = self.supersession.begin((target.uri, "fix"))
        try:
            def job() -> PipelineResult | None:
                pipeline = self.current_pipeline()
                if pipeline is None or token.cancelled:
                    return None
                progress.report("generating a fix", 30)
                return pipeline.fix(target.text, diagnostics=diagnostics or None, path=target.path,
                                    language=target.language, should_cancel=token)

            result = await self.run_model(token, job, self.settings.budgets.fix_timeout_ms / 1000)
            if result is None or token.cancelled:
                progress.end("cancelled")
                return action
            progress.report("checking the fix", 80)
            start, end, text = diff_region(target.text, result.text)
            verdict = await asyncio.to_thread(check_edit, target.text, start, end, text, path=target.path,
                                              language=target.language, targets=diagnostics)
        finally:
            self.supersession.finish((target.uri, "fix"), token)
        if not verdict.ok:
            progress.end("no fix found")
            self.window_show_message(types.ShowMessageParams(
                type=types.MessageType.Info, message=f"GLM-5 found no fix to offer: {verdict.reason()}"))
            return action
        progress.end("done")
        edit = convert.lsp_text_edit(target.text, start, end, text, self.encoding)
        action.edit = types.WorkspaceEdit(changes={target.uri: [edit]})
        return action

    async def resolve_body(self, action: types.CodeAction, target: Target, start: int, end: int) -> types.CodeAction:
        """Fill in the "Generate body" edit: a multi-line completion in place of ``pass``/``...``."""
        document = target.text[:start] + target.text[end:]
        token = self.supersession.begin((target.uri, "body"))
        try:
            def job() -> PipelineResult | None:
                pipeline = self.current_pipeline()
                if pipeline is None or token.cancelled:
                    return None
                return pipeline.complete(document, start, path=target.path, language=target.language,
                                         multiline=True, should_cancel=token)

            result = await self.run_model(token, job, self.settings.budgets.fix_timeout_ms / 1000)
        finally:
            self.supersession.finish((target.uri, "body"), token)
        if result is None or token.cancelled:
            return action
        body = clean_completion(result.text, document[:start], document[start:], multiline=True,
                                unit=indent_unit(target.text))
        if not body.strip():
            return action
        verdict = await asyncio.to_thread(check_edit, target.text, start, end, body, path=target.path,
                                          language=target.language)
        if not verdict.ok:
            self.window_show_message(types.ShowMessageParams(
                type=types.MessageType.Info, message=f"GLM-5 found no body to offer: {verdict.reason()}"))
            return action
        edit = convert.lsp_text_edit(target.text, start, end, body, self.encoding)
        action.edit = types.WorkspaceEdit(changes={target.uri: [edit]})
        return action

    def client_resolves_edits(self) -> bool:
        caps = self.client_capabilities.text_document if self.client_capabilities else None
        support = caps.code_action.resolve_support if caps and caps.code_action else None
        return bool(support and "edit" in support.properties)

    def attach_log_handler(self, loop: asyncio.AbstractEventLoop) -> None:
        self._log_handler = ClientLogHandler(self, loop, _LOG_LEVELS[self.settings.log_level])
        logging.getLogger("glm5_lsp").addHandler(self._log_handler)
        logging.getLogger("glm5_lsp").setLevel(logging.DEBUG)


def _position_argument(value: Any) -> types.Position | None:
    """``{"line": int, "character": int}`` from a command's JSON arguments, or None when malformed."""
    if not isinstance(value, dict):
        return None
    line, character = value.get("line"), value.get("character")
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31 for v in (line, character)):
        return None
    return types.Position(line=line, character=character)


def guarded(name: str) -> Callable[[Callable[..., Awaitable[T]]], Callable[..., Awaitable[T]]]:
    """Answer a failing request with a JSON-RPC error (logged), never take the server down."""

    def wrap(handler: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        @functools.wraps(handler)
        async def run(*args: Any) -> T:
            try:
                return await handler(*args)
            except (asyncio.CancelledError, JsonRpcException):
                raise
            except Exception as error:
                log.exception("%s failed", name)
                raise JsonRpcInternalError(f"{name} failed: {type(error).__name__}: {error}") from error

        return run

    return wrap


def build_server() -> Glm5Server:
    """A server with every feature registered."""
    server = Glm5Server()

    @server.feature(types.INITIALIZE)
    def initialize(ls: Glm5Server, params: types.InitializeParams) -> None:
        ls.apply_settings(params.initialization_options)

    @server.feature(types.INITIALIZED)
    async def initialized(ls: Glm5Server, params: types.InitializedParams) -> None:
        ls.loop = asyncio.get_running_loop()
        ls.attach_log_handler(ls.loop)
        log.info("glm5-lsp %s (python %s) started", __version__, sys.version.split()[0])
        ls.start_engine()

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def did_change_configuration(ls: Glm5Server, params: types.DidChangeConfigurationParams) -> None:
        ls.apply_settings(params.settings)

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    async def did_open(ls: Glm5Server, params: types.DidOpenTextDocumentParams) -> None:
        ls.schedule_diagnostics(params.text_document.uri)
        document = params.text_document
        context = ls.engine.context
        if context is not None and ls.locate(document.uri, None) is not None:
            path = to_fs_path(document.uri) or document.uri
            try:
                await asyncio.to_thread(context.open_document, path, document.text, document.language_id)
            except Exception:  # the document still gets completions: the prompt re-reads its text
                log.exception("the context engine could not open %s", path)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: Glm5Server, params: types.DidChangeTextDocumentParams) -> None:
        ls.schedule_diagnostics(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: Glm5Server, params: types.DidCloseTextDocumentParams) -> None:
        task = ls._diagnose_tasks.pop(params.text_document.uri, None)
        if task is not None:
            task.cancel()
        if ls.engine.context is not None:
            ls.engine.context.close_document(to_fs_path(params.text_document.uri) or params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    @guarded("inline completion")
    async def inline_completion(
        ls: Glm5Server, params: types.InlineCompletionParams
    ) -> types.InlineCompletionList | None:
        if not ls.settings.features.inline_completion:
            return None
        target = ls.locate(params.text_document.uri, params.position)
        if target is None:
            return types.InlineCompletionList(items=[])
        text = await ls.completion_text(target, multiline=ls.multiline_for(target), kind="inline")
        if not text:
            return types.InlineCompletionList(items=[])
        here = params.position
        return types.InlineCompletionList(
            items=[types.InlineCompletionItem(insert_text=text, range=types.Range(start=here, end=here))]
        )

    @server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(trigger_characters=["."]))
    @guarded("completion")
    async def completion(ls: Glm5Server, params: types.CompletionParams) -> types.CompletionList | None:
        if not ls.settings.features.completion:
            return None
        target = ls.locate(params.text_document.uri, params.position)
        if target is None:
            return types.CompletionList(is_incomplete=False, items=[])
        context = ls.engine.context
        names_job = asyncio.to_thread(names_at, target.text, target.offset, path=target.path,
                                      language=target.language, context=context)
        model_job = ls.completion_text(target, multiline=False, kind="completion")
        names, line = await asyncio.gather(names_job, model_job)
        typed = word_before(target.text, target.offset)
        word_range = convert.lsp_range(target.text, target.offset - len(typed), target.offset, ls.encoding)
        items: list[types.CompletionItem] = []
        if line:
            full = typed + line
            items.append(types.CompletionItem(
                label=full.strip() or full, kind=types.CompletionItemKind.Snippet, detail="GLM-5",
                sort_text="0000", filter_text=full, preselect=True,
                text_edit=types.TextEdit(range=word_range, new_text=full),
            ))
        for index, name in enumerate(names):
            items.append(types.CompletionItem(
                label=name.name, kind=_COMPLETION_KINDS.get(name.kind, types.CompletionItemKind.Variable),
                detail=name.detail or None, sort_text=f"1{index:04d}",
                text_edit=types.TextEdit(range=word_range, new_text=name.name),
            ))
        return types.CompletionList(is_incomplete=True, items=items)

    @server.feature(
        types.TEXT_DOCUMENT_CODE_ACTION,
        types.CodeActionOptions(
            code_action_kinds=[types.CodeActionKind.QuickFix, types.CodeActionKind.RefactorRewrite],
            resolve_provider=True,
        ),
    )
    @guarded("code action")
    async def code_action(ls: Glm5Server, params: types.CodeActionParams) -> list[types.CodeAction] | None:
        if not ls.settings.features.code_actions:
            return None
        target = ls.locate(params.text_document.uri, params.range.start)
        if target is None or convert.lsp_offset(target.text, params.range.end, ls.encoding) is None:
            return []
        wanted = [str(getattr(kind, "value", kind)) for kind in params.context.only] if params.context.only else None
        actions: list[types.CodeAction] = []
        data = {"uri": target.uri, "version": target.version}
        if wanted is None or any(kind in ("quickfix", "") for kind in wanted):
            own = await asyncio.to_thread(diagnose, target.text, target.path, target.language)
            ours = [convert.lsp_diagnostic(target.text, d, ls.encoding) for d in own]
            relevant = [d for d in list(params.context.diagnostics) + ours
                        if convert.lsp_ranges_overlap(d.range, params.range)]
            if relevant:
                action = types.CodeAction(title=FIX_TITLE, kind=types.CodeActionKind.QuickFix, diagnostics=relevant,
                                          is_preferred=True, data={**data, "action": "fix"})
                if ls.client_resolves_edits():
                    actions.append(action)
                else:
                    resolved = await ls.resolve_fix(action, target)
                    if resolved.edit is not None:
                        actions.append(resolved)
        if ls.settings.features.generate_body and (wanted is None or any(
                kind in ("", "refactor", "refactor.rewrite") for kind in wanted)):
            start = target.offset
            end = convert.lsp_offset(target.text, params.range.end, ls.encoding) or start
            for body in empty_bodies(target.text, target.language):
                if body.header_start <= end and start <= body.end:
                    action = types.CodeAction(
                        title=f"{BODY_TITLE}: {body.name}" if body.name else BODY_TITLE,
                        kind=types.CodeActionKind.RefactorRewrite,
                        data={**data, "action": "body", "start": body.start, "end": body.end},
                    )
                    if ls.client_resolves_edits():
                        actions.append(action)
                    else:
                        resolved = await ls.resolve_body(action, target, body.start, body.end)
                        if resolved.edit is not None:
                            actions.append(resolved)
        return actions

    @server.feature(types.CODE_ACTION_RESOLVE)
    @guarded("code action resolve")
    async def resolve_code_action(ls: Glm5Server, action: types.CodeAction) -> types.CodeAction:
        data = action.data if isinstance(action.data, dict) else {}
        target = ls.locate(str(data.get("uri", "")), None)
        if target is None or target.version != data.get("version"):
            log.info("code action for a closed or changed document: nothing to resolve")
            return action
        if data.get("action") == "fix":
            return await ls.resolve_fix(action, target)
        if data.get("action") == "body":
            start, end = int(data.get("start", -1)), int(data.get("end", -1))
            if 0 <= start <= end <= len(target.text):
                return await ls.resolve_body(action, target, start, end)
        return action

    @server.command("glm5.generate")
    @guarded("glm5.generate")
    async def generate(ls: Glm5Server, *args: Any) -> dict[str, Any]:
        """``{"prompt": str, "language"?: str}`` -> code; or ``{"uri", "position"}`` -> code inserted there."""
        options = args[0] if args and isinstance(args[0], dict) else {}
        token = CancelToken()
        if "prompt" in options:
            prompt, language = str(options["prompt"]), str(options.get("language", "python"))

            def job() -> PipelineResult | None:
                pipeline = ls.current_pipeline()
                return None if pipeline is None else pipeline.generate(prompt, language=language, should_cancel=token)

            result = await ls.run_model(token, job, ls.settings.budgets.fix_timeout_ms / 1000)
            return {"text": result.text if result else "", "clean": bool(result and result.clean), "applied": False}
        position = _position_argument(options.get("position"))
        target = ls.locate(str(options.get("uri", "")), position) if position is not None else None
        if target is None:
            return {"text": "", "clean": False, "applied": False}
        text = await ls.completion_text(target, multiline=True, kind="generate")
        applied = False
        if text:
            edit = convert.lsp_text_edit(target.text, target.offset, target.offset, text, ls.encoding)
            reply = await ls.workspace_apply_edit_async(types.ApplyWorkspaceEditParams(
                edit=types.WorkspaceEdit(changes={target.uri: [edit]}), label="GLM-5: generate"))
            applied = bool(reply and reply.applied)
        return {"text": text, "clean": True, "applied": applied}

    @server.command("glm5.fix")
    @guarded("glm5.fix")
    async def fix(ls: Glm5Server, *args: Any) -> dict[str, Any]:
        """``{"uri"}``: fix the whole document with the repair loop and apply the edit when it checks out."""
        options = args[0] if args and isinstance(args[0], dict) else {}
        target = ls.locate(str(options.get("uri", "")), None)
        if target is None:
            return {"applied": False, "reason": "unknown document"}
        errors = [d for d in await asyncio.to_thread(diagnose, target.text, target.path, target.language)
                  if d.severity == "error"]
        if not errors:
            return {"applied": False, "reason": "no errors to fix"}
        action = types.CodeAction(title=FIX_TITLE, diagnostics=[
            convert.lsp_diagnostic(target.text, d, ls.encoding) for d in errors])
        resolved = await ls.resolve_fix(action, target)
        if resolved.edit is None:
            return {"applied": False, "reason": "no fix that checks out"}
        reply = await ls.workspace_apply_edit_async(types.ApplyWorkspaceEditParams(edit=resolved.edit,
                                                                                   label=FIX_TITLE))
        return {"applied": bool(reply and reply.applied), "reason": ""}

    @server.command("glm5.reindex")
    @guarded("glm5.reindex")
    async def reindex(ls: Glm5Server, *args: Any) -> dict[str, Any]:
        """Rebuild the context engine's index of the workspace, with ``$/progress``."""
        started = time.perf_counter()
        root = ls.workspace.root_path
        engine = ls.engine
        count = await ls.index_workspace(engine, root) if root and engine.context is not None else 0
        return {"indexed": count, "seconds": time.perf_counter() - started}

    @server.feature(types.SHUTDOWN)
    def shutdown(ls: Glm5Server, params: None) -> None:
        ls.supersession.cancel_all("shutdown")
        if ls._log_handler is not None:
            logging.getLogger("glm5_lsp").removeHandler(ls._log_handler)
            ls._log_handler = None

    return server
