"""Export a ``glm_moe_dsa`` checkpoint to GGUF for llama.cpp (architecture ``glm-dsa``).

    python -m glm5_lsp.gguf_export [MODEL_DIR] OUT.gguf [--dtype f32|f16]

llama.cpp runs GLM-5 as its ``glm-dsa`` architecture (``src/models/glm-dsa.cpp``): MLA in the
absorbed form (``attn_k_b``/``attn_v_b``, the per-head halves of ``kv_b_proj``), the DSA lightning
indexer with its top-k (``indexer.*``; "shared" layers reuse the previous full layer's top-k,
``attention.indexer.types``), and the sigmoid-routed MoE with a selection bias and shared experts.
That is this runtime's model, so the export is a re-layout of the same weights, nothing dropped:

- the fused routed experts ``gate_up_proj [E, 2I, H]`` split into ``ffn_gate_exps``/``ffn_up_exps``;
- ``kv_b_proj [H*(dn+dv), L]`` split per head into ``attn_k_b [H, L, dn]`` and ``attn_v_b [H, dv, L]``;
- an indexer head narrower than llama.cpp's smallest (64) is widened exactly (``indexer_width``);
- RoPE needs no permutation: both runtimes rotate interleaved pairs (llama.cpp's ``NORM`` rope);
- the byte-level BPE tokenizer as ``gpt2`` with GPT-2's pre-tokenizer (``ByteLevel(use_regex)``),
  its special tokens as control tokens, and the infilling ids (``<|code_prefix|>`` ...) written as
  ``fim_pre``/``fim_suf``/``fim_mid``, which is what llama.cpp's ``/infill`` needs.

What llama.cpp does not have: this project's attention policy (role biases on the indexer's scores,
forced error-context keys) and the decoding monitor. Served by llama.cpp the model selects its keys
with the plain indexer, as the checkpoint was trained.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from glm5_lsp.model.config import GlmMoeDsaConfig

ARCH = "glm-dsa"


class ExportError(ValueError):
    """A checkpoint llama.cpp's ``glm-dsa`` cannot represent, or a file that cannot be read."""


