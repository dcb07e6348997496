"""``textDocument/inlineCompletion`` (ghost text) and ``textDocument/completion`` (the model's line
first, then the symbol table's names)."""

from __future__ import annotations

import asyncio
import time

from lsprotocol import types

from glm5_lsp.server import convert
from glm5_lsp.server.state import Glm5Server, log
from glm5_lsp.server.symbols import names_at, word_before

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


def register(server: Glm5Server) -> None:
    """Register the completion features on ``server``."""

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(
        ls: Glm5Server, params: types.InlineCompletionParams
    ) -> types.InlineCompletionList | None:
        received = time.perf_counter()  # the budget counts from here
        if not ls.settings.features.inline_completion:
            return None
        target = ls.locate(params.text_document.uri, params.position)
        if target is None:
            return types.InlineCompletionList(items=[])
        text = await ls.completion_text(target, multiline=ls.multiline_for(target), kind="inline", received=received)
        if not text:
            return types.InlineCompletionList(items=[])
        here = target.view.position(target.offset)  # the cursor, clamped into its line
        return types.InlineCompletionList(
            items=[types.InlineCompletionItem(insert_text=text, range=types.Range(start=here, end=here))]
        )

    @server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(trigger_characters=["."]))
    async def completion(ls: Glm5Server, params: types.CompletionParams) -> types.CompletionList | None:
        received = time.perf_counter()
        if not ls.settings.features.completion:
            return None
        target = ls.locate(params.text_document.uri, params.position)
        if target is None:
            return types.CompletionList(is_incomplete=False, items=[])
        context = ls.engine.context
        names_job = asyncio.to_thread(names_at, target.text, target.offset, path=target.path,
                                      language=target.language, context=context)
        model_job = ls.completion_text(target, multiline=False, kind="completion", received=received)
        names, line = await asyncio.gather(names_job, model_job, return_exceptions=True)
        if isinstance(line, BaseException):  # the model failed: the symbol table's names still answer
            if isinstance(line, asyncio.CancelledError):
                raise line
            log.warning("model line completion failed: %s", line)
            line = ""
        if isinstance(names, BaseException):
            raise names
        typed = word_before(target.text, target.offset)
        word_range = convert.lsp_range(target.view, target.offset - len(typed), target.offset)
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
