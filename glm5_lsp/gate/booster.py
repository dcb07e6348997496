"""The gate as files: LightGBM boosters in LightGBM's own text format, and one JSON beside them.

A gate lives in a folder (by default ``gate/`` inside the model folder it was trained for):

- ``quality.txt``: the quality head, P(the candidate's first line is what the user would write)
  (``quality.1.txt``... beside it: more boosters of the same rows, other seeds, averaged);
- ``length.txt`` (optional): the length head, which of :data:`LENGTH_OPTIONS` of a multi-line candidate
  to show;
- ``strategy.txt`` (optional): what to do when the first candidate is not shown (:data:`STRATEGIES`);
- ``checks.jsonl.gz``: training rows (features, label) for the stability check of an online update;
- ``gate.json``: the feature names each booster reads (in order), the default threshold, the model's
  fingerprint, the training features' histograms (for drift) and what training measured.

Nothing is pickled: the boosters are text, the rest JSON.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glm5_lsp.gate.features import CATEGORICAL, FEATURES, vector

log = logging.getLogger(__name__)

FORMAT = 1
GATE_DIR = "gate"  # inside the model folder
LENGTH_OPTIONS: tuple[str, ...] = ("line", "lines2", "lines3", "block")
STRATEGIES: tuple[str, ...] = ("regenerate", "finish_word", "silent")
DEFAULT_THRESHOLD = 0.5  # only until a trained gate says otherwise
CHECKS_FILE = "checks.jsonl.gz"


class GateError(ValueError):
    """A gate folder that cannot be read (missing files, a booster LightGBM rejects, bad JSON)."""


def model_fingerprint(model_dir: str | Path) -> str:
    """A short id of the weights in ``model_dir``: each safetensors file's name, size and the SHA-256 of
    its first and last MiB (fast on a large checkpoint, different whenever the weights are)."""
    folder = Path(model_dir)
    digest = hashlib.sha256()
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise GateError(f"no safetensors in {folder}")
    for path in files:
        size = path.stat().st_size
        digest.update(f"{path.name}:{size}:".encode())
        with path.open("rb") as handle:
            digest.update(handle.read(1 << 20))
            if size > 2 << 20:
                handle.seek(size - (1 << 20))
                digest.update(handle.read())
    return digest.hexdigest()[:16]


def default_gate_dir(model_dir: str | Path) -> Path:
    return Path(model_dir) / GATE_DIR


def _lightgbm() -> Any:
    try:
        import lightgbm
    except ImportError as error:  # pragma: no cover - a dependency of the package
        raise GateError(f"lightgbm is not installed: {error}") from error
    return lightgbm


@dataclass
class Head:
    """Boosters of one head and the feature names they read, in order. Several boosters (the same
    rows, other LightGBM seeds: its bagging and feature sampling) are averaged: one seed's gate moves
    its threshold by as much as its rows do (BENCHMARKS.md, "The gate averaged over seeds")."""

    boosters: list[Any]  # lightgbm.Booster, at least one
    features: list[str]
    classes: list[str] = field(default_factory=list)  # multiclass heads: the class of each output

    def __post_init__(self) -> None:
        if not self.boosters:
            raise GateError("a gate head needs at least one booster")

    @property
    def booster(self) -> Any:
        """The first booster (the only one of a head trained with one seed)."""
        return self.boosters[0]

    def predict(self, values: Mapping[str, float]) -> Any:
        import numpy as np

        row = np.asarray([vector(values, self.features)], dtype=np.float64)
        outputs = []
        for booster, predictor in zip(self.boosters, self._predictors()):
            if predictor is not None:
                outputs.append(predictor.predict(row, num_iteration=booster.best_iteration)[0])
            else:
                outputs.append(booster.predict(row, num_threads=1)[0])
        return outputs[0] if len(outputs) == 1 else np.mean(outputs, axis=0)

    def _predictors(self) -> list[Any]:
        """LightGBM's predictor for each booster, made once (``Booster.predict`` makes one a call, a
        fifth of a candidate's prediction time); None where this LightGBM has no such thing."""
        found = self.__dict__.get("_inner")
        if found is None:
            found = self.__dict__["_inner"] = [_inner_predictor(b) for b in self.boosters]
        return found

    def predict_many(self, rows: Sequence[Mapping[str, float]]) -> Any:
        import numpy as np

        matrix = np.asarray([vector(values, self.features) for values in rows], dtype=np.float64)
        outputs = [booster.predict(matrix, num_threads=1) for booster in self.boosters]
        return outputs[0] if len(outputs) == 1 else np.mean(outputs, axis=0)


