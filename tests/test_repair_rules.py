"""Repair rules: exception templates with adaptive fill, style consistency, performance hints
(data in ``tests/data/repair/{templates_document.py,style/,perf/}``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from glm5_lsp.backends.base import Completion, CompletionRequest
from glm5_lsp.checks.perf_hints import perf_hints
from glm5_lsp.checks.providers import DiagnosticRunner, default_providers
from glm5_lsp.repair.exceptions import (
    CombinedExceptions,
    DocumentExceptions,
    JediExceptions,
    SymbolTableExceptions,
    exception_rewriter,
    exception_site,
    handler_templates,
    narrow_broad_handlers,
    templates_at,
)
from glm5_lsp.repair.loop import RepairLoop, RepairSettings, RepairTarget
from glm5_lsp.repair.style import StyleConsistency, detect_style, name_case
from glm5_lsp.spans import Prompt

DATA = Path(__file__).parent / "data" / "repair"
DOCUMENT = (DATA / "templates_document.py").read_text()


class FixedExceptions:
    """A stand-in for the symbol table: fixed answers per called name."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table

    def exception_classes(self, code: str, called) -> list[str]:
        return [e for name in called for e in self.table.get(name, [])]


# ---- templates -------------------------------------------------------------------------------


def test_exception_site_detection() -> None:
    site = exception_site("def f():\n    try:\n        x = load(p)\n        save(p, x)\n    except")
    assert site is not None and site.kind == "except" and site.indent == "    "
    assert site.called == ("load", "save")
    assert exception_site("    raise").kind == "raise"  # type: ignore[union-attr]
    assert exception_site("    x = 1") is None


def test_document_exceptions_follow_the_called_functions() -> None:
    known = DocumentExceptions()
    assert known.exception_classes(DOCUMENT, ["load"]) == ["ConfigError"]
    assert known.exception_classes(DOCUMENT, ["load", "save"]) == ["ConfigError", "StoreError"]
    assert known.exception_classes(DOCUMENT, []) == ["ConfigError", "StoreError"]  # a raise site


def test_templates_are_filled_not_bare_exception() -> None:
    prefix = DOCUMENT + "\n\ndef main(p):\n    try:\n        return load(p)\n    except"
    templates = templates_at(prefix, DOCUMENT, DocumentExceptions())
    assert templates == ["except ConfigError as exc:\n        raise\n"]
    assert templates_at(DOCUMENT + "\n\ndef f():\n    raise", DOCUMENT, DocumentExceptions()) == [
        'raise ConfigError("")', 'raise StoreError("")']
    site = exception_site("    except")
    assert handler_templates(site, ["A", "B"])[0] == "except (A, B) as exc:\n        raise\n"
    assert all("except Exception" not in t for t in templates)


def test_jedi_finds_what_called_apis_raise() -> None:
    code = "import json\n\ndef f(text):\n    return json.loads(text)\n"
    found = JediExceptions().exception_classes(code, ["json.loads", "int"])
    assert "json.JSONDecodeError" in found and "ValueError" in found


def test_broad_handler_in_a_candidate_is_narrowed() -> None:
    code = "def f(p):\n    try:\n        return load(p)\n    except Exception as e:\n        return None\n"
    known = FixedExceptions({"load": ["ConfigError", "OSError"]})
    narrowed = narrow_broad_handlers(code, 0, 10, known)
    assert narrowed is not None and "except (ConfigError, OSError) as e:" in narrowed
    bare = code.replace("except Exception as e:", "except:")
    assert "except (ConfigError, OSError):" in narrow_broad_handlers(bare, 0, 10, known)  # type: ignore[operator]
    assert narrow_broad_handlers(code, 0, 2, known) is None  # the handler is outside the candidate's lines
    assert narrow_broad_handlers(code, 0, 10, FixedExceptions({})) is None  # nothing known: left alone


