"""The model in C (``glm5_lsp/native.c``) where it applies: the generator's fastest path for the
editor's two hot calls, a decoding step and a short prompt's prefill.

Under TorchScript a decoding step of the embedded model is about 1,300 tensor operations and a
prompt's prefill a few hundred, each costing more in dispatch than in arithmetic; ``native.c``
computes either in one call, on the model's own fp32 weights (their addresses, read in place) and
the cache's rows, without the interpreter lock. It applies to calls of one sequence of up to
``lean.PREFILL_MAX_TOKENS`` tokens (:func:`lean.lean_ok`): a step, a prompt's prefill (the last
position's logits) or a draft's verification (every position's), each row attending to every key
or, past DSA's top-k, to the indexer's choice with the attention policy's key bias and the error
context's forced keys (a multi-line completion's or a fix's longer prompt); elsewhere (a
statistics' probe, a long prompt past the top-k) the scripted or the general path runs.

The compiled module is optional (``setup.py`` builds it where a C compiler is found); without it,
or for a model it cannot hold (a layout it does not know), :func:`get` returns None.
``GLM5_NATIVE=0`` in the environment turns it off (to compare, or to rule it out).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from glm5_lsp.model.glm5 import GlmMoeDsaForCausalLM, Step

try:
    from glm5_lsp import _native
except ImportError:  # built without a C compiler: the scripted path runs
    _native = None

log = logging.getLogger(__name__)

_P = ctypes.c_void_p
_I = ctypes.c_int64
_F = ctypes.c_float

SELECTING_MAX_ROWS = 448  # at most this many rows of a call past DSA's top-k (past that, torch's batched
# products may win; C scores every selecting row's keys in blocks, ``index_scores_rows``). Past 400 keys
# of the embedded model (`python benchmarks/runtime.py --part native-dsa --threads 1`, and its
# ``native_dsa_compare(rows=(128, 256, 448))``): C 4.40x as fast at 8 rows, 2.03x at 64, 1.59x at 128,
# 1.30x at 256, 1.16x at 448 (1.11x at 64 and 0.89x at 128 when each row read every key on its own)
MAX_EXPERTS = 256  # native.c's fixed arrays
MAX_GROUPS = 64


class _Layer(ctypes.Structure):
    _fields_ = [
        ("in_norm", _P), ("post_norm", _P), ("in_eps", _F), ("post_eps", _F),
        ("w_x", _P), ("q_norm", _P), ("q_eps", _F), ("kv_norm", _P), ("kv_eps", _F),
        ("q_b", _P), ("w_uk", _P), ("w_uv_t", _P), ("o_proj", _P),
        ("has_index", _I), ("ik_w", _P), ("ik_b", _P), ("ik_eps", _F), ("iq_w", _P),
        ("is_moe", _I), ("gate_w", _P), ("up_w", _P), ("down_w", _P), ("inter", _I),
        ("router_w", _P), ("router_bias", _P), ("gate_up", _P), ("down", _P),
        ("latents", _P), ("index_keys", _P),
        ("w_x_t", _P), ("q_b_t", _P), ("o_proj_t", _P), ("gate_t", _P), ("up_t", _P), ("down_t", _P),
        ("router_t", _P), ("gate_up_t", _P), ("down_e_t", _P), ("iq_w_t", _P),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        ("hidden", _I), ("heads", _I), ("nope", _I), ("rope", _I), ("kv_rank", _I), ("v_dim", _I),
        ("q_lora", _I), ("i_dim", _I), ("i_heads", _I),
        ("n_layers", _I), ("vocab", _I), ("n_experts", _I), ("top_k", _I), ("n_group", _I), ("topk_group", _I),
        ("norm_topk_prob", _I), ("moe_inter", _I),
        ("scaling", _F), ("attn_scale", _F), ("i_scale", _F),
        ("embed", _P), ("norm_w", _P), ("lm_head", _P), ("norm_eps", _F),
        ("layers", ctypes.POINTER(_Layer)), ("lm_head_t", _P),
    ]


PANEL = 32  # outputs per panel (native.c's ``linear_rows_t``)


def panels(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``[..., out, in]`` as ``native.c``'s ``linear_rows_t`` reads it: for each matrix, the
    outputs in panels of :data:`PANEL`, each panel ``[in, PANEL]`` (the last as wide as what is left)
    laid out one after another, so a panel is one contiguous block (the size of the matrix in all)."""
    out = weight.shape[-2]
    if out <= PANEL:  # one panel: the plain transpose
        return weight.transpose(-1, -2).contiguous()
    lead = weight.shape[:-2]
    pieces = [weight[..., r0:r0 + PANEL, :].transpose(-1, -2).reshape(*lead, -1) for r0 in range(0, out, PANEL)]
    return torch.cat(pieces, dim=-1).contiguous()