def _inner_predictor(booster: Any) -> Any:
    try:
        from lightgbm.basic import _InnerPredictor

        return _InnerPredictor.from_booster(booster=booster, pred_parameter={"num_threads": 1})
    except (ImportError, AttributeError, TypeError):
        return None


@dataclass
class Gate:
    """The trained gate: ``score`` a candidate's features, ``shows`` it above the threshold, choose its
    ``length`` and the ``strategy`` after a rejected one."""

    quality: Head
    threshold: float = DEFAULT_THRESHOLD
    length_head: Head | None = None
    strategy_head: Head | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    stale: bool = False  # trained for other weights than those it was loaded beside
    # Rows of the training data (features, exact) kept for the stability check of an online update.
    checks: list[tuple[dict[str, float], bool]] = field(default_factory=list)

    # ---- use ----------------------------------------------------------------------------------

    def score(self, values: Mapping[str, float]) -> float:
        """P(the candidate is kept), from :func:`~glm5_lsp.gate.features.features`' values."""
        return float(self.quality.predict(values))

    def shows(self, values: Mapping[str, float], threshold: float | None = None) -> bool:
        return self.score(values) >= (self.threshold if threshold is None else threshold)

    def length(self, values: Mapping[str, float]) -> str | None:
        """Which of :data:`LENGTH_OPTIONS` to show of a multi-line candidate (None: no length head)."""
        if self.length_head is None:
            return None
        return _argmax(self.length_head.predict(values), self.length_head.classes)

    def strategy(self, values: Mapping[str, float]) -> str | None:
        """What to do after a candidate that is not shown (None: no strategy head)."""
        if self.strategy_head is None:
            return None
        return _argmax(self.strategy_head.predict(values), self.strategy_head.classes)

    # ---- files --------------------------------------------------------------------------------

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        heads: dict[str, Any] = {}
        for name, head in (("quality", self.quality), ("length", self.length_head), ("strategy", self.strategy_head)):
            path = folder / f"{name}.txt"
            files = [path.name] if head is None else [booster_file(name, k) for k in range(len(head.boosters))]
            for stale in folder.glob(f"{name}.*.txt"):  # the extra boosters of an earlier save
                if stale.name not in files:
                    stale.unlink()
            if head is None:
                path.unlink(missing_ok=True)
                continue
            for booster, file in zip(head.boosters, files):
                tmp = folder / (file + ".tmp")
                booster.save_model(str(tmp))  # LightGBM's text format
                tmp.replace(folder / file)
            # "file": the first booster, which a reader that knows no "files" uses alone
            heads[name] = {"file": files[0], "files": files, "features": head.features, "classes": head.classes}
        checks = folder / CHECKS_FILE
        if self.checks:
            names = self.quality.features
            lines = "".join(json.dumps({"f": [_json_number(v) for v in vector(values, names)], "y": int(label)},
                                       separators=(",", ":")) + "\n" for values, label in self.checks)
            tmp = checks.with_suffix(".tmp")
            tmp.write_bytes(gzip.compress(lines.encode("utf-8"), mtime=0))
            tmp.replace(checks)
        else:
            checks.unlink(missing_ok=True)
        meta = {**self.meta, "format": FORMAT, "threshold": self.threshold, "heads": heads,
                "categorical": [c for c in CATEGORICAL]}
        tmp = folder / "gate.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1, sort_keys=True, allow_nan=False) + "\n", encoding="utf-8")
        tmp.replace(folder / "gate.json")
        return folder

    @classmethod
    def load(cls, folder: str | Path, model_dir: str | Path | None = None) -> Gate:
        """The gate in ``folder``; given ``model_dir``, ``stale`` says whether its weights differ from
        those the gate was trained for (the gate still works: its features drift, see ``drift``)."""
        folder = Path(folder)
        try:
            meta = json.loads((folder / "gate.json").read_text(encoding="utf-8"))
        except OSError as error:
            raise GateError(f"no gate in {folder}: {error}") from error
        except ValueError as error:
            raise GateError(f"{folder / 'gate.json'} is not JSON: {error}") from error
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise GateError(f"{folder / 'gate.json'}: unknown format {meta.get('format') if isinstance(meta, dict) else meta!r}")
        lgb = _lightgbm()
        heads: dict[str, Head] = {}
        for name, spec in (meta.get("heads") or {}).items():
            files = spec.get("files") or [spec.get("file", f"{name}.txt")]
            if not isinstance(files, list):
                raise GateError(f"{folder / 'gate.json'}: the {name} head's files are not a list: {files!r}")
            features = [str(f) for f in spec.get("features") or []]
            boosters = []
            for file in files:
                path = folder / str(file)
                try:
                    booster = lgb.Booster(model_file=str(path))
                except Exception as error:  # LightGBM raises its own LightGBMError (or OSError)
                    raise GateError(f"cannot read the {name} booster {path}: {error}") from error
                if booster.num_feature() != len(features):
                    raise GateError(f"{path}: the booster reads {booster.num_feature()} features, gate.json names "
                                    f"{len(features)}")
                boosters.append(booster)
            heads[name] = Head(boosters, features, [str(c) for c in spec.get("classes") or []])
        if "quality" not in heads:
            raise GateError(f"{folder}: no quality head")
        threshold = float(meta.get("threshold", DEFAULT_THRESHOLD))
        if not 0.0 <= threshold <= 1.0:
            raise GateError(f"{folder / 'gate.json'}: threshold {threshold} outside [0, 1]")
        gate = cls(heads["quality"], threshold, heads.get("length"), heads.get("strategy"), meta)
        gate.checks = _read_checks(folder / CHECKS_FILE, gate.quality.features)
        if model_dir is not None and meta.get("model_fingerprint"):
            try:
                gate.stale = model_fingerprint(model_dir) != meta["model_fingerprint"]
            except (OSError, GateError):
                gate.stale = True
            if gate.stale:
                log.warning("the gate in %s was trained for other weights than those in %s", folder, model_dir)
        unknown = [f for f in gate.quality.features if f not in FEATURES]
        if unknown:
            log.info("the gate reads %d features this version does not compute (missing: NaN): %s",
                     len(unknown), ", ".join(unknown[:5]))
        return gate


