"""``Pipeline.fix`` and ``Pipeline.fixes``: model-free fixes first, the model for what they leave.

The model is ``tests/data/batch/scripted_backend.py``'s scripted backend, so a test can tell whether
it was asked, and what.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from glm5_lsp import batch
from glm5_lsp.evaluate.datasets import Problem
from glm5_lsp.evaluate.runner import generate_candidate
from glm5_lsp.pipeline import Pipeline, PipelineSettings
from glm5_lsp.quickfix import names
from glm5_lsp.repair.loop import RepairSettings

_spec = importlib.util.spec_from_file_location(
    "scripted_backend", Path(__file__).parent / "data" / "batch" / "scripted_backend.py")
assert _spec and _spec.loader
scripted = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scripted)


def test_a_fix_the_parser_knows_needs_no_model() -> None:
    backend = scripted.ScriptedBackend("def f(a, b):\n    return junk\n")
    result = Pipeline(backend).fix("def f(a, b)\n    return a + b\n")
    assert result.text == "def f(a, b):\n    return a + b\n" and result.clean
    assert backend.requests == [] and result.finish_reason == "quickfix" and result.rounds == 0
    assert result.completion_tokens == 0 and result.diagnostics_after == []
    assert result.diagnostics_before and result.diagnostics_before[0]["message"] == "expected ':'"


def test_a_misspelled_local_and_a_missing_import_are_fixed_together() -> None:
    backend = scripted.ScriptedBackend("    return junk\n")
    result = Pipeline(backend).fix("def f(obj):\n    return os.path.join(ojb)\n")
    assert result.text == "import os.path\ndef f(obj):\n    return os.path.join(obj)\n" and result.clean
    assert backend.requests == []


def test_the_model_gets_what_the_model_free_fixes_leave() -> None:
    """The missing colon is the parser's; the trailing ``+`` is the model's, which is shown only it."""
    code = "def f(a)\n    return a\n\n\ndef g(y):\n    return y +\n"
    prompts: list[str] = []

    def answer(request) -> str:
        prompts.append(request.prompt.prefix)
        return "    return y + 2\n"

    result = Pipeline(scripted.ScriptedBackend(answer)).fix(code)
    assert result.text == "def f(a):\n    return a\n\n\ndef g(y):\n    return y + 2\n" and result.clean
    assert len(prompts) == 1 and "expected ':'" not in prompts[0] and "def f(a):" not in prompts[0]
    assert prompts[0].endswith("# Fixed version:\ndef g(y):\n")
    assert result.finish_reason != "quickfix" and result.rounds >= 1


def test_the_model_alone_can_still_be_asked_for_comparisons() -> None:
    backend = scripted.ScriptedBackend("def f(a, b):\n    return a + b\n")
    result = Pipeline(backend).fix("def f(a, b)\n    return a + b\n", model_free=False)
    assert len(backend.requests) == 1 and result.finish_reason != "quickfix" and result.clean


def test_without_the_model_or_its_time_the_partial_fix_comes_back_unclean() -> None:
    code = "def f(a)\n    return a +\n"
    backend = scripted.ScriptedBackend("    return a + 1\n")
    result = Pipeline(backend).fix(code, use_model=False)
    assert backend.requests == [] and not result.clean
    assert result.text == "def f(a):\n    return a +\n"  # the colon is in; what is left is listed
    assert result.diagnostics_after and result.finish_reason == "quickfix"
    result = Pipeline(backend).fix(code, time_budget_s=0.5)  # below MIN_MODEL_FIX_S: no model
    assert backend.requests == [] and not result.clean


def test_nothing_to_fix_and_nothing_found_leave_the_code_as_it_was() -> None:
    code = "def f():\n    return undefined_a\n"
    result = Pipeline(scripted.ScriptedBackend("    return undefined_b\n"),
                      PipelineSettings(repair=RepairSettings(max_rounds=1))).fix(code)
    assert result.text == code and not result.clean


def test_fixes_lists_every_candidate_with_a_title_and_one_preferred() -> None:
    pipeline = Pipeline(scripted.ScriptedBackend("unused"))
    found = pipeline.fixes("def f(obj, job):\n    return ojb + job\n")
    assert sorted(f.title for f in found) == ["Replace 'ojb' with 'job'", "Replace 'ojb' with 'obj'"]
    assert [f.preferred for f in found] == [True] + [False] * (len(found) - 1)
    record = found[0].to_dict()
    assert record["kind"] == "name" and record["source"] == "names" and record["clean"] and record["diagnostics"] == []
    json.dumps(record)
    # Asked about one line: only that line's problems; asked about none, all of them, one after the other.
    code = "def f(obj):\n    return ojb\n\n\ndef g(item):\n    return itme\n"
    assert [f.title for f in pipeline.fixes(code, diagnostics=[{"line": 5, "message": "undefined"}])] == [
        "Replace 'itme' with 'item'"]
    everything = pipeline.fixes(code)[0]
    assert everything.steps == ("Replace 'ojb' with 'obj'", "Replace 'itme' with 'item'") and everything.clean()


def test_fixes_adds_the_models_fix_only_where_none_is_clean() -> None:
    backend = scripted.ScriptedBackend("    return y + 2\n")
    pipeline = Pipeline(backend)
    found = pipeline.fixes("def g(y):\n    return y +\n", include_model=True)
    assert [f.title for f in found] == ["Fix with GLM-5"] and found[0].kind == "model" and found[0].preferred
    assert found[0].text == "def g(y):\n    return y + 2\n"
    asked = len(backend.requests)
    assert [f.title for f in pipeline.fixes("def f(a)\n    return a\n", include_model=True)] == ["Insert missing ':'"]
    assert len(backend.requests) == asked  # a clean model-free fix: the model is not asked


def test_a_failing_generator_costs_its_fixes_only(monkeypatch) -> None:
    def broken(*_args: object) -> list:
        raise RuntimeError("boom")

    monkeypatch.setattr(names, "name_candidates", broken)
    backend = scripted.ScriptedBackend("    return obj\n")
    result = Pipeline(backend).fix("def f(obj):\n    return ojb\n")
    assert result.text == "def f(obj):\n    return obj\n" and result.clean and len(backend.requests) == 1


def test_batch_and_eval_fix_tasks_get_the_model_free_fixes(tmp_path: Path) -> None:
    backend = scripted.ScriptedBackend("    return junk\n")
    pipeline = Pipeline(backend)
    result = batch.run_task(pipeline, {"id": "1", "kind": "fix", "code": "def f(obj)\n    return ojb\n"})
    assert result.text == "def f(obj):\n    return obj\n" and result.clean
    problem = Problem(task_id="t", kind="fix", code="def f(x):\n    if x = 1:\n        return 2\n",
                      hints=[{"message": "f has a bug; fix it", "severity": "error", "source": "tests"}])
    text, result = generate_candidate(pipeline, problem)
    assert text == "def f(x):\n    if x == 1:\n        return 2\n" and result.clean
    assert backend.requests == []
