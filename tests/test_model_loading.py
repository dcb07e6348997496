"""Bad checkpoints fail with errors that name the file or tensor at fault; nothing is unpickled."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny import tiny_model

from glm5_lsp.model import CheckpointError, ConfigError, load_model, load_tokenizer, save_model


@pytest.fixture()
def checkpoint(tmp_path: Path) -> Path:
    save_model(tiny_model(), tmp_path / "ok")
    return tmp_path / "ok"


def _rewrite(folder: Path, edit) -> None:
    file = folder / "model.safetensors"
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file))


def test_loads_on_meta_without_copies(checkpoint: Path) -> None:
    model = load_model(checkpoint)
    assert all(p.device.type == "cpu" and p.dtype == torch.float32 for p in model.parameters())
    assert model.model.layers[1].mlp.gate.weight.dtype == torch.float32


def test_bf16_weights_load_as_fp32_by_default_and_as_asked(checkpoint: Path) -> None:
    _rewrite(checkpoint, lambda t: t.update({k: v.to(torch.bfloat16) for k, v in t.items()}))
    assert next(load_model(checkpoint).parameters()).dtype == torch.float32
    half = load_model(checkpoint, dtype=torch.bfloat16)
    assert half.model.embed_tokens.weight.dtype == torch.bfloat16
    assert half.model.layers[1].mlp.gate.weight.dtype == torch.float32  # the router stays fp32


def test_missing_tensor_is_named(checkpoint: Path) -> None:
    _rewrite(checkpoint, lambda t: t.pop("model.layers.0.self_attn.kv_b_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor\(s\): model\.layers\.0\.self_attn\.kv_b_proj\.weight"):
        load_model(checkpoint)


def test_misshapen_tensor_is_named(checkpoint: Path) -> None:
    _rewrite(checkpoint, lambda t: t.update({"model.norm.weight": torch.ones(3)}))
    with pytest.raises(CheckpointError, match=r"'model\.norm\.weight' has shape \[3\], expected \[64\]"):
        load_model(checkpoint)


def test_missing_expert_is_named(tmp_path: Path) -> None:
    save_model(tiny_model(), tmp_path, fused_experts=False)
    _rewrite(tmp_path, lambda t: t.pop("model.layers.2.mlp.experts.5.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"model\.layers\.2\.mlp\.experts"):
        load_model(tmp_path)


def test_mtp_layer_is_ignored(checkpoint: Path) -> None:
    _rewrite(checkpoint, lambda t: t.update({"model.layers.3.eh_proj.weight": torch.zeros(4, 4)}))
    load_model(checkpoint)


def test_other_model_type_is_refused(checkpoint: Path) -> None:
    cfg = json.loads((checkpoint / "config.json").read_text())
    cfg["model_type"] = "llama"
    (checkpoint / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="model_type 'llama'"):
        load_model(checkpoint)


def test_pickle_checkpoints_are_refused_not_loaded(tmp_path: Path, checkpoint: Path) -> None:
    folder = tmp_path / "pickled"
    folder.mkdir()
    shutil.copy(checkpoint / "config.json", folder)
    (folder / "pytorch_model.bin").write_bytes(b"not even a pickle")
    with pytest.raises(CheckpointError, match="pickle"):
        load_model(folder)
    with pytest.raises(CheckpointError, match="never loaded"):
        load_model(folder / "pytorch_model.bin")


def test_corrupt_safetensors_and_index_are_named(checkpoint: Path) -> None:
    (checkpoint / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_model(checkpoint)
    (checkpoint / "model.safetensors.index.json").write_text('{"weight_map": {"x": "model-00002.safetensors"}}')
    with pytest.raises(CheckpointError, match="model-00002.safetensors"):
        load_model(checkpoint)


def test_missing_config_and_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path)
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(ValueError, match="not a valid tokenizer.json"):
        load_tokenizer(tmp_path)
