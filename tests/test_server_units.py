"""The server's pure parts: post-processing, the single/multi-line policy, empty bodies, LSP
conversions, the cache and supersession. Cases live in ``tests/data/server/*_cases.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types

from glm5_lsp.checks.edits import check_edit, diagnose
from glm5_lsp.context.syntax import empty_bodies, wants_multiline
from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.indentation import indent_unit
from glm5_lsp.lru import LRUCache
from glm5_lsp.pipeline.core import tidy_for_document
from glm5_lsp.postprocess import tidy
from glm5_lsp.server import convert
from glm5_lsp.server.jobs import Supersession
from glm5_lsp.server.loader import Engine
from glm5_lsp.server.settings import parse_settings
from glm5_lsp.textdiff import diff_region

DATA = Path(__file__).resolve().parent / "data" / "server"
CURSOR = "‸"


def _cases(name: str) -> list[dict[str, Any]]:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", _cases("postprocess_cases.json"), ids=lambda c: c["why"])
def test_clean_completion(case: dict[str, Any]) -> None:
    got = tidy_for_document(case["completion"], case["prefix"], case["suffix"], multiline=case["multiline"],
                            unit=case.get("unit", "    "), language=case.get("language"))
    assert got == case["expected"]


@pytest.mark.parametrize("case", _cases("postprocess_cases.json"), ids=lambda c: c["why"])
def test_post_processing_is_idempotent(case: dict[str, Any]) -> None:
    """Text the rules passed passes them again unchanged (a typed-through suggestion is re-cut by them)."""
    args = case["prefix"], case["suffix"]
    once = tidy(case["completion"], *args, multiline=case["multiline"], language=case.get("language"))
    assert tidy(once, *args, multiline=case["multiline"], language=case.get("language")) == once
    cleaned = tidy_for_document(case["completion"], *args, multiline=case["multiline"], unit=case.get("unit", "    "),
                                language=case.get("language"))
    assert tidy_for_document(cleaned, *args, multiline=case["multiline"], unit=case.get("unit", "    "),
                             language=case.get("language")) == cleaned


@pytest.mark.parametrize("case", _cases("multiline_cases.json"), ids=lambda c: c["why"])
def test_wants_multiline(case: dict[str, Any]) -> None:
    marked = case["text"]
    offset = marked.index(CURSOR)
    assert wants_multiline(marked.replace(CURSOR, ""), offset, case["language"]) is case["multiline"]


@pytest.mark.parametrize(
    "text, unit",
    [("def f():\n    return 1\n", "    "), ("def f():\n  if x:\n    y\n", "  "), ("def f():\n\treturn 1\n", "\t"),
     ("x = 1\n", "    "),
     # A form feed breaks no line (str.splitlines made "  b" and "  d" lines, and the unit two spaces).
     ("def f():\n    a = 1\x0c  b\n    c = 2\x0c  d\n    e = 3\n", "    ")],
)
def test_indent_unit(text: str, unit: str) -> None:
    assert indent_unit(text) == unit


def test_empty_bodies_python() -> None:
    text = (
        'def documented(x):\n    """Docs."""\n    ...\n\n'
        "def placeholder():\n    pass\n\n"
        "def real():\n    return 1\n\n"
        "class C:\n    def method(self):\n        pass  # todo\n"
    )
    found = {body.name: text[body.start:body.end] for body in empty_bodies(text, "python")}
    assert found == {"documented": "...", "placeholder": "pass", "method": "pass"}


@pytest.mark.parametrize(
    "language, text, name",
    [("javascript", "function f(a) {\n}\nfunction g() { return 1 }\n", "f"),
     ("go", "package m\n\nfunc Add(a int) int {\n}\n", "Add"),
     ("rust", "fn add(a: i32) -> i32 {}\nfn one() -> i32 { 1 }\n", "add"),
     ("c", "int main(void) {}\n", "main")],
)
def test_empty_bodies_in_brace_languages(language: str, text: str, name: str) -> None:
    [body] = empty_bodies(text, language)
    assert body.name == name and text[body.start - 1] == "{" and text[body.end] == "}"


def test_unknown_language_has_no_syntax() -> None:
    assert empty_bodies("def f():\n    pass\n", "plaintext") == []
    assert wants_multiline("x = 1\n", 4, "plaintext") is False


@pytest.mark.parametrize("encoding, units", [("utf-16", 6), ("utf-8", 9), ("utf-32", 5)])
def test_positions_count_the_negotiated_units(encoding: str, units: int) -> None:
    text = "a😀b é\nnext"  # 😀 is 2 UTF-16 units and 4 UTF-8 bytes; é is 2 UTF-8 bytes
    end_of_line = 5  # characters: a, 😀, b, space, é
    assert convert.lsp_position(text, end_of_line, encoding) == types.Position(line=0, character=units)
    assert convert.lsp_offset(text, types.Position(line=0, character=units), encoding) == end_of_line
    assert convert.lsp_offset(text, types.Position(line=1, character=4), encoding) == len(text)


def test_a_position_past_a_line_end_is_the_line_end_and_past_the_last_line_none() -> None:
    """The protocol: "If the character value is greater than the line length it defaults back to
    the line length." A line that does not exist has no position."""
    text = "ab\ncd"
    assert convert.lsp_offset(text, types.Position(line=2, character=0)) is None
    assert convert.lsp_offset(text, types.Position(line=0, character=3)) == 2
    assert convert.lsp_offset(text, types.Position(line=0, character=2**31 - 1)) == 2
    assert convert.lsp_offset(text, types.Position(line=1, character=2)) == 5
    assert convert.lsp_offset("ab\r\ncd", types.Position(line=0, character=9)) == 2  # before the \r\n


