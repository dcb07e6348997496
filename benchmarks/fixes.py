"""Fix with GLM-5 on broken code: the share fixed and the time per fix, without the model and with it.

Three sources of broken code:

- **synthetic**: real top-level functions of installed packages (``--packages report``, the
  default: ``glm5_lsp.train.corpus.BENCHMARK_REPORT``, never tuned on; ``fit``: ``BENCHMARK_FIT``,
  for tuning), each with the imports it uses, checked clean first (it compiles, ruff and pyflakes
  report nothing), then broken by one seeded mutation of one class:

  ``colon`` a block's ``:`` deleted; ``bracket`` a closing bracket deleted; ``quote`` a one-line
  string's closing quote deleted; ``indent`` one statement line indented by a wrong amount;
  ``local`` one use of a local (3+ letters) misspelled; ``attribute`` one attribute of an imported
  module misspelled; ``imported`` one use of a ``from``-imported name misspelled; ``import`` one
  import the function needs removed; ``unused`` an unused standard-library import added;
  ``eq`` ``==`` in an ``if``/``elif``/``while`` condition written ``=``.

  A misspelling is one edit (two neighbours swapped, a letter dropped, doubled or replaced) that
  names nothing the snippet binds. *Fixed* means: the result compiles, has no pyflakes/ruff finding
  (the original had none) and is the original program again (the same AST, imports compared as a
  set): a valid but different name or bracket counts as not fixed.

- **debugbench**: DebugBench's Python syntax tasks (missing colons, unclosed parentheses and strings,
  illegal indentation, ``==``/``=`` misused) and reference-error tasks (undefined objects and methods,
  illegal keywords, faulty indexing), from ``../shared/benchmarks/debugbench``. Only tasks whose
  ``oracle_code`` passes its own examples here are kept (LeetCode's judge is not available offline;
  each example's ``Input``/``Output`` becomes an assertion, with LeetCode's usual imports). *Fixed*:
  compiles, no pyflakes/ruff finding the oracle does not have, examples pass.

- **humanevalfix**: HumanEvalPack's Python tasks, as ``glm5-lsp eval humanevalfix`` asks them
  (``Pipeline.fix`` with the example-test hint). *Fixed*: compiles, no finding the canonical
  solution does not have, the tests pass.

Configurations: ``quick`` (``Pipeline.fix(use_model=False)``: parsers, ruff, names), ``model``
(``Pipeline.fix`` on the embedded model: the model-free fixes first, the model for what they leave)
and ``model-only`` (``Pipeline.fix(model_free=False)``: the embedded model alone, which is what
"Fix with GLM-5" did before). ``--model-limit`` runs the model configurations on the first cases of
each class only (the quick configuration's figures for those same cases are in ``--out``).
Times are each ``Pipeline.fix`` call's wall clock; before a snippet is fixed, its original text is
warmed as the language server warms a file it opens (``quickfix.warm``, ``pynames.jedi.warm_jedi``).
Programs run in the evaluation sandbox (``glm5_lsp.evaluate.sandbox``).

    python benchmarks/fixes.py --per-class 30 --configs quick,model --seed 0 [--packages fit] [--out r.json]
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import io
import json
import logging
import random
import re
import sys
import time
import tokenize
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from glm5_lsp.backends.base import Completion, CompletionRequest
from glm5_lsp.checks.providers import default_runner
from glm5_lsp.evaluate.datasets import load_problems
from glm5_lsp.evaluate.sandbox import SandboxLimits, run_program
from glm5_lsp.pipeline import Pipeline, PipelineSettings
from glm5_lsp.pynames.jedi import warm_jedi
from glm5_lsp.quickfix import warm
from glm5_lsp.quickfix.names import attribute_problems
from glm5_lsp.train.corpus import BENCHMARK_FIT, BENCHMARK_REPORT, TEST_DIRS, VENDORED_DIRS

SHARED = ROOT.parent / "shared" / "benchmarks"
DEBUGBENCH = SHARED / "debugbench"
HUMANEVALFIX = SHARED / "humanevalpack" / "humanevalpack.jsonl"
CLASSES = ("colon", "bracket", "quote", "indent", "local", "attribute", "imported", "import", "unused", "eq")
SYNTAX_CLASSES = ("colon", "bracket", "quote", "indent", "eq")
NAME_CLASSES = ("local", "attribute", "imported", "import")
DEBUGBENCH_FILES = {
    "syntax": ("missing_colons", "unclosed_parentheses", "unclosed_string", "illegal_indentation", "misused_eq_or_assign"),
    "reference": ("undefined_objects", "undefined_methods", "illegal_keywords", "faulty_indexing"),
}
UNUSED_MODULES = ("os", "sys", "re", "json", "math", "itertools", "functools", "collections", "string", "textwrap",
                  "random", "shutil", "typing", "pathlib", "logging", "time", "copy", "struct")
LEETCODE_PRELUDE = """from typing import *
import collections, heapq, bisect, itertools, functools, math, string, re, operator
from collections import *
from itertools import *
from functools import *
from heapq import *
from bisect import *
from math import *

