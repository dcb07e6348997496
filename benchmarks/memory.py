"""The workspace memory's own figures: perplexity with and without it, decoding speed with and without
drafts, and what updates and a large workspace cost.

    python benchmarks/memory.py perplexity [--packages ...] [--max-tokens 8000]
    python benchmarks/memory.py drafts [--requests 12] [--max-new-tokens 64] [--prompt-tokens N]
    python benchmarks/memory.py updates [--edits 300]
    python benchmarks/memory.py workspace [--files 2000]

``perplexity``: the embedded model's held-out perplexity on ``BENCHMARK_REPORT`` packages (never
trained or tuned on), each copied as its own workspace, alone and mixed with the memory holding the
rest of that package plus the libraries it imports and the standard library (the scored file's own
positions excluded), and with the file's own text above each token in the memory too (as the
editor's memory holds the document being edited; ``memory.fit.score_package(above=True)``), with
the shipped interpolation (``glm5_lsp/memory/interpolation.json``, fitted on ``BENCHMARK_FIT``
only): its table (the longest match: what ships) and its level gate (the shorter suffixes' estimates
too: ``memory.shorterSuffixes``). ``drafts``: greedy decoding with the mixture, the same requests
with and without drafts, on a file with repeated structure (pycparser's ``c_ast.py``, the memory
holding its workspace and libraries), on tqdm's ``std.py`` with the same memory (the file above the
cursor included), with a memory of tqdm's other files only, and with an empty memory (no draft is
ever proposed: what asking costs); tokens/s of each, drafted and accepted tokens, and whether the
texts are the same. Each request writes at the end of the file cut there (nothing below the
cursor); ``--prompt-tokens N`` keeps the prompt's last N tokens (64: a one-line request's, within the
top-k; the default, the 100 lines, a multi-line request's, past it). ``updates``: one-line edits typed into a 2,600-line file (the standard
library's ``argparse.py``), each in the memory before the next. ``workspace``: a workspace of N
files (installed source copied) indexed in a fresh process: seconds, peak memory (RSS), progress.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def weights_commit() -> str:
    out = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h", "--", "glm5_lsp/weights"],
                         capture_output=True, text=True, check=False)
    return out.stdout.strip() or "?"


def perplexity(args: argparse.Namespace) -> None:
    from glm5_lsp.memory.fit import Scores, load_runtime, score_package
    from glm5_lsp.memory.fit import perplexity as ppl
    from glm5_lsp.memory.mixing import Interpolation

    model, tokenizer, window = load_runtime(None)
    levels = Interpolation.default(levels=True)
    table = Interpolation(levels.table, levels.source)  # what ships: the longest match, by the table
    print(f"weights from commit {weights_commit()}; window {window}; interpolation: {levels.source}"
          f"{'' if levels.gate is not None else ' (no level gate in the file)'}")
    print("The memory holds the rest of the package and the libraries it imports; in the 'file above' columns also")
    print("the file's own text above the token (as the editor's memory holds the document being edited). 'Table'")
    print("(what ships): the longest match mixed in by the interpolation table; 'shorter suffixes' (the option")
    print("memory.shorterSuffixes): the level gate, the shorter suffixes' estimates mixed in too. 'Best' is the")
    print("most any mixture of them could reach: at each token the best of the model's and the memory's")
    print("estimates' probabilities, chosen knowing the token.")
    print("| package | tokens | model alone | + memory (table) | ratio | + file above (table) | ratio "
          "| + file above (shorter suffixes) | ratio | best | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    total, total_above = Scores(), Scores()
    cache: dict = {}

    def row(name: str, scores: Scores, above: Scores) -> None:
        alone = ppl(scores, None)
        figures = (ppl(scores, table), ppl(above, table), ppl(above, levels), hindsight(above))
        print(f"| {name} | {len(scores.model)} | {alone:.2f} | "
              + " | ".join(f"{value:.2f} | {value / alone:.2f}" for value in figures) + " |", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        for name in args.packages:
            scores = score_package(name, model, tokenizer, Path(tmp) / "rest", window, args.max_tokens,
                                   log=lambda _: None, model_cache=cache)
            above = score_package(name, model, tokenizer, Path(tmp) / "above", window, args.max_tokens,
                                  log=lambda _: None, above=True, model_cache=cache)
            total.extend(scores)
            total_above.extend(above)
            row(name, scores, above)
    row("all", total, total_above)


def hindsight(scores) -> float:
    """Perplexity with each token's best probability, the model's or one of the memory's estimates'
    (the longest match's, the shorter suffixes'): the floor of every mixture of them, whatever weights
    each token gets."""
    import numpy as np

    p_model, _, _ = scores.arrays()
    _, levels, _ = scores.level_arrays()
    best = np.maximum(p_model, levels.max(axis=1))
    return float(np.exp(-np.mean(np.log(np.maximum(best, 1e-12)))))


def drafts(args: argparse.Namespace) -> None:
    import torch

    from glm5_lsp.memory.heldout import copy_package
    from glm5_lsp.memory.mixing import DraftSettings, MemoryProcessor
    from glm5_lsp.memory.workspace import MemorySettings, WorkspaceMemory, as_key
    from glm5_lsp.model import GenerationConfig, Generator, default_model_path, load_model, load_tokenizer

    torch.set_num_threads(1)
    path = default_model_path()
    model, tokenizer = load_model(path), load_tokenizer(path)
    model.eval()
    shown = f"the last {args.prompt_tokens} tokens of " if args.prompt_tokens else ""
    print(f"weights from commit {weights_commit()}; {args.requests} requests per file, "
          f"{args.max_new_tokens} new tokens, greedy, prompts of {shown}the 100 lines before a line start")
    print("| code | tokens/s without drafts | with drafts | ratio | accepted / drafted | same text |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for package, rel, label, kind in (
                ("pycparser", "pycparser/c_ast.py", "repeated structure (pycparser c_ast.py; workspace + libraries)", "all"),
                ("tqdm", "tqdm/std.py", "tqdm std.py (workspace + libraries)", "all"),
                ("tqdm", "tqdm/std.py", "tqdm std.py, the memory holding tqdm's other files only", "others"),
                ("tqdm", "tqdm/std.py", "tqdm std.py, an empty memory (the cost of asking)", "empty")):
            root = copy_package(package, Path(tmp))
            memory = WorkspaceMemory(tokenizer, None if kind == "all" else MemorySettings(libraries=False, stdlib=False))
            if kind != "empty":
                memory.index_folder(root)
            if kind != "all":
                memory.remove(as_key(root / rel))
            file = root / rel
            lines = file.read_text(encoding="utf-8").split("\n")
            starts = [i for i in range(120, len(lines) - 20) if lines[i].strip()]
            picks = [starts[(k * len(starts)) // args.requests] for k in range(args.requests)]
            totals = {False: [0, 0.0], True: [0, 0.0]}
            drafted = accepted = 0
            same = True
            for line in picks:
                prompt = "\n".join(lines[line - 100:line]) + "\n"
                # New code being written at the end of the file: nothing below the cursor (what the
                # model is about to write must not be in the memory already).
                document = "\n".join(lines[:line]) + "\n"
                ids = tokenizer.encode(prompt)
                if args.prompt_tokens:
                    ids = ids[-args.prompt_tokens:]
                texts = {}
                for use in (False, True, False, True):  # twice each, alternating: the machine is shared
                    matcher = memory.matcher(as_key(file), document, len(document)) if kind == "all" else memory.matcher()
                    processor = MemoryProcessor(matcher,
                                                tokenizer, drafts=DraftSettings(enabled=use))
                    processor.bind_prompt(ids)
                    generator = Generator(model, tokenizer)
                    generator.prefill(ids)  # the prompt cached: decoding alone is timed
                    started = time.perf_counter()
                    out = generator.generate(ids, GenerationConfig(max_new_tokens=args.max_new_tokens, stop_at_eos=False),
                                             logits_processor=processor, drafter=processor.propose if use else None)
                    seconds = time.perf_counter() - started - out.prefill_seconds
                    totals[use][0] += len(out.token_ids)
                    totals[use][1] += seconds
                    texts.setdefault(use, out.text)
                    same = same and texts[use] == out.text
                    if use:
                        drafted += out.drafted_tokens
                        accepted += out.accepted_tokens
                same = same and texts[False] == texts[True]
            without = totals[False][0] / totals[False][1]
            with_ = totals[True][0] / totals[True][1]
            print(f"| {label} | {without:.1f} | {with_:.1f} | {with_ / without:.2f} | {accepted} / {drafted} | "
                  f"{'yes' if same else 'NO'} |", flush=True)


def updates(args: argparse.Namespace) -> None:
    from glm5_lsp.memory.workspace import MemorySettings, WorkspaceMemory
    from glm5_lsp.model import default_model_path, load_tokenizer

    tokenizer = load_tokenizer(default_model_path())
    source = Path(sysconfig.get_paths()["stdlib"]) / "argparse.py"
    text = source.read_text(encoding="utf-8")
    lines = text.split("\n")
    memory = WorkspaceMemory(tokenizer, MemorySettings(libraries=False, stdlib=False))
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(source, Path(tmp) / "argparse.py")
        memory.index_folder(tmp)
        key = str((Path(tmp) / "argparse.py").resolve())
        started = time.perf_counter()
        memory.update(key, text)  # opened: tokenized whole once
        opened = time.perf_counter() - started
        times = []
        line = len(lines) // 2
        for i in range(args.edits):
            lines[line] = lines[line] + "x" if i % 20 else lines[line]
            if i % 20 == 0:
                line = (line + 37) % len(lines)
            started = time.perf_counter()
            memory.update(key, "\n".join(lines))
            times.append((time.perf_counter() - started) * 1000)
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    print(f"{len(lines)}-line file ({len(text)} characters): first open {opened * 1000:.1f} ms; "
          f"{args.edits} one-character edits: p50 {statistics.median(times):.1f} ms, p95 {p95:.1f} ms, "
          f"max {times[-1]:.1f} ms (the text joined per edit included, as an editor's full sync sends it)")


def workspace(args: argparse.Namespace) -> None:
    from glm5_lsp.train.corpus import BENCHMARK_REPORT

    site = Path(sysconfig.get_paths()["purelib"])
    skip = {n.replace("-", "_") for n in BENCHMARK_REPORT}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ws"
        count = 0
        for path in sorted(site.rglob("*.py")):
            if count >= args.files:
                break
            rel = path.relative_to(site)
            if rel.parts[0] in skip or "test" in rel.parts[0] or path.stat().st_size > 200_000:
                continue
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            count += 1
        size = sum(p.stat().st_size for p in root.rglob("*.py"))
        print(f"workspace: {count} files, {size / 1e6:.1f} MB of source copied from site-packages")
        code = (
            "import json, resource, sys, time\n"
            "from glm5_lsp.memory.workspace import WorkspaceMemory\n"
            "from glm5_lsp.model import default_model_path, load_tokenizer\n"
            "tok = load_tokenizer(default_model_path())\n"
            "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "memory = WorkspaceMemory(tok)\n"
            "last = [0.0]\n"
            "def progress(message, fraction):\n"
            "    if fraction - last[0] >= 0.1 or fraction >= 1.0:\n"
            "        last[0] = fraction\n"
            "        print(f'  progress {fraction:4.0%} {message}', flush=True)\n"
            "started = time.perf_counter()\n"
            "stats = memory.index_folder(sys.argv[1], progress=progress)\n"
            "seconds = time.perf_counter() - started\n"
            "peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "print(json.dumps({'seconds': round(seconds, 1), 'peak_rss_mb': round(peak / 1024), "
            "'rss_before_mb': round(base / 1024), **stats.to_dict()}))\n"
        )
        env_cache = Path(tmp) / "cache"
        import os

        for label, env in (("cold (no library cache)", {**os.environ, "GLM5_LSP_CACHE_DIR": str(env_cache)}),
                           ("warm (libraries cached)", {**os.environ, "GLM5_LSP_CACHE_DIR": str(env_cache)})):
            out = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, env=env,
                                 check=False)
            print(f"{label}:")
            print(out.stdout.rstrip())
            if out.returncode:
                print(out.stderr[-2000:])
    print(f"(this process's peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB)")
    _ = json


def main(argv: list[str] | None = None) -> int:
    from glm5_lsp.train.corpus import BENCHMARK_REPORT

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("perplexity")
    p.add_argument("--packages", nargs="+", default=list(BENCHMARK_REPORT))
    p.add_argument("--max-tokens", type=int, default=8000)
    d = sub.add_parser("drafts")
    d.add_argument("--requests", type=int, default=12)
    d.add_argument("--max-new-tokens", type=int, default=64)
    d.add_argument("--prompt-tokens", type=int, default=0, help="keep the prompt's last N tokens (0: all)")
    u = sub.add_parser("updates")
    u.add_argument("--edits", type=int, default=300)
    w = sub.add_parser("workspace")
    w.add_argument("--files", type=int, default=2000)
    args = parser.parse_args(argv)
    {"perplexity": perplexity, "drafts": drafts, "updates": updates, "workspace": workspace}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
