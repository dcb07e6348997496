"""The server on the project's own runtime: a tiny random GLM-5 checkpoint (``tiny_checkpoint`` in
``conftest.py``) loaded in-process by the ``local`` backend, with the real tokenizer's special tokens.

Random weights write arbitrary text, so these tests check what must hold whatever the model says:
the model loads once in the background with progress, and answers never leak special tokens or
break the protocol. (Cancellation between tokens is checked deterministically in
``test_server_e2e.py``.)
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

REPO = Path(__file__).resolve().parents[1]
SERVER = ClientServerConfig(
    server_command=[sys.executable, "-m", "glm5_lsp.cli", "serve"],
    server_env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
)
DOC = "import os\n\n\ndef join_all(parts):\n    result = []\n    for part in parts:\n        \n    return os.sep.join(result)\n"
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]


@pytest_lsp.fixture(scope="module", config=SERVER)
async def client(lsp_client: LanguageClient, tiny_checkpoint: Path, tmp_path_factory: Any) -> Any:
    caps = client_capabilities("visual-studio-code")
    assert caps.text_document is not None
    caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    root = tmp_path_factory.mktemp("workspace")
    (root / "join.py").write_text(DOC)
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=caps, root_uri=root.as_uri(),
        initialization_options={
            "model": {"backend": "local", "path": str(tiny_checkpoint)},
            "completion": {"debounceMs": 0, "multilineMaxTokens": 64},
            "repair": {"maxRounds": 1, "returnUnclean": True},
            "budgets": {"requestTimeoutMs": 60000, "completionMs": 60000},
        },
    ))
    deadline = time.monotonic() + 120
    while not _loaded(lsp_client):
        assert time.monotonic() < deadline, "the model never finished loading"
        await asyncio.sleep(0.05)
    lsp_client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=(root / "join.py").as_uri(), language_id="python", version=1, text=DOC)))
    lsp_client.root = root  # type: ignore[attr-defined]
    yield
    await lsp_client.shutdown_session()


def _loaded(client: LanguageClient) -> bool:
    for reports in list(client.progress_reports.values()):
        if reports and getattr(reports[0], "title", "") == "GLM-5: loading the model":
            return isinstance(reports[-1], types.WorkDoneProgressEnd)
    return False


def _params(client: LanguageClient, line: int, character: int) -> types.InlineCompletionParams:
    return types.InlineCompletionParams(
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
        text_document=types.TextDocumentIdentifier(uri=(client.root / "join.py").as_uri()),  # type: ignore[attr-defined]
        position=types.Position(line=line, character=character),
    )


async def test_the_local_model_loads_once_with_progress(client: LanguageClient) -> None:
    assert _loaded(client)
    assert not [m for m in client.messages if m.type == types.MessageType.Error], client.messages
    assert any("model ready (local)" in m.message for m in client.log_messages)


@pytest.mark.parametrize("line, character", [(4, 15), (6, 8), (7, 11), (3, 0)])
async def test_answers_are_well_formed_and_never_leak_special_tokens(
    client: LanguageClient, line: int, character: int
) -> None:
    result = await client.text_document_inline_completion_async(_params(client, line, character))
    assert isinstance(result, types.InlineCompletionList)
    for item in result.items:
        assert isinstance(item.insert_text, str) and item.insert_text.strip()
        assert "<|" not in item.insert_text
        here = types.Position(line=line, character=character)
        assert item.range == types.Range(start=here, end=here)