class ListNode:
    def __init__(self, val=0, next=None):
        self.val = val
        self.next = next

class TreeNode:
    def __init__(self, val=0, left=None, right=None):
        self.val = val
        self.left = left
        self.right = right

"""
log = logging.getLogger("benchmarks.fixes")


# ---- snippets from real functions --------------------------------------------------------------


@dataclass
class Snippet:
    origin: str  # package/file.py:function
    code: str  # the function with the imports it uses
    path: str = ""  # the source file


@dataclass
class Case:
    dataset: str  # "synthetic", "debugbench", "humanevalfix"
    kind: str  # the mutation class or the DebugBench/HumanEvalFix category
    name: str
    broken: str
    original: str = ""  # the working code (synthetic: what a right fix gives back)
    hints: list[dict] = field(default_factory=list)
    test_program: Callable[[str], str] | None = None  # candidate -> program whose exit status says pass/fail
    reference_findings: frozenset[tuple[str, str]] = frozenset()  # what the working code already has
    path: str | None = None  # the file the code comes from (its package is the fix's workspace)


def package_files(names: tuple[str, ...]) -> Iterator[tuple[str, Path]]:
    for name in names:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            log.warning("%s is not installed", name)
            continue
        for file in dist.files or []:
            parts = Path(str(file)).parts
            if not str(file).endswith(".py") or ".." in parts or set(parts) & (TEST_DIRS | VENDORED_DIRS):
                continue
            yield name, Path(str(dist.locate_file(file)))


def functions(names: tuple[str, ...], min_lines: int = 4, max_lines: int = 60) -> list[Snippet]:
    """Every top-level function of the packages, with the top-level imports whose names it uses."""
    out = []
    for package, path in package_files(names):
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
                   and not (isinstance(node, ast.ImportFrom) and (node.level or node.module == "__future__"))]
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if not min_lines <= node.end_lineno - start + 1 <= max_lines:
                continue
            lines = source.splitlines()[start - 1:node.end_lineno]
            body = "\n".join(lines) + "\n"
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            needed = []
            for statement in imports:
                kept = [a for a in statement.names if (a.asname or a.name.split(".")[0]) in used]
                if kept:
                    if isinstance(statement, ast.Import):
                        needed.append("import " + ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in kept))
                    else:
                        names_text = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in kept)
                        needed.append(f"from {statement.module} import {names_text}")
            head = "\n".join(needed) + "\n\n\n" if needed else ""
            out.append(Snippet(f"{package}/{path.name}:{node.name}", head + body, str(path)))
    return out


def is_clean(code: str, runner) -> bool:
    """It compiles, and neither the checkers nor the fixer's own attribute check find anything
    (``@asyncio.coroutine`` is gone from Python 3.11: code that uses it is not a fair original)."""
    try:
        compile(code, "<snippet>", "exec")
    except (SyntaxError, ValueError):
        return False
    return not runner.diagnose(code, "snippet.py", "python").diagnostics and not attribute_problems(code, None, 5.0)


def tokens(code: str) -> list[tokenize.TokenInfo]:
    return list(tokenize.generate_tokens(io.StringIO(code).readline))


def _offset(code: str, row: int, col: int) -> int:
    lines = code.split("\n")
    return sum(len(line) + 1 for line in lines[:row - 1]) + col


def misspell(word: str, rng: random.Random, taken: set[str]) -> str | None:
    for _ in range(20):
        i = rng.randrange(len(word))
        kind = rng.choice(("swap", "drop", "double", "replace"))
        if kind == "swap" and i < len(word) - 1 and word[i] != word[i + 1]:
            new = word[:i] + word[i + 1] + word[i] + word[i + 2:]
        elif kind == "drop" and len(word) > 3:
            new = word[:i] + word[i + 1:]
        elif kind == "double":
            new = word[:i] + word[i] + word[i:]
        elif kind == "replace" and word[i].isalpha():
            letter = rng.choice("abcdefghijklmnopqrstuvwxyz")
            new = word[:i] + (letter.upper() if word[i].isupper() else letter) + word[i + 1:]
        else:
            continue
        if new != word and new.isidentifier() and new not in taken and not new[0].isdigit():
            return new
    return None


def _bound_names(tree: ast.AST) -> set[str]:
    found = set(dir(__builtins__)) if not isinstance(__builtins__, dict) else set(__builtins__)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.alias):
            found.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
    return found


def mutate(snippet: Snippet, kind: str, rng: random.Random) -> str | None:
    """``snippet`` broken by one mutation of ``kind``, or None when it has nothing to break that way."""
    code = snippet.code
    tree = ast.parse(code)
    toks = tokens(code)
    if kind == "colon":
        spots = [t for i, t in enumerate(toks[:-1]) if t.string == ":" and t.type == tokenize.OP and
                 (toks[i + 1].type == tokenize.NEWLINE or (toks[i + 1].type == tokenize.COMMENT and i + 2 < len(toks)
                                                           and toks[i + 2].type == tokenize.NEWLINE))]
        return _delete_token(code, rng, spots)
    if kind == "bracket":
        return _delete_token(code, rng, [t for t in toks if t.type == tokenize.OP and t.string in ")]}"])
    if kind == "quote":
        spots = [t for t in toks if t.type == tokenize.STRING and t.start[0] == t.end[0]
                 and not t.string.endswith(('"""', "'''")) and len(t.string) >= 2]
        if not spots:
            return None
        t = rng.choice(spots)
        end = _offset(code, *t.end)
        return code[:end - 1] + code[end:]
    if kind == "indent":
        starts = [t for i, t in enumerate(toks) if i > 0 and toks[i - 1].type in (tokenize.NEWLINE, tokenize.INDENT,
                  tokenize.DEDENT) and t.type not in (tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE,
                  tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER) and t.start[1] > 0]
        rng.shuffle(starts)
        for t in starts:
            delta = rng.choice((4, 2, -1, -2, -3))
            line_start = _offset(code, t.start[0], 0)
            indent = t.start[1]
            if indent + delta < 0:
                continue
            new = code[:line_start] + " " * (indent + delta) + code[line_start + indent:]
            if not _compiles(new):
                return new
        return None
    if kind in ("local", "imported"):
        taken = _bound_names(tree)
        if kind == "local":
            function = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
            pool = {a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)} | \
                {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        else:
            pool = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
        uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                and n.id in pool and len(n.id) >= 3]
        if not uses:
            return None
        node = rng.choice(uses)
        new_name = misspell(node.id, rng, taken)
        if new_name is None:
            return None
        at = _offset(code, node.lineno, node.col_offset)
        return code[:at] + new_name + code[at + len(node.id):]
    if kind == "attribute":
        modules = {a.asname or a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
        reads = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                 and n.value.id in modules and len(n.attr) >= 3]
        if not reads:
            return None
        node = rng.choice(reads)
        new_name = misspell(node.attr, rng, _bound_names(tree))
        if new_name is None:
            return None
        end = _offset(code, node.end_lineno, node.end_col_offset)
        return code[:end - len(node.attr)] + new_name + code[end:]
    if kind == "import":
        lines = code.split("\n")
        spots = [i for i, line in enumerate(lines) if line.startswith(("import ", "from "))]
        if not spots:
            return None
        i = rng.choice(spots)
        statement = ast.parse(lines[i]).body[0]
        assert isinstance(statement, (ast.Import, ast.ImportFrom))
        if len(statement.names) == 1:
            del lines[i]
        else:
            drop = rng.randrange(len(statement.names))
            kept = [a for j, a in enumerate(statement.names) if j != drop]
            text = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in kept)
            lines[i] = f"import {text}" if isinstance(statement, ast.Import) else f"from {statement.module} import {text}"
        return "\n".join(lines)
    if kind == "unused":
        present = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                   for a in n.names} | _bound_names(tree)
        choices = [m for m in UNUSED_MODULES if m not in present]
        if not choices:
            return None
        module = rng.choice(choices)
        return f"import {module}\n" + code if not code.startswith(("import", "from")) else \
            re.sub(r"\A((?:(?:import|from) [^\n]*\n)+)", lambda m: m.group(1) + f"import {module}\n", code, count=1)
    if kind == "eq":
        tests = [n.test for n in ast.walk(tree) if isinstance(n, (ast.If, ast.While))]
        compares = [c for test in tests for c in ast.walk(test)
                    if isinstance(c, ast.Compare) and len(c.ops) == 1 and isinstance(c.ops[0], ast.Eq)]
        rng.shuffle(compares)
        for compare in compares:
            left_end = _offset(code, compare.left.end_lineno, compare.left.end_col_offset)
            right_start = _offset(code, compare.comparators[0].lineno, compare.comparators[0].col_offset)
            between = code[left_end:right_start]
            if between.count("==") != 1:
                continue
            at = left_end + between.index("==")
            new = code[:at] + "=" + code[at + 2:]
            if not _compiles(new):
                return new
        return None
    raise ValueError(kind)


