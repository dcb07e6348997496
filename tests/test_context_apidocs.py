"""The API-doc index: static chunks from installed modules and workspace docs, BM25 ranking, budgets,
persistence. Data: ``tests/data/context/ws/`` (README.md, docs/guide.rst, Python docstrings).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from glm5_lsp.context.apidoc_sources import doc_file_chunks, locate_module, module_chunks, split_doc
from glm5_lsp.context.apidocs import ApiDocIndex, installed_imports
from glm5_lsp.context.cursor_query import build_query, split_identifier, tokenize
from glm5_lsp.context.tokens import TokenCounter

WS = Path(__file__).parent / "data" / "context" / "ws"


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> ApiDocIndex:
    root = tmp_path_factory.mktemp("apidocs")
    shutil.copytree(WS, root / "ws")
    index = ApiDocIndex(root / "ws", cache_dir=root / "cache")
    index.index_workspace(["json", "os.path", "re", "textwrap"])
    return index


def test_module_chunks_are_read_statically_with_signatures_and_docs():
    chunks = {c.title.split("(")[0]: c for c in module_chunks("json") if c.part == 0}
    assert "json.dumps" in chunks and "json.loads" in chunks
    assert chunks["json.dumps"].title.startswith("json.dumps(obj, *, skipkeys=False")
    assert "JSON formatted" in chunks["json.dumps"].text
    assert "class json.JSONDecoder" in chunks  # re-exported through __all__ from json.decoder
    decode = [c for c in module_chunks("json") if c.owner == "JSONDecoder" and c.name == "decode"]
    assert decode and decode[0].title.startswith("json.JSONDecoder.decode(s")


def test_submodule_alias_and_compiled_modules():
    joins = [c for c in module_chunks("os.path") if c.name == "join"]
    assert joins and joins[0].title.startswith("os.path.join(") and joins[0].module == "os.path"
    math = {c.name for c in module_chunks("math")}  # a C module: signatures from its typeshed stub
    assert {"sqrt", "floor"} <= math


def test_missing_package_is_skipped_with_a_log_line(caplog, tmp_path):
    caplog.set_level(logging.INFO)
    assert locate_module("no_such_package_xyz") is None
    assert module_chunks("no_such_package_xyz") == []
    index = ApiDocIndex(None, cache_dir=tmp_path)
    assert index.add_package("no_such_package_xyz") == 0
    assert "no_such_package_xyz" in caplog.text
    assert installed_imports(["json", "no_such_package_xyz", ".relative", "os.path"]) == ["json", "os.path"]


def test_long_docstrings_split_at_section_boundaries():
    doc = "Summary line.\n\n" + "Body text. " * 60 + "\n\nParameters\n----------\nx : int\n    " + "Size. " * 80
    doc += "\n\nReturns\n-------\nint\n    The result."
    pieces = split_doc(doc, max_chars=600)
    assert len(pieces) >= 3 and all(len(p) <= 600 for p in pieces)
    assert any(p.startswith("Parameters") for p in pieces) and any(p.startswith("Returns") for p in pieces)
    assert split_doc("short") == ["short"]


def test_workspace_doc_sections():
    md = {c.name: c for c in doc_file_chunks(WS / "README.md", "README.md")}
    assert set(md) == {"Shapes", "Installation", "Usage"}
    assert md["Usage"].title == "README.md: Usage" and "parse_shape" in md["Usage"].text
    rst = {c.name: c for c in doc_file_chunks(WS / "docs" / "guide.rst", "docs/guide.rst")}
    assert "Serialising" in rst and "to_json" in rst["Serialising"].text


def test_tokenize_splits_identifiers():
    assert split_identifier("HTTPServer") == ["http", "server"]
    assert tokenize("parse_known_args(self)") == ["parseknownargs", "parse", "known", "args"]


@pytest.mark.parametrize(
    "code, wanted",
    [
        ("import json\nout = json.du", "json.dumps"),
        ("import json\ndata = json.lo", "json.loads"),
        ("import os\np = os.path.jo", "os.path.join"),
        ("import re as regex\nm = regex.fulLM", "re.fullmatch"),
        ("import textwrap\ntext = textwrap.ded", "textwrap.dedent"),
    ],
)
def test_ranking_finds_the_api_being_typed(index, code, wanted):
    query = build_query(code, len(code), {"json": "json", "os": "os", "regex": "re", "textwrap": "textwrap"})
    titles = [c.title.split("(")[0] for c, _ in index.search(query, 5)]
    assert wanted in titles, titles


def test_ranking_finds_workspace_docs(index):
    titles = [c.title for c, _ in index.search(tokenize("polygon registry install"), 3)]
    assert "README.md: Installation" in titles


def test_query_reads_receiver_call_and_typed_prefix():
    code = "import numpy as np\nx = foo(1, np.linalg.no"
    query = build_query(code, len(code), {"np": "numpy"}, ["numpy"])
    assert (query.typed, query.receiver, query.call) == ("no", "numpy.linalg", "foo")
    assert query.tokens().count("mp:numpy.linalg:no") == 4 and "pfx:no" in query.tokens()


def test_top_respects_the_budget(index):
    count = TokenCounter()
    query = build_query("import json\njson.", 17, {"json": "json"})
    chunks = index.top(query, 120, count)
    assert chunks and sum(count(c.render()) + 1 for c in chunks) <= 120
    assert index.top(query, 0, count) == []
    assert index.top(["zzzunknownzzz"], 500, count) == []


def test_index_is_persisted_and_updated_incrementally(index, tmp_path):
    root, cache = index.root, index._state_dir.parents[2]
    again = ApiDocIndex(root, cache_dir=cache)
    stats = again.index_workspace(["json", "os.path", "re", "textwrap"])
    assert not stats.rebuilt and len(again) == len(index)
    readme = root / "README.md"
    readme.write_text(readme.read_text() + "\n## Troubleshooting\n\nDelete the frobnicator cache.\n")
    again.add_doc_file(readme)
    assert again.ensure_index()  # one source changed: rebuilt from cached chunks
    assert again.search(tokenize("frobnicator"), 1)[0][0].name == "Troubleshooting"


def test_best_chunk_is_cut_to_fit_rather_than_dropped(index):
    count = TokenCounter()
    query = build_query("import json\njson.loa", 20, {"json": "json"})
    best = index.search(query, 1)[0][0]
    assert best.name == "loads" and count(best.render()) > 110
    chunks = index.top(query, 110, count)
    assert chunks[0].title == best.title and chunks[0].text.endswith(" ...")
    assert sum(count(c.render()) + 1 for c in chunks) <= 110


def test_usage_prior_breaks_ties_toward_the_api_the_workspace_calls(index):
    query = build_query("import os\np = os.path.", 22, {"os": "os"})
    index.set_usage({"os.path.realpath": 50})
    try:
        assert index.search(query, 1)[0][0].name == "realpath"
    finally:
        index.set_usage({})
