"""Training and evaluation rows for the gate: the shipped pipeline's candidates on held-out real code.

For each installed package named (each copied into its own workspace folder), cursors are seeded as
``benchmarks/lines.py`` seeds them (``glm5_lsp.memory.heldout.seeded_cases``). At each cursor, one
after another, through the server's own engine (``server.loader.Engine``: the default settings, the
context engine, the repair loop with its decoding monitor, token healing, the as-you-type budget):

- **single**: the as-you-type single-line completion, its features and its labels (``labels``);
- **memory**: where the workspace memory's own continuation says something else, that continuation
  as the candidate standing in for a withheld one (``pipeline.gating.stand_in``: not generated, no
  step statistics), its features and labels; the quality head learns from these rows too;
- **regen**: the same request generated again without the unsure stop (``completion.minTokenProb`` 0:
  the model's whole greedy line), what "regenerate" would show;
- **finish**: the typed word finished from the names around it (the repair loop's word finisher), what
  "finish the word" would show;
- **block**: the same cursor with the rest of its block removed too (the lines after it at its
  indentation or deeper, at most :data:`MAX_BLOCK_LINES`), completed multi-line: its features, and the
  edit similarity of its first 1, 2, 3 lines and of all of it against what was removed (the length
  head's data).

One JSON object per cursor; NaN features are written as null. A package already in the output file is
skipped (a rerun resumes).
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glm5_lsp.backends.base import capabilities
from glm5_lsp.gate.booster import LENGTH_OPTIONS
from glm5_lsp.gate.features import features, request_info
from glm5_lsp.gate.labels import edit_similarity, first_line, label
from glm5_lsp.gate.stats import DecodeRecorder, DecodeStats
from glm5_lsp.postprocess import trailing_identifier

if TYPE_CHECKING:
    from glm5_lsp.memory.heldout import Case

log = logging.getLogger(__name__)

MAX_BLOCK_LINES = 6


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def block_case(document: str, offset: int, line: int, rest: str) -> tuple[str, str]:
    """The document with the cursor's line cut (as given) and the rest of its block removed, and what
    was removed after the cursor (the rest of the line, then the block's lines)."""
    lines = document.split("\n")
    cut = lines[line]
    indent = _indent(cut) if cut.strip() else len(cut)
    below = lines[line + 1:]
    taken = 0
    for text in below[:MAX_BLOCK_LINES]:
        if text.strip() and _indent(text) < indent:
            break
        taken += 1
    block = below[:taken]
    while block and not block[-1].strip():
        block.pop()
    removed = len(block)
    while taken > removed and not below[removed].strip():
        removed += 1  # blank lines between the block and what follows stay
    truth = rest + ("\n" + "\n".join(block) if block else "")
    new = "\n".join([*lines[: line + 1], *below[len(block):]])
    assert new[:offset] == document[:offset]
    return new, truth


def length_options(text: str, truth: str) -> dict[str, float]:
    """Edit similarity against ``truth`` of each length option of a multi-line candidate ``text``."""
    lines = text.rstrip("\n").split("\n") if text.strip() else []
    kept = {"line": lines[:1], "lines2": lines[:2], "lines3": lines[:3], "block": lines}
    truth = "\n".join(part.rstrip() for part in truth.split("\n"))
    return {name: edit_similarity("\n".join(part.rstrip() for part in kept[name]), truth) if kept[name] else 0.0
            for name in LENGTH_OPTIONS}


def _json_features(values: dict[str, float]) -> dict[str, float | None]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else round(v, 6)) for k, v in values.items()}


RESULT_FIELDS = ("text", "clean", "rounds", "prompt_tokens", "completion_tokens", "finish_reason", "finished_word",
                 "remembered")


def _raw(result: Any, stats: DecodeStats | None) -> dict[str, Any]:
    """What the features were computed from (so they can be computed again as the features change)."""
    out: dict[str, Any] = {"result": {k: getattr(result, k) for k in RESULT_FIELDS}}
    recalled = getattr(result, "recalled", None)
    if recalled is not None:
        out["result"]["recalled"] = asdict(recalled)
    out["result"]["vouched"] = bool(getattr(result, "vouched", False))
    if stats is not None:
        out["stats"] = {k: [round(v, 5) if isinstance(v, float) and math.isfinite(v) else v for v in values]
                        for k, values in asdict(stats).items() if isinstance(values, list)}
    return out