def _delete_token(code: str, rng: random.Random, spots: list[tokenize.TokenInfo]) -> str | None:
    if not spots:
        return None
    t = rng.choice(spots)
    at = _offset(code, *t.start)
    return code[:at] + code[at + len(t.string):]


def _compiles(code: str) -> bool:
    try:
        compile(code, "<mutant>", "exec")
        return True
    except (SyntaxError, ValueError):
        return False


def synthetic_cases(packages: tuple[str, ...], per_class: int, seed: int, runner) -> list[Case]:
    rng = random.Random(seed)
    snippets = [s for s in functions(packages) if is_clean(s.code, runner)]
    rng.shuffle(snippets)
    log.info("%d clean functions", len(snippets))
    cases: list[Case] = []
    used: dict[str, int] = {}
    for kind in CLASSES:
        made = 0
        for snippet in sorted(snippets, key=lambda s: used.get(s.origin, 0)):  # unused functions first
            if made >= per_class:
                break
            broken = mutate(snippet, kind, rng)
            if broken is None or broken == snippet.code:
                continue
            if kind in ("local", "imported", "import", "unused") and \
                    not runner.diagnose(broken, "snippet.py", "python").diagnostics:
                continue  # the mutation broke nothing a checker sees (an attribute's is the fixer's own to find)
            used[snippet.origin] = used.get(snippet.origin, 0) + 1
            cases.append(Case("synthetic", kind, snippet.origin, broken, snippet.code, path=snippet.path))
            made += 1
    return cases


