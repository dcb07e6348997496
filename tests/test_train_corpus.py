"""Corpus filter: licences, de-duplication, generated/vendored files, hold-out, benchmark guard.

Fixtures: ``tests/data/train/stdlib``, ``tests/data/train/site``, ``tests/data/train/benchmarks``
(see ``tests/data/train/README.md``).
"""

from __future__ import annotations

import gzip
import json
from email.message import Message
from pathlib import Path

import pytest

from glm5_lsp.train.contamination import BenchmarkGuard
from glm5_lsp.train.corpus import STDLIB, CorpusConfig, build_corpus
from glm5_lsp.train.licence import classify_metadata, spdx_is_permissive

DATA = Path(__file__).parent / "data" / "train"
SHARED = Path(__file__).parents[1].parent / "shared"


def _metadata(**fields: str | list[str]) -> Message:
    message = Message()
    for key, value in fields.items():
        for item in value if isinstance(value, list) else [value]:
            message[key.replace("_", "-")] = item
    return message


@pytest.mark.parametrize(
    ("fields", "permissive"),
    [
        ({"License_Expression": "MIT"}, True),
        ({"License_Expression": "Apache-2.0 OR BSD-3-Clause"}, True),
        ({"License_Expression": "MIT OR GPL-2.0-only"}, True),
        ({"License_Expression": "Apache-2.0 WITH LLVM-exception AND MIT"}, True),
        ({"License_Expression": "PSF-2.0"}, True),
        ({"License_Expression": "GPL-3.0-or-later"}, False),
        ({"License_Expression": "MPL-2.0 AND MIT"}, False),
        ({"License_Expression": "BSD-3-Clause AND Zlib"}, False),
        ({"Classifier": ["License :: OSI Approved :: BSD License"]}, True),
        ({"Classifier": ["License :: OSI Approved :: ISC License (ISCL)"]}, True),
        (
            {
                "Classifier": [
                    "License :: OSI Approved :: MIT License",
                    "License :: OSI Approved :: GNU General Public License (GPL)",
                ]
            },
            False,
        ),
        ({"License": "MIT License"}, True),
        ({"License": "Permission is hereby granted, free of charge, to any person obtaining a copy"}, True),
        ({"License": "LGPL"}, False),
        ({"License": "UNKNOWN"}, False),
        ({}, False),
    ],
)
def test_licence_classification(fields: dict, permissive: bool) -> None:
    assert classify_metadata(_metadata(**fields)).permissive is permissive


def test_expression_takes_precedence_over_classifiers() -> None:
    meta = _metadata(License_Expression="GPL-2.0-only", Classifier=["License :: OSI Approved :: MIT License"])
    assert not classify_metadata(meta).permissive
    assert spdx_is_permissive("(MIT OR Apache-2.0) AND BSD-2-Clause")


def _fixture_corpus(**overrides) -> tuple:
    guard = BenchmarkGuard.from_benchmarks(DATA / "benchmarks")
    config = CorpusConfig(**{
        "stdlib": DATA / "stdlib",
        "site_dirs": (DATA / "site",),
        "holdout": ("stdlib:json", "heldpkg", "absentpkg"),
        "guard": guard,
        **overrides,
    })
    corpus = build_corpus(config)
    return (
        corpus,
        {(d.package, d.relpath) for d in corpus.train},
        {(d.unit, d.relpath) for d in corpus.heldout},
    )


def test_fixture_corpus_keeps_only_permissive_clean_unique_files() -> None:
    corpus, train, heldout = _fixture_corpus()
    assert train == {
        (STDLIB, "shapes.py"),  # shapes_copy.py is the same content: dropped as a duplicate
        ("goodpkg", "goodpkg/__init__.py"),
        ("goodpkg", "goodpkg/core.py"),
        ("classicpkg", "classicpkg/__init__.py"),
    }
    assert heldout == {
        ("stdlib:json", "json/__init__.py"),
        ("stdlib:json", "json/decoder.py"),
        ("heldpkg", "heldpkg/__init__.py"),
    }
    manifest = corpus.manifest
    assert {r["package"] for r in manifest["refused_licence"]} == {"gplpkg", "nolicpkg"}
    assert manifest["dropped_files"] == {
        "benchmark_text": 1,
        "duplicate": 1,
        "empty": 1,
        "generated": 1,
        "minified": 1,
        "syntax": 1,
    }
    assert manifest["heldout_missing"] == ["absentpkg"]
    good = next(r for r in manifest["sources"] if r["package"] == "goodpkg")
    assert (good["version"], good["licence"], good["files"]) == ("1.0", "MIT", 2)
    assert good["bytes"] == sum(
        (DATA / "site" / p).stat().st_size for p in ("goodpkg/__init__.py", "goodpkg/core.py")
    )
    assert manifest["totals"]["train_files"] == 4
    json.dumps(manifest)  # serialisable as is


