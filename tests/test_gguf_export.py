"""The GGUF export (``glm5_lsp/gguf_export.py``): every weight in llama.cpp's ``glm-dsa`` layout, read back.

(The export was also compared with llama.cpp's own ``convert_hf_to_gguf.py`` from the
llama-cpp-python 0.3.36 sources on the embedded model: the 90 tensors are byte-identical.)
``test_llamacpp_server.py`` runs the exported file in llama.cpp's server.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file

from glm5_lsp.gguf_export import ExportError, export, indexer_width, main


def _weights(folder: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for file in folder.glob("*.safetensors"):
        out.update(load_file(str(file)))
    return out


def test_export_round_trips_every_weight_and_the_vocabulary(tiny_checkpoint: Path, tmp_path: Path) -> None:
    out = export(tiny_checkpoint, tmp_path / "tiny.gguf")
    reader = gguf.GGUFReader(str(out))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    source = _weights(tiny_checkpoint)

    assert fields["general.architecture"] == "glm-dsa"
    assert fields["glm-dsa.block_count"] == config["num_hidden_layers"]
    assert fields["glm-dsa.attention.head_count_kv"] == 1  # absorbed MLA: one latent "head"
    assert fields["glm-dsa.attention.key_length"] == config["kv_lora_rank"] + config["qk_rope_head_dim"]
    assert fields["glm-dsa.attention.key_length_mla"] == config["qk_nope_head_dim"] + config["qk_rope_head_dim"]
    assert fields["glm-dsa.attention.indexer.top_k"] == config["index_topk"]
    assert fields["glm-dsa.attention.indexer.key_length"] == indexer_width(config["index_head_dim"]) == 64
    assert fields["glm-dsa.expert_group_count"] == config["n_group"]
    assert fields["glm-dsa.leading_dense_block_count"] == config["first_k_dense_replace"]
    vocab = json.loads((tiny_checkpoint / "tokenizer.json").read_text())
    specials = {t["content"]: t["id"] for t in vocab["added_tokens"]}
    assert fields["tokenizer.ggml.fim_pre_token_id"] == specials["<|code_prefix|>"]
    assert fields["tokenizer.ggml.fim_mid_token_id"] == specials["<|code_middle|>"]
    assert fields["tokenizer.ggml.tokens"][specials["<|code_suffix|>"]] == "<|code_suffix|>"
    assert fields["tokenizer.ggml.add_bos_token"] is False and fields["tokenizer.ggml.pre"] == "gpt-2"

    np.testing.assert_array_equal(tensors["token_embd.weight"], source["model.embed_tokens.weight"])
    h, nope = config["num_attention_heads"], config["qk_nope_head_dim"]
    for i in range(config["num_hidden_layers"]):
        kv_b = source[f"model.layers.{i}.self_attn.kv_b_proj.weight"].reshape(h, nope + config["v_head_dim"], -1)
        rebuilt = np.concatenate([tensors[f"blk.{i}.attn_k_b.weight"].transpose(0, 2, 1), tensors[f"blk.{i}.attn_v_b.weight"]], axis=1)
        np.testing.assert_array_equal(rebuilt, kv_b)
        assert_indexer_scores_unchanged(tensors, source, i, config)
    gate_up = source["model.layers.1.mlp.experts.gate_up_proj"]
    inter = config["moe_intermediate_size"]
    np.testing.assert_array_equal(tensors["blk.1.ffn_gate_exps.weight"], gate_up[:, :inter])
    np.testing.assert_array_equal(tensors["blk.1.ffn_up_exps.weight"], gate_up[:, inter:])
    np.testing.assert_array_equal(tensors["blk.1.exp_probs_b.bias"], source["model.layers.1.mlp.gate.e_score_correction_bias"])
    assert "blk.0.ffn_gate.weight" in tensors and "blk.0.ffn_gate_exps.weight" not in tensors


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-6) * weight + bias


def assert_indexer_scores_unchanged(tensors: dict, source: dict, layer: int, config: dict) -> None:
    """llama.cpp's indexer is at least 64 wide; the widened one scores every (query, key) as the original."""
    src = f"model.layers.{layer}.self_attn.indexer."
    rng = np.random.default_rng(layer)
    x = rng.standard_normal((5, config["hidden_size"])).astype(np.float32)  # hidden states of 5 keys
    q_lat = rng.standard_normal((3, config["q_lora_rank"])).astype(np.float32)  # query latents of 3 queries
    heads, dim = config["index_n_heads"], config["index_head_dim"]

    def scores(wk, norm_w, norm_b, wq_b, width):
        keys = _layer_norm(x @ wk.T, norm_w, norm_b)  # [5, D]
        queries = (q_lat @ wq_b.T).reshape(3, heads, width)  # [3, Hi, D]
        return np.einsum("qhd,kd->qhk", queries, keys)

    want = scores(source[src + "wk.weight"], source[src + "k_norm.weight"], source[src + "k_norm.bias"],
                  source[src + "wq_b.weight"], dim)
    blk = f"blk.{layer}.indexer."
    got = scores(tensors[blk + "attn_k.weight"], tensors[blk + "k_norm.weight"], tensors[blk + "k_norm.bias"],
                 tensors[blk + "attn_q_b.weight"], tensors[blk + "k_norm.weight"].shape[0])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_indexer_width_is_llamacpp_s_smallest_power_of_two() -> None:
    assert [indexer_width(d) for d in (16, 32, 64, 128, 256)] == [64, 64, 64, 128, 256]
    with pytest.raises(ExportError, match="index_head_dim 48"):
        indexer_width(48)


def test_f16_export_keeps_norms_and_router_in_f32(tiny_checkpoint: Path, tmp_path: Path) -> None:
    reader = gguf.GGUFReader(str(export(tiny_checkpoint, tmp_path / "half.gguf", dtype="f16")))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.1.ffn_up_exps.weight"] == "F16" and types["blk.1.ffn_gate_inp.weight"] == "F32"
    assert types["output_norm.weight"] == "F32"


def test_unrepresentable_checkpoints_are_refused(tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(tiny_checkpoint, bad)
    config = json.loads((bad / "config.json").read_text())
    layers = config["num_hidden_layers"]
    config["mlp_layer_types"] = ["sparse"] + ["dense"] * (layers - 1)
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError, match="dense MLPs only in the first layers"):
        export(bad, tmp_path / "bad.gguf")
    assert main([str(bad), str(tmp_path / "bad.gguf")]) == 2
    assert "dense MLPs only" in capsys.readouterr().err
    assert main([str(tmp_path / "nowhere"), str(tmp_path / "x.gguf")]) == 2