# ---- DebugBench and HumanEvalFix ---------------------------------------------------------------


def _method_name(code: str) -> str | None:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Solution":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and not item.name.startswith("_"):
                    return item.name
    return None


_LITERALS = {"true": "True", "false": "False", "null": "None"}


def _python_literal(text: str) -> str:
    return re.sub(r"\b(true|false|null)\b", lambda m: _LITERALS[m.group(1)], text.strip())


def debugbench_program(record: dict) -> Callable[[str], str] | None:
    """A test program for a DebugBench task (its examples as assertions), or None when the examples
    do not read as plain values."""
    method = _method_name(record["oracle_code"])
    if method is None or re.search(r"\b(ListNode|TreeNode|Node)\b", record["oracle_code"].split("def " + method)[1].split(")")[0]):
        return None
    checks = []
    for example in record.get("examples") or []:
        found = re.search(r"Input:\s*(.*?)\s*Output:\s*(.*?)(?:\n|$)", example, re.DOTALL)
        if not found:
            return None
        arguments, expected = _python_literal(found.group(1)), _python_literal(found.group(2))
        try:
            ast.parse(f"dict({arguments})", mode="eval")
            ast.literal_eval(expected)
        except (SyntaxError, ValueError):
            return None
        checks.append(f"assert Solution().{method}(**dict({arguments})) == {expected}")
    if not checks:
        return None
    tail = "\n".join(checks) + "\n"
    return lambda candidate: LEETCODE_PRELUDE + candidate + "\n\n" + tail


