"""Runtime benchmark: our GLM-5 runtime against transformers' reference, and DSA against dense attention.

One checkpoint (random weights; the architecture, not the weights, sets the cost): vocab 16384,
hidden 384, 8 layers, 6 heads, q_lora 192, kv_lora 128, nope 64 / rope 32 / v 64, 16 routed experts
top-2 + 1 shared, moe_intermediate 256, first layer dense (intermediate 1024), indexer 4 x 64, top-k 512.

Part 1, same weights, 4,096-token context: prefill tokens/s and greedy decode tokens/s (32 new
tokens), ours vs ``transformers.GlmMoeDsaForCausalLM``; both compute only the last position's logits
in prefill, and decode is each library's own generation API (our ``Generator.generate``,
transformers' ``generate``) timed from the first new token to the last (a streamer's timestamps
for transformers), so neither prefill is in it. Part 2, our runtime only, 16,384-token context: DSA (top-k 512) against dense attention
(top-k covering the sequence): decode-step time and prefill peak memory (each prefill in a fresh
subprocess, peak RSS above the loaded model).

    python benchmarks/runtime.py                 # everything (about 10-15 minutes on 2 cores)
    python benchmarks/runtime.py --part reference --context 1024   # a quicker look
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from glm5_lsp.model import GenerationConfig, Generator, GlmMoeDsaConfig, GlmMoeDsaForCausalLM, load_model, save_model

SIZES = dict(
    vocab_size=16384,
    hidden_size=384,
    intermediate_size=1024,
    moe_intermediate_size=256,
    num_hidden_layers=8,
    num_attention_heads=6,
    num_key_value_heads=6,
    n_shared_experts=1,
    n_routed_experts=16,
    num_experts_per_tok=2,
    q_lora_rank=192,
    kv_lora_rank=128,
    qk_nope_head_dim=64,
    qk_rope_head_dim=32,
    v_head_dim=64,
    first_k_dense_replace=1,
    index_n_heads=4,
    index_head_dim=64,
    index_topk=512,
    max_position_embeddings=32768,
    eos_token_id=None,
    bos_token_id=None,
)


class _NoText:
    """Decoding benchmarks need ids only; this stands in for a tokenizer."""

    eos_token_id = None

    def decode(self, ids) -> str:
        return ""


def build_checkpoint(folder: Path, **overrides) -> Path:
    config = GlmMoeDsaConfig.from_dict({**SIZES, **overrides})
    torch.manual_seed(0)
    model = GlmMoeDsaForCausalLM(config)
    model.init_weights(seed=0)
    save_model(model, folder, max_shard_bytes=200_000_000, fused_experts=False)  # per-expert, like save_pretrained
    return folder


def prompt(n: int) -> torch.Tensor:
    return torch.randint(0, SIZES["vocab_size"], (1, n), generator=torch.Generator().manual_seed(0))


def ours_prefill_and_decode(path: Path, ids: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    model = load_model(path)
    gen = Generator(model, _NoText())  # type: ignore[arg-type]
    with torch.inference_mode():
        model(ids[:, :64], last_only=True)  # warm-up
        t0 = time.perf_counter()
        gen.prefill(ids[0].tolist())
        prefill = time.perf_counter() - t0
        gen.reset()
        out = gen.generate(ids[0].tolist(), GenerationConfig(max_new_tokens=new_tokens, stop_at_eos=False))
    decode = out.seconds - out.prefill_seconds  # the first new token comes from the prefill's logits
    return ids.shape[1] / prefill, (len(out.token_ids) - 1) / decode


def reference_prefill_and_decode(path: Path, ids: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """transformers' own API. Prefill: one forward. Decode: ``generate`` of 1 + N tokens, timed by a
    streamer between the first new token (the prefill's) and the last, so the prefill is not in it."""
    import transformers
    from transformers.generation.streamers import BaseStreamer

    class Stamps(BaseStreamer):
        def __init__(self) -> None:
            self.times: list[float] = []

        def put(self, value) -> None:
            self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    model = transformers.GlmMoeDsaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        model(ids[:, :64], logits_to_keep=1)  # warm-up
        t0 = time.perf_counter()
        model(ids, use_cache=True, logits_to_keep=1)
        prefill = time.perf_counter() - t0
        stamps = Stamps()
        out = model.generate(ids, max_new_tokens=1 + new_tokens, min_new_tokens=1 + new_tokens, do_sample=False,
                             streamer=stamps)
        assert out.shape[1] - ids.shape[1] == 1 + new_tokens
    # put() is called with the prompt, then once per new token: the last 1 + N stamps are the tokens
    tokens = stamps.times[-(1 + new_tokens):]
    return ids.shape[1] / prefill, new_tokens / (tokens[-1] - tokens[0])


def long_context_child(path: Path, context: int, steps: int, threads: int) -> dict[str, float]:
    """In a fresh subprocess: prefill ``context`` tokens (peak RSS growth above the loaded model and its
    cache, from Linux's resettable high-water mark),
    then time ``steps`` single-token decode steps on that cache."""
    code = f"""
import json, sys, time, torch
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from glm5_lsp.model import KVCache, load_model
torch.set_num_threads({threads})
model = load_model({str(path)!r})
ids = torch.randint(0, {SIZES['vocab_size']}, (1, {context}), generator=torch.Generator().manual_seed(0))
cache = KVCache(model.config, capacity={context} + {steps} + 4)
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # kB -> MiB
open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current RSS
base = status("VmRSS")
with torch.inference_mode():
    model(ids, cache=cache, last_only=True)
    peak = status("VmHWM") - base
    token = torch.tensor([[7]])
    model(token, cache=cache)
    t0 = time.perf_counter()
    for _ in range({steps}):
        model(token, cache=cache)
    step_ms = (time.perf_counter() - t0) / {steps} * 1000
print(json.dumps(dict(peak_mib=peak, step_ms=step_ms)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"long-context child failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["all", "reference", "dsa"], default="all")
    parser.add_argument("--context", type=int, default=4096, help="context for the reference comparison")
    parser.add_argument("--long-context", type=int, default=16384, help="context for DSA vs dense")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=16, help="decode steps timed at the long context")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sparse = build_checkpoint(Path(tmp) / "dsa")
        print(f"checkpoint: {sum(p.stat().st_size for p in sparse.glob('*.safetensors')) / 2**20:.0f} MiB, threads {args.threads}")
        if args.part in ("all", "reference"):
            ids = prompt(args.context)
            o_pre, o_dec = ours_prefill_and_decode(sparse, ids, args.new_tokens)
            r_pre, r_dec = reference_prefill_and_decode(sparse, ids, args.new_tokens)
            results.update(ours_prefill=o_pre, ref_prefill=r_pre, ours_decode=o_dec, ref_decode=r_dec)
            print(f"context {args.context}: prefill tokens/s ours {o_pre:.0f} vs transformers {r_pre:.0f} -> {o_pre / r_pre:.1f}x")
            print(f"context {args.context}: decode tokens/s ours {o_dec:.1f} vs transformers {r_dec:.2f} -> {o_dec / r_dec:.1f}x")
        if args.part in ("all", "dsa"):
            dense = build_checkpoint(Path(tmp) / "dense", index_topk=args.long_context + 64)
            n = args.long_context
            dsa = long_context_child(sparse, n, args.steps, args.threads)
            full = long_context_child(dense, n, args.steps, args.threads)
            s_ms, d_ms, s_mem, d_mem = dsa["step_ms"], full["step_ms"], dsa["peak_mib"], full["peak_mib"]
            results.update(dsa_step_ms=s_ms, dense_step_ms=d_ms, dsa_prefill_mib=s_mem, dense_prefill_mib=d_mem)
            print(f"context {n}: decode step DSA {s_ms:.1f} ms vs dense {d_ms:.1f} ms -> {d_ms / s_ms:.1f}x faster")
            print(f"context {n}: prefill peak memory DSA {s_mem:.0f} MiB vs dense {d_mem:.0f} MiB -> {s_mem / d_mem:.2f}x")
    print(json.dumps({k: round(v, 3) for k, v in results.items()}))


if __name__ == "__main__":
    main()
