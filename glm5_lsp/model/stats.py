"""Per-step statistics of the model's internals, handed out by the generator when asked
(``GenerationConfig.step_stats``): what the quality gate (``glm5_lsp.gate``) reads besides the logits.

One step is one token chosen: the forward position whose logits it was chosen from (the prompt's last
position for the first token, then each decoding step's token, or a draft verification's row). Per
step and per layer (:data:`LAYER_STATS`) and per step (:data:`STEP_STATS`):

- ``dsa_concentration`` (layers with their own indexer, ``indexer_types == "full"``): of the indexer's
  softmax mass on its top-k keys, the share on its top 16 (``min(16, k)``), by the indexer's *own*
  scores over every causal key (no policy bias, no forced keys: how peaked the indexer is, not what
  the editor asked). ``k`` is the step's top-k budget. When a query keeps every key (the context fits
  the budget, or attention is dense) there is no selection, but the statistic is still defined: the
  scores are computed for it (only when asked), and the share is over all the causal keys, so it is 1
  while there are at most 16 of them. It is never NaN.
- ``dsa_mass_error_context``, ``dsa_mass_current_block``, ``dsa_mass_api_doc`` (every layer): the main
  attention's probability mass, averaged over heads, on keys of that role, over the keys the query
  actually attended (its selection, forced keys included, or every causal key when it keeps them
  all). Always defined: 0 where the prompt has no such keys.
- ``moe_router_entropy`` (MoE layers): the entropy, in nats, of the router's sigmoid scores
  normalised over the routed experts (the selection bias steers the choice only and is left out).
- ``moe_top_weight`` (MoE layers): the largest weight a chosen expert gets, before
  ``routed_scaling_factor`` (normalised over the chosen experts when ``norm_topk_prob``).
- ``moe_shared_share`` (MoE layers): ``|shared| / (|routed| + |shared|)`` for the L2 norms of the
  shared experts' and the routed experts' outputs.
- ``hidden_norm``: the L2 norm of the last hidden state (before the final norm).

So each per-layer list runs over the layers where its statistic exists (all layers for the masses,
the full-indexer layers for the concentration, the MoE layers for the router's), in layer order; the
shape matches ``glm5_lsp.gate.stats.DecodeStats.per_layer`` (name -> steps -> layers) and
``per_step`` (name -> steps), so the gate copies them as they are.

The lean paths (``lean.py``) and the general ``forward`` fill a :class:`StatsProbe` with the same
numbers (``tests/test_model_stats.py``). While decoding, a step adds one product per layer (its
attention probabilities times the keys' role one-hot; two where it selected keys) and otherwise keeps
references to tensors it computes anyway (the indexer's query and head weights, the router's scores,
the experts' outputs, the hidden state). :meth:`StatsProbe.finish` reduces them all at once, in a
fixed number of batched operations: the indexer's scores of every step against the cache's indexer
keys (a kept step's keys are never rewritten), then the shares, entropies and norms.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from glm5_lsp.model.policy import Role

if TYPE_CHECKING:
    from glm5_lsp.model.glm5 import Step

LAYER_STATS: tuple[str, ...] = (
    "dsa_concentration",
    "dsa_mass_error_context",
    "dsa_mass_current_block",
    "dsa_mass_api_doc",
    "moe_router_entropy",
    "moe_top_weight",
    "moe_shared_share",
)
STEP_STATS: tuple[str, ...] = ("hidden_norm",)
MASS_ROLES: tuple[Role, ...] = (Role.ERROR_CONTEXT, Role.CURRENT_BLOCK, Role.API_DOC)  # dsa_mass_* in order
CONCENTRATION_TOP = 16  # dsa_concentration: the share of the top-k mass on this many keys


@dataclass
class StepStats:
    """The runtime's statistics of one generation: ``per_layer[name][step][layer]`` and
    ``per_step[name][step]`` under :data:`LAYER_STATS` and :data:`STEP_STATS`."""

    per_layer: dict[str, list[list[float]]] = field(default_factory=dict)
    per_step: dict[str, list[float]] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return len(self.per_step.get("hidden_norm", ()))


@dataclass
class _ForwardRecord:
    """What one forward call recorded, one entry per layer in each list. A ``lean`` call (``lean.py``'s
    step, or its prefill's last row) records one row in each entry's row shape; any other (the general
    path, or the lean prefill of a draft, which records every row) its ``rows`` rows stacked first."""

    rows: int
    lean: bool
    masses: list[torch.Tensor] = field(default_factory=list)  # row [H, 3]: attention mass by head and role
    index_rope: list[torch.Tensor] = field(default_factory=list)  # row [Hi, R]: the indexer query's rotated part
    index_rest: list[torch.Tensor] = field(default_factory=list)  # row [Hi, Di - R]: and its other part
    index_weights: list[torch.Tensor] = field(default_factory=list)  # row [Hi]: its head weights
    index_scale: list[float] = field(default_factory=list)  # what the head weights are still to be scaled by
    router: list[torch.Tensor] = field(default_factory=list)  # row [1, E]: sigmoid scores
    top_weight: list[torch.Tensor | float] = field(default_factory=list)  # row: a float
    routed: list[torch.Tensor] = field(default_factory=list)  # row [1, D]
    shared: list[torch.Tensor] = field(default_factory=list)  # row [1, D]
    hidden: torch.Tensor | None = None  # row [1, D]
    kend: int = 0  # keys of the first recorded row (row r has kend + r)


class StatsProbe:
    """Collects :class:`StepStats` over one generation of one sequence (batch 1).

    Each forward call: :meth:`begin` (which query rows it records: the last only, or all), the
    layers' records in layer order, :meth:`end` (the call's block number). :meth:`finish` takes the
    ``(block, row)`` each step's logits came from and returns the statistics in that order. The
    indexer's scores are computed there, for every step at once, from the recorded queries and the
    cache's indexer keys (which still hold every key a kept step saw).
    """

    def __init__(self, scaling: float = 1.0) -> None:
        self.scaling = scaling  # routed_scaling_factor: moe_top_weight is reported before it
        self.blocks: list[_ForwardRecord] = []
        self.rows = slice(0, 1)  # the rows of this call's queries that are recorded
        self._current: _ForwardRecord | None = None
        self._cache = None
        self._topk = 0
        self._key_scale = 1.0  # the indexer's score scale (head_dim ** -0.5)
        self._index_layers: list[int] = []
        self._roles = torch.zeros(0, len(MASS_ROLES))  # one-hot of each key position's role (MASS_ROLES)
        self._filled = 0  # positions of ``_roles`` written (beyond: zero rows, the role of code)
        self._role_ids = torch.tensor([int(r) for r in MASS_ROLES], dtype=torch.long)

    # ---- one forward call ----------------------------------------------------------------------

    def begin(self, step: Step, t: int, last_only: bool, lean: bool = False) -> None:
        """A forward call of ``t`` new tokens at ``step.start`` starts; the roles of its keys are noted.
        ``lean``: its one recorded row comes in the row shape (see :class:`_ForwardRecord`)."""
        if step.role_ids is None or step.role_ids.shape[0] != 1:
            raise ValueError("step statistics are collected for one sequence at a time")
        if step.cache is None:
            raise ValueError("step statistics are collected on a cache (its indexer keys are read at the end)")
        self.rows = slice(t - 1, t) if last_only else slice(0, t)
        self._cache = step.cache
        self._topk = step.topk
        start, end = step.start, step.start + t
        if end > self._roles.shape[0]:
            grown = torch.zeros(max(end, 2 * self._roles.shape[0], 64), len(MASS_ROLES))
            grown[: self._filled] = self._roles[: self._filled]
            self._roles = grown
        if self._filled < start:  # keys cached before this generation
            self._roles[self._filled : start] = self._one_hot(step.cache.roles[0, self._filled : start])
        if t == 1 and start >= self._filled and int(step.role_ids[0, 0]) == int(Role.CODE):
            pass  # a decoded token of code: its row is zero already
        else:
            self._roles[start:end] = self._one_hot(step.role_ids[0])
        self._filled = max(self._filled, end)
        self._current = _ForwardRecord(self.rows.stop - self.rows.start, lean, kend=start + self.rows.start + 1)

    def _one_hot(self, roles: torch.Tensor) -> torch.Tensor:
        return (roles.to("cpu")[:, None] == self._role_ids[None, :]).float()

    def key_roles(self, kend: int) -> torch.Tensor:
        """``[kend, 3]``: each key's role one-hot over :data:`MASS_ROLES`."""
        return self._roles[:kend]

    def attention(self, probs: torch.Tensor, key_roles: torch.Tensor) -> None:
        """One layer's attention for the recorded rows: ``probs`` (lean: ``[H, K]``; general:
        ``[n, H, K]``) over keys whose roles are ``key_roles [K, 3]``."""
        self._current.masses.append(torch.matmul(probs, key_roles))

    def index_query(self, layer: int, rope: torch.Tensor, rest: torch.Tensor, weights: torch.Tensor,
                    weight_scale: float, key_scale: float) -> None:
        """One full-indexer layer's query for the recorded rows (lean: ``[Hi, R]``, ``[Hi, Di - R]``,
        ``[Hi]``; general: each with the rows first): its score of key ``k`` is ``sum_h weights[h] *
        weight_scale * relu(key_scale * q[h] . k)``, as ``Indexer.scores``; scored in :meth:`finish`.
        Every call passes its rows in the same memory layout (``rope`` contiguous, ``rest`` a slice of
        a contiguous query): ``torch.stack`` of a mixed list is ten times as slow."""
        block = self._current
        if not self.blocks and len(block.index_rope) == len(self._index_layers):
            self._index_layers.append(layer)
        self._key_scale = key_scale
        block.index_rope.append(rope)
        block.index_rest.append(rest)
        block.index_weights.append(weights)
        block.index_scale.append(weight_scale)

    def router(self, scores: torch.Tensor, top_weight: torch.Tensor | float, routed: torch.Tensor | None,
               shared: torch.Tensor) -> None:
        """One MoE layer: sigmoid ``scores`` (lean ``[1, E]``; general ``[n, E]``), the largest chosen
        weight as the router returns it (a float; general ``[n]``), the routed and shared experts'
        outputs (``[1, D]``; general ``[n, D]``)."""
        block = self._current
        block.router.append(scores)
        block.top_weight.append(top_weight)
        block.routed.append(routed if routed is not None else torch.zeros_like(shared))
        block.shared.append(shared)

    def hidden(self, x: torch.Tensor) -> None:
        """The last hidden state of the recorded rows, ``[1, D]`` (general ``[n, D]``)."""
        self._current.hidden = x

    def end(self) -> int:
        self.blocks.append(self._current)
        self._current = None
        return len(self.blocks) - 1

    # ---- the whole generation ------------------------------------------------------------------

    def finish(self, used: list[tuple[int, int]]) -> StepStats:
        """The statistics of the steps whose logits came from ``used[i] = (block, row)``, in order.

        The records are gathered with one ``torch.stack``/``cat`` each and reduced in NumPy, whose
        small operations cost about a tenth of torch's (this runs once per candidate)."""
        per_layer: dict[str, list[list[float]]] = {name: [[] for _ in used] for name in LAYER_STATS}
        if not used or not self.blocks:
            return StepStats(per_layer, {name: [] for name in STEP_STATS})
        steps = [(self.blocks[b], r) for b, r in used]
        n = len(steps)

        def each(name: str, flat: bool = False) -> list:
            """Every used step's entries of a per-layer list, step-major, in their row shape."""
            out = []
            for block, r in steps:
                entries = getattr(block, name)
                if block.lean or name == "index_scale":  # (one scale per layer, whatever the rows)
                    out += entries
                else:
                    out += [e[r : r + 1] if flat else e[r] for e in entries]
            return out

        def gather(name: str, flat: bool = False) -> np.ndarray:
            parts = each(name, flat)
            return (torch.cat(parts) if flat else torch.stack(parts)).float().numpy()

        first = self.blocks[0]
        if first.masses:
            masses = gather("masses").reshape(n, len(first.masses), -1, len(MASS_ROLES)).mean(2)  # [S, L, 3]
            for k, role in enumerate(MASS_ROLES):
                per_layer[f"dsa_mass_{role.name.lower()}"] = masses[:, :, k].tolist()
        if first.index_rope:
            per_layer["dsa_concentration"] = self._concentration(steps, each).tolist()
        if first.router:
            layers = len(first.router)
            scores = gather("router", flat=True).reshape(n, layers, -1).astype(np.float64)  # sigmoids: > 0
            total = scores.sum(-1)
            entropy = np.log(total) - (scores * np.log(scores)).sum(-1) / total  # of scores / total
            per_layer["moe_router_entropy"] = entropy.tolist()
            top = np.array([float(w) for w in each("top_weight")]).reshape(n, layers) / self.scaling
            per_layer["moe_top_weight"] = top.tolist()
            norms = np.linalg.norm(torch.cat(each("routed", True) + each("shared", True)).float().numpy(), axis=-1)
            routed, shared = norms[: n * layers], norms[n * layers :]
            per_layer["moe_shared_share"] = (shared / np.maximum(routed + shared, 1e-30)).reshape(n, layers).tolist()
        hidden = torch.cat([b.hidden if b.lean else b.hidden[r : r + 1] for b, r in steps]).float().numpy()
        return StepStats(per_layer, {"hidden_norm": np.linalg.norm(hidden, axis=-1).tolist()})

    def _concentration(self, steps, each) -> np.ndarray:
        """``[S, Li]``: every kept step's indexer scores over its causal keys, scored at once against
        the cache's keys, reduced to the share of the top-k mass on the top 16."""
        n, layers = len(steps), len(self.blocks[0].index_rope)
        kends = np.array([block.kend + r for block, r in steps])
        width = int(kends.max())
        query = torch.cat([torch.stack(each("index_rope")), torch.stack(each("index_rest"))], dim=-1).float()
        heads = query.shape[1]
        query = query.view(n, layers, heads, -1).transpose(0, 1).reshape(layers, n * heads, -1)
        keys = torch.stack([self._cache.index_keys[j][0, :width] for j in self._index_layers]).float()
        # (torch's product, on torch's threads; the rest in NumPy)
        per_head = torch.bmm(query, keys.transpose(1, 2)).mul_(self._key_scale).relu_().numpy()  # [Li, S*Hi, Tk]
        weights = torch.stack(each("index_weights")).float().numpy().reshape(n, layers, heads)
        scales = each("index_scale")
        weights = weights * (scales[0] if len(set(scales)) == 1 else np.array(scales).reshape(n, layers, 1))
        per_head = per_head.reshape(layers, n, heads, width).transpose(1, 0, 2, 3)  # [S, Li, Hi, Tk]
        scores = (weights[..., None] * per_head).sum(2)  # [S, Li, Tk]
        scores = np.where(np.arange(width)[None, None, :] < kends[:, None, None], scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        top = min(CONCENTRATION_TOP, width)
        if width <= self._topk:  # every causal key is among the top k: their mass is 1
            return np.partition(probs, width - top, axis=-1)[..., width - top :].sum(-1)
        kept = np.partition(probs, width - self._topk, axis=-1)[..., width - self._topk :]  # each row's top k
        best = np.partition(kept, self._topk - min(top, self._topk), axis=-1)[..., self._topk - min(top, self._topk):]
        return best.sum(-1) / kept.sum(-1)