def findings(code: str, runner) -> frozenset[tuple[str, str]]:
    return frozenset((d.code, d.message) for d in runner.diagnose(code, "task.py", "python").diagnostics)


def debugbench_cases(runner, limit: int | None, half: str = "all") -> list[Case]:
    """DebugBench's tasks (``half``: "dev", the even-numbered tasks of each file, looked at while
    the fixer was written; "report", the odd-numbered ones; "all")."""
    cases = []
    for group, files in DEBUGBENCH_FILES.items():
        for stem in files:
            path = DEBUGBENCH / f"python3_{stem}.json"
            records = json.loads(path.read_text(encoding="utf-8"))
            if half != "all":
                records = records[0 if half == "dev" else 1::2]
            kept = 0
            for record in records:
                if limit is not None and kept >= limit:
                    break
                program = debugbench_program(record)
                if program is None or not run_program(program(record["oracle_code"]), SandboxLimits(timeout_s=10)).passed:
                    continue
                kept += 1
                cases.append(Case("debugbench", f"{group}:{stem}", record["slug"], record["buggy_code"],
                                  record["oracle_code"], test_program=program,
                                  reference_findings=findings(record["oracle_code"], runner)))
    return cases


def humanevalfix_cases(runner, limit: int | None) -> list[Case]:
    problems, _ = load_problems("humanevalfix", HUMANEVALFIX, limit=limit)
    records = {}
    for line in HUMANEVALFIX.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            records[record["task_id"]] = record
    cases = []
    for problem in problems:
        record = records[problem.task_id]
        canonical = record["declaration"] + record["canonical_solution"]
        cases.append(Case("humanevalfix", record.get("bug_type", "bug"), problem.task_id, problem.code, canonical,
                          hints=problem.hints, test_program=problem.program,
                          reference_findings=findings(canonical, runner)))
    return cases


# ---- judging and running ------------------------------------------------------------------------


