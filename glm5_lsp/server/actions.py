"""Code actions for the diagnostics in range (the client's and our own): each model-free fix
(``Pipeline.fixes``: the parsers', ruff's, the names') as its own ``quickfix`` action with a title
that says what it does ("Insert missing ':'", "Replace 'ojb' with 'obj'", "Add 'import os'"), the
best one ``isPreferred``, then "Fix with GLM-5" (the model) last; and "Generate body with GLM-5" on
a placeholder body.

The model-free fixes are found when the actions are listed (within ``QUICK_FIX_S``) and kept per
document version, so ``codeAction/resolve`` only turns the chosen one into edits; the model's fix
and the body are computed in ``codeAction/resolve`` when the client supports it (the lightbulb is
instant); for a client that cannot resolve, the model's fix is computed up front only where no
model-free fix is offered (it takes the model seconds). An action's edits are the smallest replacements that turn the client's text into the
fixed one (:func:`smallest_edits`), so the cursor and undo stay where the user expects. Every edit
is checked before it is offered."""

from __future__ import annotations

import asyncio
import difflib
import logging
import time
from typing import Any

from lsprotocol import types

from glm5_lsp.lru import LRUCache
from glm5_lsp.pipeline import PipelineResult, check_edit, diagnose, empty_bodies
from glm5_lsp.server import convert
from glm5_lsp.server.progress import WorkProgress
from glm5_lsp.server.state import Glm5Server, Target
from glm5_lsp.textdiff import diff_region

FIX_TITLE = "Fix with GLM-5"
BODY_TITLE = "Generate body with GLM-5"
QUICK_FIX_S = 0.3  # the model-free fixes' time when the actions are listed
QUICK_ACTIONS = 6  # model-free fixes offered at most
log = logging.getLogger("glm5_lsp.server")


class QuickFixes:
    """The model-free fixes found for a document version and the lines asked about, kept so that a
    resolve (and the next listing for the same lines: editors ask on every cursor move) need not
    find them again. A fix is ``(title, fixed text, kind)``."""

    def __init__(self, size: int = 32) -> None:
        self._found: LRUCache[list[tuple[str, str, str]]] = LRUCache(size)

    @staticmethod
    def key(uri: str, version: int | None, lines: list[int]) -> str:
        return f"{uri}\x00{version}\x00{','.join(map(str, sorted(set(lines))))}"

    def get(self, key: str) -> list[tuple[str, str, str]] | None:
        return self._found.get(key)

    def put(self, key: str, fixes: list[tuple[str, str, str]]) -> None:
        self._found.put(key, fixes)


QUICK = QuickFixes()


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
            relevant = _distinct([d for d in list(params.context.diagnostics) + ours
                                  if convert.lsp_lines_overlap(d.range, params.range)])
            if relevant:
                quick = await quick_fixes(ls, target, relevant)
                lines = sorted({d.range.start.line for d in relevant})
                for index, (title, fixed, _kind) in enumerate(quick):
                    action = types.CodeAction(
                        title=title, kind=types.CodeActionKind.QuickFix, diagnostics=relevant,
                        is_preferred=index == 0,
                        data={**data, "action": "quick", "title": title, "index": index, "lines": lines})
                    if not client_resolves_edits(ls):
                        action.edit = workspace_edit(target, fixed)
                        if action.edit is None:
                            continue
                    actions.append(action)
                action = types.CodeAction(title=FIX_TITLE, kind=types.CodeActionKind.QuickFix, diagnostics=relevant,
                                          is_preferred=not quick, data={**data, "action": "fix"})
                if client_resolves_edits(ls):
                    actions.append(action)
                elif not quick:  # the model's fix computed up front (seconds): only when nothing else fixes it
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
        if data.get("action") == "quick":
            return await resolve_quick(ls, action, target, data)
        if data.get("action") == "body":
            start = target.view.offset_of_document(_integer(data.get("start")))
            end = target.view.offset_of_document(_integer(data.get("end")))
            if start is not None and end is not None and 0 <= start <= end <= len(target.text):
                return await resolve_body(ls, action, target, start, end)
        return action


