"""Code actions: "Fix with GLM-5" for diagnostics in range (the client's and our own) and "Generate
body with GLM-5" on a placeholder body. Edits are computed in ``codeAction/resolve`` when the client
supports it (the lightbulb is instant), and every edit is checked before it is offered."""

from __future__ import annotations

import asyncio

from lsprotocol import types

from glm5_lsp.pipeline import PipelineResult
from glm5_lsp.server import convert
from glm5_lsp.server.checks import check_edit, diagnose
from glm5_lsp.server.postprocess import clean_completion, indent_unit
from glm5_lsp.server.progress import WorkProgress
from glm5_lsp.server.state import Glm5Server, Target, log
from glm5_lsp.server.syntax import empty_bodies
from glm5_lsp.textdiff import diff_region

FIX_TITLE = "Fix with GLM-5"
BODY_TITLE = "Generate body with GLM-5"


def register(server: Glm5Server) -> None:
    """Register ``textDocument/codeAction`` and ``codeAction/resolve`` on ``server``."""

    @server.feature(
        types.TEXT_DOCUMENT_CODE_ACTION,
        types.CodeActionOptions(
            code_action_kinds=[types.CodeActionKind.QuickFix, types.CodeActionKind.RefactorRewrite],
            resolve_provider=True,
        ),
    )
    async def code_action(ls: Glm5Server, params: types.CodeActionParams) -> list[types.CodeAction] | None:
        if not ls.settings.features.code_actions:
            return None
        target = ls.locate(params.text_document.uri, params.range.start)
        if target is None:
            return []
        end = target.view.offset(params.range.end)
        end = len(target.text) if end is None else max(end, target.offset)
        wanted = [str(getattr(kind, "value", kind)) for kind in params.context.only] if params.context.only else None
        actions: list[types.CodeAction] = []
        # Offsets in the data are the document's: resolve reads the same view again from them.
        data = {"uri": target.uri, "version": target.version, "at": target.view.document_offset(target.offset)}
        if wanted is None or any(kind in ("quickfix", "") for kind in wanted):
            own = await asyncio.to_thread(diagnose, target.text, target.path, target.language)
            ours = [convert.lsp_diagnostic(target.view, d) for d in own]
            relevant = [d for d in list(params.context.diagnostics) + ours
                        if convert.lsp_lines_overlap(d.range, params.range)]
            if relevant:
                action = types.CodeAction(title=FIX_TITLE, kind=types.CodeActionKind.QuickFix, diagnostics=relevant,
                                          is_preferred=True, data={**data, "action": "fix"})
                if client_resolves_edits(ls):
                    actions.append(action)
                else:
                    resolved = await resolve_fix(ls, action, target)
                    if resolved.edit is not None:
                        actions.append(resolved)
        if ls.settings.features.generate_body and (wanted is None or any(
                kind in ("", "refactor", "refactor.rewrite") for kind in wanted)):
            start = target.offset
            for body in empty_bodies(target.text, target.language):
                if body.header_start <= end and start <= body.end:
                    action = types.CodeAction(
                        title=f"{BODY_TITLE}: {body.name}" if body.name else BODY_TITLE,
                        kind=types.CodeActionKind.RefactorRewrite,
                        data={**data, "action": "body", "start": target.view.document_offset(body.start),
                              "end": target.view.document_offset(body.end)},
                    )
                    if client_resolves_edits(ls):
                        actions.append(action)
                    else:
                        resolved = await resolve_body(ls, action, target, body.start, body.end)
                        if resolved.edit is not None:
                            actions.append(resolved)
        return actions

    @server.feature(types.CODE_ACTION_RESOLVE)
    async def resolve_code_action(ls: Glm5Server, action: types.CodeAction) -> types.CodeAction:
        data = action.data if isinstance(action.data, dict) else {}
        uri = data.get("uri")
        target = ls.locate(uri, offset=max(0, _integer(data.get("at")))) if isinstance(uri, str) else None
        if target is None or target.version != data.get("version"):
            log.info("code action for a closed or changed document: nothing to resolve")
            return action
        if data.get("action") == "fix":
            return await resolve_fix(ls, action, target)
        if data.get("action") == "body":
            start = target.view.offset_of_document(_integer(data.get("start")))
            end = target.view.offset_of_document(_integer(data.get("end")))
            if start is not None and end is not None and 0 <= start <= end <= len(target.text):
                return await resolve_body(ls, action, target, start, end)
        return action