def test_benchmark_folder_is_never_read() -> None:
    corpus, _train, heldout = _fixture_corpus(benchmarks=DATA / "stdlib" / "json")
    assert not any(unit == "stdlib:json" for unit, _ in heldout)
    assert corpus.manifest["dropped_files"]["benchmark_folder"] == 2


def test_subsample_is_deterministic_and_bounded() -> None:
    a, train_a, _ = _fixture_corpus(max_train_bytes=200, seed=3)
    _b, train_b, _ = _fixture_corpus(max_train_bytes=200, seed=3)
    assert train_a == train_b and 0 < len(train_a) < 4
    assert sum(d.size for d in a.train) <= 200


def test_manifest_written(tmp_path: Path) -> None:
    corpus, _, _ = _fixture_corpus()
    corpus.write_manifest(tmp_path / "manifest.json")
    assert json.loads((tmp_path / "manifest.json").read_text())["totals"] == corpus.manifest["totals"]


def test_guard_round_trips_through_its_file(tmp_path: Path) -> None:
    guard = BenchmarkGuard.from_benchmarks(DATA / "benchmarks")
    guard.save(tmp_path / "guard.json")
    again = BenchmarkGuard.load(tmp_path / "guard.json")
    assert again == guard
    leak = (DATA / "site" / "goodpkg" / "leak.py").read_text()
    assert again.contains(leak) and not again.contains((DATA / "stdlib" / "shapes.py").read_text())


def test_guard_refuses_a_folder_without_humaneval(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="HumanEval"):
        BenchmarkGuard.from_benchmarks(tmp_path)


@pytest.mark.skipif(
    not (SHARED / "benchmarks" / "humaneval").is_dir(), reason="../shared/benchmarks is absent"
)
def test_guard_flags_every_real_humaneval_prompt() -> None:
    guard = BenchmarkGuard.from_benchmarks(SHARED / "benchmarks")
    with gzip.open(
        SHARED / "benchmarks" / "humaneval" / "HumanEval.jsonl.gz", "rt", encoding="utf-8"
    ) as handle:
        prompts = [json.loads(line)["prompt"] for line in handle if line.strip()]
    assert len(prompts) == 164
    assert all(guard.contains(p) for p in prompts)
    assert not guard.contains((DATA / "stdlib" / "shapes.py").read_text())


def test_parallel_checks_match_serial() -> None:
    """The process pool (used from 64 files on) accepts exactly what the serial path does."""
    source = Path(__file__).resolve().parents[1] / "glm5_lsp"
    serial = build_corpus(CorpusConfig(stdlib=source, site_dirs=(), holdout=("stdlib:model",)))
    parallel = build_corpus(CorpusConfig(stdlib=source, site_dirs=(), holdout=("stdlib:model",), workers=2))
    assert len(serial.train) >= 64
    assert [d.digest for d in parallel.train] == [d.digest for d in serial.train]
    assert parallel.manifest["dropped_files"] == serial.manifest["dropped_files"]


def test_the_editor_benchmarks_packages_are_never_trained_on() -> None:
    from glm5_lsp.train.corpus import BENCHMARK_FIT, BENCHMARK_HOLDOUT, BENCHMARK_REPORT

    assert not set(BENCHMARK_FIT) & set(BENCHMARK_REPORT)
    corpus, train, heldout = _fixture_corpus(excluded=("goodpkg",))
    assert not any(package == "goodpkg" for package, _ in train)
    assert not any(unit == "goodpkg" for unit, _ in heldout), "excluded is not evaluated either"
    base = _fixture_corpus()[0].manifest["totals"]["candidate_files"]
    excluded = corpus.manifest["dropped_files"]["benchmark_holdout"]
    assert excluded >= 2 and corpus.manifest["totals"]["candidate_files"] == base - excluded
    assert corpus.manifest["excluded_for_benchmarks"] == ["goodpkg"]
    assert CorpusConfig().excluded == BENCHMARK_HOLDOUT
    shipped = Path(__file__).parents[1] / "glm5_lsp" / "weights" / "glm5-code-tiny" / "corpus_manifest.json"
    if shipped.is_file():
        sources = {r["package"].lower() for r in json.loads(shipped.read_text())["sources"]}
        assert not sources & {p.lower() for p in BENCHMARK_HOLDOUT}


