"""The language server's state: a pygls ``LanguageServer`` subclass that owns the settings, the model
engine, the completion cache and the in-flight jobs, and the helpers every feature shares.

A request reads top to bottom: :meth:`Glm5Server.locate` the document and cursor (unknown documents,
lines past the end and unsupported languages answer empty; a large document is read as a window,
``text.View``), ask the cache, start a cancellable job on the model worker
(:meth:`Glm5Server.run_model`: a newer request for the same document supersedes it;
``$/cancelRequest`` and the request timeout cancel it between tokens; a backend failure is an empty
answer and a log line, and a model that is down is shown to the user once), post-process, convert at
the edge (``convert.lsp_*`` on the request's view). The features live in ``completions``,
``actions`` and ``commands``; ``server.build_server`` registers them. Every message goes through
``protocol.Glm5Protocol`` (each request answered) over ``transport.MessageReader`` (framing
errors answered and resynchronised).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar
from urllib.parse import unquote

from lsprotocol import types
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from glm5_lsp import __version__
from glm5_lsp.languages import detect_language, supported_languages
from glm5_lsp.lru import LRUCache
from glm5_lsp.pipeline import (
    BackendError,
    BackendUnavailable,
    Pipeline,
    PipelineResult,
    diagnose,
    forget_trees,
    wants_multiline,
    warm,
)
from glm5_lsp.pipeline.memory import IndexCancelled
from glm5_lsp.pipeline.session import AcceptanceLog, SuggestionTracker
from glm5_lsp.server import convert
from glm5_lsp.server.heap import IdleSettler, freeze_survivors, release_memory
from glm5_lsp.server.jobs import CancelToken, Supersession
from glm5_lsp.server.loader import Engine
from glm5_lsp.server.progress import ClientLogHandler, WorkProgress
from glm5_lsp.server.protocol import Glm5Protocol, strict_converter
from glm5_lsp.server.settings import Settings, parse_settings
from glm5_lsp.server.text import SyncedDocument, View, document_view
from glm5_lsp.server.transport import FramingError, MessageReader, ThreadedStreamReader
from glm5_lsp.server.typed_through import TypedThrough

log = logging.getLogger("glm5_lsp.server")
DIAGNOSTICS_YIELD_STEPS = 40  # x 50 ms: how long our published diagnostics wait for a pause in completions
DIAGNOSTICS_QUIET_S = 0.4  # the pause: this long without a completion running
# An as-you-type completion is answered by its budget (``budgets.completionMs``) plus ANSWER_GRACE_S
# if the model worker has not started it by then (busy, or stuck on a model that hangs: the user gets
# one empty answer, on time), and by its budget plus JUDGING_GRACE_S at the latest if it has: the
# pipeline cuts its generation at the budget and then checks the candidate it has (up to 250 ms more
# on a loaded machine; cut at budget + 50 ms, 10-30% of the answers were lost). Later is dropped.
ANSWER_GRACE_S = 0.05
JUDGING_GRACE_S = 0.25
MEMORY_DOCUMENT_CHARS = 1_000_000  # a larger open document stays out of the workspace memory
T = TypeVar("T")

_LOG_LEVELS = {"error": logging.ERROR, "warning": logging.WARNING, "info": logging.INFO, "debug": logging.DEBUG}


@dataclass(frozen=True)
class Target:
    """An open document and a cursor in it, in the project's terms (character offsets).

    ``text`` is what the model and the checks read: the whole document, or for one over
    ``limits.windowChars`` its head and a window around the cursor; ``view`` maps its offsets to the
    document's positions (every ``convert`` call takes it).
    """

    uri: str
    text: str
    offset: int
    path: str
    language: str
    version: int | None
    view: View


class Glm5Server(LanguageServer):
    """Owns the settings, the model engine, the completion cache and the in-flight jobs."""

    def __init__(self) -> None:
        super().__init__("glm5-lsp", __version__, text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
                         protocol_cls=Glm5Protocol, converter_factory=strict_converter)
        self.settings = Settings()
        self.engine = Engine(self.settings, None)
        self.cache: LRUCache[str] = LRUCache(self.settings.completion.cache_size)
        self.typed_through = TypedThrough()
        # Which shown inline suggestions the user kept (``completion.acceptanceLog``): shown here, accepted
        # by the item's command (``glm5.accepted``), typed over or removed as ``didChange`` tells.
        self.tracker = SuggestionTracker(AcceptanceLog(enabled=self.settings.completion.acceptance_log))
        # the gate's score and features of each cached completion (for the log's "shown" record)
        self._judged: LRUCache[tuple[float | None, dict[str, float]]] = LRUCache(self.settings.completion.cache_size)
        self.supersession = Supersession()
        # One model worker: the model is CPU-bound, so requests run one at a time, newest wins.
        self.model_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="glm5-model")
        self.loop: asyncio.AbstractEventLoop | None = None
        self._log_handler: ClientLogHandler | None = None
        self._diagnose_tasks: dict[str, asyncio.Task[None]] = {}
        self._warm_tasks: dict[str, asyncio.Task[None]] = {}
        self._windowed: set[str] = set()  # documents read as a window (logged once each)
        self.backend_down = False  # a BackendUnavailable was the last answer (shown to the user once)
        self.heap = IdleSettler(self._on_model_worker, self.supersession.busy)
        self._remembering: set[str] = set()  # documents whose text is going into the memory now
        self._lone_folder: str | None = None  # no workspace from the client: the first opened file's folder
        self._remember_again: set[str] = set()  # ... and that changed again meanwhile

    protocol: Glm5Protocol

    # ---- serving ------------------------------------------------------------------------------

    def serve_stdio(self, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> int:
        """Serve one client on stdin/stdout until ``exit`` or the end of input; the exit status."""
        self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
        source = stdin or sys.stdin.buffer
        return asyncio.run(self._serve(lambda loop: ThreadedStreamReader(source, loop).read))

    def serve_tcp(self, host: str, port: int, ready: Callable[[int], None] | None = None) -> int:
        """Listen on ``host:port`` for one client and serve it; the exit status.

        One client per server: the listening socket is closed as soon as the first client
        connects, so a second one is refused (the server's workspace, settings and model belong
        to one session, and a second client kept waiting would see a server that never answers
        ``initialize``). The server exits when its client's session ends.
        """
        return asyncio.run(self._serve_tcp(host, port, ready))

    async def _serve_tcp(self, host: str, port: int, ready: Callable[[int], None] | None) -> int:
        loop = asyncio.get_running_loop()
        first: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = loop.create_future()

        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if first.done():
                log.warning("refused a second client (%s): this server serves one client",
                            writer.get_extra_info("peername"))
                writer.close()
                return
            first.set_result((reader, writer))

        listener = await asyncio.start_server(on_client, host, port)
        bound = listener.sockets[0].getsockname()[1]
        log.info("listening for one client on %s:%d", host, bound)
        if ready is not None:
            ready(bound)
        try:
            reader, writer = await first
        finally:
            listener.close()
        self.protocol.set_writer(writer)
        try:
            return await self._serve(lambda _loop: reader.read)
        finally:
            writer.close()

    async def _serve(self, make_read: Callable[[asyncio.AbstractEventLoop], Callable[[int], Any]]) -> int:
        loop = asyncio.get_running_loop()
        reader = MessageReader(make_read(loop), lambda: self.settings.limits.max_message_mb << 20)
        protocol = self.protocol
        while protocol.exit_code is None:
            frame = await reader.next()
            if frame is None:
                log.info("the client closed the connection%s", "" if protocol._shutdown else " without shutdown")
                break
            if isinstance(frame, FramingError):
                protocol.send_error(None, frame.code, frame.message)
            else:
                protocol.receive(frame.data)
        code = protocol.exit_code if protocol.exit_code is not None else (0 if protocol._shutdown else 1)
        self.stop()
        return code

    def stop(self) -> None:
        """Cancel what runs; the model worker is let go without waiting for a job stuck in it."""
        self.supersession.cancel_all("exit")
        self.heap.cancel()
        if self.engine.memory is not None:
            self.engine.memory.cancel()
        for tasks in (self._diagnose_tasks, self._warm_tasks):
            for task in tasks.values():
                task.cancel()
            tasks.clear()
        self.detach_log_handler()
        self.model_worker.shutdown(wait=False, cancel_futures=True)
        if self._thread_pool is not None:
            self._thread_pool.shutdown(wait=False, cancel_futures=True)

    def report_server_error(self, error: Exception, source: Any) -> None:
        """pygls' hook for errors outside a request: logged (a request's own error is its answer)."""
        log.error("%s", error)

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
        # The multi-line budget also sets the prompt budget at load ("auto": the trained context less it).
        reload = (new.model, new.attention, new.repair, new.budgets, new.completion.multiline_max_tokens,
                  new.memory) != (
            self.settings.model, self.settings.attention, self.settings.repair, self.settings.budgets,
            self.settings.completion.multiline_max_tokens, self.settings.memory,
        )
        if new.completion.acceptance_log != self.settings.completion.acceptance_log:
            self.tracker.log.enabled = new.completion.acceptance_log  # off: nothing more is written
        reload = reload or new.completion.gate_path != self.settings.completion.gate_path
        self._judged.clear()
        self.settings = new
        if not reload and self.engine is not None:
            self.engine.update_settings(new)  # completion lengths, temperature: from the next request
        self.cache.clear()
        self.cache.resize(new.completion.cache_size)
        if self._log_handler is not None:
            self._log_handler.setLevel(_LOG_LEVELS[new.log_level])
        if reload and self.loop is not None:
            self.start_engine()

    def start_engine(self) -> None:
        """(Re)create the engine and load it on the model worker, reporting ``$/progress``."""
        assert self.loop is not None
        if self.protocol.exit_code is not None:  # exit came first: the model worker is gone
            return
        self.supersession.cancel_all("reload")
        if self.engine.memory is not None:
            self.engine.memory.cancel()  # the old engine's first build, if it still runs
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
            # Logged first: both go out through the event loop in the order they are asked for, so a
            # client that sees the progress end has the log line already.
            log.info("model ready (%s) in %.1fs", self.settings.model.backend, engine.load_seconds)
            progress.end(f"ready in {engine.load_seconds:.1f}s")
            for uri, opened in list(self.workspace.text_documents.items()):  # opened while the model loaded: what
                self.warm_document(uri, opened.language_id)  # their warm-up read from the pipeline is read now
            if root and engine.context is not None:
                await self.index_workspace(engine, root)
            if engine.memory is not None:
                for uri in list(self.workspace.text_documents):  # opened while the model loaded
                    self.remember_document(uri)
            if root and engine.memory is not None and self.engine is engine:
                await self.index_memory(engine, root)
            elif not root:
                self._lone_folder = None  # a new engine's memory: its folder is chosen again
                for uri in list(self.workspace.text_documents):
                    self.index_lone_folder(uri)

        self.loop.create_task(run())

    def index_lone_folder(self, uri: str) -> None:
        """Where the client names no workspace (a file opened on its own: no project marker above
        it), the workspace memory's first build covers the folder of the first file opened from
        disk: its own files, not its folders' (it may be a home folder), and the libraries they
        import. Without it the memory held the open documents alone, and no library."""
        engine = self.engine
        if self.workspace.root_path or self.loop is None or engine.memory is None or self._lone_folder is not None:
            return
        path = to_fs_path(uri) if uri.startswith("file:") else None
        if not path or not os.path.isfile(path):
            return
        self._lone_folder = folder = os.path.dirname(os.path.abspath(path))
        log.info("no workspace folder from the client: the workspace memory reads %s (its own files)", folder)
        self.loop.create_task(self.index_memory(engine, folder, recursive=False))

    async def index_memory(self, engine: Engine, root: str, recursive: bool = True) -> dict[str, Any] | None:
        """The workspace memory's first build of ``root`` (its files, the libraries they import;
        ``recursive`` False: the files of ``root`` itself), in a thread of its own (a daemon:
        exiting never waits for it), reporting ``$/progress``. Documents opened meanwhile keep the
        editor's text. None when it failed or was stopped."""
        assert self.loop is not None and engine.memory is not None
        memory = engine.memory
        progress = WorkProgress(self, self.loop, "GLM-5: workspace memory")
        await progress.begin(root)
        started = time.perf_counter()
        try:
            stats = await in_daemon_thread(memory.index, root, progress.report,
                                           lambda: self.engine is not engine or self.protocol.exit_code is not None,
                                           recursive)
        except IndexCancelled:
            progress.end("stopped")
            return None
        except Exception:  # an unreadable folder or library must not cost the user completions
            log.exception("the workspace memory of %s could not be built", root)
            progress.end("failed")
            return None
        self.cache.clear()  # answers from before the memory was there
        progress.end(f"{stats['files']} files, {stats['tokens'] + stats['library_tokens']:,} tokens "
                     f"in {time.perf_counter() - started:.1f}s")
        return stats

    # ---- the workspace memory's documents -----------------------------------------------------

    def remember_document(self, uri: str) -> None:
        """An opened, changed or saved document: its text goes into the workspace memory, off the
        event loop (only the changed lines are re-tokenized), the latest text once per burst."""
        memory = self.engine.memory
        if memory is None or self.loop is None:
            return
        if uri in self._remembering:
            self._remember_again.add(uri)
            return
        self._remembering.add(uri)

        async def run() -> None:
            try:
                while True:
                    self._remember_again.discard(uri)
                    document = self.document(uri)
                    if document is None or self.engine.memory is not memory:
                        return
                    path = to_fs_path(uri) or uri
                    language = detect_language(path, document.language_id)
                    text = document.source
                    if len(text) <= MEMORY_DOCUMENT_CHARS and memory.applies(language) \
                            and await asyncio.to_thread(memory.update, path, text):
                        self.cache.clear()  # answers elsewhere may read what this document now says
                    if uri not in self._remember_again:
                        return
            except Exception:  # the memory is an aid: a failure is logged, the document served anyway
                log.exception("the workspace memory could not take %s", uri)
            finally:
                self._remembering.discard(uri)

        self.loop.create_task(run())

    def files_changed(self, changes: list[types.FileEvent]) -> None:
        """``workspace/didChangeWatchedFiles``: a file created or changed outside the editor is read
        again (an open document keeps the editor's text), a deleted one is forgotten."""
        memory = self.engine.memory
        if memory is None or self.loop is None:
            return
        work = []
        for change in changes:
            path = to_fs_path(change.uri) or change.uri
            if change.type == types.FileChangeType.Deleted:
                work.append((memory.remove, path))
            elif self.document(change.uri) is None:
                work.append((memory.refresh, path))
        if work:
            self.loop.create_task(self._memory_work(work))

    def files_renamed(self, files: list[types.FileRename]) -> None:
        """``workspace/didRenameFiles``: a file (or folder) moved keeps its text under the new name."""
        memory = self.engine.memory
        if memory is None or self.loop is None:
            return
        work = [(memory.rename, to_fs_path(f.old_uri) or f.old_uri, to_fs_path(f.new_uri) or f.new_uri) for f in files]
        if work:
            self.loop.create_task(self._memory_work(work))

    async def watch_files(self, params: Any = None) -> None:
        """Ask the client to report Python files changed outside the editor
        (``workspace/didChangeWatchedFiles``), where it lets a server register that."""
        workspace = self.client_capabilities.workspace if self.client_capabilities else None
        watched = workspace.did_change_watched_files if workspace else None
        if not (watched and watched.dynamic_registration):
            return
        options = types.DidChangeWatchedFilesRegistrationOptions(
            watchers=[types.FileSystemWatcher(glob_pattern="**/*.{py,pyi}")])
        try:
            await self.client_register_capability_async(types.RegistrationParams(registrations=[
                types.Registration(id="glm5-watched-files", method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES,
                                   register_options=options)]))
        except Exception:  # a client that refuses: files changed outside the editor are read when opened
            log.debug("the client did not register the file watchers", exc_info=True)

    async def _memory_work(self, work: list[tuple[Any, ...]]) -> None:
        def run() -> None:
            for fn, *args in work:
                try:
                    fn(*args)
                except Exception:  # one unreadable file must not stop the others
                    log.exception("the workspace memory could not follow %s", args[0])

        await asyncio.to_thread(run)
        self.cache.clear()

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

    def document(self, uri: str) -> SyncedDocument | None:
        found = self.workspace.text_documents.get(unquote(uri))
        return found if isinstance(found, SyncedDocument) else None

    def locate(self, uri: str, position: types.Position | None = None, *, offset: int | None = None) -> Target | None:
        """The open document and cursor (``position``, or a document ``offset``), or None (unknown
        document, a line past the end, an unsupported language). A position past the end of a
        line is that line's end (the protocol's rule)."""
        document = self.document(uri)
        if document is None:
            return None
        path = to_fs_path(uri) or uri
        language = detect_language(path, document.language_id)
        if language not in supported_languages():
            return None
        if position is not None:
            cursor = document.offset_at(position)
            if cursor is None:
                return None
        else:
            cursor = max(0, min(offset or 0, len(document)))
        view = document_view(document, cursor, self.settings.limits.window_chars)
        if view.windowed and uri not in self._windowed:
            self._windowed.add(uri)
            log.info("%s has %d characters, over limits.windowChars (%d): the model, the checks and the index "
                     "read its head and a window around the cursor, and its own diagnostics are not published",
                     path, len(document), self.settings.limits.window_chars)
        local = view.offset_of_document(cursor)
        return Target(uri, view.text, local if local is not None else 0, path, language, document.version, view)

    @property
    def encoding(self) -> str:
        kind = self.workspace.position_encoding
        return str(kind.value if isinstance(kind, types.PositionEncodingKind) else kind or "utf-16")

    # ---- running model work -----------------------------------------------------------------

    async def run_model(self, token: CancelToken, job: Callable[[], T | None], timeout_s: float, *,
                        answer_by_s: float | None = None, started: threading.Event | None = None,
                        judging_s: float = 0.0, uri: str | None = None) -> T | None:
        """Run ``job`` on the model worker; client cancellation and the timeout set ``token``.

        None when the backend failed (a log line; a model that is down is shown to the user once),
        or when ``answer_by_s`` passed first (``judging_s`` later if the job had ``started`` by then):
        the job is cancelled and left to stop on its own, and its answer is dropped. A job for
        document ``uri`` that ends after the document closed lets go of what it made for it (the
        context engine re-reads a document a prompt names).
        """
        loop = asyncio.get_running_loop()
        timer = loop.call_later(timeout_s, token.cancel, "timeout")
        future = loop.run_in_executor(self.model_worker, job)
        if uri is not None:
            future.add_done_callback(lambda _done: self._release(uri) if self.document(uri) is None else None)
        try:
            if answer_by_s is not None:
                done, _ = await asyncio.wait({future}, timeout=max(0.0, answer_by_s))
                if not done and judging_s > 0 and started is not None and started.is_set():
                    done, _ = await asyncio.wait({future}, timeout=judging_s)
                if not done:
                    token.cancel("deadline")
                    future.add_done_callback(self._late_job)
                    return None
            result = await future
        except BackendError as error:
            self.backend_failed(error)
            return None
        except asyncio.CancelledError:
            token.cancel("client")
            raise
        finally:
            timer.cancel()
        self.backend_answered()
        return result

    def _late_job(self, future: asyncio.Future[Any]) -> None:
        """A job whose answer came after its request was answered: only its failure matters."""
        if future.cancelled():
            return
        error = future.exception()
        if isinstance(error, BackendError):
            self.backend_failed(error)
        elif error is not None:
            log.error("a model job failed after its request was answered",
                      exc_info=(type(error), error, error.__traceback__))

    def backend_failed(self, error: BackendError) -> None:
        """A backend failure: answered empty, one log line; a model that went down is shown once."""
        down = isinstance(error, BackendUnavailable)
        log.warning("the model %s: %s; answered empty", "is unavailable" if down else "failed", error)
        if down and not self.backend_down:
            self.backend_down = True
            self.window_show_message(types.ShowMessageParams(
                type=types.MessageType.Warning,
                message=f"glm5-lsp: the model is unavailable ({error}); completions are empty until it answers again"))

    def backend_answered(self) -> None:
        if self.backend_down:
            self.backend_down = False
            log.info("the model answers again")

    def _on_model_worker(self, fn: Callable[[], None]) -> asyncio.Future[None]:
        return asyncio.get_running_loop().run_in_executor(self.model_worker, fn)

    def note_activity(self) -> None:
        """A request or an opened document: the heap is settled again after the next quiet spell."""
        if self.loop is not None:
            self.heap.touch(self.loop)

    def current_pipeline(self) -> Pipeline | None:
        """The loaded pipeline; None when the model failed to load (that was shown to the user)."""
        return self.engine.pipeline

    async def completion_text(self, target: Target, *, multiline: bool, kind: str, received: float | None = None,
                              trigger: str | None = None) -> str:
        """The post-processed completion at a cursor ("" when there is none), cached and superseding.

        An as-you-type one (``kind`` "inline" or "completion") is answered by ``budgets.completionMs``
        plus ``ANSWER_GRACE_S`` after the request was ``received`` (``time.perf_counter()``) if the
        model worker had not started it by then, else plus ``JUDGING_GRACE_S``, whatever the model
        and the checks are doing: what is not done by then is dropped. As-you-type ones are judged by
        the completion gate (``completion.minQuality``; ``trigger``: "automatic" or "invoked").
        """
        started = time.perf_counter() if received is None else received
        as_you_type = kind in ("inline", "completion")
        budget = self.settings.budgets.completion_ms / 1000 if as_you_type else None
        deadline = None if budget is None else started + budget + ANSWER_GRACE_S
        key = completion_key(target, multiline)
        token = self.supersession.begin((target.uri, kind))  # even a cache hit makes older requests stale
        cached = self.cache.get(key)
        shown = (target.uri, kind, multiline)
        if cached is None:  # typing the suggestion's first characters: the rest is still the answer
            cached = self.typed_through.rest(shown, target.text, target.offset)
        if cached is not None:
            self.supersession.finish((target.uri, kind), token)
            self.typed_through.remember(shown, target.text, target.offset, cached)
            return cached
        try:
            debounce = self.settings.completion.debounce_ms / 1000
            if debounce:
                await asyncio.sleep(debounce)
                if token.cancelled:  # a newer keystroke arrived while we waited
                    return ""

            picked_up = [0.0, 0.0]  # when the model worker started and finished the job
            began = threading.Event()

            def job() -> PipelineResult | None:
                picked_up[0] = time.perf_counter()
                began.set()
                try:
                    pipeline = self.current_pipeline()
                    if pipeline is None or token.cancelled:
                        return None
                    # The budget counts from the request, not from when the worker got to it.
                    left = None if budget is None else max(0.05, budget - (picked_up[0] - started))
                    return pipeline.complete(target.text, target.offset, path=target.path, language=target.language,
                                             multiline=multiline, should_cancel=token, time_budget_s=left,
                                             gated=as_you_type, trigger=trigger)
                finally:
                    picked_up[1] = time.perf_counter()

            result = await self.run_model(token, job, self.settings.budgets.request_timeout_ms / 1000,
                                          answer_by_s=None if deadline is None else deadline - time.perf_counter(),
                                          started=began, judging_s=JUDGING_GRACE_S - ANSWER_GRACE_S,
                                          uri=target.uri)
        finally:
            self.supersession.finish((target.uri, kind), token)
            self.note_activity()
        if result is None or token.cancelled:
            log.debug("completion at %s:%d dropped (%s)", target.path, target.offset,
                      token.reason or "no model or it failed")
            return ""
        if not result.clean and not self.settings.repair.return_unclean:
            log.info("completion dropped: no candidate passed the checks in %d round(s)", result.rounds)
            text = ""
        else:
            text = result.text  # post-processed (re-indented to the file's unit) and checked once, in the pipeline
        log.debug("%s completion at %s:%d: %.0f ms (waited %.0f ms for the model worker, "
                  "pipeline %.0f of %.0f ms there, %d round(s)%s)%s", kind, target.path, target.offset,
                  (time.perf_counter() - started) * 1000, (picked_up[0] - started) * 1000, result.seconds * 1000,
                  (picked_up[1] - picked_up[0]) * 1000, result.rounds,
                  ", the typed word finished" if result.finished_word else "", "" if text else ", empty")
        if result.withheld:
            log.debug("completion at %s:%d withheld: %s", target.path, target.offset, result.withheld)
        if text:
            self._judged.put(key, (result.score, result.features))
        if text or result.finish_reason != "cancelled":  # nothing because time ran out is no answer to keep
            self.cache.put(key, text)
        self.typed_through.remember(shown, target.text, target.offset, text)
        return text

    def track_shown(self, target: Target, text: str, multiline: bool) -> str | None:
        """The acceptance log's id for the inline suggestion ``text`` sent at ``target`` (the same id
        when it is the same suggestion again, or its rest typed through), or None when the log is off
        or the document is read as a window (its offsets are the window's)."""
        if not self.tracker.log.enabled or target.view.windowed or not text:
            return None
        same = self.tracker.current(target.uri, target.offset, text)
        if same is not None:
            return same
        score, features = self._judged.get(completion_key(target, multiline)) or (None, {})
        gate = getattr(self.current_pipeline(), "gate", None)
        return self.tracker.shown(target.uri, target.text, target.offset, text, features=features, score=score,
                                  threshold=None if gate is None or gate.gate is None else gate.threshold,
                                  language=target.language, model=None if gate is None else gate.model)

    def track_change(self, uri: str) -> None:
        """A change to ``uri``: a suggestion shown there may now be typed over, or accepted and removed."""
        if not self.tracker.follows(uri):
            return
        document = self.document(uri)
        if document is not None:
            self.tracker.changed(uri, document.source)

    def multiline_for(self, target: Target) -> bool:
        policy = self.settings.completion.lines
        if policy != "auto":
            return policy == "multi"
        return wants_multiline(target.text, target.offset, target.language)

    # ---- diagnostics --------------------------------------------------------------------------

    def schedule_diagnostics(self, uri: str) -> None:
        """Publish our own compiler diagnostics for ``uri`` shortly after the last change, once no
        completion has run for ``DIAGNOSTICS_QUIET_S`` (or after two seconds of waiting for that)."""
        if not self.settings.features.diagnostics or self.loop is None:
            return
        previous = self._diagnose_tasks.pop(uri, None)
        if previous is not None:
            previous.cancel()

        async def publish() -> None:
            await asyncio.sleep(0.15)
            # Completions go first: the checks (0.1-0.3 s on a 2,600-line file) would take turns with
            # one for the interpreter, and the ghost text is what the user waits for. While the user
            # types, a completion follows every keystroke, so the checks wait for a pause in them.
            for _ in range(DIAGNOSTICS_YIELD_STEPS):
                if self.supersession.quiet_for() >= DIAGNOSTICS_QUIET_S:
                    break
                await asyncio.sleep(0.05)
            target = self.locate(uri)
            if target is None or target.view.windowed:  # a large document is not checked whole
                return
            found = await asyncio.to_thread(diagnose, target.text, target.path, target.language)
            current = self.document(uri)
            if current is None or current.version != target.version:
                return
            self.text_document_publish_diagnostics(
                types.PublishDiagnosticsParams(
                    uri=uri, version=target.version,
                    diagnostics=[convert.lsp_diagnostic(target.view, d, self.encoding) for d in found],
                )
            )

        self._diagnose_tasks[uri] = self.loop.create_task(publish())

    # ---- opening and closing ----------------------------------------------------------------------

    def warm_document(self, uri: str, language_id: str | None) -> None:
        """Prepare an opened document in the background (the context engine's view of it, the API
        docs of what it imports, jedi's parse of it), so the first completion need not. A large
        document is warmed as its head and first window, without jedi. Closing it stops what has
        not started. Nothing here holds the message, so a 5 MB text is not kept alive by it."""
        previous = self._warm_tasks.pop(uri, None)
        if previous is not None:
            previous.cancel()
        task = asyncio.get_running_loop().create_task(self._warm(uri, language_id))
        self._warm_tasks[uri] = task
        task.add_done_callback(lambda done: self._warm_tasks.pop(uri, None) if self._warm_tasks.get(uri) is done else None)

    async def _warm(self, uri: str, language_id: str | None) -> None:
        target = self.locate(uri, offset=0)
        context = self.engine.context
        if target is None:
            return
        if context is not None:
            try:
                await asyncio.to_thread(context.open_document, target.path, target.text, language_id)
            except Exception:  # the document still gets completions: the prompt re-reads its text
                log.exception("the context engine could not open %s", target.path)
                return
            if self.document(uri) is None:
                return
            try:  # its imports' API docs, before the first completion asks for them
                added = await asyncio.to_thread(context.warm, target.path)
                if added:
                    log.info("indexed the API docs of %d package(s) %s imports", added, target.path)
            except Exception:  # the index stays as it was; completions go on without those docs
                log.exception("could not index the packages %s imports", target.path)
        pipeline = self.current_pipeline()
        if pipeline is not None and not target.view.windowed and self.document(uri) is not None:
            # the repair loop's reading of the whole file (its style), once, not in its first request
            await asyncio.to_thread(pipeline.warm_document, target.text, target.path, language_id)
        # Not for a document read as a window: jedi's parse of each window a large document shows
        # (its trees, its caches) stayed in the heap after the document closed, 8 MB a document.
        if target.language == "python" and self.engine.monitors_names and not target.view.windowed \
                and self.document(uri) is not None:
            # the decoding monitor's jedi lookups then fit in a request's time from the first one
            await asyncio.to_thread(warm, target.text, target.path)
        del target
        if self.document(uri) is None:  # closed while it was warmed: let that go too
            self._release(uri)
            return
        # What the warm-up built lives while the file is open: out of the collector's walks with it.
        await asyncio.to_thread(freeze_survivors)
        self.note_activity()

    def forget_document(self, uri: str) -> None:
        """A closed document: its running work is cancelled, and everything kept for it is let go
        (its pending diagnostics, the context engine's document and summary, jedi's parse of it,
        the suggestion shown in it, the recent syntax trees); then the memory goes back to the system."""
        for tasks in (self._diagnose_tasks, self._warm_tasks):
            task = tasks.pop(uri, None)
            if task is not None:
                task.cancel()
        self.supersession.cancel_where(lambda key: isinstance(key, tuple) and key[:1] == (uri,), "closed")
        self.typed_through.forget(lambda key: isinstance(key, tuple) and key[:1] == (uri,))
        self.tracker.forget(uri)
        self._windowed.discard(uri)
        self._release(uri)

    def _release(self, uri: str) -> None:
        """Let go of what was kept for a closed document, off the event loop (the context engine's
        lock may be held by a warm-up for a while, and handing memory back takes a moment)."""
        path = to_fs_path(uri) or uri
        context = self.engine.context

        def release() -> None:
            if context is not None:
                context.close_document(path)
            forget_trees()
            forget_jedi_parse(path)
            release_memory()

        try:
            asyncio.get_running_loop().run_in_executor(None, release)
        except RuntimeError:  # no event loop (a test driving the server directly)
            release()

    def detach_log_handler(self) -> None:
        if self._log_handler is not None:
            logging.getLogger("glm5_lsp").removeHandler(self._log_handler)
            self._log_handler = None

    def attach_log_handler(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send the package's log records to the client (``window/logMessage``) at ``settings.logLevel``.

        The stderr handlers keep the level the command line chose (``-v``), however verbose the
        client's log is.
        """
        root = logging.getLogger()
        for handler in root.handlers:
            if handler.level == logging.NOTSET:
                handler.setLevel(root.level)
        self._log_handler = ClientLogHandler(self, loop, _LOG_LEVELS[self.settings.log_level])
        package = logging.getLogger("glm5_lsp")
        package.addHandler(self._log_handler)
        package.setLevel(logging.DEBUG)  # each handler filters by its own level


async def in_daemon_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a daemon thread of its own, awaited: a long build the process need not
    wait for when it exits (``asyncio.to_thread``'s pool is joined at exit)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as caught:  # noqa: BLE001 - handed to the awaiting coroutine
            result, error = None, caught
        if not loop.is_closed():
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="glm5-memory-build", daemon=True).start()
    return await future


def completion_key(target: Target, multiline: bool) -> tuple[str, int, bool, str]:
    """The completion cache's key: the text read, the cursor, single or multi-line, the language."""
    return (hashlib.sha1(target.text.encode("utf-8", "surrogatepass")).hexdigest(), target.offset, multiline,
            target.language)


def forget_jedi_parse(path: str) -> None:
    """Drop parso's cached parse of ``path`` (jedi keeps one per file it was asked about)."""
    cache = getattr(sys.modules.get("parso.cache"), "parser_cache", None)
    if not isinstance(cache, dict):
        return
    import pathlib

    keys = {path, pathlib.Path(path)}
    for by_path in list(cache.values()):
        for key in keys:
            by_path.pop(key, None)
