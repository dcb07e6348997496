"""The GLM-5 (``glm_moe_dsa``) runtime: our own PyTorch implementation; ``transformers`` is only its test oracle."""

from glm5_lsp.model.config import ConfigError, GlmMoeDsaConfig
from glm5_lsp.model.generate import Generation, GenerationConfig, Generator, cached_forward
from glm5_lsp.model.glm5 import GlmMoeDsaForCausalLM, Selection, TrainOutput
from glm5_lsp.model.kv_cache import KVCache
from glm5_lsp.model.loading import CheckpointError, default_model_path, load_model, save_model
from glm5_lsp.model.policy import AttentionConfig, AttentionPolicy, Role
from glm5_lsp.model.stats import LAYER_STATS, STEP_STATS, StepStats
from glm5_lsp.model.tokenizer import Tokenizer, load_tokenizer

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
