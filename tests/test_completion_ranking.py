"""List completion ranked as a language server's users expect (issue 21, point 3 and acceptance 4).

Unit tests of ``glm5_lsp.server.ranking``, then the real ``glm5-lsp serve`` (scripted model,
``tests/data/server/ranking_script.json``): modules after ``import``, attributes after a dot,
names in scope by relevance, each label once, never a truncated name.
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

from glm5_lsp.server.ranking import attribute_words, cursor_kind, occurrences, rank, truncated

DATA = Path(__file__).resolve().parent / "data" / "server"
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(DATA))

from scripted_openai import ScriptedOpenAI

SERVER = ClientServerConfig(
    server_command=[sys.executable, "-m", "glm5_lsp.cli", "serve"],
    server_env={**os.environ, "PYTHONPATH": str(REPO)},
)
ASYNC = pytest.mark.asyncio(loop_scope="module")


@pytest.mark.parametrize("line, kind", [
    ("import ", "import"), ("import o", "import"), ("    import os, sy", "import"), ("from ", "import"),
    ("from os.pa", "import"), ("from os import pa", "from-import"), ("x = os.pa", "attribute"),
    ("self.", "attribute"), ("f(a).b", "attribute"), ("x = na", "name"), ("return ", "name"),
    ("x = 1.", "name"), ("important = ", "name"),
])
def test_cursor_kind(line: str, kind: str) -> None:
    assert cursor_kind(line) == kind


def test_names_the_file_uses_near_the_cursor_come_first() -> None:
    text = (
        "def parse(value):\n"
        "    parsed_value = value.strip()\n"
        "    parsed_value = parsed_value.lower()\n"
        "    pa\n"
        "    return parsed_value\n"
    )
    offset = text.index("    pa\n") + 6
    names = ["pass_through", "parse", "parsed_value", "partial", "_parse_private", "__path__", "pandas"]
    ranked = rank(names, text, offset, "pa")
    assert ranked[0] == "parsed_value"  # used three times, on the lines around the cursor
    assert ranked[1] == "parse"
    assert ranked[-2:] == ["_parse_private", "__path__"]  # private, then dunder, last


def test_a_name_typed_with_its_case_beats_one_that_only_matches_ignoring_case() -> None:
    text = "Parser = 1\nparser = 2\nparser\nPa"
    assert rank(["parser", "Parser"], text, len(text), "Pa")[0] == "Parser"


def test_labels_come_out_once_the_best_placed_one_kept() -> None:
    text = "class _ArgumentGroup:\n    pass\n\n\n_Ar"
    items = [("_ArgumentGroup", "class"), ("_ArgumentGroup", "name"), ("_Action", "class")]
    ranked = rank(items, text, len(text), "_Ar", name=lambda item: item[0])
    assert [label for label, _ in ranked] == ["_ArgumentGroup", "_Action"]
    assert ranked[0] == ("_ArgumentGroup", "class")


def test_private_names_are_not_pushed_down_when_the_user_types_an_underscore() -> None:
    text = "_split_lines = 1\n_split_lines\n_sp"
    assert rank(["split", "_split_lines"], text, len(text), "_sp")[0] == "_split_lines"


def test_a_truncated_name_is_recognised() -> None:
    seen = occurrences("def _split_lines(text):\n    return text\n")
    assert truncated("_split_lin", [], seen)
    assert truncated("x = _split_lin", [], seen)
    assert not truncated("_split_lines", [], seen)
    assert not truncated("_split_lines(text)", [], seen)
    assert not truncated("brand_new_name", [], seen)  # a name nothing else begins with is not cut


def test_attribute_words_are_what_the_code_reads_after_a_dot() -> None:
    text = "self.save_pkcs1()\nx = key . n\ny = 1.5\n'a.not_this'  # b.nor_this\n"
    assert attribute_words(text) == {"save_pkcs1", "n"}


def test_a_tier_ranks_the_finders_answers_before_the_files_words() -> None:
    text = "obj.sample()\nobj.sample()\nobj.sa"
    ranked = rank(["save", "sample"], text, len(text), "sa", tier=lambda n: 0 if n == "save" else 1)
    assert ranked == ["save", "sample"]
    assert rank(["save", "sample"], text, len(text), "sa")[0] == "sample"  # without tiers: the file's use wins


def test_occurrences_skip_strings_and_comments() -> None:
    seen = occurrences("name = 'other'  # third\nname\n\"\"\"doc\nfourth\"\"\"\n")
    assert seen == {"name": [0, 1]}


# ---- the real server -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scripted() -> Any:
    server = ScriptedOpenAI.from_file(DATA / "ranking_script.json")
    server.url = server.start()  # type: ignore[attr-defined]
    yield server
    server.stop()


def _loaded(client: LanguageClient) -> bool:
    for reports in list(client.progress_reports.values()):
        if reports and getattr(reports[0], "title", "") == "GLM-5: loading the model":
            return isinstance(reports[-1], types.WorkDoneProgressEnd)
    return False


@pytest_lsp.fixture(scope="module", config=SERVER)
async def client(lsp_client: LanguageClient, scripted: Any, tmp_path_factory: Any) -> Any:
    root = tmp_path_factory.mktemp("ranking")
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), root_uri=root.as_uri(),
        initialization_options={
            "model": {"backend": "openai", "url": scripted.url, "name": "scripted", "timeoutSeconds": 10},
            "completion": {"debounceMs": 0}, "budgets": {"requestTimeoutMs": 20000, "completionMs": 20000}}))
    deadline = time.monotonic() + 30
    while not _loaded(lsp_client):
        assert time.monotonic() < deadline, "the model never loaded"
        await asyncio.sleep(0.02)
    lsp_client.root = root  # type: ignore[attr-defined]
    yield
    await lsp_client.shutdown_session()


async def _complete(client: LanguageClient, name: str, text: str) -> list[types.CompletionItem]:
    """The list at the end of ``text`` (the cursor), as a client orders it."""
    uri = (client.root / name).as_uri()  # type: ignore[attr-defined]
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
    lines = text.split("\n")
    result = await client.text_document_completion_async(types.CompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=len(lines) - 1, character=len(lines[-1]))))
    assert isinstance(result, types.CompletionList)
    return sorted(result.items, key=lambda item: item.sort_text or item.label)


ARGPARSE_LIKE = (
    "import os\n\n\n"
    "class _ArgumentGroup:\n    pass\n\n\n"
    "class _ActionsContainer:\n    def _add_container_actions(self):\n        pass\n\n\n"
    "def _split_lines(text, width):\n    return text.splitlines()\n\n\n"
    "def format_help(group):\n    lines = _split_lines(group, 80)\n    return lines\n"
)


@ASYNC
async def test_after_import_modules_are_offered_not_the_files_classes(client: LanguageClient) -> None:
    items = await _complete(client, "imports.py", ARGPARSE_LIKE + "\nimport o")
    labels = [item.label for item in items if item.detail != "GLM-5"]
    assert "os" in labels and "operator" in labels, labels[:20]
    assert all(item.kind == types.CompletionItemKind.Module for item in items if item.detail != "GLM-5")
    assert "_ArgumentGroup" not in labels and "format_help" not in labels
    items = await _complete(client, "imports2.py", ARGPARSE_LIKE + "\nimport ")
    labels = [item.label for item in items]
    assert "_ArgumentGroup" not in labels and "abc" in labels
    items = await _complete(client, "imports3.py", ARGPARSE_LIKE + "\nfrom collections import Ord")
    assert "OrderedDict" in [item.label for item in items]


@ASYNC
async def test_attributes_after_a_dot_come_from_jedi(client: LanguageClient) -> None:
    items = await _complete(client, "attrs.py", "import os\n\nos.pa")
    labels = [item.label for item in items if item.detail != "GLM-5"]
    assert "path" in labels[:3], labels
    assert "path" in labels and "pardir" in labels and "_ArgumentGroup" not in labels


@ASYNC
async def test_names_in_scope_by_relevance_each_once_none_truncated(client: LanguageClient) -> None:
    """The scripted model answers ``_split_lin`` (a name cut short): never offered; the file's
    ``_split_lines`` is, once, first among what ``_sp`` matches."""
    text = ARGPARSE_LIKE + "\n\ndef wrap(group):\n    return _sp"
    items = await _complete(client, "scope.py", text)
    labels = [item.label for item in items]
    assert len(labels) == len(set(labels)), [x for x in labels if labels.count(x) > 1]
    # (the pipeline may finish the word from the names in scope: then the model's pick is the name's item)
    assert "_split_lin" not in labels and labels[0] == "_split_lines", labels[:10]
    items = await _complete(client, "scope2.py", ARGPARSE_LIKE + "\n\ndef wrap(group):\n    return _")
    labels = [item.label for item in items]
    assert len(labels) == len(set(labels)) and labels.count("_ArgumentGroup") == 1
    seen = occurrences(ARGPARSE_LIKE)
    assert not [label for label in labels if truncated(label, [], seen)]


@ASYNC
async def test_the_models_line_is_its_own_item_first(client: LanguageClient) -> None:
    items = await _complete(client, "line.py", ARGPARSE_LIKE + "\n\ndef wrap(group):\n    return format_he")
    assert items[0].detail == "GLM-5" and items[0].label == "format_help(group)"
    assert [item.label for item in items[1:]] == ["format_help"]


@ASYNC
async def test_after_a_dot_jedi_cannot_type_the_files_own_attributes_are_offered(client: LanguageClient) -> None:
    text = "def dump(key):\n    data = key.save_pkcs1(format='PEM')\n    return key.sa"
    items = await _complete(client, "attr_words.py", text)
    assert "save_pkcs1" in [item.label for item in items][:5]