def _tensors(model_dir: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({model_dir / name for name in json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()})
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ExportError(f"no safetensors weights in {model_dir}")
    out: dict[str, np.ndarray] = {}
    for file in files:
        out.update(load_file(str(file)))
    return out


def _check(config: GlmMoeDsaConfig) -> None:
    kinds = config.mlp_layer_types or []
    lead = config.first_k_dense_replace
    if kinds and kinds != ["dense"] * lead + ["sparse"] * (config.num_hidden_layers - lead):
        raise ExportError(f"llama.cpp's {ARCH} has dense MLPs only in the first layers; mlp_layer_types={kinds}")
    types = config.indexer_types or []
    if types and types[0] != "full":
        raise ExportError("the first layer must run the indexer ('full'): a shared layer reuses an earlier one's top-k")
    if config.attention_bias:
        raise ExportError(f"llama.cpp's {ARCH} has no attention biases")
    rope = config.rope_parameters or {}
    if rope.get("rope_type", "default") not in ("default", None):
        raise ExportError(f"rope_type {rope.get('rope_type')!r} is not exported (only the default RoPE)")


def indexer_width(head_dim: int) -> int:
    """The indexer head width llama.cpp can run: a power of two of at least 64.

    llama.cpp rotates the indexer's queries and keys by a Walsh-Hadamard matrix (orthonormal, so
    scores are unchanged) whose size is a power of two from 64 up (``build_input_k_rot`` in
    ``llama-kv-cache.cpp``); a narrower head fails a matrix-shape check when the graph is built. A
    head whose width divides that size is widened exactly: the key projection and its LayerNorm
    repeated (same mean and variance), the query projection padded with zeros (same dot products).
    llama.cpp's score scale (one over the square root of the width) changes with it, uniformly,
    which leaves every top-k the same.
    """
    width = 64
    while width < head_dim:
        width *= 2
    if width % head_dim:
        raise ExportError(f"index_head_dim {head_dim} cannot be exported exactly: llama.cpp's indexer needs a power "
                          f"of two of at least 64, and {width} is not a multiple of {head_dim}")
    return width


def export(model_dir: str | Path, out: str | Path, dtype: str = "f32") -> Path:
    """Write ``out`` (a GGUF file) from the checkpoint folder ``model_dir``; returns the path."""
    import gguf

    model_dir, out = Path(model_dir), Path(out)
    config = GlmMoeDsaConfig.from_pretrained(model_dir)
    _check(config)
    weights = _tensors(model_dir)
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    float_type = {"f32": np.float32, "f16": np.float16}[dtype]

    writer = gguf.GGUFWriter(str(out), ARCH)
    writer.add_name(model_dir.name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
    _metadata(writer, config, gguf)
    _vocab(writer, tokenizer, config, gguf)

    def add(name: str, array: np.ndarray, keep_f32: bool = False) -> None:
        array = np.ascontiguousarray(array, dtype=np.float32 if keep_f32 or array.ndim == 1 else float_type)
        writer.add_tensor(name, array)

    def take(name: str) -> np.ndarray:
        try:
            return weights.pop(name).astype(np.float32)
        except KeyError:
            raise ExportError(f"{model_dir}: no tensor {name}") from None

    h, nope, dv, rank = config.num_attention_heads, config.qk_nope_head_dim, config.v_head_dim, config.kv_lora_rank
    index_dim = indexer_width(config.index_head_dim)
    add("token_embd.weight", take("model.embed_tokens.weight"))
    add("output_norm.weight", take("model.norm.weight"))
    if not config.tie_word_embeddings:
        add("output.weight", take("lm_head.weight"))
    for i in range(config.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        a = p + "self_attn."
        add(b + "attn_norm.weight", take(p + "input_layernorm.weight"))
        add(b + "ffn_norm.weight", take(p + "post_attention_layernorm.weight"))
        add(b + "attn_q_a.weight", take(a + "q_a_proj.weight"))
        add(b + "attn_q_a_norm.weight", take(a + "q_a_layernorm.weight"))
        add(b + "attn_q_b.weight", take(a + "q_b_proj.weight"))
        add(b + "attn_kv_a_mqa.weight", take(a + "kv_a_proj_with_mqa.weight"))
        add(b + "attn_kv_a_norm.weight", take(a + "kv_a_layernorm.weight"))
        kv_b = take(a + "kv_b_proj.weight").reshape(h, nope + dv, rank)  # [H, dn + dv, L]
        add(b + "attn_k_b.weight", kv_b[:, :nope, :].transpose(0, 2, 1))  # [H, L, dn]
        add(b + "attn_v_b.weight", kv_b[:, nope:, :])  # [H, dv, L]
        add(b + "attn_output.weight", take(a + "o_proj.weight"))
        if (a + "indexer.wk.weight") in weights:
            copies = index_dim // config.index_head_dim
            # Widened (see indexer_width): keys repeated, so the LayerNorm sees the same mean and
            # variance; queries zero past the original width, so every score is unchanged.
            add(b + "indexer.attn_k.weight", np.tile(take(a + "indexer.wk.weight"), (copies, 1)))  # [D', H]
            wq_b = take(a + "indexer.wq_b.weight").reshape(config.index_n_heads, config.index_head_dim, -1)
            pad = np.zeros((wq_b.shape[0], index_dim - config.index_head_dim, wq_b.shape[2]), np.float32)
            add(b + "indexer.attn_q_b.weight", np.concatenate([wq_b, pad], axis=1).reshape(-1, wq_b.shape[2]))
            add(b + "indexer.proj.weight", take(a + "indexer.weights_proj.weight"), keep_f32=True)
            add(b + "indexer.k_norm.weight", np.tile(take(a + "indexer.k_norm.weight"), copies))
            add(b + "indexer.k_norm.bias", np.tile(take(a + "indexer.k_norm.bias"), copies))
        m = p + "mlp."
        if i < config.first_k_dense_replace:
            for part in ("gate", "up", "down"):
                add(b + f"ffn_{part}.weight", take(m + f"{part}_proj.weight"))
            continue
        add(b + "ffn_gate_inp.weight", take(m + "gate.weight"), keep_f32=True)
        add(b + "exp_probs_b.bias", take(m + "gate.e_score_correction_bias"))
        gate_up = take(m + "experts.gate_up_proj")  # [E, 2I, H]: gate rows, then up rows
        inter = gate_up.shape[1] // 2
        add(b + "ffn_gate_exps.weight", gate_up[:, :inter])  # [E, I, H]
        add(b + "ffn_up_exps.weight", gate_up[:, inter:])
        add(b + "ffn_down_exps.weight", take(m + "experts.down_proj"))  # [E, H, I]
        for part in ("gate", "up", "down"):
            add(b + f"ffn_{part}_shexp.weight", take(m + f"shared_experts.{part}_proj.weight"))
    leftover = sorted(name for name in weights if not name.startswith(f"model.layers.{config.num_hidden_layers}."))
    if leftover:  # every weight has a place: nothing is silently dropped
        raise ExportError(f"{model_dir}: tensors with no place in {ARCH}: {', '.join(leftover[:8])}")

    out.parent.mkdir(parents=True, exist_ok=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _metadata(writer, config: GlmMoeDsaConfig, gguf) -> None:
    rope = config.rope_parameters or {}
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(1)  # MLA in the absorbed form is multi-query attention over the latent
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_layer_norm_eps(1e-6)  # the indexer's key LayerNorm
    writer.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    writer.add_rope_dimension_count(config.qk_rope_head_dim)
    writer.add_vocab_size(config.vocab_size)
    writer.add_q_lora_rank(config.q_lora_rank)
    writer.add_kv_lora_rank(config.kv_lora_rank)
    writer.add_key_length(config.kv_lora_rank + config.qk_rope_head_dim)
    writer.add_value_length(config.kv_lora_rank)
    writer.add_key_length_mla(config.qk_nope_head_dim + config.qk_rope_head_dim)
    writer.add_value_length_mla(config.v_head_dim)
    writer.add_leading_dense_block_count(config.first_k_dense_replace)
    writer.add_expert_count(config.n_routed_experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    writer.add_expert_group_count(config.n_group)
    writer.add_expert_group_used_count(config.topk_group)
    writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    writer.add_expert_shared_count(config.n_shared_experts)
    writer.add_expert_weights_scale(config.routed_scaling_factor)
    if config.norm_topk_prob:
        writer.add_expert_weights_norm(True)
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    writer.add_indexer_head_count(config.index_n_heads)
    writer.add_indexer_key_length(indexer_width(config.index_head_dim))
    writer.add_indexer_top_k(config.index_topk)
    types = config.indexer_types or ["full"] * config.num_hidden_layers
    writer.add_array(f"{ARCH}.attention.indexer.types", [kind == "full" for kind in types])


def _vocab(writer, tokenizer: dict, config: GlmMoeDsaConfig, gguf) -> None:
    model = tokenizer.get("model") or {}
    pre = tokenizer.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or pre.get("type") != "ByteLevel" or not pre.get("use_regex", True):
        raise ExportError("only byte-level BPE tokenizers with GPT-2's pre-tokenizer are exported "
                          f"(model {model.get('type')!r}, pre-tokenizer {pre.get('type')!r})")
    vocab: dict[str, int] = dict(model["vocab"])
    special = {t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])}
    vocab.update(special)
    size = max(config.vocab_size, max(vocab.values()) + 1)
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    for text, i in vocab.items():
        tokens[i] = text
        types[i] = gguf.TokenType.CONTROL if text in special else gguf.TokenType.NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # llama.cpp's name for GPT-2's pre-tokenizer regex
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    eos = config.eos_token_id[0] if isinstance(config.eos_token_id, list) else config.eos_token_id
    if eos is not None:
        writer.add_eos_token_id(int(eos))
    if config.pad_token_id is not None:
        writer.add_pad_token_id(int(config.pad_token_id))
    if config.bos_token_id is not None:
        writer.add_bos_token_id(int(config.bos_token_id))
    writer.add_add_bos_token(False)  # prompts start as the model was trained: no beginning-of-text token
    for key, token in (("fim_pre", "<|code_prefix|>"), ("fim_suf", "<|code_suffix|>"), ("fim_mid", "<|code_middle|>")):
        if token in special:
            writer.add_uint32(f"tokenizer.ggml.{key}_token_id", special[token])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m glm5_lsp.gguf_export", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=None, help="checkpoint folder (default: the embedded model)")
    parser.add_argument("out", help="the .gguf file to write")
    parser.add_argument("--dtype", choices=("f32", "f16"), default="f32", help="weight type (norms and router stay f32)")
    args = parser.parse_args(argv)
    from glm5_lsp.model.loading import default_model_path

    try:
        path = export(args.model or default_model_path(), args.out, args.dtype)
    except (ExportError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB, {ARCH})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
