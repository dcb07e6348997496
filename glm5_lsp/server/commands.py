"""``workspace/executeCommand``: ``glm5.generate``, ``glm5.fix``, ``glm5.reindex``, and ``glm5.accepted``
(an inline suggestion's own command, which the editor runs when the user accepts it)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException

from glm5_lsp.pipeline import PipelineResult, diagnose
from glm5_lsp.server import convert
from glm5_lsp.server.actions import FIX_TITLE, resolve_fix
from glm5_lsp.server.jobs import CancelToken
from glm5_lsp.server.state import Glm5Server

log = logging.getLogger(__name__)

ACCEPTED_COMMAND = "glm5.accepted"
COMMANDS = ("glm5.generate", "glm5.fix", "glm5.reindex", ACCEPTED_COMMAND)


def register(server: Glm5Server) -> None:
    """Register the ``glm5.*`` commands on ``server``."""

    @server.command("glm5.generate")
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
            edit = convert.lsp_text_edit(target.view, target.offset, target.offset, text)
            applied, _ = await apply_edit(ls, types.WorkspaceEdit(changes={target.uri: [edit]}), "GLM-5: generate")
        return {"text": text, "clean": True, "applied": applied}

    @server.command("glm5.fix")
    async def fix(ls: Glm5Server, *args: Any) -> dict[str, Any]:
        """``{"uri"}``: fix the whole document with the repair loop and apply the edit when it checks out."""
        options = args[0] if args and isinstance(args[0], dict) else {}
        target = ls.locate(str(options.get("uri", "")))
        if target is None:
            return {"applied": False, "reason": "unknown document"}
        if target.view.windowed:
            return {"applied": False, "reason": f"the document is over limits.windowChars "
                                                f"({ls.settings.limits.window_chars} characters): fix a part of it"}
        errors = [d for d in await asyncio.to_thread(diagnose, target.text, target.path, target.language)
                  if d.severity == "error"]
        if not errors:
            return {"applied": False, "reason": "no errors to fix"}
        action = types.CodeAction(title=FIX_TITLE, diagnostics=[convert.lsp_diagnostic(target.view, d) for d in errors])
        resolved = await resolve_fix(ls, action, target)
        if resolved.edit is None:
            return {"applied": False, "reason": "no fix that checks out"}
        applied, reason = await apply_edit(ls, resolved.edit, FIX_TITLE)
        return {"applied": applied, "reason": reason}

    @server.command("glm5.reindex")
    async def reindex(ls: Glm5Server, *args: Any) -> dict[str, Any]:
        """Rebuild the context engine's index of the workspace, with ``$/progress``."""
        started = time.perf_counter()
        root = ls.workspace.root_path
        engine = ls.engine
        count = await ls.index_workspace(engine, root) if root and engine.context is not None else 0
        return {"indexed": count, "seconds": time.perf_counter() - started}

    @server.command(ACCEPTED_COMMAND)
    def accepted(ls: Glm5Server, *args: Any) -> dict[str, Any]:
        """``[id]``: the user accepted the inline suggestion ``id`` (the acceptance log's "accepted")."""
        suggestion = args[0] if args and isinstance(args[0], str) else None
        return {"recorded": suggestion is not None and ls.tracker.accepted(suggestion)}


async def apply_edit(ls: Glm5Server, edit: types.WorkspaceEdit, label: str) -> tuple[bool, str]:
    """Ask the editor to apply ``edit``: whether it did, and why not ("" when it did or gave no
    reason). An editor that answers with an error, or with something other than the protocol's
    ``{"applied": bool}`` (some answer ``null``), has not applied it: the command still answers."""
    try:
        reply = await ls.workspace_apply_edit_async(types.ApplyWorkspaceEditParams(edit=edit, label=label))
    except JsonRpcException as error:
        log.warning("the editor's answer to workspace/applyEdit (%s): %s", label, error)
        return False, f"the editor's answer to workspace/applyEdit: {error}"
    if reply is not None and reply.applied:
        return True, ""
    return False, (reply.failure_reason or "") if reply is not None else ""


def _position_argument(value: Any) -> types.Position | None:
    """``{"line": int, "character": int}`` from a command's JSON arguments, or None when malformed."""
    if not isinstance(value, dict):
        return None
    line, character = value.get("line"), value.get("character")
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31 for v in (line, character)):
        return None
    return types.Position(line=line, character=character)
