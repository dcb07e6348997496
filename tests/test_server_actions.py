"""Code actions from the model-free fixes (issue 21, point 1 in the editor): each fix its own
``quickfix`` action with a title that says what it does, the best one ``isPreferred``, "Fix with
GLM-5" last; edits resolved from the fixes found when the actions were listed, as the smallest
replacements of the client's text.

The real ``glm5-lsp serve`` with the scripted OpenAI-compatible model
(``tests/data/server/scripted_openai.py``); the model-free fixes never ask it.
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
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

DATA = Path(__file__).resolve().parent / "data" / "server"
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(DATA))

from scripted_openai import ScriptedOpenAI

from glm5_lsp.server.actions import smallest_edits

SERVER = ClientServerConfig(
    server_command=[sys.executable, "-m", "glm5_lsp.cli", "serve"],
    server_env={**os.environ, "PYTHONPATH": str(REPO)},
)
ASYNC = pytest.mark.asyncio(loop_scope="module")
LONG = "import sys\n\n\ndef f(obj):\n" + "".join(f"    x{i} = sys.argv[{i % 3}]\n" for i in range(40)) + \
    "    return os.path.join(obj, x0)\n"


@pytest.fixture(scope="module")
def scripted() -> Any:
    server = ScriptedOpenAI.from_file(DATA / "script.json")
    server.url = server.start()  # type: ignore[attr-defined]
    yield server
    server.stop()


def _options(url: str) -> dict[str, Any]:
    return {"model": {"backend": "openai", "url": url, "name": "scripted", "timeoutSeconds": 10},
            "completion": {"debounceMs": 0}, "budgets": {"requestTimeoutMs": 20000, "completionMs": 20000}}


async def _start(lsp: LanguageClient, url: str, resolve: bool = True) -> None:
    caps = client_capabilities("visual-studio-code")
    assert caps.text_document is not None and caps.text_document.code_action is not None
    if not resolve:
        caps.text_document.code_action.resolve_support = None
    await lsp.initialize_session(types.InitializeParams(capabilities=caps, initialization_options=_options(url)))
    deadline = time.monotonic() + 30
    while not _loaded(lsp):
        assert time.monotonic() < deadline, "the model never loaded"
        await asyncio.sleep(0.02)


def _loaded(client: LanguageClient) -> bool:
    for reports in list(client.progress_reports.values()):
        if reports and getattr(reports[0], "title", "") == "GLM-5: loading the model":
            return isinstance(reports[-1], types.WorkDoneProgressEnd)
    return False


@pytest_lsp.fixture(scope="module", config=SERVER)
async def client(lsp_client: LanguageClient, scripted: Any) -> Any:
    await _start(lsp_client, scripted.url)
    yield
    await lsp_client.shutdown_session()


def _open(client: LanguageClient, name: str, text: str, version: int = 1) -> str:
    uri = (DATA / "docs" / name).as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=version, text=text)))
    return uri


async def _actions(client: LanguageClient, uri: str, line: int, tries: int = 8) -> list[types.CodeAction]:
    """The actions on ``line``; asked again (up to ``tries`` times) while only the model's is there:
    on a loaded machine the model-free fixes' 300 ms may run out on a first request, whose jedi and
    import-index warm-ups the next ones no longer pay (an empty answer is not kept)."""
    at = types.Position(line, 0)
    for _ in range(tries):
        found = await client.text_document_code_action_async(types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), range=types.Range(start=at, end=at),
            context=types.CodeActionContext(diagnostics=[])))
        actions = [a for a in found or [] if isinstance(a, types.CodeAction)]
        if any(a.title != "Fix with GLM-5" for a in actions):
            break
    return actions


def apply(text: str, edits: list[types.TextEdit]) -> str:
    lines = text.split("\n")

    def offset(p: types.Position) -> int:
        return sum(len(line) + 1 for line in lines[: p.line]) + p.character

    for edit in sorted(edits, key=lambda e: offset(e.range.start), reverse=True):
        text = text[: offset(edit.range.start)] + edit.new_text + text[offset(edit.range.end):]
    return text


@ASYNC
async def test_each_fix_is_its_own_action_the_best_preferred_the_model_last(client: LanguageClient) -> None:
    text = "def f(obj):\n    if obj\n        return 1\n    return 0\n"
    uri = _open(client, "colon_action.py", text)
    actions = await _actions(client, uri, 1)
    titles = [a.title for a in actions]
    assert titles[0] == "Insert missing ':'" and titles[-1] == "Fix with GLM-5", titles
    assert [a.is_preferred for a in actions] == [True] + [False] * (len(actions) - 1)
    assert all(a.kind == types.CodeActionKind.QuickFix and a.diagnostics for a in actions)
    assert actions[0].edit is None  # resolved lazily: this client resolves edits
    resolved = await client.code_action_resolve_async(actions[0])
    assert resolved.edit is not None and resolved.edit.changes is not None
    [edit] = resolved.edit.changes[uri]
    assert edit.new_text == ":" and edit.range.start == edit.range.end == types.Position(1, 10)
    compile(apply(text, [edit]), "colon.py", "exec")


@ASYNC
async def test_a_misspelled_local_and_a_missing_import_say_what_they_do(client: LanguageClient) -> None:
    uri = _open(client, "names_action.py", "def f(obj):\n    return ojb\n")
    titles = [a.title for a in await _actions(client, uri, 1)]
    assert titles[0] == "Replace 'ojb' with 'obj'" and titles[-1] == "Fix with GLM-5", titles
    uri = _open(client, "import_action.py", "def f(p):\n    return os.path.join(p, 'x')\n")
    actions = await _actions(client, uri, 1)
    assert actions[0].title in ("Add 'import os'", "Add 'import os.path'"), [a.title for a in actions]


@ASYNC
async def test_the_edits_are_the_smallest_replacements(client: LanguageClient) -> None:
    """An import added at the top of a long function and nothing else: one insertion, not a
    rewrite of the 40 lines between it and the name."""
    uri = _open(client, "long_action.py", LONG)
    actions = await _actions(client, uri, LONG.count("\n") - 1)
    assert actions and actions[0].title.startswith("Add 'import os"), [a.title for a in actions]
    resolved = await client.code_action_resolve_async(actions[0])
    assert resolved.edit is not None and resolved.edit.changes is not None
    edits = resolved.edit.changes[uri]
    fixed = apply(LONG, list(edits))
    compile(fixed, "long.py", "exec")
    assert all(e.range.start.line == e.range.end.line for e in edits)
    assert sum(len(e.new_text) for e in edits) < 30, edits


@ASYNC
async def test_a_resolve_for_a_changed_document_edits_nothing(client: LanguageClient) -> None:
    text = "def g(a)\n    return a\n"
    uri = _open(client, "stale_action.py", text)
    [first, *_] = await _actions(client, uri, 0)
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangeWholeDocument(text="def g(a):\n    return a\n")]))
    resolved = await client.code_action_resolve_async(first)
    assert resolved.edit is None


@ASYNC
async def test_a_clean_line_gets_no_fix(client: LanguageClient) -> None:
    uri = _open(client, "clean_action.py", "def f(obj):\n    return obj\n")
    assert [a.title for a in await _actions(client, uri, 1, tries=1) if a.kind == types.CodeActionKind.QuickFix] == []


@ASYNC
async def test_without_resolve_support_the_fixes_come_with_their_edits(scripted: Any) -> None:
    lsp = await SERVER.start()
    try:
        await _start(lsp, scripted.url, resolve=False)
        text = "def f(obj):\n    return ojb\n"
        uri = _open(lsp, "eager_action.py", text)
        actions = await _actions(lsp, uri, 1)
        assert actions[0].title == "Replace 'ojb' with 'obj'" and actions[0].edit is not None
        # the model's fix (seconds of the model's time, up front) only where nothing else fixes it
        assert "Fix with GLM-5" not in [a.title for a in actions]
        assert actions[0].edit.changes is not None
        assert apply(text, list(actions[0].edit.changes[uri])) == "def f(obj):\n    return obj\n"
        await lsp.shutdown_session()
    finally:
        await lsp.stop()


def test_smallest_edits_rebuild_the_new_text() -> None:
    import itertools
    import random

    rng = random.Random(21)
    for _ in range(1500):
        old = "".join(rng.choice("ab\n ") for _ in range(rng.randint(0, 30)))
        chars = list(old)
        for _ in range(rng.randint(0, 4)):
            at = rng.randint(0, len(chars))
            chars[at:at + rng.randint(0, 3)] = rng.choice(["", "x", "\n", "ab\n"])
        new = "".join(chars)
        edits = smallest_edits(old, new)
        ordered = sorted(edits)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(ordered)), edits
        rebuilt = old
        for start, end, text in sorted(edits, reverse=True):
            rebuilt = rebuilt[:start] + text + rebuilt[end:]
        assert rebuilt == new
    assert smallest_edits(LONG, "import os\n" + LONG.replace("obj, x0", "obj, x1")) == [
        (0, 0, "import os\n"), (len(LONG) - 3, len(LONG) - 2, "1")]