def test_symbol_table_exceptions_adapter() -> None:
    @dataclass
    class Symbol:
        name: str
        kind: str
        signature: str
        parent: str | None = None

    @dataclass
    class Summary:
        symbols: list

    class Table:
        def summaries(self):
            return [Summary([Symbol("ParseError", "class", "class ParseError(ValueError)"),
                             Symbol("Parser", "class", "class Parser(Base)"),
                             Symbol("parse", "function", "def parse(text)")])]

    assert SymbolTableExceptions(Table()).exception_classes("", []) == ["ParseError"]
    combined = CombinedExceptions([FixedExceptions({"parse": ["ValueError"]}), SymbolTableExceptions(Table())])
    assert combined.exception_classes("", ["parse"]) == ["ValueError"]


class OneShot:
    name, supports_internals = "one-shot", False

    def __init__(self, text: str) -> None:
        self.text = text

    def complete(self, request: CompletionRequest) -> Completion:
        return Completion(self.text, "stop", logprob=-1.0, completion_tokens=3)


def test_loop_applies_the_exception_rewriter() -> None:
    document = DOCUMENT + "\n\ndef main(p):\n    "
    candidate = "try:\n        return load(p)\n    except Exception:\n        return None\n"
    target = RepairTarget(document, len(document), len(document), "m.py", "python")
    runner = DiagnosticRunner(default_providers("python", use_external=False))
    loop = RepairLoop(OneShot(candidate), RepairSettings(), runner,
                      rewriters=[exception_rewriter(CombinedExceptions([DocumentExceptions()]))])
    result = loop.run(CompletionRequest(Prompt(document)), target)
    assert result.clean and result.text == candidate.replace("except Exception:", "except ConfigError:")


# ---- style -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name,case", [
    ("read_config", "snake"), ("readConfig", "camel"), ("ConfigStore", "pascal"), ("MAX_ITEMS", "upper"),
    ("value", None), ("_private_name", "snake"), ("x", None),
])
def test_name_case(name: str, case: str | None) -> None:
    assert name_case(name) == case


def test_detect_python_style() -> None:
    profile = detect_style((DATA / "style" / "snake_double.py").read_text())
    assert profile.naming == {"function": "snake", "variable": "snake", "class": "pascal"}
    assert profile.quote == '"' and profile.comment_space is True


def test_detect_javascript_style() -> None:
    profile = detect_style((DATA / "style" / "camel_single.js").read_text(), "javascript")
    assert profile.naming == {"function": "camel", "variable": "camel"} and profile.quote == "'"


def test_style_fix_and_violations() -> None:
    profile = detect_style((DATA / "style" / "snake_double.py").read_text())
    candidate = "def loadAll(path_name):\n    rawText = open(path_name, 'r').read()  #raw\n    return 'it\\'s'\n"
    fixed = profile.fix(candidate)
    assert "open(path_name, \"r\")" in fixed and "# raw" in fixed
    assert "'it\\'s'" in fixed  # a backslash inside: left alone
    remaining = profile.violations(fixed)
    assert any("loadAll" in v for v in remaining) and any("rawText" in v for v in remaining)
    assert len(remaining) == 3  # two names and the literal with an escaped quote
    assert profile.violations("def load_all(x):\n    raw_text = x  # ok\n") == []


def test_style_ranks_down_a_candidate_breaking_naming() -> None:
    style = StyleConsistency()
    document = (DATA / "style" / "snake_double.py").read_text() + "\n\ndef count_lines(path_name):\n    "
    target = RepairTarget(document, len(document), len(document), "s.py", "python")
    assert style.penalty("lineCount = 3\n    return lineCount", target) == 1
    assert style.penalty("line_count = 3\n    return line_count", target) == 0
    assert style.rewrite("return open(path_name, 'r')", target) == 'return open(path_name, "r")'


# ---- performance hints ------------------------------------------------------------------------

