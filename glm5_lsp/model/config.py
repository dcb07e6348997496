"""``GlmMoeDsaConfig``: the GLM-5 (``model_type: glm_moe_dsa``) hyper-parameters, with Hugging Face's field names.

A ``config.json`` written by ``transformers`` loads as is (unknown keys are kept in ``extra`` and
written back); derived fields (``indexer_types``, ``mlp_layer_types``) follow the same rules as
``transformers.GlmMoeDsaConfig``. The defaults are GLM-5's own sizes.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODEL_TYPE = "glm_moe_dsa"


class ConfigError(ValueError):
    """A config that this runtime cannot run, naming the field at fault."""


@dataclass
class GlmMoeDsaConfig:
    vocab_size: int = 154880
    hidden_size: int = 6144
    intermediate_size: int = 12288  # dense MLP width (the first `first_k_dense_replace` layers)
    moe_intermediate_size: int = 2048  # width of each routed expert (and of the shared experts, times n_shared_experts)
    num_hidden_layers: int = 78
    num_attention_heads: int = 64
    num_key_value_heads: int = 64  # MLA expands the latent per head; kept for Hugging Face compatibility
    n_shared_experts: int = 1
    n_routed_experts: int = 256
    routed_scaling_factor: float = 2.5
    kv_lora_rank: int = 512  # width of the compressed KV latent (what the cache stores)
    q_lora_rank: int = 2048  # width of the query latent (also the indexer's query input)
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 192
    v_head_dim: int = 256
    n_group: int = 1  # grouped routing: experts split into n_group groups, topk_group of them eligible
    topk_group: int = 1
    num_experts_per_tok: int = 8
    norm_topk_prob: bool = True
    hidden_act: str = "silu"
    max_position_embeddings: int = 202752
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-5
    pad_token_id: int | None = None
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 1
    tie_word_embeddings: bool = False
    rope_parameters: dict[str, Any] | None = None  # {"rope_type": "default", "rope_theta": ...}
    attention_bias: bool = False
    attention_dropout: float = 0.0
    first_k_dense_replace: int = 3
    mlp_layer_types: list[str] | None = None  # per layer "dense" | "sparse" (MoE)
    index_topk: int = 2048  # keys each query keeps under DSA
    index_head_dim: int = 128
    index_n_heads: int = 32
    indexer_types: list[str] | None = None  # per layer "full" (runs the indexer) | "shared" (reuses the last full one)
    model_type: str = MODEL_TYPE
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # unknown keys, round-tripped

    def __post_init__(self) -> None:
        if self.model_type != MODEL_TYPE:
            raise ConfigError(f"config.json has model_type {self.model_type!r}; this runtime runs {MODEL_TYPE!r}")
        if self.rope_parameters is None:
            theta = self.extra.pop("rope_theta", 10000.0)
            self.rope_parameters = {"rope_type": "default", "rope_theta": theta}
        rope_type = self.rope_parameters.get("rope_type", self.rope_parameters.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(f"rope_parameters.rope_type {rope_type!r} is not supported (only 'default')")
        if self.indexer_types is None:
            pattern = self.extra.get("index_topk_pattern")
            if pattern is not None:
                table = {"F": "full", "S": "shared"}
                self.indexer_types = [table[c] for c in pattern] if isinstance(pattern, str) else list(pattern)
            else:
                freq = max(int(self.extra.get("index_topk_freq", 1)), 1)
                offset = int(self.extra.get("index_skip_topk_offset", 2))
                self.indexer_types = [
                    "full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(self.num_hidden_layers)
                ]
        if self.mlp_layer_types is None:
            n_dense = min(self.first_k_dense_replace, self.num_hidden_layers)
            self.mlp_layer_types = ["dense"] * n_dense + ["sparse"] * (self.num_hidden_layers - n_dense)
        self._validate()

    def _validate(self) -> None:
        n = self.num_hidden_layers
        for name in ("indexer_types", "mlp_layer_types"):
            value = getattr(self, name)
            if len(value) != n:
                raise ConfigError(f"{name} has {len(value)} entries for {n} layers")
        if any(t not in ("full", "shared") for t in self.indexer_types):
            raise ConfigError(f"indexer_types must be 'full' or 'shared', got {self.indexer_types}")
        if self.indexer_types and self.indexer_types[0] != "full":
            raise ConfigError("indexer_types[0] must be 'full': a shared layer reuses an earlier full layer")
        if any(t not in ("dense", "sparse") for t in self.mlp_layer_types):
            raise ConfigError(f"mlp_layer_types must be 'dense' or 'sparse', got {self.mlp_layer_types}")
        if self.n_routed_experts % self.n_group:
            raise ConfigError(f"n_routed_experts {self.n_routed_experts} is not divisible by n_group {self.n_group}")
        if self.index_head_dim < self.qk_rope_head_dim:
            raise ConfigError("index_head_dim must be at least qk_rope_head_dim")
        if self.hidden_act != "silu":
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not supported (only 'silu')")

    # -- derived sizes ---------------------------------------------------------------------------
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def rope_theta(self) -> float:
        return float(self.rope_parameters["rope_theta"])  # type: ignore[index]

    # -- (de)serialisation -----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GlmMoeDsaConfig:
        data = dict(data)
        if "num_local_experts" in data and "n_routed_experts" not in data:
            data["n_routed_experts"] = data.pop("num_local_experts")
        data.setdefault("model_type", MODEL_TYPE)
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs = {k: v for k, v in data.items() if k in known}
        extra = {k: v for k, v in data.items() if k not in known}
        return cls(**kwargs, extra=extra)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> GlmMoeDsaConfig:
        path = Path(path)
        file = path / "config.json" if path.is_dir() else path
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"no config.json at {file}") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{file} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{file} must hold a JSON object")
        try:
            return cls.from_dict(data)
        except TypeError as exc:
            raise ConfigError(f"{file}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        out.update({k: v for k, v in self.extra.items() if k not in out})
        out["head_dim"] = self.qk_rope_head_dim
        out["qk_head_dim"] = self.qk_head_dim
        out.setdefault("architectures", ["GlmMoeDsaForCausalLM"])
        return out

    def save_pretrained(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