def _distinct(diagnostics: list[types.Diagnostic]) -> list[types.Diagnostic]:
    """The client's diagnostics and our own, each once (the client may send back what we published)."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for d in diagnostics:
        key = (d.range.start.line, d.range.start.character, d.range.end.line, d.range.end.character, d.message)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


async def quick_fixes(ls: Glm5Server, target: Target, diagnostics: list[types.Diagnostic],
                      lines: list[int] | None = None) -> list[tuple[str, str, str]]:
    """The model-free fixes for ``diagnostics`` (best first), found within ``QUICK_FIX_S`` and kept
    per document version and lines; [] while the model loads (the pipeline is not there yet) or
    for a document read as a window (a fix is judged on the whole text)."""
    lines = sorted({d.range.start.line for d in diagnostics}) if lines is None else lines
    key = QUICK.key(target.uri, target.version, lines)
    found = QUICK.get(key)
    if found is not None:
        return found
    pipeline = ls.current_pipeline()
    if pipeline is None or target.view.windowed:
        return []
    given = [d for d in (convert.diagnostic_from_lsp(target.view, lsp) for lsp in diagnostics) if d is not None]
    started = time.perf_counter()

    def job() -> list[tuple[str, str, str]]:
        fixes = pipeline.fixes(target.text, diagnostics=given or None, path=target.path, language=target.language,
                               time_budget_s=QUICK_FIX_S)
        return [(fix.title, fix.text, fix.kind) for fix in fixes if fix.kind != "model"][:QUICK_ACTIONS]

    try:
        found = await asyncio.to_thread(job)
    except Exception:  # the model's fix is still offered
        log.exception("the model-free fixes of %s failed", target.path)
        return []
    log.debug("%d model-free fix(es) for %s in %.0f ms", len(found), target.path,
                    (time.perf_counter() - started) * 1000)
    if found:  # none may be time running out on a loaded machine: the next request tries again
        QUICK.put(key, found)
    return found


async def resolve_quick(ls: Glm5Server, action: types.CodeAction, target: Target,
                        data: dict[str, Any]) -> types.CodeAction:
    """Fill in a model-free fix's edits from the fixes found when the actions were listed (found
    again, for the same version and lines, if they were let go)."""
    raw_lines = data.get("lines")
    lines = [line for line in raw_lines if isinstance(line, int) and not isinstance(line, bool)] \
        if isinstance(raw_lines, list) else []
    found = await quick_fixes(ls, target, list(action.diagnostics or []), lines or None)
    index = _integer(data.get("index"))
    chosen = next((fixed for title, fixed, _ in found if title == data.get("title")), None)
    if chosen is None and 0 <= index < len(found):
        chosen = found[index][1]
    if chosen is None:
        log.info("the fix %r is no longer offered for %s", data.get("title"), target.path)
        return action
    action.edit = workspace_edit(target, chosen)
    return action


def workspace_edit(target: Target, fixed: str) -> types.WorkspaceEdit | None:
    """The edits that turn the document the client has into ``fixed`` (None when they would touch
    a part of a windowed document that was not read)."""
    edits = []
    for start, end, text in smallest_edits(target.text, fixed):
        if not target.view.contiguous(start, end):
            return None
        edits.append(convert.lsp_text_edit(target.view, start, end, text))
    return types.WorkspaceEdit(changes={target.uri: edits}) if edits else None


def smallest_edits(old: str, new: str) -> list[tuple[int, int, str]]:
    """Non-overlapping replacements ``(start, end, text)`` in ``old``'s offsets that turn it into
    ``new``, each as small as its lines allow: an import added at the top and a name respelled
    further down are two edits, not one that rewrites everything between them."""
    start, end, middle = diff_region(old, new)
    if start == end and not middle:
        return []
    head = old.rfind("\n", 0, start) + 1  # whole lines around the change
    tail_at = old.find("\n", end)
    tail = len(old) if tail_at == -1 else tail_at + 1
    old_part = old[head:tail]
    new_part = new[head:len(new) - (len(old) - tail)]
    a, b = old_part.splitlines(keepends=True), new_part.splitlines(keepends=True)
    if len(a) * len(b) > 250_000:  # a huge rewrite: one replacement
        return [(start, end, middle)]
    starts = [head]
    for line in a:
        starts.append(starts[-1] + len(line))
    edits = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        o_start, o_end = starts[i1], starts[i2]
        s, e, text = diff_region(old[o_start:o_end], "".join(b[j1:j2]))
        if e > s or text:
            edits.append((o_start + s, o_start + e, text))
    return edits


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
    fixed = target.text[:start] + text + target.text[end:]
    action.edit = workspace_edit(target, fixed) or types.WorkspaceEdit(
        changes={target.uri: [convert.lsp_text_edit(target.view, start, end, text)]})
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
    body = result.text  # post-processed in the pipeline, re-indented to the file's unit
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