def test_diagnostics_round_trip_through_lsp() -> None:
    text = "x = 'é'\nprint(y)\n"
    ours = Diagnostic(line=1, col=6, end_line=1, end_col=7, message="undefined name 'y'", severity="warning",
                      source="pyflakes", code="F821")
    lsp = convert.lsp_diagnostic(text, ours)
    assert lsp.range == types.Range(start=types.Position(1, 6), end=types.Position(1, 7))
    assert lsp.severity == types.DiagnosticSeverity.Warning and lsp.source == "glm5-lsp (pyflakes)"
    back = convert.diagnostic_from_lsp(text, lsp)
    assert (back.line, back.col, back.end_line, back.end_col, back.message) == (1, 6, 1, 7, ours.message)


def test_diff_region_and_edit() -> None:
    old, new = "def f(:\n    pass\n", "def f():\n    pass\n"
    start, end, inserted = diff_region(old, new)
    assert (start, end, inserted) == (6, 6, ")")
    edit = convert.lsp_text_edit(old, start, end, inserted)
    assert edit.range.start == types.Position(0, 6) and edit.new_text == ")"


def test_check_edit_wants_the_targets_gone_and_nothing_new() -> None:
    broken = "def f(:\n    return 1\n"
    [target, *_] = [d for d in diagnose(broken, "f.py", "python") if d.source == "compile"]
    assert check_edit(broken, 6, 6, ")", path="f.py", language="python", targets=[target]).ok
    unchanged = check_edit(broken, 6, 6, "", path="f.py", language="python", targets=[target])
    assert not unchanged.ok and "does not fix" in unchanged.reason()
    worse = check_edit("x = 1\n", 0, 1, "print(y)\nx", path="f.py", language="python")
    assert not worse.ok and "would add" in worse.reason()
    foreign = Diagnostic(line=0, col=0, end_line=0, end_col=1, message="style", source="pylint")
    assert check_edit("x = 1\n", 4, 5, "2", path="f.py", language="python", targets=[foreign]).ok


def test_performance_hints_are_our_diagnostics_and_a_fix_must_remove_them() -> None:
    code = "def f(words):\n    s = ''\n    for w in words:\n        s += w\n    return s\n"
    [hint] = [d for d in diagnose(code, "f.py", "python") if d.source == "perf"]
    assert hint.severity == "info" and hint.code == "string-concat-in-loop" and "join" in hint.message
    joined = "def f(words):\n    return ''.join(words)\n"
    start, end, text = diff_region(code, joined)
    assert check_edit(code, start, end, text, path="f.py", language="python", targets=[hint]).ok
    renamed = code.replace("w in words:\n        s += w", "word in words:\n        s += word")
    start, end, text = diff_region(code, renamed)
    assert check_edit(code, start, end, text, path="f.py", language="python", targets=[hint]).ok is False


