"""The workspace memory through the real ``glm5-lsp serve``: built for the workspace folder with
``$/progress``, following the editor's edits and the files changed, renamed and deleted outside it.

The model is a served one (the real ``openai`` backend on the scripted server of
``tests/data/server``) that always answers something that does not compile, so the answer shown
is the memory's continuation, judged like any candidate: what it says is what the memory holds.
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

from scripted_openai import Rule, ScriptedOpenAI

SERVER = ClientServerConfig(
    server_command=[sys.executable, "-m", "glm5_lsp.cli", "serve"],
    server_env={**os.environ, "PYTHONPATH": str(REPO)},
)
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

BILLING = '''def compute_total(items, discount=0.0, rounding="plain"):
    return sum(items) * (1 - discount)


def invoice(items):
    return compute_total(items, discount=0.25, rounding="banker")
'''
LINE = "    return compute_total(items, discount=0.25, roun"
QUOTE = f"from billing import compute_total\n\n\ndef quote(items):\n{LINE}\n"
CURSOR = types.Position(line=4, character=len(LINE))


@pytest.fixture(scope="module")
def scripted() -> Any:
    server = ScriptedOpenAI([Rule(before_cursor="", reply="ding=)))(")])  # never compiles
    server.url = server.start()  # type: ignore[attr-defined]
    yield server
    server.stop()


@pytest.fixture(scope="module")
def root(tmp_path_factory: Any) -> Path:
    folder = tmp_path_factory.mktemp("memory-ws")
    (folder / "billing.py").write_text(BILLING, encoding="utf-8")
    (folder / "quote.py").write_text(QUOTE, encoding="utf-8")
    return folder


@pytest_lsp.fixture(scope="module", config=SERVER)
async def client(lsp_client: LanguageClient, scripted: Any, root: Path) -> Any:
    caps = client_capabilities("visual-studio-code")
    assert caps.text_document is not None
    caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=caps, root_uri=root.as_uri(),
        initialization_options={
            "model": {"backend": "openai", "url": scripted.url, "name": "scripted", "timeoutSeconds": 10},
            "completion": {"debounceMs": 0},
            "budgets": {"requestTimeoutMs": 20000, "completionMs": 20000},
            "memory": {"libraries": False, "stdlib": False},
        },
    ))
    await wait_until(lambda: ended(lsp_client, "GLM-5: workspace memory") is not None, 60)
    lsp_client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=(root / "quote.py").as_uri(), language_id="python", version=1, text=QUOTE)))
    yield
    await lsp_client.shutdown_session()


async def wait_until(check: Any, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds}s waiting for {check}")
        await asyncio.sleep(0.02)


def ended(client: LanguageClient, title: str) -> types.WorkDoneProgressEnd | None:
    for reports in list(client.progress_reports.values()):
        if reports and isinstance(reports[0], types.WorkDoneProgressBegin) and reports[0].title == title:
            return reports[-1] if isinstance(reports[-1], types.WorkDoneProgressEnd) else None
    return None


async def shown(client: LanguageClient, root: Path) -> str:
    result = await client.text_document_inline_completion_async(types.InlineCompletionParams(
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
        text_document=types.TextDocumentIdentifier(uri=(root / "quote.py").as_uri()), position=CURSOR))
    items = (result.items if isinstance(result, types.InlineCompletionList) else result) or []
    return str(items[0].insert_text) if items else ""


async def shows(client: LanguageClient, root: Path, expected: str, seconds: float = 10) -> None:
    """The memory's answer becomes ``expected`` (the server follows each change off its event loop)."""
    deadline = time.monotonic() + seconds
    while (answer := await shown(client, root)) != expected:
        assert time.monotonic() < deadline, f"still {answer!r}, expected {expected!r}"
        await asyncio.sleep(0.1)


async def test_the_first_build_reports_progress_and_the_memory_answers(client: LanguageClient, root: Path) -> None:
    end = ended(client, "GLM-5: workspace memory")
    assert end is not None and end.message and end.message.startswith("2 files")
    await shows(client, root, 'ding="banker")')