def _dist(site: Path, name: str, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\nLicense-Expression: MIT\n")
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in files) + f"{name}-1.0.dist-info/METADATA,,\n")


def test_a_fetched_site_folder_is_read_beside_site_packages(tmp_path: Path) -> None:
    """``scripts/fetch_corpus.sh`` unpacks wheels into a folder of its own that a new run reads
    after this Python's site-packages: its distributions join the corpus under the same rules (a
    benchmark package there is still left out, a copy of a file already read is a duplicate)."""
    extra = tmp_path / "site"
    for name in ("newpkg", "pexpect"):  # pexpect: one of BENCHMARK_FIT's packages
        _dist(extra, name, {f"{name}/__init__.py": f"def {name}_main(value):\n    return value + 1\n"})
    core = (DATA / "site" / "goodpkg" / "core.py").read_text()
    _dist(extra, "goodcopy", {"goodcopy/core.py": core})  # the same file under another name
    corpus, train, _ = _fixture_corpus(site_dirs=(DATA / "site", extra))
    _, alone, _ = _fixture_corpus()
    assert train - alone == {("newpkg", "newpkg/__init__.py")}
    assert corpus.manifest["dropped_files"]["benchmark_holdout"] == 1
    assert corpus.manifest["dropped_files"]["duplicate"] == 2  # shapes_copy.py, goodcopy/core.py


def test_the_fetched_wheels_leave_out_the_benchmarks_and_the_held_out_packages() -> None:
    from glm5_lsp.train.corpus import BENCHMARK_HOLDOUT, DEFAULT_HOLDOUT

    listed = Path(__file__).parents[1] / "scripts" / "corpus_packages.txt"
    pins = [line.strip() for line in listed.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert len(pins) > 200
    names = set()
    for pin in pins:
        name, _, version = pin.partition("==")
        assert version and name == name.lower(), pin  # pinned, normalised
        names.add(name.replace("_", "-"))
    never = {n.lower().replace("_", "-") for n in BENCHMARK_HOLDOUT + DEFAULT_HOLDOUT if ":" not in n}
    assert not names & never
    assert len(names) == len(pins)


def _code(name: str, lines: int) -> str:
    """Distinct code of ``lines`` long lines (``name`` makes it its own)."""
    return "".join(f"result_{name}_{i} = compute_something_long({i}, '{name}') + offset_{i}\n" for i in range(lines))


def test_a_copy_of_a_kept_out_package_under_another_name_is_not_trained_on(tmp_path: Path) -> None:
    """A benchmark's package vendored inside another (numba ships cloudpickle as numba/cloudpickle) is
    dropped, as is a copy of a held-out package's code; a licence text that many packages share is not
    a copy."""
    licence = "".join(f"# Permission is hereby granted, free of charge, clause number {i} of the licence\n"
                      for i in range(20))
    site = tmp_path / "site"
    benchmark_code = _code("pickle", 40)
    _dist(site, "cloudpickle", {"cloudpickle/core.py": licence + benchmark_code})  # BENCHMARK_FIT's
    _dist(site, "tqdm", {"tqdm/std.py": _code("bars", 20)})  # BENCHMARK_REPORT's, its licence refused below
    (site / "tqdm-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: tqdm\nVersion: 1.0\n"
                                                          "License-Expression: MPL-2.0\n")
    _dist(site, "bars", {"bars/std.py": _code("bars", 20)})
    _dist(site, "bigpkg", {"bigpkg/__init__.py": _code("big", 12),
                           "bigpkg/vendored_pickle/core.py": "import os\n" + benchmark_code[: len(benchmark_code) // 2]})
    _dist(site, "heldpkg", {"heldpkg/__init__.py": _code("held", 30)})
    _dist(site, "fork", {"fork/held.py": "# a fork\n" + _code("held", 30) + _code("fork", 5)})
    for n in range(6):  # the same licence text in six packages: boilerplate, not a copy
        _dist(site, f"plain{n}", {f"plain{n}/__init__.py": licence + _code(f"plain{n}", 10)})
    corpus = build_corpus(CorpusConfig(stdlib=tmp_path / "no-stdlib", site_dirs=(site,), holdout=("heldpkg",)))
    trained = {(d.package, d.relpath) for d in corpus.train}
    assert ("bigpkg", "bigpkg/__init__.py") in trained
    assert ("bigpkg", "bigpkg/vendored_pickle/core.py") not in trained
    assert ("fork", "fork/held.py") not in trained
    assert ("bars", "bars/std.py") not in trained
    assert {f"plain{n}" for n in range(6)} <= {package for package, _ in trained}
    assert corpus.manifest["dropped_files"]["copies_kept_out_code"] == 3
