"""Our runtime against llama.cpp on the same model: the embedded checkpoint, and its GGUF export.

The anchor for the runtime is what a CPU user would get from llama.cpp. Both run the embedded
model in fp32 on the same infilling prompts, greedy, the same number of new tokens (end-of-text
ignored), the same thread count, alternating which goes first:

- ours: ``Generator.generate`` on the tokenizer's infilling ids (no attention-policy roles, no
  monitor: the bare runtime), its own prefill and decode timings, and the call's wall time;
- llama.cpp: ``llama-server`` (``tests/llama_server.py`` finds or names the binary) asked through
  ``/infill`` with ``cache_prompt`` off, its own ``timings`` (prompt and predicted tokens per
  second) and the request's wall time (HTTP on loopback included).

Prompts: infilling cases cut from the source of the ``BENCHMARK_REPORT`` packages (never trained
on), the cursor at a random line start of a random file, up to ``--prefix-tokens`` before and
``--suffix-tokens`` after. Also printed: how often the two wrote the same text (greedy, one model).

    python benchmarks/llamacpp.py                       # 24 cases, 64 new tokens, 1 thread
    python benchmarks/llamacpp.py --threads 2 --cases 12
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from llama_server import find_llama_server, llama_server

from glm5_lsp.gguf_export import export
from glm5_lsp.model import GenerationConfig, Generator, default_model_path, load_model, load_tokenizer
from glm5_lsp.train.corpus import BENCHMARK_REPORT


def package_files(name: str) -> list[Path]:
    spec = importlib.util.find_spec(name.replace("-", "_"))
    if spec is None or not spec.origin:
        return []
    root = Path(spec.origin).parent
    return sorted(p for p in root.rglob("*.py") if "test" not in p.parts and p.stat().st_size > 2000)


def cases(tokenizer, count: int, prefix_tokens: int, suffix_tokens: int, seed: int) -> list[tuple[str, str, str]]:
    rng = random.Random(seed)
    files = [f for name in BENCHMARK_REPORT for f in package_files(name)]
    if not files:
        raise SystemExit("none of the BENCHMARK_REPORT packages is installed")
    out = []
    while len(out) < count:
        path = rng.choice(files)
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        if len(lines) < 40:
            continue
        cut = rng.randrange(20, len(lines) - 10)
        before, after = "".join(lines[:cut]), "".join(lines[cut:])
        ids = tokenizer.encode(before)[-prefix_tokens:]
        prefix = tokenizer.decode(ids)
        suffix = tokenizer.decode(tokenizer.encode(after)[:suffix_tokens])
        out.append((f"{path.parent.name}/{path.name}:{cut + 1}", prefix, suffix))
    return out


def run_ours(generator: Generator, tokenizer, prefix: str, suffix: str, new_tokens: int) -> dict:
    ids = tokenizer.fim_prompt_ids(prefix, suffix)
    started = time.perf_counter()
    out = generator.generate(ids, GenerationConfig(max_new_tokens=new_tokens, stop_at_eos=False))
    wall = time.perf_counter() - started
    decode = out.seconds - out.prefill_seconds
    return {"text": out.text, "prompt": len(ids), "n": len(out.token_ids), "prefill_tps": len(ids) / out.prefill_seconds,
            "decode_tps": len(out.token_ids) / decode if decode > 0 else float("nan"), "wall": wall}


def run_llama(url: str, prefix: str, suffix: str, new_tokens: int) -> dict:
    body = {"input_prefix": prefix, "input_suffix": suffix, "n_predict": new_tokens, "temperature": 0.0,
            "ignore_eos": True, "cache_prompt": False, "stream": False}
    started = time.perf_counter()
    data = httpx.post(url + "/infill", json=body, timeout=300).json()
    wall = time.perf_counter() - started
    timings = data["timings"]
    return {"text": data["content"], "prompt": data["tokens_evaluated"], "n": data["tokens_predicted"],
            "prefill_tps": timings["prompt_per_second"], "decode_tps": timings["predicted_per_second"], "wall": wall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prefix-tokens", type=int, default=320)
    parser.add_argument("--suffix-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so llama-server is stopped on the way out
    binary = find_llama_server()
    if binary is None:
        print("no llama-server: set $GLM5_LLAMA_SERVER, put it on PATH, or run scripts/build_llama_server.sh")
        return 2
    torch.set_num_threads(args.threads)
    path = default_model_path()
    tokenizer = load_tokenizer(path)
    generator = Generator(load_model(path).eval(), tokenizer)
    prompts = cases(tokenizer, args.cases, args.prefix_tokens, args.suffix_tokens, args.seed)
    rows: dict[str, list[dict]] = {"ours": [], "llama.cpp": []}
    with tempfile.TemporaryDirectory() as tmp:
        gguf = export(path, Path(tmp) / "glm5-code-tiny.gguf")
        with llama_server(binary, gguf, ctx=1024, threads=args.threads, log=Path(tmp) / "server.log") as url:
            run_llama(url, "x = 1\n", "\n", 4)  # warm both up once
            run_ours(generator, tokenizer, "x = 1\n", "\n", 4)
            for i, (_, prefix, suffix) in enumerate(prompts):
                order = [("ours", lambda p=prefix, s=suffix: run_ours(generator, tokenizer, p, s, args.new_tokens)),
                         ("llama.cpp", lambda p=prefix, s=suffix: run_llama(url, p, s, args.new_tokens))]
                for name, run in order if i % 2 == 0 else order[::-1]:
                    rows[name].append(run())

    same = sum(a["text"] == b["text"] for a, b in zip(rows["ours"], rows["llama.cpp"]))
    prompt_tokens = statistics.median(r["prompt"] for r in rows["ours"])
    print(f"{len(prompts)} infilling prompts from BENCHMARK_REPORT (median {prompt_tokens:.0f} prompt tokens), "
          f"{args.new_tokens} new tokens each, {args.threads} thread(s), fp32, greedy")
    print(f"{'':12} {'prefill tok/s':>14} {'decode tok/s':>13} {'request ms':>11}   (medians)")
    medians = {}
    for name, got in rows.items():
        medians[name] = [statistics.median(r[key] for r in got) for key in ("prefill_tps", "decode_tps", "wall")]
        prefill, decode, wall = medians[name]
        print(f"{name:12} {prefill:14.0f} {decode:13.0f} {wall * 1000:11.1f}")
    (op, od, ow), (lp, ld, lw) = medians["ours"], medians["llama.cpp"]
    print(f"{'ours/llama':12} {op / lp:14.2f}x {od / ld:12.2f}x {ow / lw:10.2f}x")
    print(f"same greedy text: {same}/{len(prompts)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
