"""End to end: the real ``glm5-lsp serve`` as a subprocess, driven through pytest-lsp.

Its model is the project's real ``openai`` backend talking to a scripted OpenAI-compatible server on
127.0.0.1 (``tests/data/server/scripted_openai.py``, rules in ``tests/data/server/script.json``), so
every answer is deterministic and every post-processing step, supersession and cancellation is
observable. Documents are ``tests/data/server/docs/*``; ``‸`` marks the cursor.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

DATA = Path(__file__).resolve().parent / "data" / "server"
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(DATA))

from scripted_openai import ScriptedOpenAI

CURSOR = "‸"
SERVER = ClientServerConfig(
    server_command=[sys.executable, "-m", "glm5_lsp.cli", "serve"],
    server_env={**os.environ, "PYTHONPATH": str(REPO)},
)
pytestmark = pytest.mark.asyncio(loop_scope="module")


def load_doc(name: str) -> tuple[str, types.Position]:
    """A test document and its cursor (the ``‸`` marker, removed)."""
    marked = (DATA / "docs" / name).read_text(encoding="utf-8")
    before = marked[: marked.index(CURSOR)]
    position = types.Position(line=before.count("\n"), character=len(before.rsplit("\n", 1)[-1]))
    return marked.replace(CURSOR, ""), position


def capabilities() -> types.ClientCapabilities:
    caps = client_capabilities("visual-studio-code")
    assert caps.text_document is not None
    caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    return caps


def init_options(url: str, **extra: Any) -> dict[str, Any]:
    options: dict[str, Any] = {
        "model": {"backend": "openai", "url": url, "name": "scripted", "timeoutSeconds": 10},
        "completion": {"debounceMs": 0},
        # generous on a loaded CI machine: these tests are about behaviour, not latency
        "budgets": {"requestTimeoutMs": 20000, "completionMs": 20000},
    }
    options.update(extra)
    return options


@pytest.fixture(scope="module")
def scripted() -> Any:
    server = ScriptedOpenAI.from_file(DATA / "script.json")
    server.url = server.start()  # type: ignore[attr-defined]
    yield server
    server.stop()


APPLIED: list[types.ApplyWorkspaceEditParams] = []


@pytest_lsp.fixture(scope="module", config=SERVER)
async def client(lsp_client: LanguageClient, scripted: Any) -> Any:
    @lsp_client.feature(types.WORKSPACE_APPLY_EDIT)
    def apply_edit(params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
        APPLIED.append(params)
        return types.ApplyWorkspaceEditResult(applied=True)

    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=capabilities(), initialization_options=init_options(scripted.url),
        root_uri=(DATA / "docs").as_uri(),
    ))
    await wait_until(lambda: _progress_ended(lsp_client, "GLM-5: loading the model"), 30)
    yield
    await lsp_client.shutdown_session()


async def wait_until(check: Any, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds}s waiting for {check}")
        await asyncio.sleep(0.02)


def _progress_ended(client: LanguageClient, title: str) -> bool:
    for reports in list(client.progress_reports.values()):
        if reports and isinstance(reports[0], types.WorkDoneProgressBegin) and reports[0].title == title:
            return isinstance(reports[-1], types.WorkDoneProgressEnd)
    return False


def open_doc(client: LanguageClient, name: str, language: str = "python", text: str | None = None) -> str:
    uri = (DATA / "docs" / name).as_uri()
    body = load_doc(name)[0] if text is None else text
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id=language, version=1, text=body)))
    return uri


def inline_params(uri: str, position: types.Position) -> types.InlineCompletionParams:
    return types.InlineCompletionParams(
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
        text_document=types.TextDocumentIdentifier(uri=uri), position=position,
    )


async def inline(client: LanguageClient, uri: str, position: types.Position) -> list[types.InlineCompletionItem]:
    result = await client.text_document_inline_completion_async(inline_params(uri, position))
    if result is None:
        return []
    return list(result.items if isinstance(result, types.InlineCompletionList) else result)


# ---- startup ---------------------------------------------------------------------------------


async def test_model_load_reports_progress_and_logs(client: LanguageClient) -> None:
    assert _progress_ended(client, "GLM-5: loading the model")
    assert any("started" in m.message for m in client.log_messages)
    assert any("model ready" in m.message for m in client.log_messages)


# ---- inline completion ------------------------------------------------------------------------


async def test_typing_then_single_line_ghost_text(client: LanguageClient) -> None:
    """Incremental sync: the client types " = " after ``message``; the completion is one line."""
    _, cursor = load_doc("greet.py")
    uri = open_doc(client, "greet.py")
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=cursor, end=cursor), text=" = ")],
    ))
    here = types.Position(line=cursor.line, character=cursor.character + 3)
    items = await inline(client, uri, here)
    assert [item.insert_text for item in items] == ['"Hello, " + name + "!"']
    assert items[0].range == types.Range(start=here, end=here)


async def test_empty_block_gets_a_multi_line_body_cut_at_the_block_end(client: LanguageClient) -> None:
    _, cursor = load_doc("total.py")
    uri = open_doc(client, "total.py")
    items = await inline(client, uri, cursor)
    assert [item.insert_text for item in items] == [
        "result = 0\n    for item in items:\n        result += item\n    return result"
    ]


@pytest.mark.parametrize(
    "name, expected",
    [
        ("sorted_call.py", "values"),  # ")" already after the cursor: not repeated
        ("compute.py", "41 + 1"),  # <|endoftext|> and what follows never leak
    ],
)
async def test_post_processing(client: LanguageClient, name: str, expected: str) -> None:
    _, cursor = load_doc(name)
    uri = open_doc(client, name)
    items = await inline(client, uri, cursor)
    assert [item.insert_text for item in items] == [expected]


async def test_a_repeated_request_is_answered_from_the_cache(client: LanguageClient, scripted: Any) -> None:
    _, cursor = load_doc("cached.py")
    uri = open_doc(client, "cached.py")
    first = await inline(client, uri, cursor)
    calls = len(scripted.records)
    started = time.perf_counter()
    second = await inline(client, uri, cursor)
    assert [i.insert_text for i in first] == [i.insert_text for i in second] == ["'quick'"]
    assert len(scripted.records) == calls, "the repeated request reached the model"
    assert time.perf_counter() - started < 1.0


async def test_typing_the_suggestion_keeps_the_rest_without_the_model(client: LanguageClient, scripted: Any) -> None:
    text, cursor = load_doc("sorted_call.py")
    uri = open_doc(client, "typed_through.py", text=text)
    assert [i.insert_text for i in await inline(client, uri, cursor)] == ["values"]
    calls = len(scripted.records)
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangePartial(range=types.Range(start=cursor, end=cursor), text="va")],
    ))
    here = types.Position(line=cursor.line, character=cursor.character + 2)
    items = await inline(client, uri, here)
    assert [i.insert_text for i in items] == ["lues"] and items[0].range == types.Range(start=here, end=here)
    assert len(scripted.records) == calls, "typing through the suggestion reached the model"


# ---- cancellation and supersession -----------------------------------------------------------


async def test_cancel_request_stops_decoding(client: LanguageClient, scripted: Any) -> None:
    """The slow rule streams 35 pieces, 250 ms apart (~9 s); $/cancelRequest after ~0.75 s stops it."""
    _, cursor = load_doc("slow_fast.py")
    uri = open_doc(client, "slow_fast.py")
    before = len(scripted.records)
    request = asyncio.ensure_future(client.protocol.send_request_async(
        types.TEXT_DOCUMENT_INLINE_COMPLETION, inline_params(uri, cursor), msg_id="cancel-me"))
    await wait_until(lambda: len(scripted.records) > before and scripted.records[-1].pieces_sent >= 3, 10)
    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="cancel-me"))
    with pytest.raises(JsonRpcException) as error:
        await asyncio.wait_for(request, 5)
    assert error.value.code == types.LSPErrorCodes.RequestCancelled
    record = scripted.records[-1]
    await asyncio.sleep(0.6)
    assert not record.finished and record.pieces_sent < record.pieces_total
    # The worker is free again at once.
    started = time.perf_counter()
    fast = await inline(client, uri, types.Position(line=1, character=7))
    assert [i.insert_text for i in fast] == ["'quick'"]
    assert time.perf_counter() - started < 2


async def test_a_newer_request_supersedes_the_older(client: LanguageClient, scripted: Any) -> None:
    text, cursor = load_doc("slow_fast.py")
    uri = open_doc(client, "superseded.py", text=text)
    before = len(scripted.records)
    started = time.perf_counter()
    older = asyncio.ensure_future(inline(client, uri, cursor))
    await wait_until(lambda: len(scripted.records) > before and scripted.records[-1].pieces_sent >= 2, 10)
    newer = await inline(client, uri, types.Position(line=1, character=7))
    old_items = await older
    assert old_items == [], "the superseded request must answer empty"
    assert [i.insert_text for i in newer] == ["'quick'"]
    assert time.perf_counter() - started < 5, "the older request ran to its end"
    assert not scripted.records[before].finished


# ---- list completion -------------------------------------------------------------------------


async def test_completion_model_line_first_then_symbol_names(client: LanguageClient) -> None:
    _, cursor = load_doc("names.py")
    uri = open_doc(client, "names.py")
    result = await client.text_document_completion_async(types.CompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=cursor))
    assert isinstance(result, types.CompletionList)
    first, rest = result.items[0], result.items[1:]
    assert first.detail == "GLM-5" and first.preselect
    word = types.Range(start=types.Position(cursor.line, cursor.character - 2), end=cursor)
    assert first.text_edit == types.TextEdit(range=word, new_text="names")
    labels = [item.label for item in rest]
    # the model's line is a name of the list: that name's own item, first, and no second "names"
    assert first.label == "names" and "names" not in labels and "numbers" not in labels  # filtered by "na"
    assert all(item.sort_text > first.sort_text for item in rest)


# ---- code actions ----------------------------------------------------------------------------


def action_params(uri: str, start: types.Position, end: types.Position,
                  diagnostics: list[types.Diagnostic] | None = None,
                  only: list[str] | None = None) -> types.CodeActionParams:
    return types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), range=types.Range(start=start, end=end),
        context=types.CodeActionContext(diagnostics=diagnostics or [], only=only),
    )


def apply(text: str, edits: list[types.TextEdit]) -> str:
    lines = text.split("\n")

    def offset(p: types.Position) -> int:
        return sum(len(line) + 1 for line in lines[: p.line]) + p.character

    for edit in sorted(edits, key=lambda e: offset(e.range.start), reverse=True):
        text = text[: offset(edit.range.start)] + edit.new_text + text[offset(edit.range.end):]
    return text


async def test_fix_with_glm5_is_deferred_to_resolve_and_checked(client: LanguageClient) -> None:
    text, cursor = load_doc("add_broken.py")
    uri = open_doc(client, "add_broken.py")
    actions = await client.text_document_code_action_async(
        action_params(uri, types.Position(cursor.line, 0), cursor))
    fixes = [a for a in actions or [] if isinstance(a, types.CodeAction) and a.title == "Fix with GLM-5"]
    assert len(fixes) == 1 and fixes[0].edit is None and fixes[0].diagnostics
    assert fixes[0].kind == types.CodeActionKind.QuickFix
    resolved = await client.code_action_resolve_async(fixes[0])
    assert resolved.edit is not None and resolved.edit.changes is not None
    fixed = apply(text, list(resolved.edit.changes[uri]))
    assert fixed == "def add(a, b):\n    return a + b\n"
    compile(fixed, "add.py", "exec")
    assert _progress_ended(client, "GLM-5: fixing")


async def test_the_fix_rewrites_the_function_that_has_the_error(client: LanguageClient) -> None:
    text, cursor = load_doc("two_functions.py")
    uri = open_doc(client, "two_functions.py")
    actions = await client.text_document_code_action_async(action_params(uri, cursor, cursor))
    [fix] = [a for a in actions or [] if isinstance(a, types.CodeAction) and a.title == "Fix with GLM-5"]
    resolved = await client.code_action_resolve_async(fix)
    assert resolved.edit is not None and resolved.edit.changes is not None
    assert apply(text, list(resolved.edit.changes[uri])) == text.replace("a *", "a * b")


async def test_the_fix_is_offered_anywhere_on_the_line_of_the_error(client: LanguageClient) -> None:
    """The compiler places the error at the end of ``return a +``; a cursor at the line's start
    (what Neovim sends) still gets the fix, a cursor on the line above does not."""
    _, cursor = load_doc("add_broken.py")
    uri = open_doc(client, "add_broken.py")

    async def fix_titles(line: int, character: int) -> list[str]:
        at = types.Position(line, character)
        actions = await client.text_document_code_action_async(action_params(uri, at, at))
        return [a.title for a in actions or [] if isinstance(a, types.CodeAction) and a.title == "Fix with GLM-5"]

    assert await fix_titles(cursor.line, 4) == ["Fix with GLM-5"]
    assert await fix_titles(cursor.line - 1, 0) == []


async def test_a_fix_that_does_not_compile_is_not_offered(client: LanguageClient) -> None:
    _, cursor = load_doc("sub_broken.py")
    uri = open_doc(client, "sub_broken.py")
    actions = await client.text_document_code_action_async(
        action_params(uri, types.Position(cursor.line, 0), cursor))
    fix = next(a for a in actions or [] if isinstance(a, types.CodeAction) and a.title == "Fix with GLM-5")
    shown = len(client.messages)
    resolved = await client.code_action_resolve_async(fix)
    assert resolved.edit is None
    await wait_until(lambda: len(client.messages) > shown, 5)
    assert "no fix" in client.messages[-1].message


async def test_the_clients_diagnostics_are_fixed_too(client: LanguageClient) -> None:
    """A diagnostic only the client knows about (e.g. from another linter) still gets the quick fix."""
    text = "def fine():\n    return 1\n"
    uri = open_doc(client, "client_diag.py", text=text)
    theirs = types.Diagnostic(range=types.Range(start=types.Position(1, 4), end=types.Position(1, 10)),
                              message="prefer explicit None", source="otherlinter")
    actions = await client.text_document_code_action_async(
        action_params(uri, types.Position(1, 0), types.Position(1, 12), [theirs]))
    fixes = [a for a in actions or [] if isinstance(a, types.CodeAction) and a.title == "Fix with GLM-5"]
    assert len(fixes) == 1 and list(fixes[0].diagnostics or []) == [theirs]
    clean = await client.text_document_code_action_async(
        action_params(uri, types.Position(1, 0), types.Position(1, 12)))
    assert not [a for a in clean or [] if isinstance(a, types.CodeAction) and a.title == "Fix with GLM-5"]


async def test_a_performance_hint_is_published_and_fixed(client: LanguageClient) -> None:
    text, cursor = load_doc("concat.py")
    uri = open_doc(client, "concat.py")
    await wait_until(lambda: uri in client.diagnostics, 10)
    [hint] = [d for d in client.diagnostics[uri] if d.source == "glm5-lsp (perf)"]
    assert hint.severity == types.DiagnosticSeverity.Information and hint.code == "string-concat-in-loop"
    actions = await client.text_document_code_action_async(action_params(uri, cursor, cursor, [hint]))
    [fix] = [a for a in actions or [] if isinstance(a, types.CodeAction) and a.title == "Fix with GLM-5"]
    resolved = await client.code_action_resolve_async(fix)
    assert resolved.edit is not None and resolved.edit.changes is not None
    assert apply(text, list(resolved.edit.changes[uri])) == "def concat(words):\n    return ''.join(words)\n"


async def test_generate_body_replaces_pass(client: LanguageClient) -> None:
    text, _ = load_doc("double.py")
    uri = open_doc(client, "double.py")
    actions = await client.text_document_code_action_async(
        action_params(uri, types.Position(0, 0), types.Position(0, 0)))
    bodies = [a for a in actions or [] if isinstance(a, types.CodeAction) and a.title.startswith("Generate body")]
    assert [a.title for a in bodies] == ["Generate body with GLM-5: double"]
    only_fixes = await client.text_document_code_action_async(
        action_params(uri, types.Position(0, 0), types.Position(0, 0), only=[types.CodeActionKind.QuickFix]))
    assert not [a for a in only_fixes or [] if isinstance(a, types.CodeAction) and a.title.startswith("Generate")]
    only_rewrites = await client.text_document_code_action_async(
        action_params(uri, types.Position(0, 0), types.Position(0, 0), only=[types.CodeActionKind.RefactorRewrite]))
    assert [a.title for a in only_rewrites or [] if isinstance(a, types.CodeAction)] == [bodies[0].title]
    resolved = await client.code_action_resolve_async(bodies[0])
    assert resolved.edit is not None and resolved.edit.changes is not None
    assert apply(text, list(resolved.edit.changes[uri])) == "def double(x):\n    return x * 2\n"


async def test_own_diagnostics_are_published(client: LanguageClient) -> None:
    uri = open_doc(client, "published.py", text="def broken(:\n    pass\n")
    await wait_until(lambda: uri in client.diagnostics, 10)
    sources = {d.source for d in client.diagnostics[uri]}
    assert "glm5-lsp (compile)" in sources


# ---- commands ----------------------------------------------------------------------------------


async def test_generate_command_from_a_prompt(client: LanguageClient) -> None:
    result = await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="glm5.generate", arguments=[{"prompt": "def fib(n):"}]))
    assert "return fib(n - 1) + fib(n - 2)" in result["text"]


async def test_generate_command_at_a_position_applies_an_edit(client: LanguageClient) -> None:
    text, cursor = load_doc("total.py")
    uri = open_doc(client, "total_command.py", text=text)
    APPLIED.clear()
    result = await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="glm5.generate", arguments=[{"uri": uri, "position": {"line": cursor.line,
                                                                        "character": cursor.character}}]))
    assert result["applied"] is True
    [edit] = APPLIED[0].edit.changes[uri]  # type: ignore[index]
    assert "for item in items:" in edit.new_text and edit.range.start == cursor


async def test_fix_command_applies_a_checked_edit(client: LanguageClient) -> None:
    text, _ = load_doc("add_broken.py")
    uri = open_doc(client, "add_command.py", text=text)
    APPLIED.clear()
    result = await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="glm5.fix", arguments=[{"uri": uri}]))
    assert result["applied"] is True
    assert apply(text, list(APPLIED[0].edit.changes[uri])) == "def add(a, b):\n    return a + b\n"  # type: ignore[index]


async def test_reindex_command_reports_progress(client: LanguageClient) -> None:
    result = await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="glm5.reindex", arguments=[]))
    assert set(result) >= {"indexed", "seconds"}
    assert _progress_ended(client, "GLM-5: indexing")


# ---- settings ----------------------------------------------------------------------------------


async def test_settings_change_the_line_policy(client: LanguageClient) -> None:
    text, cursor = load_doc("total.py")
    uri = open_doc(client, "total_single.py", text=text)
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"glm5": {"completion": {"lines": "single", "debounceMs": 0}}}))
    try:
        items = await inline(client, uri, cursor)
        assert [i.insert_text for i in items] == ["result = 0"]
    finally:
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
            settings={"glm5": {"completion": {"lines": "auto"}}}))


async def test_invalid_settings_are_shown_and_ignored(client: LanguageClient) -> None:
    shown = len(client.messages)
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"glm5": {"completion": {"maxTokens": "lots", "lines": "sideways"}}}))
    await wait_until(lambda: len(client.messages) > shown, 5)
    message = client.messages[-1]
    assert message.type == types.MessageType.Warning
    assert "completion.maxTokens" in message.message and "completion.lines" in message.message
    _, cursor = load_doc("sorted_call.py")
    uri = open_doc(client, "still_works.py", text=load_doc("sorted_call.py")[0])
    assert [i.insert_text for i in await inline(client, uri, cursor)] == ["values"]


async def test_invalid_initialization_options_are_shown_and_defaults_kept(scripted: Any) -> None:
    lsp = await SERVER.start()
    try:
        await lsp.initialize_session(types.InitializeParams(
            capabilities=capabilities(),
            initialization_options=init_options(scripted.url, attention={"apiFocus": 3}),
        ))
        await wait_until(lambda: bool(lsp.messages), 10)
        assert "attention.apiFocus" in lsp.messages[0].message
        _, cursor = load_doc("sorted_call.py")
        uri = open_doc(lsp, "sorted_call.py")
        await wait_until(lambda: _progress_ended(lsp, "GLM-5: loading the model"), 30)
        assert [i.insert_text for i in await inline(lsp, uri, cursor)] == ["values"]
        await lsp.shutdown_session()
    finally:
        await lsp.stop()


async def test_the_completion_budget_cuts_a_slow_generation(scripted: Any) -> None:
    """``budgets.completionMs``: a generation still running at the budget is cut there, and what
    comes back is a checked prefix of it (or nothing), long before the model would have finished."""
    lsp = await SERVER.start()
    try:
        options = init_options(scripted.url)
        options["budgets"] = {"requestTimeoutMs": 20000, "completionMs": 1500}
        await lsp.initialize_session(types.InitializeParams(capabilities=capabilities(), initialization_options=options))
        await wait_until(lambda: _progress_ended(lsp, "GLM-5: loading the model"), 30)
        text, cursor = load_doc("slow_fast.py")
        uri = open_doc(lsp, "budget.py", text=text)
        started = time.perf_counter()
        items = await inline(lsp, uri, cursor)
        elapsed = time.perf_counter() - started
        await lsp.shutdown_session()
    finally:
        await lsp.stop()
    full = "1 + 2 + 3 + 4 + 5 + 6 + 7 + 8 + 9 + 10 + 11 + 12 + 13 + 14 + 15 + 16"  # 8 s when streamed whole
    assert elapsed < 6, f"the generation ran on for {elapsed:.1f} s"
    texts = [item.insert_text.strip() for item in items]
    assert all(full.startswith(text) and len(text) < len(full) for text in texts), texts  # type: ignore[union-attr]


async def test_without_resolve_support_only_checked_fixes_are_offered(scripted: Any) -> None:
    """A client that cannot resolve edits gets them computed up front, and a fix that does not
    compile is not offered at all."""
    caps = capabilities()
    assert caps.text_document is not None and caps.text_document.code_action is not None
    caps.text_document.code_action.resolve_support = None
    lsp = await SERVER.start()
    try:
        await lsp.initialize_session(types.InitializeParams(
            capabilities=caps, initialization_options=init_options(scripted.url)))
        await wait_until(lambda: _progress_ended(lsp, "GLM-5: loading the model"), 30)
        offered = {}
        for name in ("add_broken.py", "sub_broken.py"):
            _, cursor = load_doc(name)
            uri = open_doc(lsp, name)
            actions = await lsp.text_document_code_action_async(
                action_params(uri, types.Position(cursor.line, 0), cursor, only=[types.CodeActionKind.QuickFix]))
            offered[name] = [a for a in actions or [] if isinstance(a, types.CodeAction)]
        [fix] = offered["add_broken.py"]
        assert fix.title == "Fix with GLM-5" and fix.edit is not None
        assert offered["sub_broken.py"] == []
        await lsp.shutdown_session()
    finally:
        await lsp.stop()


# ---- never crash -------------------------------------------------------------------------------


async def test_unknown_documents_past_the_end_and_other_languages_answer_empty(client: LanguageClient) -> None:
    assert await inline(client, (DATA / "docs" / "never_opened.py").as_uri(), types.Position(0, 0)) == []
    uri = open_doc(client, "greet.py")
    assert await inline(client, uri, types.Position(line=99, character=0)) == []
    assert await inline(client, uri, types.Position(line=0, character=500)) == []
    _, cursor = load_doc("notes.txt")
    notes = open_doc(client, "notes.txt", language="plaintext")
    assert await inline(client, notes, cursor) == []
    listed = await client.text_document_completion_async(types.CompletionParams(
        text_document=types.TextDocumentIdentifier(uri=notes), position=cursor))
    assert isinstance(listed, types.CompletionList) and not listed.items
    actions = await client.text_document_code_action_async(
        action_params(notes, types.Position(0, 0), types.Position(0, 3)))
    assert actions is not None and not list(actions)


async def test_a_failing_backend_answers_empty_with_a_log_line_and_the_server_lives_on(client: LanguageClient) -> None:
    """A backend error is no fault of the request: an empty completion and one log line, not a
    JSON-RPC error (a 400 is not the model being down: no message box either)."""
    _, cursor = load_doc("broken.py")
    uri = open_doc(client, "broken.py")
    shown = len(client.messages)
    assert await inline(client, uri, cursor) == []
    await wait_until(lambda: any("the model failed" in m.message and "400" in m.message
                                 for m in client.log_messages), 5)
    assert len(client.messages) == shown
    listed = await client.text_document_completion_async(types.CompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=cursor))
    assert isinstance(listed, types.CompletionList) and listed.items, "names still answer without the model"
    assert all(item.detail != "GLM-5" for item in listed.items)
    text, cursor = load_doc("compute.py")
    uri = open_doc(client, "after_error.py", text=text)
    assert [i.insert_text for i in await inline(client, uri, cursor)] == ["41 + 1"]


async def test_bad_resolve_data_and_bad_command_arguments_are_harmless(client: LanguageClient) -> None:
    action = types.CodeAction(title="Fix with GLM-5", data={"uri": 42, "action": "fix"})
    assert (await client.code_action_resolve_async(action)).edit is None
    for arguments in (["not an object"], [{"uri": "file:///x.py", "position": {"line": -1, "character": 0}}]):
        result = await client.workspace_execute_command_async(types.ExecuteCommandParams(
            command="glm5.generate", arguments=arguments))
        assert result["text"] == "" and result["applied"] is False
