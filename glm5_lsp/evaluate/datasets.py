"""Benchmark files as :class:`Problem` s: what the pipeline is asked, and how a candidate is tested.

- ``humaneval``: HumanEval (``HumanEval.jsonl[.gz]``): continue the signature plus docstring.
- ``humaneval-infilling``: single-line, multi-line or random-span infilling (``HumanEval-*Infilling*.jsonl[.gz]``):
  fill the middle between ``prompt`` and ``suffix``. The subset comes from ``--subset`` or the file.
- ``humanevalfix``: HumanEvalPack Python (``humanevalpack.jsonl``): the declaration plus the buggy
  body, with the example tests as the hint; the pipeline returns the whole fixed function.
- ``mbpp``: either CodeT's sanitized file (``prompt`` with a signature and docstring, ``test``) or the
  original ``mbpp.jsonl`` (``text``, ``test_list``: the paper's prompt, the description plus the tests).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NAMES: tuple[str, ...] = ("humaneval", "humaneval-infilling", "humanevalfix", "mbpp")
SUBSETS: tuple[str, ...] = ("single-line", "multi-line", "random-span")


class DatasetError(ValueError):
    """A benchmark file that is missing, unreadable or not the benchmark asked for."""


@dataclass
class Problem:
    """One benchmark task: the request for the pipeline and the test program around a candidate."""

    task_id: str
    kind: str  # "generate" (prompt), "complete" (prefix + suffix), "fix" (code + hints)
    prompt: str = ""  # generate
    prefix: str = ""  # complete
    suffix: str = ""
    multiline: bool | None = None
    code: str = ""  # fix
    hints: list[dict[str, Any]] = field(default_factory=list)
    program_head: str = ""  # test program = program_head + candidate + joiner + program_tail
    program_tail: str = ""
    joiner: str = "\n"  # "" for infilling: the middle sits exactly between prefix and suffix

    def program(self, candidate: str) -> str:
        return f"{self.program_head}{candidate}{self.joiner}{self.program_tail}"


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Records of a ``.jsonl`` or ``.jsonl.gz`` file (blank lines skipped)."""
    if not path.is_file():
        raise DatasetError(f"no such file: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:  # type: ignore[operator]
            for number, line in enumerate(handle, 1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError as error:
                        raise DatasetError(f"{path} line {number}: not JSON ({error.msg})") from None
    except (OSError, EOFError) as error:
        raise DatasetError(f"cannot read {path}: {error}") from None


def _need(record: dict[str, Any], keys: tuple[str, ...], path: Path, name: str) -> None:
    missing = [key for key in keys if key not in record]
    if missing:
        raise DatasetError(f"{path} does not look like {name}: a record lacks {', '.join(missing)}")


def infer_subset(path: Path, first_task_id: str) -> str:
    """The infilling subset from the file name or the task id (``SingleLineInfilling/HumanEval/0/L0``)."""
    probe = (path.name + " " + first_task_id).lower()
    for marker, subset in (("singleline", "single-line"), ("multiline", "multi-line"), ("randomspan", "random-span")):
        if marker in probe:
            return subset
    raise DatasetError(f"cannot tell the infilling subset of {path}; pass --subset {{{','.join(SUBSETS)}}}")


def load_problems(name: str, path: Path, subset: str | None = None, limit: int | None = None) -> tuple[list[Problem], str | None]:
    """The first ``limit`` problems of benchmark ``name`` in ``path``, and the infilling subset used."""
    if name not in NAMES:
        raise DatasetError(f"unknown benchmark {name!r}; expected one of {NAMES}")
    problems: list[Problem] = []
    for record in read_jsonl(path):
        if limit is not None and len(problems) >= limit:
            break
        if name == "humaneval":
            problems.append(_humaneval(record, path))
        elif name == "humaneval-infilling":
            _need(record, ("task_id", "prompt", "suffix", "test", "entry_point"), path, name)
            subset = subset or infer_subset(path, record["task_id"])
            problems.append(_infilling(record, subset))
        elif name == "humanevalfix":
            problems.append(_humanevalfix(record, path))
        else:
            problems.append(_mbpp(record, path))
    if not problems:
        raise DatasetError(f"{path} holds no problems")
    return problems, subset


def _humaneval(record: dict[str, Any], path: Path) -> Problem:
    _need(record, ("task_id", "prompt", "test", "entry_point"), path, "HumanEval")
    return Problem(
        task_id=record["task_id"], kind="generate", prompt=record["prompt"], program_head=record["prompt"],
        program_tail=f"\n{record['test']}\ncheck({record['entry_point']})\n",
    )


def _infilling(record: dict[str, Any], subset: str) -> Problem:
    prefix, suffix = record["prompt"], record["suffix"]
    return Problem(
        task_id=record["task_id"], kind="complete", prefix=prefix, suffix=suffix,
        multiline=subset != "single-line", program_head=prefix, joiner="",
        program_tail=suffix + f"\n{record['test']}\ncheck({record['entry_point']})\n",
    )


def _humanevalfix(record: dict[str, Any], path: Path) -> Problem:
    _need(record, ("task_id", "declaration", "buggy_solution", "test", "entry_point"), path, "HumanEvalPack")
    example = record.get("example_test") or ""
    asserts = [line.strip() for line in example.splitlines() if line.strip().startswith("assert")][:3]
    hint = f"{record['entry_point']} has a bug; fix it"
    if asserts:
        hint += " so that these pass: " + "; ".join(asserts)
    return Problem(
        task_id=record["task_id"], kind="fix", code=record["declaration"] + record["buggy_solution"],
        hints=[{"message": hint, "severity": "error", "source": "tests"}],
        program_tail=f"\n{record['test']}\n",
    )


def _mbpp(record: dict[str, Any], path: Path) -> Problem:
    if "prompt" in record and "test" in record:  # CodeT's sanitized file: signature + docstring
        _need(record, ("task_id", "entry_point"), path, "MBPP (sanitized)")
        return Problem(
            task_id=str(record["task_id"]), kind="generate", prompt=record["prompt"], program_head=record["prompt"],
            program_tail=f"\n{record['test']}\ncheck({record['entry_point']})\n",
        )
    _need(record, ("task_id", "text", "test_list"), path, "MBPP")
    tests = "\n".join(record["test_list"])
    instruction = f"{record['text']}\nYour code should pass these tests:\n{tests}"
    setup = record.get("test_setup_code") or ""
    return Problem(
        task_id=str(record["task_id"]), kind="generate", prompt=instruction,
        program_head=setup + "\n" if setup else "", program_tail=f"\n{tests}\n",
    )