def test_lru_cache() -> None:
    cache: LRUCache[str] = LRUCache(2)
    cache.put("a", "1")
    cache.put("b", "2")
    assert cache.get("a") == "1"
    cache.put("c", "3")  # evicts b, the least recently used
    assert cache.get("b") is None and cache.get("a") == "1" and cache.get("c") == "3"
    cache.resize(0)
    cache.put("d", "4")
    assert len(cache) == 0


def test_supersession_cancels_only_the_same_key() -> None:
    jobs = Supersession()
    first = jobs.begin(("doc", "inline"))
    other = jobs.begin(("other", "inline"))
    second = jobs.begin(("doc", "inline"))
    assert first.cancelled and first.reason == "superseded"
    assert not other.cancelled and not second.cancelled
    assert jobs.busy()
    jobs.finish(("doc", "inline"), second)
    jobs.cancel_all("shutdown")
    assert other.cancelled and other.reason == "shutdown" and not second.cancelled
    assert not jobs.busy()  # (diagnostics wait while it is busy)


def test_supersession_says_how_long_no_job_has_run() -> None:
    import time

    jobs = Supersession()
    assert jobs.quiet_for() == float("inf")
    token = jobs.begin(("doc", "inline"))
    assert jobs.quiet_for() == 0.0
    jobs.finish(("doc", "inline"), token)
    time.sleep(0.02)
    assert 0.02 <= jobs.quiet_for() < 5


@pytest.mark.parametrize("setting,trained,expected", [
    (0, 512, 512 - 96),  # auto: the trained context less the multi-line generation budget
    (0, None, 1024),  # auto, the model does not say: the default
    (0, 100, 64),  # never below the floor
    (2048, 512, 2048),  # an explicit budget wins
    (10, None, 64),
])
def test_context_budget_fits_the_model(setting: int, trained: int | None, expected: int) -> None:
    from glm5_lsp.server.loader import context_budget
    from glm5_lsp.server.settings import Settings

    settings = Settings()
    settings.budgets.context_tokens = setting
    assert context_budget(settings, trained) == expected


@pytest.mark.parametrize("setting,context,topk,expected", [
    (0, 416, None, 208),  # auto: half the prompt budget
    (0, 416, 128, 64),  # and no more than half the model's DSA top-k
    (0, 416, 256, 128),
    (0, 1024, 2048, 512),
    (0, 100, None, 64),  # never below the floor
    (300, 416, 128, 300),  # an explicit budget wins
    (900, 416, None, 416),  # but never above the prompt budget
])
def test_a_single_line_prompt_gets_half_the_budget(setting: int, context: int, topk: int | None, expected: int) -> None:
    from glm5_lsp.server.loader import line_context_budget
    from glm5_lsp.server.settings import Settings

    settings = Settings()
    settings.budgets.line_context_tokens = setting
    assert line_context_budget(settings, context, topk) == expected


def test_warming_an_opened_file_indexes_the_packages_it_imports(tmp_path: Path) -> None:
    from glm5_lsp.context import ContextEngine
    from glm5_lsp.pipeline.session import SharedContext

    def make(root: str | None) -> ContextEngine:
        return ContextEngine(workspace_root=root, cache_dir=tmp_path / "cache")

    shared = SharedContext(make(None), make)  # no workspace index: nothing is indexed yet
    path = str(tmp_path / "script.py")
    shared.open_document(path, "import textwrap\n\nprint(textwrap.dedent('  x'))\n", "python")
    assert "package:textwrap" not in shared.engine.apidocs.sources
    assert shared.warm(path) == 1
    assert "package:textwrap" in shared.engine.apidocs.sources
    found = shared.engine.apidocs.search(["dedent"], 3)
    assert any(chunk.name == "dedent" for chunk, _ in found)
    assert shared.warm(path) == 0  # already there


def test_typing_through_a_suggestion_keeps_its_rest() -> None:
    from glm5_lsp.server.typed_through import TypedThrough

    shown = TypedThrough()
    document = "x = sorted(\nprint(x)\n"
    cursor = document.index("\nprint")
    shown.remember("k", document, cursor, "values)")
    typed = document[:cursor] + "val" + document[cursor:]
    assert shown.rest("k", typed, cursor + 3) == "ues)"
    assert shown.rest("k", typed.replace("val", "vel"), cursor + 3) is None  # typed something else
    assert shown.rest("k", document[:cursor] + "values)" + document[cursor:], cursor + 7) is None  # all of it
    assert shown.rest("k", typed.replace("print", "pront"), cursor + 3) is None  # the rest of the file changed
    assert shown.rest("k", "# new\n" + typed, cursor + 9) is None  # and so did what came before
    assert shown.rest("other", typed, cursor + 3) is None
    shown.remember("k", document, cursor, "")
    assert shown.rest("k", typed, cursor + 3) is None  # nothing shown: nothing to type through