def available() -> bool:
    """Whether the compiled step is installed, matches this side's layout, and is not turned off."""
    if _native is None or os.environ.get("GLM5_NATIVE", "1") == "0":
        return False
    return tuple(_native.layout()) == (ctypes.sizeof(_Model), ctypes.sizeof(_Layer))


class NativeStep:
    """One model's weights as ``native.c`` reads them, and its scratch. Holds references to every
    tensor whose address it passes (the model's own; none is copied). The layers' cache addresses
    and the scratch are shared by every call: a lock keeps two threads' steps apart (generators on
    one model in two threads; the C call itself lets go of the interpreter lock)."""

    def __init__(self, model: GlmMoeDsaForCausalLM) -> None:
        cfg = model.config
        layers = list(model.model.layers)
        self._keep: list[torch.Tensor] = []
        first = layers[0].self_attn
        some_index = next((layer.self_attn.indexer for layer in layers if layer.self_attn.indexer is not None), None)
        moes = [layer.mlp for layer in layers if hasattr(layer.mlp, "experts")]
        router = moes[0].gate if moes else None
        self.n_layers = len(layers)
        self._layers = (_Layer * self.n_layers)()
        # For several tokens at once (a prompt's prefill, a draft's verification) the products read
        # their weights in panels (:func:`panels`; outer products, no sums across vector lanes: about
        # 2.5x the rate): copies, made on first use and again when a weight changed in place (its
        # version moved).
        self._transposed: list[tuple[ctypes.Structure, str, torch.Tensor, int, torch.Tensor | None]] = []  # (the
        # struct, its field, the source, the version copied, the copy)
        for i, layer in enumerate(layers):
            attn, mlp = layer.self_attn, layer.mlp
            fused, absorbed = attn.fused, attn.absorbed
            row = self._layers[i]
            row.in_norm = self._ptr(layer.input_layernorm.weight)
            row.post_norm = self._ptr(layer.post_attention_layernorm.weight)
            row.in_eps, row.post_eps = layer.input_layernorm.eps, layer.post_attention_layernorm.eps
            row.w_x = self._ptr(fused.w_x)
            row.q_norm, row.q_eps = self._ptr(attn.q_a_layernorm.weight), attn.q_a_layernorm.eps
            row.kv_norm, row.kv_eps = self._ptr(attn.kv_a_layernorm.weight), attn.kv_a_layernorm.eps
            row.q_b = self._ptr(attn.q_b_proj.weight)
            row.w_uk, row.w_uv_t = self._ptr(absorbed.w_uk), self._ptr(absorbed.w_uv_t)
            row.o_proj = self._ptr(attn.o_proj.weight)
            index_queries = None
            if attn.indexer is not None:
                norm = attn.indexer.k_norm
                row.has_index = 1
                row.ik_w, row.ik_b, row.ik_eps = self._ptr(norm.weight), self._ptr(norm.bias), norm.eps
                index_queries = fused.w_q[fused.q_rows :]  # [Hi * Di, q_lora]: the rows after the heads' queries
                row.iq_w = self._ptr(index_queries)
            shared = mlp.shared_experts if hasattr(mlp, "experts") else mlp
            row.gate_w, row.up_w = self._ptr(shared.gate_proj.weight), self._ptr(shared.up_proj.weight)
            row.down_w, row.inter = self._ptr(shared.down_proj.weight), shared.gate_proj.weight.shape[0]
            pairs = [("w_x_t", fused.w_x), ("q_b_t", attn.q_b_proj.weight), ("o_proj_t", attn.o_proj.weight),
                     ("gate_t", shared.gate_proj.weight), ("up_t", shared.up_proj.weight),
                     ("down_t", shared.down_proj.weight)]
            if index_queries is not None:
                pairs.append(("iq_w_t", index_queries))
            if hasattr(mlp, "experts"):
                row.is_moe = 1
                row.router_w, row.router_bias = self._ptr(mlp.gate.weight), self._ptr(mlp.gate.e_score_correction_bias)
                row.gate_up, row.down = self._ptr(mlp.experts.gate_up_proj), self._ptr(mlp.experts.down_proj)
                pairs += [("router_t", mlp.gate.weight), ("gate_up_t", mlp.experts.gate_up_proj),
                          ("down_e_t", mlp.experts.down_proj)]
            self._transposed += [(row, name, source.detach(), -1, None) for name, source in pairs]
        m = self._model = _Model()
        m.hidden, m.heads, m.nope, m.rope = cfg.hidden_size, first.n_heads, first.nope_dim, first.rope_dim
        m.kv_rank, m.v_dim, m.q_lora = first.kv_rank, first.v_dim, first.q_a_proj.out_features
        m.i_dim = some_index.head_dim if some_index is not None else 0
        m.i_heads = some_index.n_heads if some_index is not None else 0
        m.n_layers, m.vocab = self.n_layers, model.lm_head.weight.shape[0]
        if router is not None:
            m.n_experts, m.top_k, m.n_group, m.topk_group = router.n_experts, router.top_k, router.n_group, router.topk_group
            m.norm_topk_prob, m.scaling = int(bool(router.norm_topk_prob)), float(router.scaling)
            m.moe_inter = moes[0].experts.down_proj.shape[-1]
        m.attn_scale = float(first.scale)
        m.i_scale = float(some_index.scale) if some_index is not None else 0.0
        m.embed = self._ptr(model.model.embed_tokens.weight)
        m.norm_w, m.norm_eps = self._ptr(model.model.norm.weight), model.model.norm.eps
        m.lm_head = self._ptr(model.lm_head.weight)
        m.layers = self._layers
        self._transposed.append((m, "lm_head_t", model.lm_head.weight.detach(), -1, None))  # several rows' logits
        self._address = ctypes.addressof(m)
        self._scratch = torch.zeros(0)
        self._bound: list[int] = []  # the cache rows' addresses the layers point at
        self._lock = threading.Lock()

    def _ptr(self, t: torch.Tensor) -> int:
        t = t.detach()
        if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError(f"not a contiguous fp32 CPU tensor: {t.dtype} {tuple(t.shape)}")
        self._keep.append(t)
        return t.data_ptr()

    def prepare(self) -> None:
        """Make the transposed weights now rather than in the first prompt's prefill."""
        with self._lock:
            _native.forward_wait()  # a call on the worker reads the copies being replaced
            self._transpose()

    def _transpose(self) -> None:
        """Make the panel copies of the weights that changed since they were last made."""
        for n, (struct, name, source, version, _) in enumerate(self._transposed):
            if source._version == version:
                continue
            copy = panels(source)
            setattr(struct, name, copy.data_ptr())
            self._transposed[n] = (struct, name, source, source._version, copy)

    def _bind(self, step: Step, t: int, width: int) -> int:
        """Point the layers at this cache's rows (again only when they moved); the address of scratch
        for ``t`` tokens (selecting up to ``width`` keys each, or 0)."""
        cache = step.cache
        addresses = ([rows.data_ptr() for rows in cache.latents]
                     + [0 if rows is None else rows.data_ptr() for rows in cache.index_keys])
        if addresses != self._bound:
            for i in range(self.n_layers):
                self._layers[i].latents = addresses[i]
                self._layers[i].index_keys = addresses[self.n_layers + i]
            self._bound = addresses
        need = _native.scratch_floats(self._address, t, cache.capacity, width)
        if need > self._scratch.numel():
            self._scratch = torch.empty(max(need, 2 * self._scratch.numel()))
        return self._scratch.data_ptr()

    def _call(self, input_ids: torch.Tensor, step: Step, every_row: bool) -> tuple:
        """The arguments of a C call (and the tensors they point into, to keep alive)."""
        ids = input_ids[0]
        if ids.dtype != torch.long or not ids.is_contiguous():
            ids = ids.to(torch.long).contiguous()
        n_out = len(ids) if every_row else 1
        logits = torch.empty(1, n_out, self._model.vocab)
        cos, sin = step.cos, step.sin
        if not (cos.is_contiguous() and sin.is_contiguous()):
            cos, sin = cos.contiguous(), sin.contiguous()
        # DSA: past ``topk`` keys each row attends to the indexer's choice (with the policy's bias), and
        # to the error context's forced keys besides; a forced row attends to every key
        topk = 0 if step.dense or step.start + len(ids) <= step.topk else step.topk
        bias = step.key_bias[0] if topk and step.key_bias is not None else None
        if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
            bias = bias.float().contiguous()
        forced = forced_rows = None
        width = topk
        if topk and step.forced_keys is not None:
            forced = step.forced_keys[0, : step.start + len(ids)].to(torch.uint8).contiguous()
            forced_rows = step.forced_rows[0].to(torch.uint8).contiguous()
            width = topk + int(forced.sum())
        _native.forward_wait()  # a call handed to the worker (``start``) uses the scratch and caches
        if len(ids) > 1:
            self._transpose()
        scratch = self._bind(step, len(ids), width)
        args = (self._address, ids.data_ptr(), len(ids), step.start, cos.data_ptr(), sin.data_ptr(), logits.data_ptr(),
                scratch, n_out, topk, 0 if bias is None else bias.data_ptr(),
                0 if forced is None else forced.data_ptr(), 0 if forced_rows is None else forced_rows.data_ptr(), width)
        return args, logits, (ids, cos, sin, self._scratch, bias, forced, forced_rows)

    def forward(self, input_ids: torch.Tensor, step: Step, every_row: bool = False) -> torch.Tensor:
        """The last position's logits ``[1, 1, V]`` for ``input_ids [1, T]`` (see :func:`applies`): a
        decoding step (:func:`lean.decode_one`) or a prompt's prefill (:func:`lean.prefill_dense`);
        ``every_row``: every position's, ``[1, T, V]`` (a draft's verification)."""
        with self._lock:
            args, logits, _ = self._call(input_ids, step, every_row)
            _native.forward(*args)
        step.cache.commit(input_ids, step.role_ids)
        return logits

    def start(self, input_ids: torch.Tensor, step: Step, every_row: bool = False) -> Pending | None:
        """:meth:`forward` on this module's worker thread, returning at once: the :class:`Pending`
        call to finish (its cache rows are committed then), or None where the worker is busy or
        absent (nothing was started)."""
        with self._lock:
            args, logits, keep = self._call(input_ids, step, every_row)
            started = time.perf_counter()
            if not _native.forward_start(*args):
                return None
            handoff = time.perf_counter() - started
        return Pending(input_ids, step, logits, keep, handoff)


