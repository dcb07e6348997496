"""``glm5-lsp``: one entry point, one subcommand per front end.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``;
only the chosen one is imported, so ``glm5-lsp serve`` never pays for torch's import when it does
not need it, and a broken optional part cannot stop the others.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("glm5_lsp.generate", "generate checked code for a prompt or a prefix/suffix pair"),
    "serve": ("glm5_lsp.server.serve_command", "run the language server (stdio by default)"),
    "serve-model": ("glm5_lsp.serve_model", "serve the runtime over an OpenAI-compatible HTTP API"),
    "batch": ("glm5_lsp.batch", "run complete/generate/fix tasks from a JSONL file"),
    "eval": ("glm5_lsp.evaluate.command", "evaluate on HumanEval, HumanEval-infilling, HumanEvalFix, MBPP"),
    "index": ("glm5_lsp.context.index_command", "build the API-doc index and symbol summaries ahead of time"),
    "train": ("glm5_lsp.train.command", "train the embedded default model"),
    "gate": ("glm5_lsp.gate.command", "train and check the gate that decides which completions are worth showing"),
}


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glm5-lsp",
        description="A self-hostable GLM-5 coding assistant: language server, generation, batch, evaluation, training.",
        epilog="Run 'glm5-lsp COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _version() -> str:
    from glm5_lsp import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        parser = _top_parser()
        if not argv:
            parser.print_help()
            return 2
        parser.parse_args(argv)  # prints --help/--version or an "invalid choice" error and exits
        return 2
    name, rest = argv[0], argv[1:]
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"glm5-lsp {name}", description=help_text)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    return int(module.run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
