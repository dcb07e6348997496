"""``glm5-lsp generate``: run a checkpoint on a prompt (or a prefix/suffix pair) and print only the generated text."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EPILOG = "Exit status: 0 on success, 2 on bad arguments or a checkpoint that cannot be loaded."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument("--model", type=Path, default=None, help="checkpoint folder (default: the embedded model)")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--prompt", help="left-to-right prompt text ('-' reads standard input)")
    group.add_argument("--prefix", help="code before the cursor (fill-in-the-middle with --suffix)")
    parser.add_argument("--suffix", default="", help="code after the cursor (with --prefix)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--stream", action="store_true", help="print text as it is generated")


def run(args: argparse.Namespace) -> int:
    import torch

    from glm5_lsp.model import (
        CheckpointError,
        ConfigError,
        GenerationConfig,
        Generator,
        default_model_path,
        load_model,
        load_tokenizer,
    )

    torch.set_num_threads(max(1, torch.get_num_threads()))
    try:
        path = args.model or default_model_path()
        model = load_model(path)
        tokenizer = load_tokenizer(path)
        config = GenerationConfig(args.max_new_tokens, args.temperature, args.top_p, args.seed, list(args.stop))
    except (FileNotFoundError, CheckpointError, ConfigError, ValueError) as exc:
        print(f"glm5-lsp generate: {exc}", file=sys.stderr)
        return 2
    if args.prefix is not None:
        if not tokenizer.has_fim:
            print("glm5-lsp generate: this tokenizer has no infilling tokens; use --prompt", file=sys.stderr)
            return 2
        ids = tokenizer.fim_prompt_ids(args.prefix, args.suffix)
    else:
        text = sys.stdin.read() if args.prompt == "-" else args.prompt
        ids = tokenizer.encode(text)
        if not ids:
            print("glm5-lsp generate: the prompt is empty", file=sys.stderr)
            return 2
    generator = Generator(model, tokenizer)
    stream = (lambda s: (sys.stdout.write(s), sys.stdout.flush())) if args.stream else None
    result = generator.generate(ids, config, on_text=stream)
    if not args.stream:
        sys.stdout.write(result.text)
    sys.stdout.flush()
    return 0
