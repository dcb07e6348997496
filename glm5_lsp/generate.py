"""``glm5-lsp generate``: one prompt (or a prefix/suffix pair) through the pipeline, its text on stdout.

The same pipeline as the editor, ``batch`` and ``eval`` (generate -> check -> repair): ``--prompt``
is continued as code (a signature and docstring get their body) or, in prose, answered with code;
``--prefix``/``--suffix`` fill in the middle. What is printed always ends with a newline.

Honest results: the exit status is 0 only when the printed text passed the checks (the candidate
spliced into its code adds no error) and does some work (not only comments, ``pass``, ``...`` or a
bare ``return``, which compile, so the checkers pass them). Otherwise stderr says what was wrong
and the status is 1; ``--allow-unclean`` prints the best unclean text anyway, with the warning.
``--raw`` prints the model's text as it comes, unchecked (``--stream`` and ``--stop`` need it).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from glm5_lsp.threads import add_threads_argument, use_threads

EPILOG = ("Exit status: 0 when the printed text passed the checks (with --raw: whenever the model wrote "
          "something); 1 when nothing did (with --allow-unclean the best unclean text is printed anyway); "
          "2 on bad arguments or a model that cannot be loaded.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from glm5_lsp.pipeline.session import add_backend_arguments

    parser.epilog = EPILOG
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--prompt", help="code to continue, or an instruction in prose ('-' reads standard input)")
    group.add_argument("--prefix", help="code before the cursor (fill-in-the-middle with --suffix)")
    parser.add_argument("--suffix", default="", help="code after the cursor (with --prefix)")
    parser.add_argument("--language", default="python", help="the code's language (default: python)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--repair-rounds", type=int, default=3, help="generations at most (1: check only)")
    parser.add_argument("--allow-unclean", action="store_true",
                        help="when no text passes the checks, print the best one anyway (with a warning; exit 1)")
    parser.add_argument("--raw", action="store_true", help="the model's text as it comes: no checks, no repair")
    parser.add_argument("--stop", action="append", default=[], help="with --raw: stop string (repeatable)")
    parser.add_argument("--stream", action="store_true", help="with --raw: print text as it is generated")
    add_threads_argument(parser)
    add_backend_arguments(parser)


def _fail(message: str, code: int = 2) -> int:
    print(f"glm5-lsp generate: {message}", file=sys.stderr)
    return code


def _emit(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def _describe(diagnostics: list[dict[str, Any]], limit: int = 3) -> str:
    shown = []
    for item in diagnostics[:limit]:
        line = item.get("line")
        where = f"line {line + 1}: " if isinstance(line, int) and not isinstance(line, bool) else ""
        shown.append(f"{where}{item.get('message', item)}")
    more = f" (and {len(diagnostics) - limit} more)" if len(diagnostics) > limit else ""
    return "; ".join(shown) + more


def run(args: argparse.Namespace) -> int:
    from glm5_lsp.pipeline.session import BackendError, CompletionRequest, backend_from_args
    from glm5_lsp.spans import Prompt

    if args.max_new_tokens < 1 or args.repair_rounds < 1:
        return _fail("--max-new-tokens and --repair-rounds must be at least 1")
    if args.threads < 1:
        return _fail("--threads must be at least 1")
    use_threads(args.threads, "generate")
    if not args.raw and (args.stream or args.stop):
        return _fail("--stream and --stop print or cut the model's text before it is checked: add --raw")
    if args.prefix is None and args.suffix:
        return _fail("--suffix goes with --prefix")
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if prompt is not None and not prompt.strip():
        return _fail("the prompt is empty")
    try:
        backend = backend_from_args(args)
        backend.load()
    except (BackendError, ValueError) as error:
        return _fail(str(error))
    try:
        if args.raw:
            stream = (lambda piece: (sys.stdout.write(piece), sys.stdout.flush())) if args.stream else None
            parts = Prompt(prompt) if prompt is not None else Prompt(args.prefix, args.suffix)
            done = backend.complete(CompletionRequest(
                prompt=parts, max_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                seed=args.seed, stop=list(args.stop), use_attention_policy=False, on_text=stream))
            if not done.text:
                return _fail(f"the model wrote nothing (finish: {done.finish_reason})", 1)
            if not args.stream:
                _emit(done.text)
            elif not done.text.endswith("\n"):
                _emit("")
            return 0
        return _checked(args, backend, prompt)
    except BackendError as error:
        return _fail(str(error))
    except ValueError as error:  # sampling settings the runtime refuses (a top_p of 0, ...)
        return _fail(str(error))


def _checked(args: argparse.Namespace, backend: Any, prompt: str | None) -> int:
    from glm5_lsp.pipeline import Pipeline, PipelineSettings, idle_result

    settings = PipelineSettings(max_tokens=args.max_new_tokens, multiline_max_tokens=args.max_new_tokens,
                                temperature=args.temperature, top_p=args.top_p, seed=args.seed, unhurried=True)
    settings.repair.max_rounds = args.repair_rounds
    settings.repair.return_unclean = True  # the best unclean text, for --allow-unclean and the message
    pipeline = Pipeline(backend, settings)
    if prompt is not None:
        result = pipeline.generate(prompt, language=args.language)
        kind = "generate"
    else:
        result = pipeline.complete(args.prefix + args.suffix, len(args.prefix), language=args.language)
        kind = "complete"
    rounds = f"{result.rounds} round{'s' if result.rounds != 1 else ''}"
    if not result.text.strip():
        return _fail(f"the model wrote nothing usable for this prompt ({rounds})", 1)
    idle = idle_result({"kind": kind}, result)
    if result.clean and idle is None:
        _emit(result.text)
        return 0
    why = idle.removeprefix("the text ") if idle else \
        f"does not pass the checks: {_describe(result.diagnostics_after) or 'unclean'}"
    if not args.allow_unclean:
        return _fail(f"no text passed the checks ({rounds}); the best one {why}. --allow-unclean prints it anyway", 1)
    _emit(result.text)
    return _fail(f"warning: the text above {why}", 1)