class Pending:
    """A call :meth:`NativeStep.start` handed to the worker: :meth:`finish` waits for it and commits
    its tokens to the cache (the caller must finish it before touching that cache again)."""

    def __init__(self, input_ids: torch.Tensor, step: Step, logits: torch.Tensor, keep: tuple,
                 handoff_seconds: float = 0.0) -> None:
        self.input_ids, self.step, self.logits, self._keep = input_ids, step, logits, keep
        self.done = False
        # How long handing the call over took: about 20 microseconds where a core is idle; where every
        # core is busy, the woken worker takes the caller's core and the hand-over lasts until the
        # scheduler gives it back (0.3-1 ms: ``generate.HANDOFF_SLOW_SECONDS``).
        self.handoff_seconds = handoff_seconds

    def drop(self) -> None:
        """Wait for the call and leave its tokens out of the cache (their rows are written over)."""
        if not self.done:
            _native.forward_wait()
            self.done = True
            self._keep = ()

    def finish(self) -> torch.Tensor:
        if not self.done:
            _native.forward_wait()  # (returns at once where another caller has waited for it already)
            self.step.cache.commit(self.input_ids, self.step.role_ids)
            self.done = True
            self._keep = ()
        return self.logits


def applies(step: Step, t: int = 1) -> bool:
    """Whether the C forward computes this call of ``t`` tokens (of a call :func:`lean.lean_ok` allows):
    no probe recording it, and no more than ``SELECTING_MAX_ROWS`` rows past DSA's top-k (a long
    prompt's prefill is quicker in torch)."""
    cache = step.cache
    selecting = 0 if step.dense else step.start + t - max(step.start, step.topk)
    return (
        step.probe is None
        and selecting <= SELECTING_MAX_ROWS
        and (step.key_bias is None or step.key_bias.shape[0] == 1)
        and all(rows.is_contiguous() for rows in cache.latents)
        and all(rows is None or rows.is_contiguous() for rows in cache.index_keys)
    )


