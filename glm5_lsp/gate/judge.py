"""The one object a front end wires in: features, score, threshold, length, strategy and drift counts
for each candidate the pipeline returns.

    gate = CompletionGate.for_model(model_dir, path=settings_path or None, min_quality=setting_or_None)
    pipeline.install_gate(gate)                 # once: the decoding observer in front of the monitor
    ...
    result = pipeline.complete(text, offset, ..., gated=True, trigger="automatic")
    result.text, result.score, result.features, result.withheld

The pipeline calls ``begin`` before the request and ``judge`` after its checks (``Pipeline.complete``
with ``gated``); front ends never call the gate themselves.

Without a trained gate for the model (``for_model`` finds none) every candidate is shown as before
(``score`` None) and nothing else changes. The length head is not used by default (``use_length``):
on held-out code it is no better than the fixed multi-line policy (BENCHMARKS.md, "The gate").
A gate trained for other weights (``stale``) still decides, with a warning at load, and its
features' drift is watched as usual.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glm5_lsp.backends.base import capabilities
from glm5_lsp.gate.booster import Gate, load_gate, model_fingerprint
from glm5_lsp.gate.drift import DriftMonitor, DriftReport
from glm5_lsp.gate.features import features, internal_feature, kept_text, request_info
from glm5_lsp.gate.stats import DecodeRecorder, DecodeStats

log = logging.getLogger(__name__)

DRIFT_EVERY = 500  # candidates between drift checks (each logged once it is judged)


@dataclass
class Verdict:
    show: bool
    text: str  # what to show: the candidate, cut to the length head's choice for a multi-line one ("" when not shown)
    score: float | None = None  # P(kept); None without a gate
    length: str | None = None  # the length head's choice (multi-line candidates)
    strategy: str | None = None  # not shown: "regenerate", "finish_word" or "silent" (None: no head)
    features: dict[str, float] = field(default_factory=dict)


class CompletionGate:
    """A gate (or none) with its decoding recorder and drift monitor. Thread-safe as the pipeline is:
    ``begin`` and ``judge`` for one request run on the same thread."""

    def __init__(self, gate: Gate | None, *, min_quality: float | None = None, healing: bool = True,
                 drift_every: int = DRIFT_EVERY, use_length: bool = False) -> None:
        self.gate = gate
        # The length head cuts multi-line candidates only when asked: measured on held-out code it is no
        # better than showing the whole block (the fixed multi-line policy), so that policy stays.
        self.use_length = use_length
        self.threshold = (gate.threshold if gate is not None else 0.0) if min_quality is None else min_quality
        self.healing = healing
        self.recorder: DecodeRecorder | None = None
        self.drift = DriftMonitor.from_meta(gate.meta) if gate is not None else None
        self.drift_every = drift_every
        self._seen = 0
        self.last_drift: DriftReport | None = None
        self.model: str | None = None  # the weights' fingerprint, for the acceptance log's records

    @classmethod
    def for_model(cls, model_dir: str | Path | None, path: str | Path | None = None,
                  min_quality: float | None = None) -> CompletionGate:
        """The gate beside the model (or at ``path``); a gate that cannot be read is logged and left off."""
        try:
            gate = load_gate(model_dir, path)
        except ValueError as error:  # GateError
            log.error("the completion gate is off: %s", error)
            gate = None
        judge = cls(gate, min_quality=min_quality)
        if model_dir is not None:
            try:
                judge.model = model_fingerprint(model_dir)
            except (ValueError, OSError):
                judge.model = None  # a folder without safetensors (a served model's name, say)
        if gate is not None and gate.stale:
            log.warning("the completion gate was trained for other weights: it still decides, and drift is "
                        "watched; retrain it (glm5-lsp gate train)")
        return judge

    def install(self, pipeline: Any) -> None:
        """Put the decoding observer in front of the pipeline's monitor (a local model only: a served one
        gives no logits, and its candidates are judged on the rest)."""
        backend = pipeline.backend
        self.healing = pipeline.settings.token_healing and capabilities(backend).forced_prefix
        if self.gate is None or not getattr(backend, "supports_internals", False):
            return
        strings: Sequence[str] = backend.tokenizer.token_strings()
        self.recorder = DecodeRecorder(strings)
        self.recorder.install(pipeline)

    def set_min_quality(self, min_quality: float | None) -> None:
        """The threshold from now on; None: the gate's own (gate.json)."""
        own = self.gate.threshold if self.gate is not None else 0.0
        self.threshold = own if min_quality is None else min_quality

    @property
    def wants_internals(self) -> bool:
        """Whether a head reads the runtime's internals (DSA, the router, the hidden state): only then is
        the backend asked for them (``CompletionRequest.step_stats``), which costs a little a step."""
        if self.gate is None:
            return False
        heads = [h for h in (self.gate.quality, self.gate.length_head, self.gate.strategy_head) if h is not None]
        return any(internal_feature(name) for head in heads for name in head.features)

    def begin(self) -> None:
        if self.recorder is not None:
            self.recorder.begin()

    def judge(self, result: Any, document: str, offset: int, *, language: str, multiline: bool,
              trigger: str | None = None, internals: Any = None, count: bool = True,
              generated: bool = True) -> Verdict:
        """The verdict on ``result`` (its ``text`` goes in at character ``offset`` of ``document``).
        ``internals``: the runtime's per-step statistics of the candidate's generation
        (``Completion.stats``, where the backend was asked for them). ``count``: add its features to
        the drift counts. ``generated``: False for a text the model did not write (the memory's
        continuation in place of a withheld candidate): the last generation's statistics are not read."""
        text = result.text or ""
        if self.gate is None or not text.strip():
            return Verdict(show=bool(text.strip()), text=text)
        values = self.features(result, document, offset, language=language, multiline=multiline, trigger=trigger,
                               internals=internals, generated=generated)
        score = self.gate.score(values)
        if count:
            self._count(values)
        if score < self.threshold:
            return Verdict(show=False, text="", score=score, strategy=self.gate.strategy(values), features=values)
        length = None
        if self.use_length and multiline and "\n" in text.strip("\n") and self.gate.length_head is not None:
            length = self.gate.length(values)
            if length is not None:
                text = kept_text(text, length)
        return Verdict(show=True, text=text, score=score, length=length, features=values)

    def features(self, result: Any, document: str, offset: int, *, language: str, multiline: bool,
                 trigger: str | None = None, internals: Any = None, generated: bool = True) -> dict[str, float]:
        """The candidate's features: the request, the result, the last generation's statistics (the
        observer's, with the runtime's ``internals`` where given)."""
        stats = self.recorder.last() if self.recorder is not None and generated else None
        if generated and internals is not None and getattr(internals, "per_layer", None) is not None:
            stats = stats if stats is not None else DecodeStats()
            stats.per_layer = dict(internals.per_layer)
            stats.per_step = dict(getattr(internals, "per_step", None) or {})
        info = request_info(document, offset, language=language, multiline=multiline, trigger=trigger,
                            healing=self.healing)
        return features(result, info, stats)

    def _count(self, values: dict[str, float]) -> None:
        if self.drift is None:
            return
        self.drift.add(values)
        self._seen += 1
        if self._seen % self.drift_every == 0:
            report = self.drift.report()
            if report.judged:
                (log.warning if report.flagged else log.info)("%s", report.summary())
            self.last_drift = report

    def drift_report(self) -> DriftReport | None:
        return self.drift.report() if self.drift is not None else None
