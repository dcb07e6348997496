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

Wired (nothing here imports LSP types; front ends reach the gate only through the pipeline):

1. ``pipeline.session.open_session(gate=True, gate_path=..., min_quality=...)`` builds
   ``CompletionGate.for_model(backend.model_path, ...)`` and ``Pipeline.install_gate`` puts the decoding
   observer in front of the monitor (local backend only). ``min_quality`` None is the gate's own
   threshold (``gate.json``); the server passes None while ``completion.minQuality`` is left at its
   default. No gate beside the model (a served model unless ``completion.gatePath`` names one): every
   candidate is shown, as before. A gate trained for other weights (``stale``) still decides, with a
   warning; drift is watched.
2. ``Pipeline.complete(..., gated=True, trigger=...)`` (the server's as-you-type completions) runs
   ``begin`` before the request and ``pipeline.gating.judged`` after its checks: below the threshold the
   result is empty with ``withheld`` saying why, or, when the strategy head says "finish_word", the
   word finisher's likeliest word (checked); "regenerate" stays silent (worse on held-out code). The
   length head is off (``use_length``): it measured no better than the fixed multi-line policy. A gate
   whose heads read the runtime's internals gets them (``CompletionRequest.step_stats``); the shipped
   one reads none. ``judge`` counts the features for drift and logs a warning when the KL divergence
   of any feature passes 0.1 (every ``DRIFT_EVERY`` candidates).
3. The acceptance log (``completion.acceptanceLog``, on by default, off writes nothing): the server's
   ``SuggestionTracker`` records each inline item sent (``shown``, with the result's ``score`` and
   ``features``), the item's ``command`` ``glm5.accepted`` (``accepted``), and every ``didChange``
   (``typed_over``, ``removed`` within 30 s); the same suggestion asked again or typed through keeps
   its id.
4. ``glm5-lsp gate train --log`` updates the booster from the log (kept only when no worse held out);
   ``glm5-lsp gate drift`` reports the log's drift.
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