EXPECTED = json.loads((DATA / "perf" / "expected.json").read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_perf_hints(name: str) -> None:
    code = (DATA / "perf" / name).read_text()
    hints = perf_hints(code)
    assert [[h.line, h.rule] for h in hints] == EXPECTED[name]
    for hint in hints:
        assert hint.message and hint.rewrite
        compile(hint.rewrite.split("#")[0].strip().split("\n")[0] or "pass", "rewrite", "exec")


def test_perf_hint_rewrites_name_the_code() -> None:
    (hint,) = perf_hints((DATA / "perf" / "list_membership.py").read_text())
    assert hint.rewrite == "seen_set = set(seen)  # before the loop\nx in seen_set"
    (hint,) = perf_hints((DATA / "perf" / "attribute_lookup.py").read_text())
    assert hint.rewrite.startswith("append = self.results.values.append")
    assert perf_hints("def broken(:\n") == []


def test_symbol_table_exceptions_over_the_real_symbol_table(tmp_path: Path) -> None:
    symbols = pytest.importorskip("glm5_lsp.context.symbols")
    table = symbols.SymbolTable(DATA / "workspace", cache_dir=tmp_path)
    table.index_workspace()
    assert SymbolTableExceptions(table).exception_classes("", []) == ["ParseError"]
    assert templates_at("def f():\n    raise", "", SymbolTableExceptions(table)) == ['raise ParseError("")']


def test_style_of_a_named_file_is_reread_only_when_it_changes_much() -> None:
    from glm5_lsp.repair.style import StyleConsistency

    snake = "".join(f"def do_thing_{i}(a):\n    return a\n" for i in range(10))
    camel = "".join(f"def doThing{i}(a):\n    return a\n" for i in range(40))
    style = StyleConsistency()
    first = style.profile(snake, "python", "m.py")
    assert first.naming.get("function") == "snake"
    assert style.profile(snake + "x = 1\n", "python", "m.py") is first  # one line typed: not re-read
    assert style.profile(camel, "python", "m.py").naming.get("function") == "camel"  # rewritten: re-read
    assert style.profile(camel, "python").naming.get("function") == "camel"  # no path: by content


def test_a_file_s_style_read_when_it_opens_is_not_read_again_by_its_first_request(monkeypatch, caplog) -> None:
    import glm5_lsp.repair.style as style_module
    from glm5_lsp.repair.standard import standard_loop

    loop = standard_loop(object(), exception_fill=False)  # a served model's loop: no monitor
    document = (DATA / "style" / "snake_double.py").read_text()
    loop.warm(document, "python", "s.py")
    monkeypatch.setattr(style_module, "detect_style", lambda *a, **k: pytest.fail("read again"))
    typed = document + "\n\ndef count_lines(path_name):\n    "
    target = RepairTarget(typed, len(typed), len(typed), "s.py", "python")
    (rewrite,), (penalty,) = loop.rewriters, loop.penalties
    assert rewrite("return open(path_name, 'r')", target) == 'return open(path_name, "r")'
    assert penalty("lineCount = 3", target) == 1

    def broken(document: str, language: str, path: str) -> None:
        raise RuntimeError("no")

    loop.warmers.append(broken)
    loop.warm(document, "python", "t.py")  # logged, not raised
    assert "could not read t.py ahead of the requests" in caplog.text


def test_a_files_style_read_from_several_threads_at_once_is_its_own() -> None:
    """A warm-up thread reads one file's conventions while requests read others': each gets its
    document's, and the memory of them stays bounded."""
    import threading

    snake = "".join(f"def do_thing_{i}(a):\n    return 'x'\n" for i in range(8))
    camel = "".join(f"def doThing{i}(a):\n    return \"x\"\n" for i in range(8))
    style = StyleConsistency()
    wrong: list[str] = []

    def read(worker: int) -> None:
        for i in range(150):
            kind = (worker + i) % 2
            path = f"w{worker}_{i}.py"
            profile = style.profile(camel if kind else snake, "python", path)
            if profile.naming.get("function") != ("camel" if kind else "snake"):
                wrong.append(path)

    threads = [threading.Thread(target=read, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not wrong
    assert len(style._by_path) <= 256
