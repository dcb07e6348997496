"""``build_server``: a :class:`~glm5_lsp.server.state.Glm5Server` with every feature registered.

The lifecycle and document-sync handlers live here; completions, code actions and commands register
themselves from their own modules.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from lsprotocol import types
from pygls.uris import to_fs_path

from glm5_lsp import __version__
from glm5_lsp.repair.monitor import warm_jedi
from glm5_lsp.server import actions, commands, completions
from glm5_lsp.server.commands import COMMANDS
from glm5_lsp.server.heap import freeze_survivors
from glm5_lsp.server.state import Glm5Server

log = logging.getLogger("glm5_lsp.server")

__all__ = ["COMMANDS", "Glm5Server", "build_server"]


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
        uri = params.text_document.uri
        target = ls.locate(uri, offset=0)  # a large document: its head and first window
        context = ls.engine.context
        if context is not None and target is not None:
            try:
                await asyncio.to_thread(context.open_document, target.path, target.text,
                                        params.text_document.language_id)
            except Exception:  # the document still gets completions: the prompt re-reads its text
                log.exception("the context engine could not open %s", target.path)
                return
            try:  # its imports' API docs, before the first completion asks for them
                added = await asyncio.to_thread(context.warm, target.path)
                if added:
                    log.info("indexed the API docs of %d package(s) %s imports", added, target.path)
            except Exception:  # the index stays as it was; completions go on without those docs
                log.exception("could not index the packages %s imports", target.path)
        if target is not None and target.language == "python" and ls.engine.monitors_names:
            try:  # the decoding monitor's jedi lookups then fit in a request's time from the first one
                await asyncio.to_thread(warm_jedi, target.text, to_fs_path(uri) or None)
            except Exception:
                log.exception("jedi could not read %s", uri)
        if ls.document(uri) is None:  # closed while it was warmed: let that go too
            ls.forget_document(uri)
            return
        # What the warm-up built lives while the file is open: out of the collector's walks with it.
        await asyncio.to_thread(freeze_survivors)
        ls.note_activity()

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: Glm5Server, params: types.DidChangeTextDocumentParams) -> None:
        ls.schedule_diagnostics(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: Glm5Server, params: types.DidCloseTextDocumentParams) -> None:
        ls.forget_document(params.text_document.uri)

    completions.register(server)
    actions.register(server)
    commands.register(server)

    @server.feature(types.SHUTDOWN)
    def shutdown(ls: Glm5Server, params: None) -> None:
        ls.supersession.cancel_all("shutdown")
        ls.heap.cancel()
        ls.detach_log_handler()

    return server
