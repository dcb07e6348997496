"""Guards against training on what is measured: source files that contain HumanEval text, and
files that copy the code of a package kept out of training (:func:`copied_files`).

The fingerprints are the distinctive lines of every HumanEval prompt (the ``def`` signature and the
docstring prose, whitespace-collapsed, at least ``min_chars`` long), kept only as SHA-1 digests so a
guard file can travel to a machine that has no copy of the benchmarks. A file is contaminated when
``min_hits`` distinct fingerprint lines occur in it (one by default: no file of the
standard library matches even one). HumanEval-infilling and HumanEvalPack are built
from the same problems, so one set of fingerprints covers them.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

# Where the HumanEval problems sit inside a benchmarks folder, in order of preference.
_HUMANEVAL_FILES: tuple[str, ...] = ("humaneval/HumanEval.jsonl.gz", "humaneval/HumanEval.jsonl")


def normalise_line(line: str) -> str:
    """Collapse whitespace and strip docstring quotes, so indentation and quoting do not matter."""
    return " ".join(line.replace('"""', " ").replace("'''", " ").split())


def _digest(line: str) -> str:
    return hashlib.sha1(line.encode("utf-8")).hexdigest()


def prompt_lines(prompt: str, min_chars: int) -> Iterator[str]:
    """The distinctive lines of one prompt: signatures and docstring prose, not doctest lines."""
    for raw in prompt.splitlines():
        line = normalise_line(raw)
        if len(line) < min_chars or line.startswith((">>>", "from ", "import ", "#")):
            continue
        yield line


@dataclass(frozen=True)
class BenchmarkGuard:
    """Line fingerprints of benchmark prompts; ``contains(text)`` says whether a file must be dropped."""

    digests: frozenset[str]
    min_chars: int = 24
    min_hits: int = 1

    @classmethod
    def from_prompts(cls, prompts: Iterable[str], min_chars: int = 24, min_hits: int = 1) -> BenchmarkGuard:
        digests = {_digest(line) for prompt in prompts for line in prompt_lines(prompt, min_chars)}
        return cls(frozenset(digests), min_chars, min_hits)

    @classmethod
    def from_benchmarks(cls, folder: Path, min_chars: int = 24, min_hits: int = 1) -> BenchmarkGuard:
        """Read HumanEval's prompts from a benchmarks folder (``humaneval/HumanEval.jsonl[.gz]``)."""
        for name in _HUMANEVAL_FILES:
            path = folder / name
            if path.is_file():
                return cls.from_prompts(_read_prompts(path), min_chars, min_hits)
        raise FileNotFoundError(
            f"no HumanEval problems under {folder} (looked for {', '.join(_HUMANEVAL_FILES)})"
        )

    @classmethod
    def load(cls, path: Path) -> BenchmarkGuard:
        """Read a guard written by :meth:`save`."""
        data = json.loads(path.read_text(encoding="utf-8"))
        try:
            return cls(frozenset(data["sha1"]), int(data["min_chars"]), int(data["min_hits"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{path} is not a benchmark guard file: {exc}") from exc

    def save(self, path: Path) -> None:
        payload = {"sha1": sorted(self.digests), "min_chars": self.min_chars, "min_hits": self.min_hits}
        path.write_text(json.dumps(payload), encoding="utf-8")

    def hits(self, text: str) -> int:
        """How many distinct fingerprint lines occur in ``text``."""
        if not self.digests:
            return 0
        found = set()
        for raw in text.splitlines():
            line = normalise_line(raw)
            if len(line) >= self.min_chars:
                digest = _digest(line)
                if digest in self.digests:
                    found.add(digest)
        return len(found)

    def contains(self, text: str) -> bool:
        return bool(self.digests) and self.hits(text) >= self.min_hits


def _read_prompts(path: Path) -> Iterator[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)["prompt"]
            except (json.JSONDecodeError, KeyError) as exc:
                raise ValueError(f"{path}:{number}: not a HumanEval problem: {exc}") from exc


# A file copies a package kept out of training (a benchmark's workspace, a held-out package) when it
# shares COPY_MIN_SHARED runs of COPY_LINES consecutive lines with that package's files, counting
# lines of at least COPY_LINE_CHARS characters (whitespace stripped) and leaving out runs found in
# COPY_COMMON_PACKAGES or more training packages (a licence's text, the same boilerplate everywhere).
# Found this way in the fetched wheels: cloudpickle vendored in numba and srsly, decorator.py in
# prometheus_client and pony, wrapt's import hooks in wandb and mlflow.
COPY_LINES = 8
COPY_LINE_CHARS = 20
COPY_MIN_SHARED = 10
COPY_COMMON_PACKAGES = 5


def line_runs(text: str) -> set[int]:
    """Fingerprints of ``text``'s runs of ``COPY_LINES`` consecutive long lines, whitespace stripped
    (the same within one process: a corpus is checked in one)."""
    lines = [stripped for raw in text.splitlines() if len(stripped := raw.strip()) >= COPY_LINE_CHARS]
    return {hash(tuple(lines[i:i + COPY_LINES])) for i in range(len(lines) - COPY_LINES + 1)}


def copied_files(protected: Iterable[str], train: Iterable[tuple[str, str]]) -> list[int]:
    """Indexes of the ``train`` files (``(package, text)``, in order) that copy ``protected`` text
    (the files of the packages kept out of training)."""
    fingerprints: set[int] = set()
    for text in protected:
        fingerprints |= line_runs(text)
    if not fingerprints:  # nothing kept out: the training files need not be read
        return []
    shared: list[tuple[str, set[int]]] = []
    packages: dict[int, set[str]] = {}
    for package, text in train:
        found = line_runs(text) & fingerprints
        shared.append((package, found))
        for run in found:
            packages.setdefault(run, set()).add(package)
    return [i for i, (_, found) in enumerate(shared)
            if sum(1 for run in found if len(packages[run]) < COPY_COMMON_PACKAGES) >= COPY_MIN_SHARED]
