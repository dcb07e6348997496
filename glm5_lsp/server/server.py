"""``build_server``: a :class:`~glm5_lsp.server.state.Glm5Server` with every feature registered.

The lifecycle and document-sync handlers live here; completions, code actions and commands register
themselves from their own modules.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from lsprotocol import types

from glm5_lsp import __version__
from glm5_lsp.server import actions, commands, completions
from glm5_lsp.server.commands import COMMANDS
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
        ls.loop.create_task(ls.watch_files(params))

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def did_change_configuration(ls: Glm5Server, params: types.DidChangeConfigurationParams) -> None:
        ls.apply_settings(params.settings)

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: Glm5Server, params: types.DidOpenTextDocumentParams) -> None:
        # The warm-up runs on its own: this handler (and the message, a 5 MB text perhaps) ends now.
        ls.schedule_diagnostics(params.text_document.uri)
        ls.warm_document(params.text_document.uri, params.text_document.language_id)
        ls.remember_document(params.text_document.uri)
        ls.index_lone_folder(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: Glm5Server, params: types.DidChangeTextDocumentParams) -> None:
        ls.schedule_diagnostics(params.text_document.uri)
        ls.track_change(params.text_document.uri)
        ls.remember_document(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: Glm5Server, params: types.DidSaveTextDocumentParams) -> None:
        ls.remember_document(params.text_document.uri)

    @server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched_files(ls: Glm5Server, params: types.DidChangeWatchedFilesParams) -> None:
        ls.files_changed(params.changes)

    @server.feature(types.WORKSPACE_DID_RENAME_FILES, types.FileOperationRegistrationOptions(
        filters=[types.FileOperationFilter(pattern=types.FileOperationPattern(glob="**/*"))]))
    def did_rename_files(ls: Glm5Server, params: types.RenameFilesParams) -> None:
        ls.files_renamed(params.files)

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
