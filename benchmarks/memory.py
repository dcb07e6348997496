"""The workspace memory's own figures: perplexity with and without it, decoding speed with and without
drafts, and what updates and a large workspace cost.

    python benchmarks/memory.py perplexity [--packages ...] [--max-tokens 8000]
    python benchmarks/memory.py neighbours [--packages ...] [--max-tokens 4000] [--max-keys 200000]
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
too: ``memory.shorterSuffixes``). ``neighbours``: kNN-LM over the model's hidden states mixed on top of
what ships, on ``BENCHMARK_FIT`` packages only (its weights are fitted on them, one left out at a time):
whether it is worth building. ``drafts``: greedy decoding with the mixture, the same requests
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
import math
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


NEIGHBOURS = 64  # nearest keys a query weighs
SHORTLIST = 32  # the mixture's likeliest ids kept per token (with its probabilities at the neighbours' ids)


def neighbours(args: argparse.Namespace) -> None:
    """kNN-LM (Khandelwal et al., 2020; kNM-LM for a repository): the model's last hidden state at each
    token (after the final norm, what ``lm_head`` reads) is a key, the token after it the value; a
    query's nearest keys vote for their values by ``exp(-distance / T)``, and that distribution is mixed
    into the shipped mixture (the table, the file above in the memory) with a weight by the nearest
    distance's decile, fitted on the other packages (leave one package out). Two datastores: the file
    above the token only (a neural cache of the document: its hidden states come with the prompt), and
    the whole package (every file's hidden states computed ahead: a forward pass over the workspace;
    ``--max-keys`` of them at most).
    Reported: perplexity, next-token accuracy and the rest of the line exact under teacher-forced greedy
    decoding (from each mid-line token, every token through the next one holding a newline is the
    argmax): a proxy for ``lines.py``'s exact share that needs no server."""
    import numpy as np
    import torch

    from glm5_lsp.memory.fit import best_weight, load_runtime, score_package, table_weights
    from glm5_lsp.memory.mixing import Interpolation
    from glm5_lsp.memory.workspace import MemorySettings, source_files, workspace_text
    from glm5_lsp.train.corpus import BENCHMARK_REPORT

    reported = sorted(set(args.packages) & set(BENCHMARK_REPORT))
    if reported:  # the weights below are fitted on the packages themselves (leave one out)
        sys.exit(f"neighbours fits its weights on the packages it reads; not on BENCHMARK_REPORT ({', '.join(reported)})")
    model, tokenizer, window = load_runtime(None)
    table = Interpolation.default(levels=False)
    settings = MemorySettings()
    head = model.lm_head.weight.detach().float()  # type: ignore[attr-defined]
    newline = np.array(["\n" in tokenizer.decode([i]) for i in range(head.shape[0])])
    print(f"weights from commit {weights_commit()}; {NEIGHBOURS} neighbours; packages: {', '.join(args.packages)}")
    packages = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.packages:
            started = time.perf_counter()
            scores = score_package(name, model, tokenizer, Path(tmp) / name, window, args.max_tokens,
                                   log=lambda _: None, above=True, details=True)
            scored_len: dict[str, int] = {}  # each scored file's tokens as score_package cut them
            for key, t in scores.positions:
                scored_len[key] = max(scored_len.get(key, 0), t + 1)
            root = (Path(tmp) / name / name).resolve()  # where score_package copied the package
            indexed = {str(p) for p in source_files(root, settings) if workspace_text(p, settings) is not None}
            files = sorted(indexed | set(scored_len))
            keys, values, owners, where = [], [], [], []
            hidden_of, ids_of = {}, {}
            kept = 0
            for number, key in enumerate(files):
                if key not in scored_len and kept >= args.max_keys:
                    continue  # a large package: its first files' keys only
                ids = tokenizer.encode(Path(key).read_text(encoding="utf-8"))
                ids = ids[:scored_len[key]] if key in scored_len else ids
                if len(ids) < 2:
                    continue
                hidden_of[key], ids_of[key] = last_hidden(model, ids, window), ids
                keys.append(hidden_of[key][:-1])  # the state at a token predicts the next one
                values.append(np.asarray(ids[1:]))
                owners.append(np.full(len(ids) - 1, number))
                where.append(np.arange(len(ids) - 1))
                kept += len(ids) - 1
            store = np.concatenate(keys)
            store_norm = (store * store).sum(1)
            value, owner, position = np.concatenate(values), np.concatenate(owners), np.concatenate(where)
            query = np.stack([hidden_of[key][t - 1] for key, t in scores.positions])
            target = np.array([ids_of[key][t] for key, t in scores.positions])
            number_of = {key: number for number, key in enumerate(files)}
            q_owner = np.array([number_of[key] for key, _ in scores.positions])
            q_before = np.array([t - 1 for _, t in scores.positions])  # the file's keys before this are above the token
            p_model = torch.softmax(torch.from_numpy(query) @ head.T, dim=-1).numpy()
            lam = table_weights(scores.arrays()[2], table)
            mixture = (1 - lam)[:, None] * p_model
            for i, estimate in enumerate(scores.estimates):
                if estimate is not None:
                    mixture[i, estimate[0]] += lam[i] * estimate[1]
            found = {}
            for store_name in ("file above", "package"):
                dist = np.empty((len(target), NEIGHBOURS), np.float32)
                voters = np.empty((len(target), NEIGHBOURS), np.int64)
                for s in range(0, len(target), 256):
                    q = query[s:s + 256]
                    d = store_norm[None, :] - 2 * q @ store.T + (q * q).sum(1)[:, None]
                    same = owner[None, :] == q_owner[s:s + 256, None]
                    hide = same & (position[None, :] >= q_before[s:s + 256, None])  # the token itself and below
                    if store_name == "file above":
                        hide |= ~same
                    d[hide] = np.inf
                    nearest = np.argpartition(d, NEIGHBOURS, axis=1)[:, :NEIGHBOURS]
                    dist[s:s + 256] = np.take_along_axis(d, nearest, 1)
                    voters[s:s + 256] = value[nearest]
                found[store_name] = (dist, voters)
            shortlist = np.argpartition(-mixture, SHORTLIST, axis=1)[:, :SHORTLIST]
            rows = np.arange(len(target))[:, None]
            packages.append({
                "name": name, "target": target, "newline": newline[target],
                "model": p_model[np.arange(len(target)), target], "model_ok": p_model.argmax(1) == target,
                "mixture": mixture[np.arange(len(target)), target], "mixture_ok": mixture.argmax(1) == target,
                "short_ids": shortlist, "short_p": mixture[rows, shortlist],
                "found": {k: (dist, voters, mixture[rows, voters]) for k, (dist, voters) in found.items()},
            })
            print(f"  {name}: {len(target)} tokens, {len(store)} keys ({time.perf_counter() - started:.0f} s)", flush=True)

    def vote(dist: np.ndarray, voters: np.ndarray, temperature: float, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each neighbour's weight (rows summing to 1, or 0 with no key) and the vote for the target."""
        finite = np.isfinite(dist)
        logits = -np.where(finite, dist, 1e30) / temperature
        weights = np.exp(logits - logits.max(1, keepdims=True)) * finite
        weights /= np.maximum(weights.sum(1, keepdims=True), 1e-30)
        return weights, (weights * (voters == target[:, None])).sum(1)

    print("| | perplexity | ratio to the model | next token right | rest of the line exact (teacher-forced) |")
    print("|---|---|---|---|---|")
    n = sum(len(p["target"]) for p in packages)
    model_nll = -sum(np.log(np.maximum(p["model"], 1e-12)).sum() for p in packages) / n
    rows_out = [("model alone", model_nll, [p["model_ok"] for p in packages]),
                ("+ memory (table, file above): what ships",
                 -sum(np.log(p["mixture"]).sum() for p in packages) / n, [p["mixture_ok"] for p in packages])]
    for store_name in ("file above", "package"):
        nll, right = 0.0, []
        for held in packages:
            others = [p for p in packages if p is not held] or [held]
            nearest = np.concatenate([p["found"][store_name][0][:, 0] for p in others])
            temperature = float(np.median(nearest[np.isfinite(nearest)])) / 2
            edges = np.quantile(nearest[np.isfinite(nearest)], np.linspace(0, 1, 11)[1:-1])
            p_vote = np.concatenate([vote(*p["found"][store_name][:2], temperature, p["target"])[1] for p in others])
            p_mix = np.concatenate([p["mixture"] for p in others])
            decile = np.searchsorted(edges, nearest)
            weight_of = [best_weight(p_vote[decile == k], p_mix[decile == k]) if (decile == k).any() else 0.0
                         for k in range(len(edges) + 1)]
            dist, voters, mix_at = held["found"][store_name]
            weights, p_target = vote(dist, voters, temperature, held["target"])
            g = np.where(np.isfinite(dist[:, 0]), np.asarray(weight_of)[np.searchsorted(edges, dist[:, 0])], 0.0)
            nll -= np.log((1 - g) * held["mixture"] + g * p_target).sum()
            # the argmax of the mix: among the mixture's shortlist and the neighbours' ids
            candidates = np.concatenate([held["short_ids"], voters], axis=1)
            base = np.concatenate([held["short_p"], mix_at], axis=1)
            votes = np.stack([(weights * (voters == candidates[:, [c]])).sum(1) for c in range(candidates.shape[1])], 1)
            best = candidates[np.arange(len(voters)), ((1 - g)[:, None] * base + g[:, None] * votes).argmax(1)]
            right.append(best == held["target"])
        rows_out.append((f"+ neighbours in the {store_name} (kNN-LM)", nll / n, right))
    for label, nll, right in rows_out:
        exact = [line_exact(ok, p["newline"]) for ok, p in zip(right, packages)]
        share = sum(e for e, _ in exact) / max(1, sum(c for _, c in exact))
        print(f"| {label} | {math.exp(nll):.2f} | {math.exp(nll - model_nll):.3f} | "
              f"{np.concatenate(right).mean():.1%} | {share:.1%} |")
    print(f"({sum(c for _, c in (line_exact(p['model_ok'], p['newline']) for p in packages))} mid-line cursors, {n} tokens)")


def last_hidden(model, ids, window: int):
    """The model's last hidden state after the final norm at each of ``ids``' positions, each from the
    window that owns it (``fit.windows``, as ``fit.model_probabilities`` reads them)."""
    import numpy as np
    import torch

    from glm5_lsp.memory.fit import windows

    captured = []
    hook = model.model.norm.register_forward_hook(lambda _m, _i, out: captured.append(out[0]))
    out = np.zeros((len(ids), model.config.hidden_size), np.float32)
    try:
        with torch.inference_mode():
            for start, stop, first in windows(len(ids), window):
                captured.clear()
                model(torch.tensor([list(ids[start:stop])], dtype=torch.long))
                out[start + first:stop] = captured[-1][first:].float().numpy()
    finally:
        hook.remove()
    return out


def line_exact(right, newline) -> tuple[int, int]:
    """Of the mid-line tokens (neither it nor the one before holds a newline), how many begin a run of
    right tokens through the line's end (the next token holding a newline, that one included)."""
    exact, cursors, run = 0, 0, True
    for i in range(len(right) - 1, -1, -1):
        run = bool(right[i]) if newline[i] else (run and bool(right[i]))
        if i and not newline[i] and not newline[i - 1]:
            cursors += 1
            exact += run
    return exact, cursors


def main(argv: list[str] | None = None) -> int:
    from glm5_lsp.train.corpus import BENCHMARK_FIT, BENCHMARK_REPORT

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("perplexity")
    p.add_argument("--packages", nargs="+", default=list(BENCHMARK_REPORT))
    p.add_argument("--max-tokens", type=int, default=8000)
    d = sub.add_parser("drafts")
    d.add_argument("--requests", type=int, default=12)
    d.add_argument("--max-new-tokens", type=int, default=64)
    d.add_argument("--prompt-tokens", type=int, default=0, help="keep the prompt's last N tokens (0: all)")
    k = sub.add_parser("neighbours")
    k.add_argument("--packages", nargs="+", default=list(BENCHMARK_FIT))
    k.add_argument("--max-tokens", type=int, default=4000)
    k.add_argument("--max-keys", type=int, default=200_000, help="a package's keys, at most (its scored files' always)")
    u = sub.add_parser("updates")
    u.add_argument("--edits", type=int, default=300)
    w = sub.add_parser("workspace")
    w.add_argument("--files", type=int, default=2000)
    args = parser.parse_args(argv)
    {"perplexity": perplexity, "neighbours": neighbours, "drafts": drafts, "updates": updates, "workspace": workspace}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