def normalized(code: str) -> tuple[frozenset, str] | None:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    imports = set()
    rest = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            imports |= {(None, a.name, a.asname, 0) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imports |= {(node.module, a.name, a.asname, node.level) for a in node.names}
        else:
            rest.append(node)
    return frozenset(imports), ast.dump(ast.Module(body=rest, type_ignores=[]))


@dataclass
class Outcome:
    dataset: str
    kind: str
    name: str
    config: str
    clean: bool  # compiles, no finding the working code does not have
    right: bool  # synthetic: the original program again; with tests: they pass
    seconds: float
    model_used: bool
    answer: str = ""
    broken: str = ""
    original: str = ""


def judge_case(case: Case, text: str, runner) -> tuple[bool, bool]:
    if not _compiles(text):
        return False, False
    extra = findings(text, runner) - case.reference_findings
    clean = not extra
    if case.test_program is not None:
        right = clean and run_program(case.test_program(text), SandboxLimits(timeout_s=10)).passed
    else:
        right = clean and normalized(text) == normalized(case.original)
    return clean, right


def run_config(pipeline: Pipeline, config: str, cases: list[Case], runner, use_model: bool,
               model_free: bool = True) -> list[Outcome]:
    outcomes = []
    for number, case in enumerate(cases, 1):
        if case.original:  # the file as it was when opened, before it broke
            warm(case.original, case.path)
            warm_jedi(case.original, case.path)
        started = time.perf_counter()
        result = pipeline.fix(case.broken, diagnostics=case.hints or None, path=case.path, use_model=use_model,
                              model_free=model_free)
        seconds = time.perf_counter() - started
        clean, right = judge_case(case, result.text, runner)
        outcomes.append(Outcome(case.dataset, case.kind, case.name, config, clean, right, seconds,
                                result.finish_reason != "quickfix" and result.completion_tokens > 0, result.text,
                                case.broken, case.original))
        if number % 50 == 0:
            log.info("%s: %d/%d", config, number, len(cases))
    return outcomes


class NoModel:
    """Stands in for a model in the quick configuration: it is never asked (``use_model=False``)."""

    name = "none"
    supports_internals = False

    def load(self) -> None:
        pass

    def complete(self, request: CompletionRequest) -> Completion:
        raise AssertionError("the quick configuration must not reach the model")


def percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * (len(ordered) - 1))))]


def table(outcomes: list[Outcome], configs: list[str]) -> str:
    groups: dict[tuple[str, str], dict[str, list[Outcome]]] = {}
    for outcome in outcomes:
        groups.setdefault((outcome.dataset, outcome.kind), {}).setdefault(outcome.config, []).append(outcome)
    head = "| dataset | class |" + "".join(f" {c}: n | fixed | clean | p50 ms | p95 ms |" for c in configs)
    rows = [head, "|" + " --- |" * (2 + 5 * len(configs))]
    for (dataset, kind), by_config in groups.items():
        rows.append(f"| {dataset} | {kind} |" + "".join(_cells(by_config.get(c, [])) for c in configs))
    for dataset in dict.fromkeys(o.dataset for o in outcomes):
        rows.append(f"| {dataset} | **all** |" + "".join(
            _cells([o for o in outcomes if o.dataset == dataset and o.config == c]) for c in configs))
    return "\n".join(rows)


def paired_table(outcomes: list[Outcome], configs: list[str]) -> str:
    """The share fixed per class on the cases every configuration ran (the model ones may have run
    on the first cases of each class only)."""
    by_case: dict[tuple[str, str, str, str], dict[str, Outcome]] = {}
    for outcome in outcomes:
        by_case.setdefault((outcome.dataset, outcome.kind, outcome.name, outcome.broken), {})[outcome.config] = outcome
    groups: dict[tuple[str, str], list[dict[str, Outcome]]] = {}
    for (dataset, kind, _, _), runs in by_case.items():
        if all(c in runs for c in configs):
            groups.setdefault((dataset, kind), []).append(runs)
            groups.setdefault((dataset, "**all**"), []).append(runs)
    rows = ["| dataset | class | n |" + "".join(f" {c}: fixed | {c}: clean |" for c in configs),
            "|" + " --- |" * (3 + 2 * len(configs))]
    for (dataset, kind), runs in sorted(groups.items(), key=lambda item: (item[0][0], item[0][1] == "**all**")):
        cells = "".join(f" {100 * sum(r[c].right for r in runs) / len(runs):.0f}% |"
                        f" {100 * sum(r[c].clean for r in runs) / len(runs):.0f}% |" for c in configs)
        rows.append(f"| {dataset} | {kind} | {len(runs)} |{cells}")
    return "\n".join(rows)


