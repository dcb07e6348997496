"""Held-out workspaces for fitting and measuring the memory: installed packages copied to folders.

``glm5_lsp.train.corpus`` keeps two lists of installed packages out of training: ``BENCHMARK_FIT``
(the memory's interpolation may be fitted on them) and ``BENCHMARK_REPORT`` (figures only). Each is
copied into its own folder, as a user's checkout would be, and cursors are seeded in its files the
way the editor benchmarks place them: two characters into an identifier of a code line (``at="word"``)
or right after a space that follows code on the line (``at="space"``: ``return |``, ``total = |``,
``f(a, |``, where typing pauses between words), or at a code line's indentation (``at="line"``: a new
line, its whole code to come), the rest of that line cut off, the lines below kept.
"""

from __future__ import annotations

import random
import re
import shutil
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")
_NEXT_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[^\sA-Za-z0-9_]+|[0-9]+")
CURSORS = ("word", "space", "line")


def package_files(name: str) -> list[tuple[str, Path]]:
    """``(relative path, installed path)`` of a distribution's ``.py`` files (scripts installed
    outside its folder left out)."""
    dist = metadata.distribution(name)
    out = []
    for entry in dist.files or ():
        if entry.suffix != ".py" or ".." in entry.parts:
            continue
        path = Path(dist.locate_file(entry))
        if path.is_file():
            out.append((entry.as_posix(), path))
    return sorted(out)


def copy_package(name: str, dest: Path) -> Path:
    """Copy a distribution's source files into ``dest/<name>`` (a fresh workspace); returns it."""
    root = dest / name
    for rel, path in package_files(name):
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return root


@dataclass(frozen=True)
class Case:
    """One seeded cursor: ``document`` is the file with the cursor line cut at ``offset``."""

    path: Path
    document: str
    offset: int
    line: int
    rest: str  # the real rest of the line after the cursor (its trailing spaces stripped)
    word: str  # the identifier the cursor is in, whole (after a space: the word or symbol run it begins)
    typed: int = 2  # how much of ``word`` is before the cursor (0 after a space)


def cursor_cases(path: Path, count: int, rng: random.Random, at: str = "word") -> list[Case]:
    """Up to ``count`` cases in one file, on code lines (not a comment or a string-only line): cut two
    characters into one of the line's identifiers (``at="word"``), right after one of its single
    spaces that follows code and comes before more code (``at="space"``), or at its indentation's end
    (``at="line"``: the whole line's code is the rest)."""
    if at not in CURSORS:
        raise ValueError(f"unknown cursor kind {at!r} (one of {', '.join(CURSORS)})")
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    candidates = []
    for number, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", '"', "'")):
            continue
        indent = len(line) - len(line.lstrip())
        columns = (_word_columns(line, indent) if at == "word" else _space_columns(line, indent) if at == "space"
                   else _line_columns(line, indent))
        if columns:
            candidates.append((number, columns))
    cases = []
    for number, columns in rng.sample(candidates, min(count, len(candidates))):
        column, word = rng.choice(columns)
        line = lines[number]
        document = "\n".join([*lines[:number], line[:column], *lines[number + 1:]])
        offset = sum(len(x) + 1 for x in lines[:number]) + column
        cases.append(Case(path, document, offset, number, line[column:].rstrip(), word, 2 if at == "word" else 0))
    return cases


def _word_columns(line: str, indent: int) -> list[tuple[int, str]]:
    return [(m.start() + 2, m.group(0)) for m in _IDENTIFIER.finditer(line)
            if m.start() >= indent and "#" not in line[:m.start()]]


def _line_columns(line: str, indent: int) -> list[tuple[int, str]]:
    match = _NEXT_WORD.match(line, indent)
    return [(indent, match.group(0))] if match else []


def _space_columns(line: str, indent: int) -> list[tuple[int, str]]:
    out = []
    for column in range(indent + 2, len(line)):
        if line[column - 1] != " " or line[column - 2] == " " or line[column] == " " or "#" in line[:column]:
            continue
        match = _NEXT_WORD.match(line, column)
        if match:
            out.append((column, match.group(0)))
    return out


def seeded_cases(root: Path, count: int, seed: int = 0, per_file: int = 2, at: str = "word") -> list[Case]:
    """``count`` cases over a workspace's files, seeded: at most ``per_file`` in one file, or as
    many as it takes to reach ``count`` in a package of few files; ``at``: the cursors' kind
    (:func:`cursor_cases`)."""
    rng = random.Random(seed)
    files = sorted(p for p in root.rglob("*.py") if p.stat().st_size > 200)
    per_file = max(per_file, -(-count // max(len(files), 1)))
    rng.shuffle(files)
    cases: list[Case] = []
    for path in files:
        if len(cases) >= count:
            break
        try:
            cases.extend(cursor_cases(path, min(per_file, count - len(cases)), rng, at))
        except (OSError, UnicodeDecodeError):
            continue
    return cases[:count]