def _fits(model: GlmMoeDsaForCausalLM) -> bool:
    layers = list(model.model.layers)
    routers = [layer.mlp.gate for layer in layers if hasattr(layer.mlp, "experts")]
    return (
        model.prepared
        and all(layer.self_attn.fused is not None for layer in layers)
        and all(r.n_experts <= MAX_EXPERTS and r.n_group <= MAX_GROUPS and r.n_experts % r.n_group == 0
                for r in routers)
        and len({(r.n_experts, r.top_k, r.n_group, r.topk_group, r.norm_topk_prob, r.scaling) for r in routers}) <= 1
    )


def _inference_weights(model: GlmMoeDsaForCausalLM) -> list:
    return [(layer.self_attn.fused, layer.self_attn.absorbed) for layer in model.model.layers]


def get(model: GlmMoeDsaForCausalLM) -> NativeStep | None:
    """The model's native step, built on first use after each ``prepare_inference`` (as
    ``scripted.get``); None where it is not installed, turned off, or cannot hold this model."""
    if not available():
        return None
    held = model.__dict__.get("_native_step")
    if held is not None and all(f is a and b is c for (f, b), (a, c) in zip(held[1], _inference_weights(model))):
        return held[0]
    built = None
    if _fits(model):
        try:
            built = NativeStep(model)
        except (ValueError, AttributeError, TypeError) as exc:  # a layout it does not know: the scripted path
            log.info("the native decoding step does not hold this model (%s); the scripted path runs", exc)
    model.__dict__["_native_step"] = (built, _inference_weights(model))
    return built