async def test_a_one_line_edit_in_the_editor_is_in_the_memory(client: LanguageClient, root: Path) -> None:
    uri = (root / "billing.py").as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=uri, language_id="python", version=1, text=BILLING)))
    line = BILLING.split("\n").index('    return compute_total(items, discount=0.25, rounding="banker")')
    start = types.Position(line=line, character=len('    return compute_total(items, discount=0.25, rounding="'))
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=start, end=types.Position(line=line, character=start.character + len("banker"))),
            text="half_even")]))
    await shows(client, root, 'ding="half_even")')
    client.text_document_did_close(types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))


async def test_files_changed_renamed_and_deleted_outside_the_editor(client: LanguageClient, root: Path) -> None:
    other = root / "rates.py"
    other.write_text("def rate(items):\n    return compute_total(items, discount=0.25, rounding_mode=3)\n",
                     encoding="utf-8")
    (root / "billing.py").write_text(BILLING.replace('discount=0.25, rounding="banker"', "discount=0.5"),
                                     encoding="utf-8")
    client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(changes=[
        types.FileEvent(uri=other.as_uri(), type=types.FileChangeType.Created),
        types.FileEvent(uri=(root / "billing.py").as_uri(), type=types.FileChangeType.Changed)]))
    await shows(client, root, "ding_mode=3)")
    moved = root / "sub" / "rates_moved.py"
    moved.parent.mkdir()
    other.rename(moved)
    client.workspace_did_rename_files(types.RenameFilesParams(files=[
        types.FileRename(old_uri=other.as_uri(), new_uri=moved.as_uri())]))
    await asyncio.sleep(0.3)
    assert await shown(client, root) == "ding_mode=3)"  # the text kept under its new name
    moved.unlink()
    client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(changes=[
        types.FileEvent(uri=moved.as_uri(), type=types.FileChangeType.Deleted)]))
    deadline = time.monotonic() + 10
    while (answer := await shown(client, root)) == "ding_mode=3)":  # forgotten
        assert time.monotonic() < deadline, answer
        await asyncio.sleep(0.1)


@pytest.fixture(scope="module")
def lone(tmp_path_factory: Any) -> Path:
    """A folder with no project marker: the two files, and one more in a folder below them."""
    folder = tmp_path_factory.mktemp("lone")
    (folder / "billing.py").write_text(BILLING, encoding="utf-8")
    (folder / "quote.py").write_text(QUOTE, encoding="utf-8")
    (folder / "deeper").mkdir()
    (folder / "deeper" / "other.py").write_text("def other():\n    return 1\n", encoding="utf-8")
    return folder


@pytest_lsp.fixture(scope="module", config=SERVER)  # the module's event loop (pytest_lsp ties the two)
async def rootless(lsp_client: LanguageClient, scripted: Any, lone: Path) -> Any:
    """A client that names no workspace (a file opened on its own, as Neovim does where no project
    marker is above it), which opens ``quote.py`` of ``lone`` at once."""
    caps = client_capabilities("visual-studio-code")
    assert caps.text_document is not None and caps.workspace is not None
    caps.workspace.did_change_watched_files = None  # this test client answers no registration
    caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=caps, root_uri=None, workspace_folders=None,
        initialization_options={
            "model": {"backend": "openai", "url": scripted.url, "name": "scripted", "timeoutSeconds": 10},
            "completion": {"debounceMs": 0},
            "budgets": {"requestTimeoutMs": 20000, "completionMs": 20000},
            "memory": {"libraries": False, "stdlib": False},
        },
    ))
    lsp_client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=(lone / "quote.py").as_uri(), language_id="python", version=1, text=QUOTE)))
    yield
    await lsp_client.shutdown_session()


async def test_with_no_workspace_the_memory_reads_the_opened_files_folder(rootless: LanguageClient,
                                                                        lone: Path) -> None:
    await wait_until(lambda: ended(rootless, "GLM-5: workspace memory") is not None, 60)
    end = ended(rootless, "GLM-5: workspace memory")
    assert end is not None and end.message and end.message.startswith("2 files")  # not deeper/other.py
    await shows(rootless, lone, 'ding="banker")')  # billing.py, beside the file opened, was read
