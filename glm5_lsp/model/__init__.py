"""The GLM-5 (``glm_moe_dsa``) runtime: our own PyTorch implementation; ``transformers`` is only its test oracle.

Files in the order a request flows: ``config.py`` (Hugging Face field names) -> ``glm5.py`` (the
whole transformer) -> ``attention.py`` (kernels) -> ``lean.py`` (the one-token CPU step and the
short-prompt prefill) -> ``scripted.py`` (the same two compiled by TorchScript) -> ``native.py`` (a
step or a short prefill in C, ``glm5_lsp/native.c``) -> ``kv_cache.py`` ->
``generate.py``; ``policy.py`` (roles -> selection
rules), ``stats.py`` (per-step statistics), ``loading.py`` (safetensors in and out), ``tokenizer.py``.

- **MLA in two forms.** Prefill chunks that attend to everything expand per-head K/V once and call
  PyTorch's fused SDPA. Everything else uses the *absorbed* form: ``W_uk`` folded into the queries,
  so MLA is multi-query attention over the cached latent ``[c_kv ; k_rope]`` (160 floats per token in
  the benchmark model) and ``W_uv`` is applied after attention. The cache stores only latents.
- **DSA selection** runs per chunk of 128 queries (``Indexer.select``): ReLU scores of the indexer
  heads, weighted per query, causal, top-k. A chunk whose keys all fit the budget keeps them all
  (no scoring). Shared layers reuse the previous full layer's ``Selection`` list.
- **Sparse attention gathers.** For a selecting chunk, each query's selected latents are gathered
  (16 queries at a time, so the copy stays in cache) and attended with two small batched matmuls;
  the work is proportional to top-k, not to the context. A chunk whose every row has at least top-k
  causal keys cannot select a missing key (``Selection.all_valid``), so its gather needs no mask.
  ``reference=True`` computes the same thing as a dense masked softmax (``eager_attention``), which the
  tests compare against.
- **Decoding** (``T <= 4`` tokens per call) runs a fused path: one matmul for every projection that
  reads the hidden state, one for every projection that reads the query latent, one RoPE call for
  every rotary slice. The fused weights are cached and rebuilt if any source weight changes.
- **One token of one sequence on the CPU** (plain fp32 decoding, no forced error-context key: what
  the editor runs thousands of times; while a context fits the top-k budget no key is forced, since
  every key is kept anyway, so error-context roles do not keep a short repair prompt off this path) leaves the module tree for ``lean.py``'s ``decode_one``, called
  by the generator (``generate.cached_forward``) when ``lean.applies``. On a small model a step is bound by per-operation overhead,
  so it is the same arithmetic in fewer operations: no module calls, the fused projections above,
  RMSNorm scaled by one vector norm, no causal mask (every cached key is causal for the newest
  query), the indexer and the absorbed attention as 2-D products on cached contiguous ``W_uk``/``W_uv``,
  the router read once as Python floats. It writes the same cache entries and selects the same keys
  as the general path, so decoding may switch paths at any token (``tests/test_model_decode.py``
  checks logits, key sets and caches; ``Generator(..., lean=False)`` turns it off).
- **A short prompt of one sequence** (2-512 tokens, every query seeing all its causal keys: the
  context fits the top-k budget, or attention is dense) takes ``lean.py``'s ``prefill_dense``, for
  the last position's logits (a prompt) or every position's (a draft's verification): the same
  fused projections, one masked absorbed attention over all keys, no indexer scoring (the selection
  would be every key, so the policy's biases and forced keys change nothing), the indexer's keys
  still cached. The
  editor's prompts are mostly shorter than the embedded model's 128 keys. Up to 64 tokens the
  routed experts run as one padded batch (two batched products) instead of a loop over experts.
  Tested against the general path like ``decode_one``; ``Generator(..., lean=False)`` turns both off.
- **The lean paths compiled.** ``scripted.py`` writes ``decode_one`` and ``prefill_dense`` once more
  as methods of a ``torch.jit.script``-ed module over the same weights (references, not copies), in
  the same operations and order: TorchScript's interpreter runs them with less overhead a step
  than Python and the dispatcher (embedded model, statistics on: a decoding step 1.38x, a 64-token
  prefill 1.25x, a 12-token generation 1.33x as fast; logits equal bit for bit on 240 real prompts x
  16 steps). Built once per set of inference weights (after ``prepare_inference``); if scripting
  fails, one log line and the Python lean paths run.
- **The editor's calls in C.** ``native.c`` computes a decoding step, a prompt's prefill or a
  draft's verification (every row's logits) for one sequence, past DSA's top-k with the indexer's
  choice, the policy's key bias and the error context's forced keys (no statistics' probe) in one call over the model's own weights (several rows
  over copies in panels of 32 outputs) and cache rows, without the interpreter lock; the sums run in another
  order, so logits agree to rounding (``tests/test_model_native.py``: 1e-4, the same greedy text).
  ``Generator.prefetch`` starts a prompt's prefill on the module's worker thread and returns: the
  language server's Python before the generation runs beside it. ``setup.py`` builds it where a C
  compiler is (optional: without one the scripted paths run); ``Generator(..., native=False)`` or
  ``GLM5_NATIVE=0`` turns it off.
- **Prefix reuse.** ``Generator`` keeps one ``KVCache``; a new prompt reuses the longest prefix whose
  token ids *and* roles match (roles steer selection, so they shape the cached latents too).
- **Training** (``forward_train``) uses the dense masked kernels so the indexer's KL target (the main
  attention, summed over heads and normalised) is available: stages ``dense``, ``indexer_warmup``
  (everything but the indexers frozen by the trainer), ``sparse``.

The package imports its modules on first use (PEP 562), so ``glm5_lsp.model.tokenizer`` and
``glm5_lsp.model.paths`` load without torch: a session over a served model never imports it.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "AttentionConfig": "glm5_lsp.model.policy",
    "AttentionPolicy": "glm5_lsp.model.policy",
    "CheckpointError": "glm5_lsp.model.loading",
    "ConfigError": "glm5_lsp.model.config",
    "Generation": "glm5_lsp.model.generate",
    "GenerationConfig": "glm5_lsp.model.generate",
    "Generator": "glm5_lsp.model.generate",
    "GlmMoeDsaConfig": "glm5_lsp.model.config",
    "GlmMoeDsaForCausalLM": "glm5_lsp.model.glm5",
    "KVCache": "glm5_lsp.model.kv_cache",
    "LAYER_STATS": "glm5_lsp.model.stats",
    "Role": "glm5_lsp.model.policy",
    "STEP_STATS": "glm5_lsp.model.stats",
    "Selection": "glm5_lsp.model.glm5",
    "StepStats": "glm5_lsp.model.stats",
    "Tokenizer": "glm5_lsp.model.tokenizer",
    "TrainOutput": "glm5_lsp.model.glm5",
    "cached_forward": "glm5_lsp.model.generate",
    "default_model_path": "glm5_lsp.model.paths",
    "load_model": "glm5_lsp.model.loading",
    "load_tokenizer": "glm5_lsp.model.tokenizer",
    "save_model": "glm5_lsp.model.loading",
}

__all__ = [
    "LAYER_STATS",
    "STEP_STATS",
    "AttentionConfig",
    "AttentionPolicy",
    "CheckpointError",
    "ConfigError",
    "Generation",
    "GenerationConfig",
    "Generator",
    "GlmMoeDsaConfig",
    "GlmMoeDsaForCausalLM",
    "KVCache",
    "Role",
    "Selection",
    "StepStats",
    "Tokenizer",
    "TrainOutput",
    "cached_forward",
    "default_model_path",
    "load_model",
    "load_tokenizer",
    "save_model",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
