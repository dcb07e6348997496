"""The gate: LightGBM beside the model, deciding from what a request already computed whether a
candidate is worth showing, how much of a multi-line one to show, and what to do after a rejected one.

- :mod:`~glm5_lsp.gate.stats`: ``DecodeStats`` (per decoding step: the chosen token's log-probability,
  entropy, top probability and margin, the probability of ending the line; named slots for the runtime's
  internals: DSA indexer concentration and role mass per layer, MoE router entropy / top weight / shared
  share, the last hidden norm) and the ``StepObserver`` logits processor that fills it today;
- :mod:`~glm5_lsp.gate.features`: ``request_info`` + ``features`` -> ``{name: float}`` (NaN = unknown);
- :mod:`~glm5_lsp.gate.labels`: exact / similar / right-word labels against real code;
- :mod:`~glm5_lsp.gate.collect`: rows from the shipped pipeline on held-out packages (``glm5-lsp gate collect``);
- :mod:`~glm5_lsp.gate.train`: the three heads, the threshold, the online update (``glm5-lsp gate train``);
- :mod:`~glm5_lsp.gate.booster`: ``Gate`` (LightGBM text files + ``gate.json`` in ``<model>/gate``);
- :mod:`~glm5_lsp.gate.drift`: feature histograms, KL divergence, the 0.1 flag;
- :mod:`~glm5_lsp.gate.acceptance`: the local acceptance log and the tracker that writes it;
- :mod:`~glm5_lsp.gate.judge`: ``CompletionGate``, the one object a front end wires in.

Wiring (the server's and the pipeline's own files; nothing here imports LSP types):

1. Engine load (after the pipeline exists): ``gate = CompletionGate.for_model(backend.model_path,
   path=settings.completion.gate_path or None, min_quality=settings.completion.min_quality)``, then
   ``gate.install(pipeline)`` (wraps ``pipeline.repair.monitor_factory`` with the decoding observer, local
   backend only). ``min_quality`` None means the gate's own threshold (``gate.json``). No gate beside
   the model: every candidate is shown, as today.
2. Per as-you-type request, on the model worker thread: ``gate.begin()`` before ``pipeline.complete``,
   then ``verdict = gate.judge(result, text, offset, language=..., multiline=..., trigger="automatic" |
   "invoked")``. Show ``verdict.text`` only when ``verdict.show``; when not, ``verdict.strategy`` says what
   the data found best next ("finish_word": the repair loop's word finisher; "regenerate": again without
   the unsure stop; "silent"). ``judge`` also counts the features for drift and logs a warning when the
   KL divergence of any feature passes 0.1 (every ``DRIFT_EVERY`` candidates).
3. Acceptance log (setting ``completion.acceptanceLog``, on by default, off writes nothing):
   ``tracker = SuggestionTracker(AcceptanceLog(enabled=setting))``; when an inline item is sent:
   ``key = tracker.shown(uri, text, offset, verdict.text, features=verdict.features,
   score=verdict.score, threshold=gate.threshold, language=..., model=gate.model)`` and the item gets
   ``command=Command("Accepted", "glm5.accepted", [key])``; the ``glm5.accepted`` command calls
   ``tracker.accepted(key)``; every ``didChange`` calls ``tracker.changed(uri, new_text)``. Not for the
   rest of a suggestion being typed through (that is the same suggestion).
4. ``glm5-lsp gate train --log`` updates the booster from the log (kept only when no worse held out);
   ``glm5-lsp gate drift`` reports the log's drift.

Today the observer sees only what a logits processor sees; the runtime's per-step internals go into
``DecodeStats.per_layer`` / ``per_step`` under the names in ``stats.LAYER_STATS`` / ``STEP_STATS`` once
the generator hands them out, and the features that read them stop being NaN (retrain the gate then).
"""

from glm5_lsp.gate.acceptance import AcceptanceLog, SuggestionTracker, read_outcomes
from glm5_lsp.gate.booster import Gate, GateError, load_gate
from glm5_lsp.gate.drift import DriftMonitor, DriftReport
from glm5_lsp.gate.features import FEATURES, RequestInfo, features, request_info
from glm5_lsp.gate.judge import CompletionGate, Verdict
from glm5_lsp.gate.stats import DecodeRecorder, DecodeStats, StepObserver

__all__ = [
    "FEATURES",
    "AcceptanceLog",
    "CompletionGate",
    "DecodeRecorder",
    "DecodeStats",
    "DriftMonitor",
    "DriftReport",
    "Gate",
    "GateError",
    "RequestInfo",
    "StepObserver",
    "SuggestionTracker",
    "Verdict",
    "features",
    "load_gate",
    "read_outcomes",
    "request_info",
]