def finish_row(word: str, case: Case, typed: str) -> dict[str, Any]:
    """The word finisher's likeliest word at ``case`` (``typed``: the part of the word before the
    cursor) and whether it is right as any answer is: the identifier it finishes is the file's
    (``else:`` finishes ``else``)."""
    return {"word": word, "right": bool(word) and label(word[len(typed):], case.rest, case.word, typed).right_word}


class Collector:
    """The engine for one workspace and what each cursor's four requests give."""

    def __init__(self, root: Path, budget_ms: int | None = None, model_path: str | None = None) -> None:
        from glm5_lsp.pipeline import Pipeline
        from glm5_lsp.server.loader import Engine
        from glm5_lsp.server.settings import Settings

        self.settings = Settings()
        if model_path:
            self.settings.model.path = str(model_path)
        self.budget_s = (budget_ms if budget_ms is not None else self.settings.budgets.completion_ms) / 1000
        engine = Engine(self.settings, str(root))
        engine.load()
        if engine.pipeline is None:
            raise RuntimeError(f"the pipeline did not load: {engine.error}")
        if engine.memory is not None:  # what the server builds when it starts: the memory is part of what ships
            engine.memory.index(str(root))
        self.pipeline = engine.pipeline
        backend = self.pipeline.backend
        self.healing = self.pipeline.settings.token_healing and capabilities(backend).forced_prefix
        self.recorder = DecodeRecorder(backend.tokenizer.token_strings())
        template = self.pipeline.repair
        self.recorder.install(self.pipeline)
        self.finisher = template.finisher
        # the same memory: a Pipeline wires its own into the loop it is given (None would unwire it)
        self.regen = Pipeline(backend, replace(self.pipeline.settings, min_token_prob=0.0), self.pipeline.context,
                              repair=template, memory=self.pipeline.memory)

    def _complete(self, pipeline: Any, document: str, offset: int, path: str, multiline: bool,
                  budget_s: float | None = None) -> tuple[Any, Any]:
        self.recorder.begin()
        started = time.perf_counter()
        result = pipeline.complete(document, offset, path=path, language="python", multiline=multiline,
                                   time_budget_s=self.budget_s if budget_s is None else budget_s)
        result.seconds = time.perf_counter() - started
        if not result.clean and not self.settings.repair.return_unclean:
            result.text = ""  # what the server shows
        return result, self.recorder.last()

    def _stand_in(self, result: Any, case: Any, path: str) -> Any:
        """What the pipeline's gating would judge in place of ``result`` were it withheld: the memory's
        continuation at the cursor (``Pipeline.stand_in_text``), where it is not ``result``'s text and
        does not stop inside a word that text or the workspace's lines spell on (None otherwise)."""
        from glm5_lsp.pipeline.gating import may_stand_in, stand_in

        recalled = getattr(result, "recalled", None)
        text = self.pipeline.stand_in_text(case.document, case.offset, recalled, path=path, language="python")
        heal = self.pipeline.healed_word(case.document, case.offset, path, "python")
        return stand_in(result, text) if may_stand_in(text, result.text, recalled, heal) else None

    def _features(self, result: Any, stats: Any, document: str, offset: int, multiline: bool) -> tuple[dict, float]:
        started = time.perf_counter()
        info = request_info(document, offset, language="python", multiline=multiline, trigger="automatic",
                            healing=self.healing)
        values = features(result, info, stats)
        return values, (time.perf_counter() - started) * 1000

    def row(self, case: Any, package: str, root: Path, *, single: bool = True, block: bool = True,
            regen: bool = True, block_at: str = "cursor", block_budget_ms: int | None = None) -> dict[str, Any]:
        path = str(case.path)
        typed_line = case.document[: case.offset].rsplit("\n", 1)[-1]
        typed = trailing_identifier(typed_line)
        out: dict[str, Any] = {"package": package, "path": str(case.path.relative_to(root)), "line": case.line,
                               "offset": case.offset,
                               "typed_line": typed_line, "rest": case.rest, "word": case.word}
        if single:
            result, stats = self._complete(self.pipeline, case.document, case.offset, path, False)
            values, feature_ms = self._features(result, stats, case.document, case.offset, False)
            mark = label(result.text, case.rest, case.word, typed)
            out["single"] = {"text": result.text, "features": _json_features(values), "feature_ms": round(feature_ms, 3),
                             "seconds": round(result.seconds, 3), "exact": mark.exact,
                             "similarity": round(mark.similarity, 4), "shown": mark.shown, "right_word": mark.right_word,
                             "finish_reason": result.finish_reason, "raw": _raw(result, stats)}
        if single:
            stand = self._stand_in(result, case, path)
            if stand is not None:
                mark = label(stand.text, case.rest, case.word, typed)
                values, _ = self._features(stand, None, case.document, case.offset, False)
                out["memory"] = {"text": stand.text, "features": _json_features(values), "exact": mark.exact,
                                 "similarity": round(mark.similarity, 4), "shown": mark.shown,
                                 "right_word": mark.right_word, "raw": _raw(stand, None)}
        if single and regen:
            again, _ = self._complete(self.regen, case.document, case.offset, path, False)
            mark = label(again.text, case.rest, case.word, typed)
            out["regen"] = {"text": first_line(again.text), "exact": mark.exact, "similarity": round(mark.similarity, 4),
                            "right_word": mark.right_word, "seconds": round(again.seconds, 3)}
        if single and self.finisher is not None:
            before = case.document[: case.offset - len(typed)]
            words = self.finisher(before, typed, case.document[case.offset:], "python")
            word = words[0] if words else ""
            out["finish"] = finish_row(word, case, typed)
        if block:
            document, offset, truth = block_document(case.document, case.offset, case.line, case.rest, block_at)
            budget = None if block_budget_ms is None else block_budget_ms / 1000
            result, stats = self._complete(self.pipeline, document, offset, path, True, budget)
            values, feature_ms = self._features(result, stats, document, offset, True)
            out["block"] = {"at": block_at, "truth": truth, "text": result.text, "features": _json_features(values),
                            "feature_ms": round(feature_ms, 3), "seconds": round(result.seconds, 3),
                            "raw": _raw(result, stats),
                            "options": {k: round(v, 4) for k, v in length_options(result.text, truth).items()}}
        return out


