"""Prompt assembly: layout, role spans, budgets and priorities, plain-text fallback, ``glm5-lsp index``.

Data: ``tests/data/context/ws/``.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from glm5_lsp.context import index_command as cli
from glm5_lsp.context.engine import ContextEngine
from glm5_lsp.context.tokens import approx_tokens
from glm5_lsp.spans import Prompt

WS = Path(__file__).parent / "data" / "context" / "ws"


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> ContextEngine:
    root = tmp_path_factory.mktemp("prompt")
    shutil.copytree(WS, root / "ws")
    engine = ContextEngine(root / "ws", cache_dir=root / "cache")
    engine.symbols.index_workspace()
    engine.apidocs.index_workspace(["json", "re", "os.path"])
    return engine


def _util(engine: ContextEngine) -> tuple[str, str]:
    path = str(engine.root / "pkg" / "util.py")
    return path, Path(path).read_text()


def _roles(prompt: Prompt) -> set[str]:
    return {s.role for s in prompt.spans}


def test_layout_and_roles(engine):
    path, text = _util(engine)
    offset = text.index("os.path.basename") + len("os.path.ba")
    prompt = engine.build_prompt(text, offset, path=path, budget_tokens=1200, error_lines=[15])
    whole = prompt.text()
    assert prompt.prefix.endswith("name = os.path.ba") and prompt.suffix.startswith("sename(path)")
    assert whole.index("# symbols") < whole.index("# api") < whole.index("def load(path: str) -> list:")
    assert {"symbol", "api_doc", "current_block", "indent", "error_context"} <= _roles(prompt)
    api = next(s for s in prompt.spans if s.role == "api_doc")
    assert "os.path.basename(" in whole[api.start : api.end]  # the call being typed is documented
    block = next(s for s in prompt.spans if s.role == "current_block")
    assert whole[block.start : block.end].startswith("def load(path: str) -> list:")
    error = next(s for s in prompt.spans if s.role == "error_context")
    assert whole[error.start : error.end] == "    with open(path) as handle:\n"
    indents = [whole[s.start : s.end] for s in prompt.spans if s.role == "indent"]
    assert indents and set("".join(indents)) == {" "}
    assert prompt.role_at(offset + len(prompt.prefix) - offset) in {"current_block", "code"}


def test_budget_is_respected_and_code_is_never_starved(engine):
    path, text = _util(engine)
    offset = text.index("total += shape")
    for budget in (40, 120, 400, 2000):
        prompt = engine.build_prompt(text, offset, path=path, budget_tokens=budget)
        assert approx_tokens(prompt.text()) <= budget + 40  # per-line rounding slack
        header_end = max((s.end for s in prompt.spans if s.role in ("symbol", "api_doc")), default=0)
        code = prompt.text()[header_end:]
        assert approx_tokens(code) >= min(budget * 0.4, approx_tokens(text) * 0.9)
        assert "total += " in prompt.suffix


def test_flagged_lines_outside_the_window_go_to_the_header(engine):
    path, text = _util(engine)
    prompt = engine.build_prompt(text, text.index("total += shape"), path=path, budget_tokens=60, error_lines=[16])
    spans = [s for s in prompt.spans if s.role == "error_context"]
    assert spans and "# 17: return [parse_sha" in prompt.text()[spans[0].start : spans[0].end]  # cut to fit
    assert "# flagged lines" in prompt.prefix


def test_other_open_files_contribute_similar_snippets(engine):
    path, text = _util(engine)
    shapes = engine.root / "pkg" / "shapes.py"
    engine.open_document(shapes, shapes.read_text())
    try:
        offset = text.index("total += shape.area()") + len("total += shape.")
        prompt = engine.build_prompt(text, offset, path=path, budget_tokens=1500)
        assert "# pkg/shapes.py:" in prompt.prefix
        assert prompt.prefix.index("# pkg/shapes.py:") < prompt.prefix.index("# symbols")
    finally:
        engine.close_document(shapes)


def test_plain_text_and_other_languages(engine):
    notes = engine.root / "notes.txt"
    text = notes.read_text()
    prompt = engine.build_prompt(text, text.index("milk"), path=notes, budget_tokens=200)
    assert prompt.prefix.endswith("eggs\n") and prompt.suffix.startswith("milk")
    block = next(s for s in prompt.spans if s.role == "current_block")
    assert prompt.text()[block.start : block.end] == "eggs\nmilk\nflour\n"
    go = engine.root / "gosrc" / "main.go"
    code = go.read_text()
    prompt = engine.build_prompt(code, code.index("return nil"), path=go, budget_tokens=400)
    assert "os.path" not in prompt.prefix  # Python package docs stay out of a Go prompt
    block = next(s for s in prompt.spans if s.role == "current_block")
    assert prompt.text()[block.start : block.end].startswith("func (s *Server) Start")


def test_text_updates_are_applied_incrementally(engine):
    path, text = _util(engine)
    engine.build_prompt(text, 0, path=path)
    edited = text.replace("MAX_SIZE = 100", "MAX_SIZE = 100\nMIN_SIZE = 1")
    engine.build_prompt(edited, 0, path=path)
    assert engine.symbols.lookup("MIN_SIZE", path).line == 4
    assert engine.documents.get(path).text == edited
    names = {s.name for s in engine.names_at("import json\njson.du", 19, path=engine.root / "tmp_names.py")}
    assert "dumps" in names


def test_index_cli_prints_what_it_indexed(tmp_path, capsys):
    root = tmp_path / "ws"
    shutil.copytree(WS, root)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args([str(root), "--cache-dir", str(tmp_path / "cache"), "--no-memory"])
    assert cli.run(args) == 0
    out = capsys.readouterr().out
    assert "source files: 13" in out and "skipped 1" in out and "API docs:" in out and "json" in out
    assert cli.run(parser.parse_args([str(root), "--cache-dir", str(tmp_path / "cache"), "--no-packages"])) == 0
    assert "reused from cache 12" in capsys.readouterr().out
    assert cli.run(parser.parse_args([str(tmp_path / "missing")])) == 2


def test_custom_token_counter_sets_the_budget(engine):
    path, text = _util(engine)
    calls = []

    def chars(s: str) -> int:  # a "tokenizer" with one token per character
        calls.append(s)
        return len(s)

    prompt = engine.build_prompt(text, text.index("total += shape"), path=path, budget_tokens=300, count_tokens=chars)
    assert calls and len(prompt.text()) <= 300
    assert "total += shape" in prompt.suffix and len(prompt.prefix) > 100
