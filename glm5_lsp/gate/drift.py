"""Feature drift: the live candidates' features against the training distribution.

Training saves one :class:`Histogram` per feature (bin edges at the training data's quantiles, a bin
for missing values, the training counts). The server keeps a :class:`DriftMonitor` with running
counts of the same bins (exponentially forgotten, so it follows the recent past) and asks it now and
then: the KL divergence KL(live || training) per feature, smoothed; past :data:`KL_LIMIT` (the seed's
0.1) the feature is flagged. When the model under the gate changes, its features move and the gate's
scores stop meaning what they did: that is the signal to retrain (``glm5-lsp gate train`` with the
acceptance log, which updates the booster from it).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

KL_LIMIT = 0.1
BINS = 10  # quantile bins per numeric feature (fewer when the values are few), plus one for missing
MIN_SAMPLES = 200  # live candidates before a divergence is judged (below, small counts alone make it large)
HALF_LIFE = 2000  # candidates after which a live count weighs half
SMOOTHING = 0.5  # added to every bin's count on both sides


@dataclass
class Histogram:
    """Bins of one feature: ``edges`` (ascending; a value v falls in the first bin whose upper edge is
    >= v, the last bin past every edge) or, for a categorical feature, one bin per category code seen
    (``categories``); the last count is always the missing values'."""

    edges: list[float] = field(default_factory=list)
    categories: list[float] = field(default_factory=list)
    counts: list[float] = field(default_factory=list)

    @property
    def size(self) -> int:
        return (len(self.categories) + 1 if self.categories else len(self.edges) + 1) + 1

    def bin(self, value: float | None) -> int:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return self.size - 1
        if self.categories:
            try:
                return self.categories.index(float(value))
            except ValueError:
                return len(self.categories)  # a category training never saw
        lo, hi = 0, len(self.edges)
        while lo < hi:  # the first edge >= value
            mid = (lo + hi) // 2
            if self.edges[mid] < value:
                lo = mid + 1
            else:
                hi = mid
        return lo

    @classmethod
    def fit(cls, values: Sequence[float | None], categorical: bool = False, bins: int = BINS) -> Histogram:
        finite = sorted(float(v) for v in values if v is not None and not math.isnan(float(v)))
        if categorical:
            hist = cls(categories=sorted(set(finite)))
        else:
            edges: list[float] = []
            for k in range(1, bins):
                if finite:
                    edge = finite[max(0, min(len(finite) - 1, (k * len(finite)) // bins - 1))]  # bins are (lo, edge]
                    if not edges or edge > edges[-1]:
                        edges.append(edge)
            if edges and edges[-1] >= finite[-1]:
                edges.pop()  # no empty top bin: the largest value's bin is the last
            hist = cls(edges=edges)
        hist.counts = [0.0] * hist.size
        for value in values:
            hist.counts[hist.bin(value)] += 1
        return hist

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"counts": [round(c, 3) for c in self.counts]}
        if self.categories:
            out["categories"] = self.categories
        else:
            out["edges"] = self.edges
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Histogram:
        hist = cls(edges=[float(e) for e in data.get("edges", [])],
                   categories=[float(c) for c in data.get("categories", [])],
                   counts=[float(c) for c in data.get("counts", [])])
        if len(hist.counts) != hist.size:
            raise ValueError(f"a histogram with {hist.size} bins has {len(hist.counts)} counts")
        return hist


def kl_divergence(live: Sequence[float], reference: Sequence[float], smoothing: float = SMOOTHING) -> float:
    """KL(live || reference) in nats over the same bins, each count smoothed by ``smoothing``."""
    p_total = sum(live) + smoothing * len(live)
    q_total = sum(reference) + smoothing * len(reference)
    out = 0.0
    for p, q in zip(live, reference):
        p = (p + smoothing) / p_total
        q = (q + smoothing) / q_total
        out += p * math.log(p / q)
    return max(0.0, out)


def fit_histograms(rows: Sequence[Mapping[str, float | None]], names: Iterable[str],
                   categorical: Iterable[str] = ()) -> dict[str, Histogram]:
    """The training distribution: one histogram per feature that is ever present in ``rows``."""
    kinds = set(categorical)
    out = {}
    for name in names:
        values = [row.get(name) for row in rows]
        if all(v is None or (isinstance(v, float) and math.isnan(v)) for v in values):
            continue  # never known in training (a served model's missing internals): nothing to compare
        out[name] = Histogram.fit(values, categorical=name in kinds)
    return out


@dataclass
class DriftReport:
    samples: float  # live candidates counted (after forgetting)
    divergences: dict[str, float]  # feature -> KL(live || training)
    limit: float = KL_LIMIT

    @property
    def judged(self) -> bool:
        return self.samples >= MIN_SAMPLES

    @property
    def drifted(self) -> list[str]:
        """Features past the limit, the largest divergence first (none until enough samples)."""
        if not self.judged:
            return []
        return sorted((f for f, kl in self.divergences.items() if kl > self.limit), key=lambda f: -self.divergences[f])

    @property
    def flagged(self) -> bool:
        return bool(self.drifted)

    @property
    def worst(self) -> tuple[str, float] | None:
        if not self.divergences:
            return None
        name = max(self.divergences, key=lambda f: self.divergences[f])
        return name, self.divergences[name]

    def summary(self) -> str:
        if not self.judged:
            return f"drift: {self.samples:.0f} candidates so far, {MIN_SAMPLES} needed to judge"
        worst = self.worst
        top = f"{worst[0]} {worst[1]:.3f}" if worst else "none"
        if self.flagged:
            return (f"drift: {len(self.drifted)} feature(s) past KL {self.limit} over {self.samples:.0f} candidates "
                    f"(worst {top}): the gate needs retraining (glm5-lsp gate train)")
        return f"drift: none past KL {self.limit} over {self.samples:.0f} candidates (worst {top})"


class DriftMonitor:
    """Running histograms of live features against the training ones. Thread-safe."""

    def __init__(self, training: Mapping[str, Histogram], half_life: float = HALF_LIFE, limit: float = KL_LIMIT) -> None:
        self.training = dict(training)
        self.limit = limit
        self.decay = 0.5 ** (1.0 / half_life) if half_life > 0 else 1.0
        self.live = {name: [0.0] * hist.size for name, hist in self.training.items()}
        self._weight = 1.0  # the weight of the next candidate's counts, divided by decay
        self._total = 0.0
        self._lock = threading.Lock()

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], **options: Any) -> DriftMonitor:
        """From a gate's ``gate.json`` (its ``histograms``)."""
        return cls({name: Histogram.from_json(data) for name, data in (meta.get("histograms") or {}).items()},
                   **options)

    def add(self, values: Mapping[str, float | None]) -> None:
        """Count one candidate's features (every older count weighs a little less: rather than scaling
        every count down, each new one weighs a little more, and all are rescaled now and then)."""
        with self._lock:
            self._weight /= self.decay
            weight = self._weight
            self._total += weight
            for name, hist in self.training.items():
                self.live[name][hist.bin(values.get(name))] += weight
            if weight > 1e100:
                self._rescale()

    def _rescale(self) -> None:
        scale = 1.0 / self._weight
        for counts in self.live.values():
            for i in range(len(counts)):
                counts[i] *= scale
        self._total *= scale
        self._weight = 1.0

    @property
    def samples(self) -> float:
        """The live counts' effective number of candidates (older ones weigh less)."""
        return self._total / self._weight

    def report(self) -> DriftReport:
        with self._lock:
            scale = 1.0 / self._weight
            divergences = {name: kl_divergence([c * scale for c in self.live[name]], hist.counts)
                           for name, hist in self.training.items()}
            return DriftReport(self._total * scale, divergences, self.limit)