@pytest.mark.parametrize(("options", "expected"), [
    ({}, True),  # the local model, the monitor on by default
    ({"repair": {"monitor": False}}, False),
    ({"model": {"backend": "openai", "url": "http://localhost:1"}}, False),  # no logits to mask: jedi stays idle
])
def test_jedi_is_warmed_only_where_the_decoding_monitor_runs(options: dict[str, Any], expected: bool) -> None:
    settings, problems = parse_settings(options)
    assert not problems
    assert Engine(settings).monitors_names is expected


def test_freezing_survivors_takes_them_out_of_the_collectors_walk() -> None:
    import gc

    from glm5_lsp.server.heap import freeze_survivors

    before = gc.get_freeze_count()
    kept = [[i] for i in range(1000)]
    freeze_survivors()
    try:
        assert gc.get_freeze_count() >= before + len(kept)
    finally:
        gc.unfreeze()


def test_the_heap_is_settled_once_after_a_quiet_spell_and_never_while_busy() -> None:
    import asyncio

    from glm5_lsp.server.heap import IdleSettler

    async def scenario() -> tuple[int, int, int]:
        loop = asyncio.get_running_loop()
        busy = [False]
        runs: list[float] = []
        settler = IdleSettler(lambda fn: loop.run_in_executor(None, fn), lambda: busy[0], idle_s=0.05,
                              settle=lambda: runs.append(loop.time()))
        for _ in range(4):  # activity every 30 ms keeps pushing it back
            settler.touch(loop)
            await asyncio.sleep(0.03)
        during_activity = len(runs)
        busy[0] = True
        await asyncio.sleep(0.12)
        while_busy = len(runs)
        busy[0] = False
        await asyncio.sleep(0.15)
        settler.cancel()
        return during_activity, while_busy, len(runs)

    assert asyncio.run(scenario()) == (0, 0, 1)


def test_completion_settings_reach_a_loaded_engine_without_a_reload() -> None:
    """``completion.maxTokens`` or ``minTokenProb`` changed in the editor applies from the next request;
    the single-line prompt budget worked out at load stays."""
    from dataclasses import replace

    from glm5_lsp.pipeline import Pipeline
    from glm5_lsp.server.loader import pipeline_settings
    from glm5_lsp.server.settings import Settings

    class NoModel:  # the pipeline only holds it here
        name, supports_internals = "none", False

    settings = Settings()
    engine = Engine(settings)
    engine.pipeline = Pipeline(NoModel(), replace(pipeline_settings(settings), line_context_tokens=128))  # type: ignore[arg-type]
    changed, problems = parse_settings({"completion": {"maxTokens": 7, "minTokenProb": 0.25}}, settings)
    assert problems == []
    engine.update_settings(changed)
    now = engine.pipeline.settings
    assert (now.max_tokens, now.min_token_prob, now.line_context_tokens) == (7, 0.25, 128)


@pytest.mark.parametrize("command", ["glm5_lsp.server.serve_command", "glm5_lsp.serve_model", "glm5_lsp.generate"])
def test_every_front_end_runs_the_model_on_one_torch_thread_by_default(command: str, monkeypatch) -> None:
    import argparse
    import importlib
    import os
    import sys

    from glm5_lsp.threads import use_threads

    parser = argparse.ArgumentParser()
    importlib.import_module(command).add_arguments(parser)
    extra = ["--prompt", "x"] if command.endswith("generate") else []
    assert parser.parse_args(extra).threads == 1
    assert parser.parse_args([*extra, "--threads", "4"]).threads == 4
    with pytest.raises(SystemExit, match="--threads must be at least 1"):
        use_threads(0, "serve-model")
    monkeypatch.delitem(sys.modules, "torch")  # not imported yet: torch reads the count when it starts
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    use_threads(3, "serve")
    assert os.environ["OMP_NUM_THREADS"] == "3"
