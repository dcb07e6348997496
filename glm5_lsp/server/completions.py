"""``textDocument/inlineCompletion`` (ghost text) and ``textDocument/completion``.

The list: jedi's answers where it has them (attributes after a dot, modules after ``import`` and
``from``), else the names in scope, ranked by relevance (``ranking.rank``: prefix match, public
before private, nearness to the cursor and how often the file uses them), each label once; the
model's rest of the line as its own item, first, unless it only ends a name cut short
(``ranking.truncated``) or repeats a name the list has."""

from __future__ import annotations

import asyncio
import time

from lsprotocol import types

from glm5_lsp.deadline import call_with_timeout
from glm5_lsp.pipeline.names import Name, names_at, word_before
from glm5_lsp.server import convert, ranking
from glm5_lsp.server.commands import ACCEPTED_COMMAND
from glm5_lsp.server.state import Glm5Server, log

JEDI_LIST_S = 0.5  # jedi's time for the list after a dot or an import, at least (else the completion budget)
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
    "text": types.CompletionItemKind.Text,
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
        multiline = ls.multiline_for(target)
        invoked = params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
        text = await ls.completion_text(target, multiline=multiline, kind="inline", received=received,
                                        trigger="invoked" if invoked else "automatic")
        if not text:
            return types.InlineCompletionList(items=[])
        here = target.view.position(target.offset)  # the cursor, clamped into its line
        # accepting it runs the item's command: the acceptance log's "accepted" (glm5.accepted)
        suggestion = ls.track_shown(target, text, multiline)
        command = None if suggestion is None else types.Command(title="Accepted", command=ACCEPTED_COMMAND,
                                                                     arguments=[suggestion])
        return types.InlineCompletionList(
            items=[types.InlineCompletionItem(insert_text=text, range=types.Range(start=here, end=here),
                                              command=command)]
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
        line_before = target.text[target.text.rfind("\n", 0, target.offset) + 1:target.offset]
        where = ranking.cursor_kind(line_before)

        jedi_s = max(JEDI_LIST_S, ls.settings.budgets.completion_ms / 1000)

        def find_names() -> tuple[list[Name], dict[str, list[int]], int]:
            """The names, the document's occurrences, and how many of the names are the finder's
            (the rest are the document's own words, ranked after them after a dot)."""
            found: list[Name] = []
            typed = word_before(target.text, target.offset)
            if target.language == "python" and where != "name":  # jedi knows modules and members
                try:  # a first inference of a type can take seconds: the list does not wait for it
                    found = call_with_timeout(lambda: names_at(
                        target.text, target.offset, path=target.path, language=target.language, context=None), jedi_s)
                except TimeoutError:
                    log.debug("jedi did not list the names at %s:%d in %.1f s", target.path, target.offset, jedi_s)
            if not found and where not in ("import", "from-import"):
                found = names_at(target.text, target.offset, path=target.path, language=target.language,
                                 context=context)
            seen = ranking.occurrences(target.text)
            listed = len(found)
            if where == "name":  # then the document's own words: a name defined further on, a parameter
                found = found + ranking.document_words(seen, typed, {n.name for n in found}, Name)
            elif where == "attribute":  # the attributes the file's code reads
                words = {w: seen[w] for w in ranking.attribute_words(target.text) if w in seen}
                found = found + ranking.document_words(words, typed, {n.name for n in found}, Name)
            return found, seen, listed

        names_job = asyncio.to_thread(find_names)
        model_job = ls.completion_text(target, multiline=False, kind="completion", received=received)
        listed, line = await asyncio.gather(names_job, model_job, return_exceptions=True)
        if isinstance(line, BaseException):  # the model failed: the symbol table's names still answer
            if isinstance(line, asyncio.CancelledError):
                raise line
            log.warning("model line completion failed: %s", line)
            line = ""
        if isinstance(listed, BaseException):
            raise listed
        found, seen, finder = listed
        typed = word_before(target.text, target.offset)
        own = {id(n) for n in found[:finder]}
        names = ranking.rank([n for n in found if n.name != typed], target.text, target.offset, typed,
                             name=lambda n: n.name, seen=seen,
                             tier=(lambda n: 0 if id(n) in own else 1) if where == "attribute" else None)
        word_range = convert.lsp_range(target.view, target.offset - len(typed), target.offset)
        items: list[types.CompletionItem] = []
        labels = {n.name for n in names}
        picked = ""  # a name of the list the model's line is: that item first, marked as the model's
        if line:
            full = typed + line
            label = full.strip() or full
            if label in labels:
                picked = label
                names.sort(key=lambda n: n.name != picked)
            elif not ranking.truncated(label, labels, seen):
                # first when it starts with a name the list or the file has; a word nothing has, last
                known = ranking.starts_known(label, labels, seen)
                items.append(types.CompletionItem(
                    label=label, kind=types.CompletionItemKind.Snippet, detail="GLM-5",
                    sort_text="0000" if known else "2000", filter_text=full, preselect=known,
                    text_edit=types.TextEdit(range=word_range, new_text=full),
                ))
        for index, name in enumerate(names):
            mine = name.name == picked
            items.append(types.CompletionItem(
                label=name.name, kind=_COMPLETION_KINDS.get(name.kind, types.CompletionItemKind.Variable),
                detail="GLM-5" if mine else name.detail or None, sort_text="0000" if mine else f"1{index:04d}",
                filter_text=name.name, preselect=True if mine else None,
                text_edit=types.TextEdit(range=word_range, new_text=name.name),
            ))
        return types.CompletionList(is_incomplete=True, items=items)