def booster_file(head: str, k: int) -> str:
    """The file of a head's ``k``-th booster: ``quality.txt``, then ``quality.1.txt``, ..."""
    return f"{head}.txt" if k == 0 else f"{head}.{k}.txt"


def _json_number(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 5)


def _read_checks(path: Path, names: Sequence[str]) -> list[tuple[dict[str, float], bool]]:
    if not path.is_file():
        return []
    try:
        text = gzip.decompress(path.read_bytes()).decode("utf-8")
        out = []
        for line in text.splitlines():
            record = json.loads(line)
            values = [math.nan if v is None else float(v) for v in record["f"]]
            out.append((dict(zip(names, values)), bool(record["y"])))
        return out
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise GateError(f"cannot read the gate's check rows {path}: {error}") from error


def _argmax(probs: Any, classes: Sequence[str]) -> str:
    values = list(probs) if hasattr(probs, "__len__") else [1 - float(probs), float(probs)]
    best = max(range(len(values)), key=lambda i: values[i])
    return classes[best] if best < len(classes) else str(best)


def load_gate(model_dir: str | Path | None = None, path: str | Path | None = None) -> Gate | None:
    """The gate for a model: ``path`` when given, else ``<model_dir>/gate``; None when there is none
    (a model nobody trained a gate for: show every candidate, as before). A gate that exists but cannot
    be read raises :class:`GateError`."""
    folder = Path(path) if path else (default_gate_dir(model_dir) if model_dir is not None else None)
    if folder is None or not (folder / "gate.json").is_file():
        return None
    return Gate.load(folder, model_dir)


def finite_or_nan(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan
    return number if math.isfinite(number) else math.nan