def _cells(items: list[Outcome]) -> str:
    if not items:
        return " 0 | - | - | - | - |"
    times = [o.seconds * 1000 for o in items]
    return (f" {len(items)} | {100 * sum(o.right for o in items) / len(items):.0f}%"
            f" | {100 * sum(o.clean for o in items) / len(items):.0f}% | {percentile(times, 0.5):.0f}"
            f" | {percentile(times, 0.95):.0f} |")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packages", choices=("report", "fit"), default="report")
    parser.add_argument("--per-class", type=int, default=30, help="synthetic snippets per mutation class")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--datasets", default="synthetic,debugbench,humanevalfix")
    parser.add_argument("--configs", default="quick,model",
                        help="quick (no model), model (the embedded model after the quick fixes), "
                             "model-only (the embedded model alone: Fix with GLM-5 before the model-free fixes)")
    parser.add_argument("--limit", type=int, default=None, help="DebugBench tasks per file and HumanEvalFix tasks, at most")
    parser.add_argument("--model-limit", type=int, default=None, help="cases per dataset class for the model configuration")
    parser.add_argument("--debugbench-half", choices=("all", "dev", "report"), default="report",
                        help="DebugBench's even-numbered tasks (dev: looked at while the fixer was written), odd ones, or all")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="write every outcome as JSON here")
    parser.add_argument("--from-json", default=None, help="print the tables of a run saved with --out, and stop")
    parser.add_argument("--verbose", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:  # the tables of a saved run
        outcomes = [Outcome(**row) for row in json.loads(Path(args.from_json).read_text(encoding="utf-8"))]
        configs = list(dict.fromkeys(o.config for o in outcomes))
        print(table(outcomes, configs))
        print("\nOn the cases every configuration ran:\n")
        print(paired_table(outcomes, configs))
        return 0
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    runner = default_runner("python")
    packages = BENCHMARK_REPORT if args.packages == "report" else BENCHMARK_FIT
    cases: list[Case] = []
    datasets = args.datasets.split(",")
    if "synthetic" in datasets:
        cases += synthetic_cases(packages, args.per_class, args.seed, runner)
    if "debugbench" in datasets:
        cases += debugbench_cases(runner, args.limit, args.debugbench_half)
    if "humanevalfix" in datasets:
        cases += humanevalfix_cases(runner, args.limit)
    configs = args.configs.split(",")
    print(f"{len(cases)} cases ({', '.join(f'{d}: {sum(c.dataset == d for c in cases)}' for d in datasets)}); "
          f"packages: {args.packages}; seed {args.seed}")
    warm()
    outcomes: list[Outcome] = []
    if "quick" in configs:
        outcomes += run_config(Pipeline(NoModel()), "quick", cases, runner, use_model=False)
    if "model" in configs or "model-only" in configs:
        import torch

        from glm5_lsp.backends.local import LocalBackend
        from glm5_lsp.model import default_model_path

        torch.set_num_threads(args.threads)
        backend = LocalBackend(default_model_path())
        backend.load()
        chosen = cases
        if args.model_limit is not None:
            count: dict[tuple[str, str], int] = {}
            chosen = []
            for case in cases:
                key = (case.dataset, case.kind)
                if count.get(key, 0) < args.model_limit:
                    count[key] = count.get(key, 0) + 1
                    chosen.append(case)
        pipeline = Pipeline(backend, PipelineSettings(unhurried=True))
        if "model-only" in configs:
            outcomes += run_config(pipeline, "model-only", chosen, runner, use_model=True, model_free=False)
        if "model" in configs:
            outcomes += run_config(pipeline, "model", chosen, runner, use_model=True)
    print(table(outcomes, configs))
    if len(configs) > 1:
        print("\nOn the cases every configuration ran:\n")
        print(paired_table(outcomes, configs))
    if args.out:
        Path(args.out).write_text(json.dumps([asdict(o) for o in outcomes], indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
