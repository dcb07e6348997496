"""Loading and saving checkpoints: Hugging Face folders of ``config.json`` plus safetensors.

- Single files (``model.safetensors``) or shards (``model.safetensors.index.json``).
- Experts per expert (``mlp.experts.N.gate_proj.weight`` ..., as released checkpoints and
  ``save_pretrained`` write them) or fused (``mlp.experts.gate_up_proj [E, 2I, H]``,
  ``mlp.experts.down_proj [E, H, I]``, as ``transformers`` holds them in memory).
- The multi-token-prediction layer (layer index ``num_hidden_layers`` and beyond) is ignored.
- The model is built on the ``meta`` device and each tensor is read once and assigned in place:
  no second copy of the weights is ever held. Pickle files are refused, never unpickled.
- The loaded model is ready for inference (``prepare_inference``: the fused projections and absorbed
  attention weights the decoding paths read are built once, here).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from glm5_lsp.model.config import ConfigError, GlmMoeDsaConfig
from glm5_lsp.model.glm5 import GlmMoeDsaForCausalLM
from glm5_lsp.model.paths import DEFAULT_MODEL_NAME, default_model_path  # noqa: F401 (re-exported)

_EXPERT_KEY = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.")
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file or tensor at fault."""


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: not a valid safetensors index ({exc})") from None
        files = sorted({path / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} names shard(s) that do not exist: {', '.join(missing)}")
        return files
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    files = sorted(path.glob("*.safetensors"))
    if files:
        return files
    pickles = [p.name for p in path.iterdir() if p.suffix in _PICKLE_SUFFIXES]
    if pickles:
        raise CheckpointError(
            f"{path} holds only pickle checkpoint(s) ({', '.join(pickles)}); they can run arbitrary code and are "
            "never loaded. Convert them to safetensors first (e.g. transformers' save_pretrained(safe_serialization=True))."
        )
    raise CheckpointError(f"no safetensors weights in {path}")


def load_model(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> GlmMoeDsaForCausalLM:
    """Load a ``glm_moe_dsa`` checkpoint folder. fp32 unless ``dtype`` says otherwise."""
    path = Path(path)
    if path.is_file():
        if path.suffix in _PICKLE_SUFFIXES:
            raise CheckpointError(f"{path} is a pickle checkpoint; it is never loaded (use safetensors)")
        path = path.parent
    if not path.is_dir():
        raise FileNotFoundError(f"no model folder at {path}")
    config = GlmMoeDsaConfig.from_pretrained(path)
    dtype = dtype or torch.float32
    device = torch.device(device)
    with torch.device("meta"):
        model = GlmMoeDsaForCausalLM(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    state: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = defaultdict(lambda: defaultdict(dict))

    def keep(name: str, tensor: torch.Tensor) -> None:
        want = expected.get(name)
        if want is None:
            raise CheckpointError(f"unexpected tensor {name!r} in checkpoint {path}")
        if tuple(tensor.shape) != want:
            raise CheckpointError(f"tensor {name!r} has shape {list(tensor.shape)}, expected {list(want)}")
        target = torch.float32 if ".mlp.gate." in name else dtype  # the router stays fp32
        state[name] = tensor.to(device=device, dtype=target)

    for file in _weight_files(path):
        try:
            handle = safe_open(str(file), framework="pt", device="cpu")
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for corrupt headers
            raise CheckpointError(f"{file}: not a readable safetensors file ({exc})") from None
        with handle:
            for name in handle.keys():  # noqa: SIM118 - a safetensors handle is not iterable
                layer = _LAYER_KEY.match(name)
                if layer and int(layer.group(1)) >= config.num_hidden_layers:
                    continue  # the MTP layer
                try:
                    tensor = handle.get_tensor(name)
                except Exception as exc:  # noqa: BLE001 - any read failure names the tensor
                    raise CheckpointError(f"{file}: tensor {name!r} cannot be read ({exc})") from None
                m = _EXPERT_KEY.match(name)
                if m:
                    experts[m.group(1)][int(m.group(2))][m.group(3)] = tensor
                    if len(experts[m.group(1)]) == config.n_routed_experts and all(
                        len(v) == 3 for v in experts[m.group(1)].values()
                    ):
                        _fuse(m.group(1), experts.pop(m.group(1)), keep)
                    continue
                keep(name, tensor)
    for prefix, parts in experts.items():  # leftovers: some expert tensors are missing
        have = sorted(parts)
        raise CheckpointError(
            f"{prefix}: checkpoint has per-expert tensors for experts {have[:8]}{'...' if len(have) > 8 else ''} "
            f"but not all {config.n_routed_experts} experts with gate_proj, up_proj and down_proj"
        )
    if config.tie_word_embeddings and "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing = sorted(set(expected) - set(state))
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise CheckpointError(f"checkpoint {path} is missing tensor(s): {shown}")
    model.load_state_dict(state, assign=True, strict=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval().prepare_inference()


def _fuse(prefix: str, parts: dict[int, dict[str, torch.Tensor]], keep) -> None:
    """Stack per-expert projections into the fused layout, one layer at a time."""
    order = sorted(parts)
    gate_up = torch.stack([torch.cat([parts[e]["gate_proj"], parts[e]["up_proj"]], dim=0) for e in order])
    down = torch.stack([parts[e]["down_proj"] for e in order])
    parts.clear()
    keep(f"{prefix}.gate_up_proj", gate_up)
    keep(f"{prefix}.down_proj", down)


def save_model(
    model: GlmMoeDsaForCausalLM, path: str | Path, max_shard_bytes: int = 15_000_000, fused_experts: bool = True
) -> list[Path]:
    """Write ``config.json`` and safetensors shards of at most ``max_shard_bytes`` (plus an index when sharded)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(path)
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        tensor = tensor.detach().contiguous()
        if not fused_experts and name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len(".gate_up_proj")]
            inter = tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                tensors[f"{prefix}.{e}.gate_proj.weight"] = tensor[e, :inter].clone()
                tensors[f"{prefix}.{e}.up_proj.weight"] = tensor[e, inter:].clone()
            continue
        if not fused_experts and name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len(".down_proj")]
            for e in range(tensor.shape[0]):
                tensors[f"{prefix}.{e}.down_proj.weight"] = tensor[e].clone()
            continue
        tensors[name] = tensor
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes > max_shard_bytes:
            raise CheckpointError(f"tensor {name!r} ({nbytes} bytes) is larger than a shard ({max_shard_bytes} bytes)")
        if size + nbytes > max_shard_bytes and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    for old in list(path.glob("model*.safetensors")) + list(path.glob("model.safetensors.index.json")):
        old.unlink()
    written = []
    if len(shards) == 1:
        file = path / "model.safetensors"
        save_file(shards[0], str(file), metadata={"format": "pt"})
        return [file]
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        file = path / f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(file), metadata={"format": "pt"})
        written.append(file)
        weight_map.update({name: file.name for name in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return written


__all__ = ["CheckpointError", "ConfigError", "default_model_path", "load_model", "save_model"]
