"""Where the embedded model lives (no torch: a served model's session reads its tokenizer from here)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_MODEL_NAME = "glm5-code-tiny"


def default_model_path() -> Path:
    """The embedded default model shipped inside the package."""
    path = Path(__file__).resolve().parent.parent / "weights" / DEFAULT_MODEL_NAME
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"no embedded default model at {path}; pass --model PATH (a folder with config.json, "
            "safetensors weights and tokenizer.json) or train one with `glm5-lsp train`"
        )
    return path
