"""Insertion text at 200+ real cursor positions, through the real server (issue 21, acceptance 3).

The real ``glm5-lsp serve`` runs the project's own runtime on a tiny random checkpoint
(``tiny_checkpoint``): random weights write arbitrary text, runs of white space included, which is
what the shared post-processing must tame whatever the model. The documents are copies of a
``BENCHMARK_FIT`` package (code no one here wrote), each cursor either in the middle of a line of
code (the line cut at the cursor, as while typing, or kept whole) or on an empty indented line (a
line of code blanked to its indentation). No inline completion may begin with a run of spaces or
tabs in the middle of a line (one space where the language wants one), and none may write the
indentation of an empty indented line again.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "sortedcontainers"  # in glm5_lsp.train.corpus.BENCHMARK_FIT
MIDDLE, EMPTY = 135, 65
SERVER = ClientServerConfig(
    server_command=[sys.executable, "-m", "glm5_lsp.cli", "serve"],
    server_env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
)
pytestmark = [pytest.mark.asyncio(loop_scope="module")]


def _package() -> Path:
    from glm5_lsp.train.corpus import BENCHMARK_FIT

    assert PACKAGE in BENCHMARK_FIT
    folder = Path(sysconfig.get_paths()["purelib"]) / PACKAGE
    if not folder.is_dir():
        pytest.skip(f"{PACKAGE} is not installed")
    return folder


def _code_lines(text: str) -> list[int]:
    """Indices of lines of code outside docstrings and comments (a plain reading: triple quotes toggle)."""
    out, inside = [], False
    for index, line in enumerate(text.split("\n")):
        quotes = line.count('"""') + line.count("'''")
        if inside or quotes:
            inside = inside != (quotes % 2 == 1)
            continue
        stripped = line.strip()
        if stripped and not stripped.startswith(("#", "@")) and len(stripped) > 6:
            out.append(index)
    return out


def _previous_code(lines: list[str], index: int) -> str:
    for line in reversed(lines[:index]):
        if line.strip() and not line.strip().startswith("#"):
            return line
    return ""


def positions(root: Path) -> list[dict[str, Any]]:
    """Cursor positions in the package's files: ``(file, text, line, character, kind)``, seeded."""
    rng = random.Random(21)
    files = sorted(root.glob("*.py"))
    texts = {f.name: f.read_text(encoding="utf-8") for f in files}
    out: list[dict[str, Any]] = []
    while sum(p["kind"] == "middle" for p in out) < MIDDLE:
        name = rng.choice(sorted(texts))
        lines = texts[name].split("\n")
        index = rng.choice(_code_lines(texts[name]))
        line = lines[index]
        indent = len(line) - len(line.lstrip())
        breaks = [i + 1 for i, ch in enumerate(line) if i >= indent and ch in ".(=, [:" and i + 1 < len(line)]
        if not breaks:
            continue
        column = rng.choice(breaks)
        if rng.random() < 0.5:  # typing: the line ends at the cursor
            lines = lines[:index] + [line[:column]] + lines[index + 1:]
        out.append({"file": name, "text": "\n".join(lines), "line": index, "character": column, "kind": "middle"})
    while sum(p["kind"] == "empty" for p in out) < EMPTY:
        name = rng.choice(sorted(texts))
        lines = texts[name].split("\n")
        index = rng.choice(_code_lines(texts[name]))
        line = lines[index]
        indent = line[: len(line) - len(line.lstrip())]
        previous = _previous_code(lines, index)
        if not indent or "\t" in indent or previous.rstrip().endswith((",", "(", "[", "{", "\\")):
            continue  # a continuation line's indentation is not a block's
        if previous.rstrip().endswith(":") and len(previous) - len(previous.lstrip()) >= len(indent):
            continue
        lines = lines[:index] + [indent] + lines[index + 1:]
        out.append({"file": name, "text": "\n".join(lines), "line": index, "character": len(indent), "kind": "empty"})
    return out


@pytest_lsp.fixture(scope="module", config=SERVER)
async def client(lsp_client: LanguageClient, tiny_checkpoint: Path, tmp_path_factory: Any) -> Any:
    root = tmp_path_factory.mktemp("workspace")
    shutil.copytree(_package(), root / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    caps = client_capabilities("visual-studio-code")
    assert caps.text_document is not None
    caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=caps, root_uri=root.as_uri(),
        initialization_options={
            "model": {"backend": "local", "path": str(tiny_checkpoint)},
            "completion": {"debounceMs": 0, "maxTokens": 6, "multilineMaxTokens": 8, "minTokenProb": 0,
                           "cacheSize": 0},
            "repair": {"maxRounds": 1, "returnUnclean": True, "monitor": False},
            "budgets": {"requestTimeoutMs": 60000, "completionMs": 60000, "contextTokens": 96},
            "features": {"diagnostics": False},
        },
    ))
    deadline = time.monotonic() + 120
    while not _loaded(lsp_client):
        assert time.monotonic() < deadline, "the model never finished loading"
        await asyncio.sleep(0.05)
    lsp_client.root = root  # type: ignore[attr-defined]
    yield
    await lsp_client.shutdown_session()


def _loaded(client: LanguageClient) -> bool:
    for reports in list(client.progress_reports.values()):
        if reports and getattr(reports[0], "title", "") == "GLM-5: loading the model":
            return isinstance(reports[-1], types.WorkDoneProgressEnd)
    return False


async def test_no_inline_completion_starts_with_white_space_mid_line_or_repeats_an_indent(
        client: LanguageClient) -> None:
    root: Path = client.root  # type: ignore[attr-defined]
    cases = positions(root / PACKAGE)
    assert len(cases) >= 200
    versions: dict[str, int] = {}
    answered = {"middle": 0, "empty": 0}
    bad: list[tuple[str, str, str]] = []
    for case in cases:
        uri = (root / PACKAGE / case["file"]).as_uri()
        if uri not in versions:
            versions[uri] = 1
            client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
                uri=uri, language_id="python", version=1, text=case["text"])))
        else:
            versions[uri] += 1
            client.text_document_did_change(types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=versions[uri]),
                content_changes=[types.TextDocumentContentChangeWholeDocument(text=case["text"])]))
        position = types.Position(line=case["line"], character=case["character"])
        result = await client.text_document_inline_completion_async(types.InlineCompletionParams(
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
            text_document=types.TextDocumentIdentifier(uri=uri), position=position))
        assert isinstance(result, types.InlineCompletionList)
        before = case["text"].split("\n")[case["line"]][: case["character"]]
        for item in result.items:
            text = item.insert_text if isinstance(item.insert_text, str) else item.insert_text.value
            answered[case["kind"]] += 1
            if case["kind"] == "middle":
                # one space where the language wants it, never a run, never after a space
                if text.startswith(("  ", "\t", " \t")) or (text[:1] == " " and before[-1:].isspace()):
                    bad.append((case["kind"], before, text))
            elif text[:1] in (" ", "\t"):
                bad.append((case["kind"], before, text))
    print(f"answered: {answered}; of {len(cases)} positions; bad: {len(bad)}")
    assert not bad, bad[:10]
    # the check means something only if the model answered at most of the positions
    assert answered["middle"] >= MIDDLE // 2 and answered["empty"] >= EMPTY // 2, answered