def block_document(document: str, offset: int, line: int, rest: str, at: str = "cursor") -> tuple[str, int, str]:
    """The length head's case for a seeded cursor: the document, the cursor and what was removed. ``at``
    "cursor": the rest of the line and of the block removed, the cursor where it was; "line_start": the
    whole line (its indentation kept) and the rest of the block removed, the cursor on the emptied line
    (where an editor asks for a multi-line completion)."""
    if at == "cursor":
        return (*_with_offset(block_case(document, offset, line, rest), offset),)
    if at != "line_start":
        raise ValueError(f"unknown block case {at!r} (cursor or line_start)")
    start = document.rfind("\n", 0, offset) + 1
    typed_line = document[start:offset]
    indent = len(typed_line) - len(typed_line.lstrip(" \t"))
    emptied = document[: start + indent] + document[offset:]
    new, truth = block_case(emptied, start + indent, line, typed_line[indent:] + rest)
    return new, start + indent, truth


def _with_offset(pair: tuple[str, str], offset: int) -> tuple[str, int, str]:
    return pair[0], offset, pair[1]


def done_packages(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    found = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            found.add(json.loads(line)["package"])
        except (ValueError, KeyError, TypeError):
            continue
    return found


def collect(packages: Sequence[str], out: Path, *, positions: int, seed: int = 0, budget_ms: int | None = None,
            block: bool = True, regen: bool = True, model_path: str | None = None, single: bool = True,
            block_at: str = "cursor", block_budget_ms: int | None = None, at: str = "word",
            progress: Callable[[str], None] = print) -> int:
    """Rows for ``positions`` cursors in each of ``packages``, appended to ``out``; returns rows written.
    ``at``: where the cursors sit (``glm5_lsp.memory.heldout.cursor_cases``)."""
    from glm5_lsp.memory.heldout import copy_package, seeded_cases

    done = done_packages(out)
    written = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    for name in packages:
        if name in done:
            progress(f"{name}: already in {out}, skipped")
            continue
        with tempfile.TemporaryDirectory(prefix=f"gate-{name}-") as tmp:
            root = copy_package(name, Path(tmp))
            cases = seeded_cases(root, positions, seed=seed, at=at)
            started = time.perf_counter()
            collector = Collector(root, budget_ms, model_path)
            rows = []
            for case in cases:
                try:
                    rows.append(collector.row(case, name, root, single=single, block=block, regen=regen,
                                              block_at=block_at, block_budget_ms=block_budget_ms))
                except Exception:  # one cursor's failure costs that cursor only
                    log.exception("%s: cursor at %s:%d failed", name, case.path, case.line)
            with out.open("a", encoding="utf-8") as handle:  # a package's rows land together
                handle.write("".join(json.dumps(r) + "\n" for r in rows))
            written += len(rows)
            exact = sum(r["single"]["exact"] for r in rows if "single" in r)
            shown = sum(r["single"]["shown"] for r in rows if "single" in r)
            lines = sum("\n" in (r["block"]["text"] or "").strip("\n") for r in rows if "block" in r)
            progress(f"{name}: {len(rows)} cursors, {shown} shown, {exact} exact, {lines} multi-line; "
                     f"{time.perf_counter() - started:.0f} s")
    return written


def read_rows(paths: Sequence[Path]) -> list[dict[str, Any]]:
    rows = []
    for path in paths:
        for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as error:
                raise ValueError(f"{path}:{number}: not JSON ({error})") from error
    return rows


def case_document(root: Path, row: Mapping[str, Any]) -> str:
    """The document a row's cursor was in, rebuilt from the package's file (the cursor's line cut)."""
    lines = (root / str(row["path"])).read_text(encoding="utf-8").split("\n")
    number = int(row["line"])
    return "\n".join([*lines[:number], str(row["typed_line"]), *lines[number + 1:]])


def recompute(rows: Sequence[dict[str, Any]], roots: Mapping[str, Path], *, healing: bool = True) -> int:
    """The rows' features computed again, in place, from what they were computed from (``raw``) and the
    rebuilt documents (``roots``: package -> its copied folder); returns how many candidates."""
    from types import SimpleNamespace

    count = 0
    for row in rows:
        root = roots.get(str(row["package"]))
        if root is None:
            continue
        document = case_document(root, row)
        offset = int(row["offset"])
        parts = [("single", document, offset, False), ("memory", document, offset, False)]
        if "block" in row:
            block_doc, block_offset, _ = block_document(document, offset, int(row["line"]), str(row["rest"]),
                                                        str(row["block"].get("at", "cursor")))
            parts.append(("block", block_doc, block_offset, True))
        for key, text, at, multiline in parts:
            raw = (row.get(key) or {}).get("raw")
            if raw is None:
                continue
            stats = capped(DecodeStats(**raw["stats"])) if raw.get("stats") else None
            info = request_info(text, at, language="python", multiline=multiline, trigger="automatic",
                                healing=healing)
            row[key]["features"] = _json_features(features(SimpleNamespace(**raw["result"]), info, stats))
            count += 1
    return count


def capped(stats: DecodeStats) -> DecodeStats:
    """Recorded stats as the observer gives them now: the distribution's figures for the first
    ``MAX_STEPS`` steps only (rows collected before the cap have them all)."""
    from glm5_lsp.gate.stats import MAX_STEPS

    for name in ("logprobs", "entropies", "top_probs", "margins", "end_probs"):
        setattr(stats, name, getattr(stats, name)[:MAX_STEPS])
    return stats