def _integer(value: object) -> int:
    """An integer from a client's echo of our data (-1 when it is not one)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


async def resolve_fix(ls: Glm5Server, action: types.CodeAction, target: Target) -> types.CodeAction:
    """Fill in the "Fix with GLM-5" edit: the repair loop's rewrite, offered only if it checks out."""
    found = (convert.diagnostic_from_lsp(target.view, d) for d in action.diagnostics or [])
    diagnostics = [d for d in found if d is not None]
    assert ls.loop is not None
    progress = WorkProgress(ls, ls.loop, "GLM-5: fixing")
    await progress.begin(target.path)
    token = ls.supersession.begin((target.uri, "fix"))
    try:
        def job() -> PipelineResult | None:
            pipeline = ls.current_pipeline()
            if pipeline is None or token.cancelled:
                return None
            progress.report("generating a fix", 30)
            return pipeline.fix(target.text, diagnostics=diagnostics or None, path=target.path,
                                language=target.language, should_cancel=token)

        result = await ls.run_model(token, job, ls.settings.budgets.fix_timeout_ms / 1000, uri=target.uri)
        if result is None or token.cancelled:
            progress.end("cancelled")
            return action
        progress.report("checking the fix", 80)
        start, end, text = diff_region(target.text, result.text)
        if not target.view.contiguous(start, end):
            progress.end("no fix found")
            log.info("the fix would rewrite past the part of %s that was read: not offered", target.path)
            return action
        verdict = await asyncio.to_thread(check_edit, target.text, start, end, text, path=target.path,
                                          language=target.language, targets=diagnostics)
    finally:
        ls.supersession.finish((target.uri, "fix"), token)
    if not verdict.ok:
        progress.end("no fix found")
        ls.window_show_message(types.ShowMessageParams(
            type=types.MessageType.Info, message=f"GLM-5 found no fix to offer: {verdict.reason()}"))
        return action
    progress.end("done")
    edit = convert.lsp_text_edit(target.view, start, end, text)
    action.edit = types.WorkspaceEdit(changes={target.uri: [edit]})
    return action


async def resolve_body(ls: Glm5Server, action: types.CodeAction, target: Target, start: int, end: int) -> types.CodeAction:
    """Fill in the "Generate body" edit: a multi-line completion in place of ``pass``/``...``."""
    document = target.text[:start] + target.text[end:]
    token = ls.supersession.begin((target.uri, "body"))
    try:
        def job() -> PipelineResult | None:
            pipeline = ls.current_pipeline()
            if pipeline is None or token.cancelled:
                return None
            return pipeline.complete(document, start, path=target.path, language=target.language,
                                     multiline=True, should_cancel=token)

        result = await ls.run_model(token, job, ls.settings.budgets.fix_timeout_ms / 1000, uri=target.uri)
    finally:
        ls.supersession.finish((target.uri, "body"), token)
    if result is None or token.cancelled:
        return action
    body = clean_completion(result.text, document[:start], document[start:], multiline=True,
                            unit=indent_unit(target.text), language=target.language)
    if not body.strip() or not target.view.contiguous(start, end):
        return action
    verdict = await asyncio.to_thread(check_edit, target.text, start, end, body, path=target.path,
                                      language=target.language)
    if not verdict.ok:
        ls.window_show_message(types.ShowMessageParams(
            type=types.MessageType.Info, message=f"GLM-5 found no body to offer: {verdict.reason()}"))
        return action
    edit = convert.lsp_text_edit(target.view, start, end, body)
    action.edit = types.WorkspaceEdit(changes={target.uri: [edit]})
    return action


def client_resolves_edits(ls: Glm5Server) -> bool:
    caps = ls.client_capabilities.text_document if ls.client_capabilities else None
    support = caps.code_action.resolve_support if caps and caps.code_action else None
    return bool(support and "edit" in support.properties)
