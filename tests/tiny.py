"""Tiny GLM-5 checkpoints for tests: made on the spot, never downloaded."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

from glm5_lsp.model import GlmMoeDsaConfig, GlmMoeDsaForCausalLM, KVCache, cached_forward, save_model

TINY = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 8,
    "routed_scaling_factor": 2.5,
    "kv_lora_rank": 32,
    "q_lora_rank": 48,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "n_group": 2,
    "topk_group": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "index_topk": 16,
    "index_head_dim": 16,
    "index_n_heads": 8,
    "max_position_embeddings": 4096,
    "eos_token_id": 0,
    "bos_token_id": None,
}


def tiny_config(**overrides) -> GlmMoeDsaConfig:
    return GlmMoeDsaConfig.from_dict({**TINY, **overrides})


def tiny_model(seed: int = 0, **overrides) -> GlmMoeDsaForCausalLM:
    model = GlmMoeDsaForCausalLM(tiny_config(**overrides))
    model.init_weights(seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    for layer in model.model.layers:  # a non-zero selection bias, so routing is not trivially symmetric
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None:
            gate.e_score_correction_bias.normal_(0.0, 0.1, generator=gen)
    return model.eval()


def fed_in_chunks(model: GlmMoeDsaForCausalLM, ids: torch.Tensor, chunks: list[int], roles: torch.Tensor | None = None,
                  cache: KVCache | None = None, **kwargs) -> tuple[list[torch.Tensor], KVCache]:
    """``ids [1, sum(chunks)]`` fed in ``chunks`` through ``cached_forward`` (``kwargs``: its options)
    into ``cache`` (a new one where None): each call's logits, and the cache."""
    cache = KVCache(model.config) if cache is None else cache
    logits, at = [], 0
    with torch.no_grad():
        for n in chunks:
            part = None if roles is None else roles[:, at : at + n]
            logits.append(cached_forward(model, ids[:, at : at + n], cache, roles=part, **kwargs))
            at += n
    return logits, cache


def training_texts(limit: int = 40) -> list[str]:
    """Real Python source from the standard library (always present) to train a tiny tokenizer on."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))[:limit]
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def make_checkpoint(folder: Path, vocab_size: int = 512, seed: int = 0, **overrides) -> Path:
    """A folder with config.json, safetensors weights and a trained byte-level BPE tokenizer.json."""
    from glm5_lsp.train.tokenizer import save_tokenizer, train_tokenizer

    tokenizer = train_tokenizer(training_texts(), vocab_size=vocab_size)
    save_tokenizer(tokenizer, folder)
    eos = tokenizer.token_to_id("<|endoftext|>")
    model = tiny_model(seed=seed, vocab_size=tokenizer.get_vocab_size(), eos_token_id=eos, **overrides)
    save_model(model, folder)
    return folder
