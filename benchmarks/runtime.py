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
subprocess, peak RSS above the loaded model). Beside each figure, a floor that no fp32 runtime on this
machine can beat, measured in the same run: decode, the weights one step reads streamed as bare
matrix-vector products; prefill, its arithmetic (``prefill_flops``) at this CPU's peak matrix rate
plus the indexer's top-k as bare calls; the DSA step, those weights plus the indexer's scan and
top-k over every cached key as bare operations.

    python benchmarks/runtime.py                 # everything (about 10-15 minutes on 2 cores)
    python benchmarks/runtime.py --part reference --context 1024   # a quicker look
    python benchmarks/runtime.py --part steps    # decode-step times alone, to compare two versions
    python benchmarks/runtime.py --part prompts  # the embedded model's short-prompt prefill, general vs lean
    python benchmarks/runtime.py --part stats    # what the per-step statistics for the gate cost
    python benchmarks/runtime.py --part verify   # the embedded model's draft verification, general vs lean
    python benchmarks/runtime.py --part script   # its scripted lean paths vs the Python ones: numbers, speed
    python benchmarks/runtime.py --part native   # its decoding step in C vs the scripted one: numbers, speed
    python benchmarks/runtime.py --part native-dsa  # past its DSA top-k: C's selection vs torch's, speed, numbers
    python benchmarks/runtime.py --part ahead    # its next step run ahead beside the logits processors, or not

Decode steps and prompt prefills run through ``generate.cached_forward``, the generator's choice of
path (the lean step where it applies), as ``Generator.generate`` runs them.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from glm5_lsp.model import (
    AttentionPolicy,
    GenerationConfig,
    Generator,
    GlmMoeDsaConfig,
    GlmMoeDsaForCausalLM,
    KVCache,
    Role,
    cached_forward,
    default_model_path,
    load_model,
    save_model,
)

SIZES = {
    "vocab_size": 16384,
    "hidden_size": 384,
    "intermediate_size": 1024,
    "moe_intermediate_size": 256,
    "num_hidden_layers": 8,
    "num_attention_heads": 6,
    "num_key_value_heads": 6,
    "n_shared_experts": 1,
    "n_routed_experts": 16,
    "num_experts_per_tok": 2,
    "q_lora_rank": 192,
    "kv_lora_rank": 128,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32,
    "v_head_dim": 64,
    "first_k_dense_replace": 1,
    "index_n_heads": 4,
    "index_head_dim": 64,
    "index_topk": 512,
    "max_position_embeddings": 32768,
    "eos_token_id": None,
    "bos_token_id": None,
}


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


def decode_weight_floor(path: Path, repeats: int = 20) -> tuple[float, float]:
    """The weights one decode step must read, streamed as bare matrix-vector products (no attention,
    no cache, no other operation): ``(milliseconds per step, MiB read)``. No fp32 implementation of
    this model decodes faster than this on this machine; it bounds the decode ratio any runtime can reach."""
    import torch.nn.functional as F

    model = load_model(path)
    mats: list[torch.Tensor] = []
    for layer in model.model.layers:
        attn = layer.self_attn
        mats += [attn.q_a_proj.weight, attn.q_b_proj.weight, attn.kv_a_proj_with_mqa.weight,
                 attn.kv_b_proj.weight, attn.o_proj.weight]
        if attn.indexer is not None:
            mats += [attn.indexer.wq_b.weight, attn.indexer.wk.weight, attn.indexer.weights_proj.weight]
        mlp = layer.mlp
        if hasattr(mlp, "experts"):  # the router, top-k routed experts and the shared expert
            k = model.config.num_experts_per_tok
            mats += [mlp.gate.weight, *mlp.experts.gate_up_proj[:k], *mlp.experts.down_proj[:k],
                     mlp.shared_experts.gate_proj.weight, mlp.shared_experts.up_proj.weight,
                     mlp.shared_experts.down_proj.weight]
        else:
            mats += [mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight]
    mats.append(model.lm_head.weight)
    inputs = [torch.randn(1, w.shape[1]) for w in mats]
    # Both memory layouts: MKL streams a column-major [out, in] matrix up to ~2.7x faster in a
    # one-row product on this CPU (the 16384-row head), so the floor is the faster of the two.
    layouts = [mats, [w.t().contiguous().t() for w in mats]]
    best = float("inf")
    with torch.inference_mode():
        for weights in layouts:
            for w, x in zip(weights, inputs):
                F.linear(x, w)
            t0 = time.perf_counter()
            for _ in range(repeats):
                for w, x in zip(weights, inputs):
                    F.linear(x, w)
            best = min(best, (time.perf_counter() - t0) / repeats * 1000)
    return best, sum(w.numel() * w.element_size() for w in mats) / 2**20


def _indexer_layers(config: GlmMoeDsaConfig) -> int:
    """Layers that run the indexer ("full"); "shared" ones reuse the previous full layer's selection."""
    return sum(kind == "full" for kind in config.indexer_types)


def prefill_flops(config: GlmMoeDsaConfig, n: int) -> float:
    """The least arithmetic an ``n``-token prefill of this model needs, in floating-point operations
    (2 per multiply-add): every projection and chosen expert per token; attention in the cheaper
    non-absorbed form (per-head keys and values made once per token), each query over its selected
    keys only; the indexer's score against every causal key wherever there are more than top-k; the
    output head for the last position only. Norms, RoPE, softmax, top-k and gathers count nothing."""
    h, heads, ih, idim = config.hidden_size, config.num_attention_heads, config.index_n_heads, config.index_head_dim
    nope, rope, vdim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
    per_token = 0  # multiply-adds of one token through every layer, outside attention and the indexer
    for kind, mlp in zip(config.indexer_types, config.mlp_layer_types):
        indexer = kind == "full"
        per_token += h * (config.q_lora_rank + config.kv_lora_rank + rope + (idim + ih if indexer else 0))
        per_token += config.q_lora_rank * (heads * (nope + rope) + (ih * idim if indexer else 0))
        per_token += config.kv_lora_rank * heads * (nope + vdim) + heads * vdim * h  # kv_b, o_proj
        if mlp == "dense":
            per_token += 3 * h * config.intermediate_size
        else:
            active = config.num_experts_per_tok + config.n_shared_experts
            per_token += h * config.n_routed_experts + active * 3 * h * config.moe_intermediate_size
    macs = n * per_token + h * config.vocab_size
    for p in range(n):
        keys = p + 1
        macs += config.num_hidden_layers * heads * min(keys, config.index_topk) * (nope + rope + vdim)
        if keys > config.index_topk:
            macs += _indexer_layers(config) * ih * keys * (idim + 1)
    return 2.0 * macs


def gemm_peak_gflops(size: int = 2048, repeats: int = 12) -> float:
    """This CPU's fp32 matrix-multiply rate on a large square product, the fastest of ``repeats`` (the
    best case for any kernel; the fastest, since a shared machine only ever slows a product down)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best / 1e9


def prefill_topk_s(config: GlmMoeDsaConfig, n: int, chunk: int = 64) -> float:
    """The indexer's top-k selections of an ``n``-token prefill as bare ``topk`` calls on random scores
    (every full layer, every query with more causal keys than top-k, ``chunk`` queries at a time), in s."""
    layers = _indexer_layers(config)
    k = config.index_topk
    rows = [torch.randn(chunk, end) for end in range(k + chunk, n + 1, chunk)]
    for r in rows[:2]:
        r.topk(k, dim=-1, sorted=False)
    t0 = time.perf_counter()
    for r in rows:
        r.topk(k, dim=-1, sorted=False)
    return (time.perf_counter() - t0) * layers


def indexer_floor_ms(config: GlmMoeDsaConfig, context: int, repeats: int = 20) -> float:
    """What a DSA decode step must do at ``context`` keys beyond the weights, as bare operations: every
    full indexer layer scores all cached indexer keys (one ``[heads, D] x [D, context]`` product on its
    own key tensor, so nothing stays in cache) and takes the top-k of the scores. In ms a step."""
    keys = [torch.randn(context, config.index_head_dim) for _ in range(_indexer_layers(config))]
    query = torch.randn(config.index_n_heads, config.index_head_dim)
    weights = torch.randn(config.index_n_heads)

    def step() -> None:
        for k in keys:
            torch.mv(torch.mm(query, k.t()).relu_().t(), weights).topk(config.index_topk, sorted=False)

    with torch.inference_mode():
        step()
        t0 = time.perf_counter()
        for _ in range(repeats):
            step()
    return (time.perf_counter() - t0) / repeats * 1000


def long_context_child(path: Path, context: int, steps: int, threads: int) -> dict[str, float]:
    """In a fresh subprocess: prefill ``context`` tokens (peak RSS growth above the loaded model and its
    cache, from Linux's resettable high-water mark),
    then time ``steps`` single-token decode steps on that cache."""
    code = f"""
import json, sys, time, torch
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from glm5_lsp.model import KVCache, cached_forward, load_model
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
    cached_forward(model, ids, cache, last_only=True)
    peak = status("VmHWM") - base
    token = torch.tensor([[7]])
    cached_forward(model, token, cache)
    t0 = time.perf_counter()
    for _ in range({steps}):
        cached_forward(model, token, cache)
    step_ms = (time.perf_counter() - t0) / {steps} * 1000
print(json.dumps(dict(peak_mib=peak, step_ms=step_ms)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"long-context child failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def decode_steps(path: Path, context: int, steps: int = 13, rounds: int = 3) -> float:
    """One decode step after a ``context``-token prefill, in ms: the best of ``rounds`` runs of ``steps``."""
    model = load_model(path)
    ids = torch.randint(0, model.config.vocab_size, (1, context), generator=torch.Generator().manual_seed(0))
    cache = KVCache(model.config, capacity=context + rounds * steps + 8)
    token = torch.tensor([[7]])
    best = float("inf")
    with torch.inference_mode():
        cached_forward(model, ids, cache, last_only=True)
        for _ in range(3):
            cached_forward(model, token, cache)
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(steps):
                cached_forward(model, token, cache)
            best = min(best, (time.perf_counter() - t0) / steps * 1000)
    return best


def prompt_prefills(path: Path, lengths=(10, 50, 100), repeats: int = 15) -> dict[int, tuple[float, float, float]]:
    """A short prompt's prefill into an empty cache, in ms (median of ``repeats``): the general
    path, the lean dense one in Python and scripted (``cached_forward``'s ``lean``, ``scripted``),
    taking turns, on the same ids."""
    model = load_model(path)
    gen = torch.Generator().manual_seed(0)
    sides = ((False, False), (True, False), (True, True))
    out = {}
    with torch.inference_mode():
        for n in lengths:
            times: dict[tuple[bool, bool], list[float]] = {side: [] for side in sides}
            for _ in range(repeats + 2):
                ids = torch.randint(0, model.config.vocab_size, (1, n), generator=gen)
                for lean, scripted in sides:
                    cache = KVCache(model.config, capacity=n + 8)
                    t0 = time.perf_counter()
                    cached_forward(model, ids, cache, last_only=True, lean=lean, scripted=scripted)
                    times[lean, scripted].append((time.perf_counter() - t0) * 1000)
            out[n] = tuple(statistics.median(times[side][2:]) for side in sides)
    return out


def _report_prompts(count: int, lengths: tuple[int, ...], packages: tuple[str, ...] | None = None,
                    after: int = 0) -> list[tuple[str, int, list[int]]]:
    """``count`` editor-like requests per prompt length from the ``BENCHMARK_REPORT`` packages' code
    (or ``packages``'): the document up to the start of a line (at least 40 lines in), its last ``n``
    tokens, and the ``after`` tokens that follow there in the file (a perfect draft)."""
    import importlib.util
    import random

    from glm5_lsp.model import load_tokenizer
    from glm5_lsp.train.corpus import BENCHMARK_REPORT

    tokenizer = load_tokenizer(default_model_path())
    files = []
    for package in packages or BENCHMARK_REPORT:
        spec = importlib.util.find_spec(package.replace("-", "_"))
        if spec is not None and spec.origin:
            files += sorted(Path(spec.origin).parent.rglob("*.py"))
    rng = random.Random(0)
    out = []
    while len(out) < count * len(lengths):
        path = rng.choice(files)
        text = path.read_text(encoding="utf-8", errors="replace")
        starts = [i + 1 for i, c in enumerate(text) if c == "\n"][40:]
        if not starts:
            continue
        offset = rng.choice(starts)
        ids = tokenizer.encode(text[:offset])
        n = lengths[len(out) % len(lengths)]
        rest = tokenizer.encode(text[offset:])[:after] if after else []
        if len(ids) >= n and len(rest) == after:
            out.append((text, offset, ids[-n:] + rest))
    return out


def _paired(calls: dict[str, object], repeats: int) -> dict[str, float]:
    """Each of ``calls`` (name -> a function of no arguments) run ``repeats`` times, the names taking
    turns (so a slow spell on this shared machine lands on all of them alike): median ms per name."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[name].append((time.perf_counter() - t0) * 1000)
    return {name: statistics.median(ms) for name, ms in times.items()}


def verify_calls(count: int = 24, drafts: tuple[int, ...] = (2, 3, 4, 5, 6, 7, 8), prompt_tokens: int = 64,
                 repeats: int = 9) -> dict[str, float]:
    """A draft's verification on the embedded model, as ``Generator.generate`` runs it: a real
    ``prompt_tokens``-token prompt (pexpect, pluggy and rsa code) prefilled, then ``[token, *k
    proposed]`` (the file's next tokens) in one ``cached_forward`` call with every row's logits, by the
    general path, the lean prefill in Python and the scripted one, taking turns, with and without the
    step statistics' probe. Per (prompt, k, probe) the ratios of the medians; reported: their median
    per probe setting and k."""
    from glm5_lsp.model.stats import StatsProbe

    path = Path(default_model_path())
    model = load_model(path)
    scaling = model.config.routed_scaling_factor
    requests = _report_prompts(count, (prompt_tokens,), packages=("pexpect", "pluggy", "rsa"), after=max(drafts) + 1)
    sides = {"general": (False, False), "lean": (True, False), "scripted": (True, True)}
    ratios: dict[tuple[bool, str, int], list[float]] = {}
    ms: dict[tuple[bool, str], list[float]] = {}

    def verify(side: tuple[bool, bool], cache: KVCache, probe: StatsProbe | None, draft: torch.Tensor) -> None:
        cache.truncate(prompt_tokens)
        cached_forward(model, draft, cache, lean=side[0], scripted=side[1], probe=probe)

    with torch.inference_mode():
        for _, _, ids in requests:
            prompt_ids = torch.tensor([ids[:prompt_tokens]])
            caches, probes = {}, {}
            for name, side in sides.items():
                caches[name] = KVCache(model.config, capacity=prompt_tokens + max(drafts) + 8)
                probes[name] = StatsProbe(scaling=scaling)  # holds the prompt's roles, as in a generation
                cached_forward(model, prompt_ids, caches[name], last_only=True, lean=side[0], scripted=side[1],
                               probe=probes[name])
            for k in drafts:
                draft = torch.tensor([ids[prompt_tokens : prompt_tokens + 1 + k]])
                for on in (False, True):
                    med = _paired({name: functools.partial(verify, side, caches[name], probes[name] if on else None,
                                                           draft)
                                   for name, side in sides.items()}, repeats)
                    for name in ("lean", "scripted"):
                        ratios.setdefault((on, name, k), []).append(med["general"] / med[name])
                    ratios.setdefault((on, "scripted/lean", k), []).append(med["lean"] / med["scripted"])
                    for name in sides:
                        ms.setdefault((on, name), []).append(med[name])
    results = {}
    print(f"{len(requests)} prompts of {prompt_tokens} tokens (pexpect, pluggy, rsa), a draft of k tokens "
          f"verified, the three paths taking turns ({repeats} each); ratios of the medians, median over prompts")
    for on in (False, True):
        label = "probe" if on else "plain"
        times = ", ".join(f"{name} {statistics.median(ms[(on, name)]):.2f} ms" for name in sides)
        print(f"{'probe on' if on else 'probe off'}: {times}")
        for name, what in (("lean", "general/lean"), ("scripted", "general/scripted"),
                           ("scripted/lean", "lean/scripted")):
            every = [r for k in drafts for r in ratios[(on, name, k)]]
            key = name.replace("/", "_per_")
            results[f"verify_{label}_{key}_ratio"] = statistics.median(every)
            print(f"  {what}: {statistics.median(every):.2f}x overall; per k "
                  + ", ".join(f"{k}: {statistics.median(ratios[(on, name, k)]):.2f}x" for k in drafts))
        for name in sides:
            results[f"verify_{label}_{name}_ms"] = statistics.median(ms[(on, name)])
    return results


def script_check(count: int = 240, lengths: tuple[int, ...] = (16, 64, 100, 150), new_tokens: int = 16) -> dict:
    """The scripted lean paths against the Python ones on the embedded model: ``count`` real prompts
    (pexpect, pluggy, rsa; the lengths in turn, the longest past the 128-key budget so steps select),
    ``new_tokens`` greedy steps each with the step statistics on, by a generator of each kind: the
    largest difference of any step's logits, and how many generations are token for token the same."""
    from glm5_lsp.model import load_tokenizer

    path = Path(default_model_path())
    model = load_model(path)
    tokenizer = load_tokenizer(path)
    requests = _report_prompts(count // len(lengths), lengths, packages=("pexpect", "pluggy", "rsa"))
    gens = {scripted: Generator(model, tokenizer, scripted=scripted) for scripted in (False, True)}
    config = GenerationConfig(max_new_tokens=new_tokens, stop_at_eos=False, step_stats=True)
    worst, same, steps, stats_worst = 0.0, 0, 0, 0.0

    def keep(seen: list[torch.Tensor], out: list[int], scores: torch.Tensor) -> torch.Tensor:
        seen.append(scores)
        return scores

    with torch.inference_mode():
        for _, _, ids in requests:
            seen: dict[bool, list[torch.Tensor]] = {False: [], True: []}
            outs = {}
            for scripted, gen in gens.items():
                gen.reset()
                outs[scripted] = gen.generate(ids, config, logits_processor=functools.partial(keep, seen[scripted]))
            same += outs[False].token_ids == outs[True].token_ids
            for a, b in zip(seen[False], seen[True]):
                worst = max(worst, float((a - b).abs().max()))
                steps += 1
            for name, rows in outs[False].stats.per_layer.items():
                for r1, r2 in zip(rows, outs[True].stats.per_layer[name]):
                    stats_worst = max([stats_worst] + [abs(x - y) for x, y in zip(r1, r2)])
    print(f"{len(requests)} real prompts ({', '.join(map(str, lengths))} tokens), {new_tokens} greedy steps with "
          f"statistics: {same}/{len(requests)} generations token-identical, largest logit difference {worst:.3g} "
          f"over {steps} steps, largest statistic difference {stats_worst:.3g}")
    return {"script_identical": same, "script_prompts": len(requests), "script_max_logit_diff": worst,
            "script_steps": steps, "script_max_stat_diff": stats_worst}


def script_speed(count: int = 40, prompt_tokens: int = 64, new_tokens: int = 12, repeats: int = 7) -> dict:
    """The Python lean paths against the scripted ones on the embedded model, the statistics' probe on
    (as the editor runs), on real ``prompt_tokens``-token prompts (pexpect, pluggy, rsa): a decoding step
    after the prompt, the prompt's prefill, and the whole ``Generator.generate`` of ``new_tokens``
    greedy tokens (from an empty cache); each pair taking turns ``repeats`` times per prompt, the ratio
    of the medians per prompt, reported as their median."""
    from glm5_lsp.model import load_tokenizer
    from glm5_lsp.model.stats import StatsProbe

    path = Path(default_model_path())
    model = load_model(path)
    tokenizer = load_tokenizer(path)
    scaling = model.config.routed_scaling_factor
    requests = _report_prompts(count, (prompt_tokens,), packages=("pexpect", "pluggy", "rsa"), after=1)
    gens = {scripted: Generator(model, tokenizer, scripted=scripted) for scripted in (False, True)}
    config = GenerationConfig(max_new_tokens=new_tokens, stop_at_eos=False, step_stats=True)
    ratios: dict[str, list[float]] = {"step": [], "prefill": [], "generate": []}
    ms: dict[tuple[str, bool], list[float]] = {}

    def step(scripted: bool, cache: KVCache, probe: StatsProbe, token: torch.Tensor) -> None:
        cache.truncate(prompt_tokens)
        cached_forward(model, token, cache, scripted=scripted, probe=probe)

    def prefill(scripted: bool, prompt: torch.Tensor) -> None:
        cache = KVCache(model.config, capacity=prompt_tokens + 8)
        cached_forward(model, prompt, cache, last_only=True, scripted=scripted, probe=StatsProbe(scaling=scaling))

    def generate(scripted: bool, ids: list[int]) -> None:
        gens[scripted].reset()
        gens[scripted].generate(ids, config)

    with torch.inference_mode():
        for _, _, ids in requests:
            prompt = torch.tensor([ids[:prompt_tokens]])
            token = torch.tensor([ids[prompt_tokens:]])
            caches, probes = {}, {}
            for scripted in (False, True):
                caches[scripted] = KVCache(model.config, capacity=prompt_tokens + 8)
                probes[scripted] = StatsProbe(scaling=scaling)
                cached_forward(model, prompt, caches[scripted], last_only=True, scripted=scripted,
                               probe=probes[scripted])
            calls = {
                "step": {s: functools.partial(step, s, caches[s], probes[s], token) for s in (False, True)},
                "prefill": {s: functools.partial(prefill, s, prompt) for s in (False, True)},
                "generate": {s: functools.partial(generate, s, ids[:prompt_tokens]) for s in (False, True)},
            }
            for what, pair in calls.items():
                med = _paired({"lean" if not s else "scripted": f for s, f in pair.items()},
                              repeats * (5 if what == "step" else 1))
                ratios[what].append(med["lean"] / med["scripted"])
                for name, value in med.items():
                    ms.setdefault((what, name == "scripted"), []).append(value)
            for probe in probes.values():
                probe.blocks.clear()
    results = {}
    print(f"{len(requests)} real {prompt_tokens}-token prompts (pexpect, pluggy, rsa), statistics on; Python lean "
          f"vs scripted taking turns; ratio of the medians per prompt, median over prompts")
    for what, each in ratios.items():
        lean_ms, script_ms = statistics.median(ms[(what, False)]), statistics.median(ms[(what, True)])
        results[f"script_{what}_ratio"] = statistics.median(each)
        results[f"script_{what}_lean_ms"], results[f"script_{what}_scripted_ms"] = lean_ms, script_ms
        label = {"step": "decoding step", "prefill": f"{prompt_tokens}-token prefill",
                 "generate": f"generate {new_tokens} tokens"}[what]
        print(f"{label}: {statistics.median(each):.3f}x (lean {lean_ms:.3f} ms, scripted {script_ms:.3f} ms; "
              f"quartiles of the ratio {_quartiles(each)})")
    return results


def native_compare(count: int = 40, prompt_tokens: int = 64, new_tokens: int = 12, check_tokens: int = 16,
                   repeats: int = 7) -> dict:
    """The embedded model's decoding step in C (``native.py``) against the scripted one, as the editor
    runs them (no statistics' probe) on real ``prompt_tokens``-token prompts (pexpect, pluggy, rsa):
    the largest logit difference over ``check_tokens`` greedy steps of each prompt (both sides fed the
    same tokens) and how many greedy texts are the same; then a decoding step after the prompt and the
    whole ``Generator.generate`` of ``new_tokens`` tokens from an empty cache, the two sides taking
    turns ``repeats`` times per prompt, the ratio of the medians per prompt, reported as their median."""
    from glm5_lsp.model import load_tokenizer, native

    path = Path(default_model_path())
    model = load_model(path)
    if native.get(model.prepare_inference()) is None:
        raise SystemExit("the C step is not built or turned off (GLM5_NATIVE): pip install -e . builds it")
    tokenizer = load_tokenizer(path)
    requests = _report_prompts(count, (prompt_tokens,), packages=("pexpect", "pluggy", "rsa"), after=1)
    gens = {c: Generator(model, tokenizer, native=c) for c in (False, True)}
    greedy = GenerationConfig(max_new_tokens=check_tokens, stop_at_eos=False)
    config = GenerationConfig(max_new_tokens=new_tokens, stop_at_eos=False)
    worst, same = 0.0, 0
    ratios: dict[str, list[float]] = {"step": [], "generate": []}
    ms: dict[tuple[str, bool], list[float]] = {}

    def step(c: bool, cache: KVCache, token: torch.Tensor) -> None:
        cache.truncate(prompt_tokens)
        cached_forward(model, token, cache, native_step=c)

    def generate(c: bool, ids: list[int]) -> None:
        gens[c].reset()
        gens[c].generate(ids, config)

    with torch.inference_mode():
        for _, _, ids in requests:
            prompt = torch.tensor([ids[:prompt_tokens]])
            caches = {c: KVCache(model.config, capacity=prompt_tokens + check_tokens + 8) for c in (False, True)}
            for c in (False, True):
                cached_forward(model, prompt, caches[c], last_only=True)
            token = torch.tensor([ids[prompt_tokens:]])
            for _ in range(check_tokens):  # the same tokens into both caches: the scripted side's argmax
                want = cached_forward(model, token, caches[False], native_step=False)
                got = cached_forward(model, token, caches[True], native_step=True)
                worst = max(worst, float((want - got).abs().max()))
                token = want[:, -1].argmax(-1, keepdim=True)
            texts = []
            for c in (False, True):
                gens[c].reset()
                texts.append(gens[c].generate(ids[:prompt_tokens], greedy).token_ids)
            same += texts[0] == texts[1]
            calls = {
                "step": {c: functools.partial(step, c, caches[c], torch.tensor([ids[prompt_tokens:]])) for c in (False, True)},
                "generate": {c: functools.partial(generate, c, ids[:prompt_tokens]) for c in (False, True)},
            }
            for what, pair in calls.items():
                med = _paired({"scripted" if not c else "native": f for c, f in pair.items()},
                              repeats * (5 if what == "step" else 1))
                ratios[what].append(med["scripted"] / med["native"])
                for name, value in med.items():
                    ms.setdefault((what, name == "native"), []).append(value)
    print(f"{len(requests)} real {prompt_tokens}-token prompts (pexpect, pluggy, rsa), no statistics' probe; the "
          f"scripted step vs the C step taking turns; ratio of the medians per prompt, median over prompts")
    print(f"largest logit difference over {check_tokens} greedy steps a prompt: {worst:.2e}; the same greedy "
          f"text ({check_tokens} tokens) at {same} of {len(requests)} prompts")
    results = {"native_max_logit_diff": worst, "native_same_text": same, "native_prompts": len(requests)}
    for what, each in ratios.items():
        script_ms, c_ms = statistics.median(ms[(what, False)]), statistics.median(ms[(what, True)])
        results[f"native_{what}_ratio"] = statistics.median(each)
        results[f"native_{what}_scripted_ms"], results[f"native_{what}_c_ms"] = script_ms, c_ms
        label = {"step": "decoding step", "generate": f"{prompt_tokens}-token prompt and {new_tokens} tokens"}[what]
        print(f"{label}: {statistics.median(each):.2f}x as fast (scripted {script_ms:.3f} ms, C {c_ms:.3f} ms; "
              f"quartiles of the ratio {_quartiles(each)})")
    return results


def native_dsa_compare(count: int = 12, prompt_tokens: int = 400, teacher_tokens: int = 300,
                       rows: tuple[int, ...] = (8, 16, 32, 64, 128), repeats: int = 7) -> dict:
    """Past the embedded model's DSA top-k, the C call (``native.c``: the indexer's scores, the
    top-k, attention over it) against torch's on real ``prompt_tokens``-token prompts (pexpect,
    pluggy, rsa): a decoding step, and calls of several rows past the top-k (8: a draft's
    verification; more: a prompt's prefill, to find where torch's batched products win), the two
    taking turns, the ratio of the medians per prompt and its median. Then the numbers: one file of
    each FIT package teacher-forced from token ``prompt_tokens`` for ``teacher_tokens`` tokens, every
    step past the top-k, perplexity with C's steps and with torch's, and how often the argmax agrees
    (C keeps the first of keys whose indexer scores tie at the top-k's edge, torch others). Last, a
    decoding step with the attention policy and a line of error-context tokens in the prompt (a
    fix's: their keys forced into every selection), torch's general path against C."""
    import math

    from glm5_lsp.memory.heldout import package_files
    from glm5_lsp.model import load_tokenizer, native
    from glm5_lsp.train.corpus import BENCHMARK_FIT

    path = Path(default_model_path())
    model = load_model(path)
    if native.get(model.prepare_inference()) is None:
        raise SystemExit("the C step is not built or turned off (GLM5_NATIVE): pip install -e . builds it")
    tokenizer = load_tokenizer(path)
    longest = max(rows)
    requests = _report_prompts(count, (prompt_tokens,), packages=("pexpect", "pluggy", "rsa"), after=longest)
    ratios: dict[int, list[float]] = {}
    ms: dict[tuple[int, bool], list[float]] = {}

    def call(c: bool, cache: KVCache, ids: torch.Tensor) -> None:
        cache.truncate(prompt_tokens)
        cached_forward(model, ids, cache, native_step=c)

    results: dict[str, float] = {}
    with torch.inference_mode():
        for _, _, ids in requests:
            prompt = torch.tensor([ids[:prompt_tokens]])
            caches = {c: KVCache(model.config, capacity=prompt_tokens + longest + 8) for c in (False, True)}
            for c in (False, True):
                cached_forward(model, prompt, caches[c], last_only=True, native_step=False)
            for n in (1, *rows):
                after = torch.tensor([ids[prompt_tokens : prompt_tokens + n]])
                if n > native.SELECTING_MAX_ROWS:  # past what cached_forward sends to C: called directly
                    compiled = native.get(model)
                    pair = {"torch": functools.partial(call, False, caches[False], after),
                            "C": functools.partial(_c_call, model, compiled, caches[True], after, prompt_tokens)}
                else:
                    pair = {"torch": functools.partial(call, False, caches[False], after),
                            "C": functools.partial(call, True, caches[True], after)}
                med = _paired(pair, repeats)
                ratios.setdefault(n, []).append(med["torch"] / med["C"])
                ms.setdefault((n, False), []).append(med["torch"])
                ms.setdefault((n, True), []).append(med["C"])
        print(f"{len(requests)} real {prompt_tokens}-token prompts (pexpect, pluggy, rsa), past the top-k of "
              f"{model.config.index_topk}; torch and C taking turns; ratio of the medians per prompt, median over prompts")
        for n in (1, *rows):
            label = "a decoding step" if n == 1 else f"{n} rows past the top-k"
            torch_ms, c_ms = statistics.median(ms[(n, False)]), statistics.median(ms[(n, True)])
            print(f"{label}: C {statistics.median(ratios[n]):.2f}x as fast (torch {torch_ms:.2f} ms, C {c_ms:.2f} ms)")
            results[f"dsa_{n}_ratio"] = statistics.median(ratios[n])
        policy = AttentionPolicy.from_config()
        forced_ratio, forced_ms, worst_forced, close = [], {False: [], True: []}, 0.0, 0

        def forced_step(c: bool, cache: KVCache, token: torch.Tensor, roles: torch.Tensor, policy) -> torch.Tensor:
            cache.truncate(prompt_tokens)
            return cached_forward(model, token, cache, roles=roles, policy=policy, native_step=c)

        for _, _, ids in requests:
            roles = torch.full((1, prompt_tokens + 1), int(Role.CODE), dtype=torch.long)
            roles[0, prompt_tokens // 2 : prompt_tokens // 2 + 12] = int(Role.ERROR_CONTEXT)
            caches = {c: KVCache(model.config, capacity=prompt_tokens + 8) for c in (False, True)}
            for c in (False, True):
                cached_forward(model, torch.tensor([ids[:prompt_tokens]]), caches[c], roles=roles[:, :prompt_tokens],
                               policy=policy, last_only=True, native_step=False)
            token = torch.tensor([ids[prompt_tokens : prompt_tokens + 1]])
            last = roles[:, prompt_tokens:]
            logits = {c: forced_step(c, caches[c], token, last, policy) for c in (False, True)}
            gap = float((logits[False] - logits[True]).abs().max())
            worst_forced, close = max(worst_forced, gap), close + (gap < 1e-4)
            med = _paired({"torch": functools.partial(forced_step, False, caches[False], token, last, policy),
                           "C": functools.partial(forced_step, True, caches[True], token, last, policy)}, repeats)
            forced_ratio.append(med["torch"] / med["C"])
            for c, name in ((False, "torch"), (True, "C")):
                forced_ms[c].append(med[name])
        print(f"a decoding step with 12 error-context keys forced in: C {statistics.median(forced_ratio):.2f}x as fast "
              f"(torch {statistics.median(forced_ms[False]):.2f} ms, C {statistics.median(forced_ms[True]):.2f} ms); "
              f"logits within 1e-4 of torch's at {close} of {len(requests)} prompts, the largest difference "
              f"{worst_forced:.2e} (where the indexer's scores tie at the top-k's edge, C keeps other keys)")
        results["dsa_forced_step_ratio"] = statistics.median(forced_ratio)
        nll = {False: 0.0, True: 0.0}
        agree = tokens = files = 0
        for name in BENCHMARK_FIT:
            ids = next((found for _, p in package_files(name)
                        if len(found := tokenizer.encode(p.read_text(encoding="utf-8", errors="replace")))
                        >= prompt_tokens + teacher_tokens), None)
            if ids is None:
                continue
            files += 1
            caches = {c: KVCache(model.config) for c in (False, True)}
            for c in (False, True):
                cached_forward(model, torch.tensor([ids[:prompt_tokens]]), caches[c], last_only=True, native_step=False)
            for i in range(prompt_tokens, prompt_tokens + teacher_tokens - 1):
                token = torch.tensor([[ids[i]]])
                logits = {c: cached_forward(model, token, caches[c], native_step=c)[0, -1] for c in (False, True)}
                for c in (False, True):
                    nll[c] -= float(torch.log_softmax(logits[c], -1)[ids[i + 1]])
                agree += int(logits[False].argmax() == logits[True].argmax())
                tokens += 1
    torch_ppl, c_ppl = math.exp(nll[False] / tokens), math.exp(nll[True] / tokens)
    print(f"teacher-forced, one file of each of {files} FIT packages, tokens {prompt_tokens}-"
          f"{prompt_tokens + teacher_tokens} ({tokens} steps): perplexity torch {torch_ppl:.4f}, C {c_ppl:.4f}; "
          f"the same argmax at {agree} of {tokens}")
    results.update({"dsa_torch_perplexity": torch_ppl, "dsa_c_perplexity": c_ppl, "dsa_same_argmax": agree,
                    "dsa_steps": tokens})
    return results


def _c_call(model, compiled, cache: KVCache, ids: torch.Tensor, keep: int) -> None:
    """The C call itself, for a call ``cached_forward`` leaves to torch (more rows past the top-k)."""
    cache.truncate(keep)
    compiled.forward(ids, model.prepare_step(ids, cache=cache), every_row=True)


def ahead_compare(count: int = 24, prompt_tokens: int = 64, new_tokens: int = 16, repeats: int = 5,
                  costs: tuple[float, ...] = (0.0003, 0.0007)) -> dict:
    """The next step run ahead on the C worker for the model's likeliest token while the logits
    processors work (``Generator.guess_ahead``) against the step after them, on real
    ``prompt_tokens``-token prompts (pexpect, pluggy, rsa): greedy generations of ``new_tokens``
    tokens from the prompt's cache, with a processor that holds the interpreter for ``cost`` seconds
    a step (the memory and the decoding monitor together take about 0.7 ms a step in a completion)
    and overrules the model's likeliest token every fourth step. Per token after the prefill, the two
    taking turns ``repeats`` times per prompt; the ratio of the medians per prompt, their median."""
    from glm5_lsp.model import load_tokenizer, native

    path = Path(default_model_path())
    model = load_model(path)
    if native.get(model.prepare_inference()) is None:
        raise SystemExit("the C step is not built or turned off (GLM5_NATIVE): pip install -e . builds it")
    tokenizer = load_tokenizer(path)
    requests = _report_prompts(count, (prompt_tokens,), packages=("pexpect", "pluggy", "rsa"))
    config = GenerationConfig(max_new_tokens=new_tokens, stop_at_eos=False)
    results: dict[str, float] = {}
    print(f"{len(requests)} real {prompt_tokens}-token prompts (pexpect, pluggy, rsa), {new_tokens} greedy tokens, "
          f"{torch.get_num_threads()} torch thread(s) (the server's default: 1); ms per token after the prefill, the "
          f"step after the processors vs run ahead, taking turns")
    for cost in costs:
        def processor(out: list[int], logits: torch.Tensor, cost: float = cost) -> torch.Tensor:
            end = time.perf_counter() + cost
            while time.perf_counter() < end:
                pass
            if len(out) % 4 == 3:
                logits[int(torch.argmax(logits))] = float("-inf")
            return logits

        gens = {ahead: Generator(model, tokenizer) for ahead in (False, True)}
        ratios, kept, same, per = [], [], 0, {False: [], True: []}
        for _, _, ids in requests:
            made: dict[bool, list] = {False: [], True: []}

            def generate(ahead: bool, ids: list[int] = ids, made: dict = made, gens: dict = gens) -> None:
                gen = gens[ahead]
                gen.guess_ahead = ahead
                result = gen.generate(ids, config, logits_processor=processor)
                made[ahead].append(result)

            for ahead in (False, True):
                gens[ahead].reset()
                generate(ahead)  # the prompt's cache, then each timed generation reuses it
            times: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(repeats):
                for ahead in (False, True):
                    generate(ahead)
                    result = made[ahead][-1]
                    times[ahead].append((result.seconds - result.prefill_seconds) * 1000 / len(result.token_ids))
            medians = {ahead: statistics.median(t) for ahead, t in times.items()}
            ratios.append(medians[False] / medians[True])
            for ahead in (False, True):
                per[ahead].append(medians[ahead])
            last = made[True][-1]
            kept.append(last.guessed_steps / max(last.forward_calls, 1))
            same += made[True][-1].token_ids == made[False][-1].token_ids
        key = f"ahead_{cost * 1000:.1f}ms"
        results[f"{key}_ratio"] = statistics.median(ratios)
        results[f"{key}_kept_share"] = statistics.median(kept)
        print(f"processor {cost * 1000:.1f} ms a step: {statistics.median(ratios):.2f}x as fast (after "
              f"{statistics.median(per[False]):.3f} ms, ahead {statistics.median(per[True]):.3f} ms a token; quartiles "
              f"of the ratio {_quartiles(ratios)}); steps run ahead and kept {statistics.median(kept):.0%} of the "
              f"calls; the same text at {same} of {len(requests)} prompts")
    return results


def _quartiles(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4)
    return f"{q[0]:.3f}-{q[2]:.3f}"


def stats_cost(count: int = 12, new_tokens: int = 24, lengths: tuple[int, ...] = (100, 300)) -> dict[str, float]:
    """What ``GenerationConfig.step_stats`` costs on the embedded model, on requests from code no one
    here wrote: each request generated without and with the statistics, alternating (greedy, the same
    text), three times; per decoding step and per prefill, the median ratio; the reduction at the end of
    a generation (``StatsProbe.finish``) in ms; and the gate's feature function (``gate.features``) on
    the same candidate with and without the runtime's statistics in its ``DecodeStats``."""
    from types import SimpleNamespace

    from glm5_lsp.gate.features import features, request_info
    from glm5_lsp.gate.stats import DecodeStats, StepObserver, end_token_ids
    from glm5_lsp.model import generate as generation
    from glm5_lsp.model import load_tokenizer

    path = Path(default_model_path())
    tokenizer = load_tokenizer(path)
    gen = Generator(load_model(path), tokenizer)
    strings = tokenizer.token_strings()
    ends = end_token_ids(strings)
    finish_ms: list[float] = []

    class TimedProbe(generation.StatsProbe):
        def finish(self, used):
            t0 = time.perf_counter()
            out = super().finish(used)
            finish_ms.append((time.perf_counter() - t0) * 1000)
            return out

    generation.StatsProbe = TimedProbe
    step_ratio: dict[int, list[float]] = {n: [] for n in lengths}
    prefill_ratio: dict[int, list[float]] = {n: [] for n in lengths}
    step_ms: dict[bool, list[float]] = {False: [], True: []}
    feature_ms: dict[bool, list[float]] = {False: [], True: []}
    requests = _report_prompts(count, lengths)
    with torch.inference_mode():
        gen.generate(requests[0][2], GenerationConfig(max_new_tokens=4))  # warm-up
        for text, offset, ids in requests:
            runs: dict[bool, list] = {False: [], True: []}
            for _ in range(3):
                for on in (False, True):
                    gen.reset()  # every prefill from scratch, so the two sides do the same work
                    observer = StepObserver(strings, ends)
                    out = gen.generate(ids, GenerationConfig(max_new_tokens=new_tokens, stop_at_eos=False,
                                                             step_stats=on), logits_processor=observer)
                    runs[on].append((out, observer))
            decode = {on: statistics.median((o.seconds - o.prefill_seconds) / o.forward_calls for o, _ in runs[on])
                      for on in runs}
            prefill = {on: statistics.median(o.prefill_seconds for o, _ in runs[on]) for on in runs}
            step_ratio[len(ids)].append(decode[True] / decode[False])
            prefill_ratio[len(ids)].append(prefill[True] / prefill[False])
            for on in runs:
                step_ms[on].append(decode[on] * 1000)
            out, observer = runs[True][-1]
            base = observer.finish()
            full = DecodeStats(**{**base.__dict__, "per_layer": out.stats.per_layer, "per_step": out.stats.per_step})
            result = SimpleNamespace(text=out.text, rounds=1, finish_reason=out.finish_reason, finished_word="",
                                     clean=True, prompt_tokens=out.prompt_tokens, completion_tokens=len(out.token_ids))
            info = request_info(text, offset, language="python", multiline=False, trigger="automatic")
            for _ in range(5):
                for on, stats in ((False, base), (True, full)):
                    t0 = time.perf_counter()
                    features(result, info, stats)
                    feature_ms[on].append((time.perf_counter() - t0) * 1000)
    generation.StatsProbe = TimedProbe.__mro__[1]

    def quantile(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    results = {}
    print(f"{len(requests)} requests from the BENCHMARK_REPORT packages, {new_tokens} new tokens each, "
          f"without and with step_stats alternating (3 each)")
    for n in lengths:
        results[f"stats_step_ratio_{n}"] = statistics.median(step_ratio[n])
        results[f"stats_prefill_ratio_{n}"] = statistics.median(prefill_ratio[n])
        print(f"{n}-token prompts: decoding step with/without statistics {statistics.median(step_ratio[n]):.3f}x "
              f"(median of {len(step_ratio[n])}), prefill {statistics.median(prefill_ratio[n]):.3f}x")
    extra = [b - a for a, b in zip(step_ms[False], step_ms[True])]
    results.update(stats_step_extra_ms_p50=quantile(extra, 0.5), stats_finish_ms_p50=quantile(finish_ms, 0.5),
                   stats_finish_ms_p95=quantile(finish_ms, 0.95),
                   features_ms_p95_without=quantile(feature_ms[False], 0.95),
                   features_ms_p95_with=quantile(feature_ms[True], 0.95))
    print(f"decoding step: {statistics.median(step_ms[False]):.2f} ms without, {statistics.median(step_ms[True]):.2f} ms "
          f"with (median extra per step {quantile(extra, 0.5):.3f} ms)")
    print(f"StatsProbe.finish per generation of {new_tokens} steps: p50 {quantile(finish_ms, 0.5):.3f} ms, "
          f"p95 {quantile(finish_ms, 0.95):.3f} ms")
    print(f"gate.features per candidate: p50 {quantile(feature_ms[False], 0.5):.3f} / p95 "
          f"{quantile(feature_ms[False], 0.95):.3f} ms without the runtime's statistics, p50 "
          f"{quantile(feature_ms[True], 0.5):.3f} / p95 {quantile(feature_ms[True], 0.95):.3f} ms with them")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["all", "reference", "dsa", "steps", "prompts", "stats", "verify", "script",
                                           "native", "native-dsa", "ahead"],
                        default="all",
                        help="steps: decode-step times only (the benchmark model at 4k and 16k, DSA and dense, "
                             "and the embedded model at 400 tokens), for comparing two versions of the runtime; "
                             "prompts: the embedded model's prefill of short prompts, general path against lean; "
                             "verify: its verification of a draft, general path against lean (Python and "
                             "scripted); script: the scripted lean paths against the Python ones, numbers and speed; "
                             "native: the decoding step in C against the scripted one, numbers and speed; "
                             "native-dsa: past the top-k, C's selection and attention against torch's; "
                             "ahead: the next step run ahead beside the logits processors against after them")
    parser.add_argument("--context", type=int, default=4096, help="context for the reference comparison")
    parser.add_argument("--long-context", type=int, default=16384, help="context for DSA vs dense")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=16, help="decode steps timed at the long context")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results: dict[str, float] = {}
    if args.part in ("verify", "script", "native", "native-dsa", "ahead"):  # the embedded model only
        if args.part == "verify":
            results.update(verify_calls())
        elif args.part == "native":
            results.update(native_compare())
        elif args.part == "native-dsa":
            results.update(native_dsa_compare())
        elif args.part == "ahead":
            results.update(ahead_compare())
        else:
            results.update(script_check())
            results.update(script_speed())
        print(json.dumps({k: round(v, 3) if not k.endswith("max_logit_diff") else v for k, v in results.items()}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        sparse = build_checkpoint(Path(tmp) / "dsa")
        config = GlmMoeDsaConfig.from_pretrained(sparse)
        print(f"checkpoint: {sum(p.stat().st_size for p in sparse.glob('*.safetensors')) / 2**20:.0f} MiB, threads {args.threads}")
        if args.part == "steps":
            dense = build_checkpoint(Path(tmp) / "dense", index_topk=args.long_context + 64)
            rows = [("benchmark model, 4,096 tokens, DSA", sparse, args.context),
                    (f"benchmark model, {args.long_context:,} tokens, DSA", sparse, args.long_context),
                    (f"benchmark model, {args.long_context:,} tokens, dense", dense, args.long_context),
                    ("embedded model, 400 tokens", Path(default_model_path()), 400)]
            for label, path, context in rows:
                ms = decode_steps(path, context)
                results[label] = ms
                print(f"decode step, {label}: {ms:.2f} ms")
        if args.part == "stats":
            results.update(stats_cost())
        if args.part == "prompts":
            for n, (general, lean, scripted) in prompt_prefills(Path(default_model_path())).items():
                results[f"prefill_{n}_general_ms"], results[f"prefill_{n}_lean_ms"] = general, lean
                results[f"prefill_{n}_scripted_ms"] = scripted
                print(f"embedded model, {n}-token prompt: prefill general {general:.2f} ms vs lean {lean:.2f} ms "
                      f"-> {general / lean:.2f}x, scripted {scripted:.2f} ms -> {general / scripted:.2f}x")
        if args.part in ("all", "reference"):
            ids = prompt(args.context)
            o_pre, o_dec = ours_prefill_and_decode(sparse, ids, args.new_tokens)
            r_pre, r_dec = reference_prefill_and_decode(sparse, ids, args.new_tokens)
            floor_ms, floor_mib = decode_weight_floor(sparse)
            results.update(ours_prefill=o_pre, ref_prefill=r_pre, ours_decode=o_dec, ref_decode=r_dec,
                           floor_step_ms=floor_ms)
            print(f"context {args.context}: prefill tokens/s ours {o_pre:.0f} vs transformers {r_pre:.0f} -> {o_pre / r_pre:.1f}x")
            print(f"context {args.context}: decode tokens/s ours {o_dec:.1f} vs transformers {r_dec:.2f} -> {o_dec / r_dec:.1f}x")
            print(f"decode floor: streaming a step's {floor_mib:.0f} MiB of weights alone takes {floor_ms:.1f} ms "
                  f"-> at most {1000 / floor_ms:.0f} tokens/s, {1000 / floor_ms / r_dec:.1f}x the reference "
                  f"(ours reaches {o_dec * floor_ms / 1000:.0%} of it)")
            flops, peak = prefill_flops(config, args.context), gemm_peak_gflops()
            topk_s = prefill_topk_s(config, args.context)
            best_s = flops / (peak * 1e9) + topk_s
            results.update(prefill_gflop=flops / 1e9, gemm_peak_gflops=peak, prefill_topk_s=topk_s)
            print(f"prefill floor: its {flops / 1e9:.0f} GFLOP of arithmetic at this CPU's peak matrix rate "
                  f"({peak:.0f} GFLOPS, {flops / (peak * 1e9):.2f} s) and the indexer's top-k as bare calls "
                  f"({topk_s:.2f} s) -> at most {args.context / best_s:.0f} tokens/s, {args.context / best_s / r_pre:.1f}x "
                  f"the reference (ours reaches {o_pre * best_s / args.context:.0%} of it)")
        if args.part in ("all", "dsa"):
            dense = build_checkpoint(Path(tmp) / "dense", index_topk=args.long_context + 64)
            n = args.long_context
            dsa = long_context_child(sparse, n, args.steps, args.threads)
            full = long_context_child(dense, n, args.steps, args.threads)
            s_ms, d_ms, s_mem, d_mem = dsa["step_ms"], full["step_ms"], dsa["peak_mib"], full["peak_mib"]
            results.update(dsa_step_ms=s_ms, dense_step_ms=d_ms, dsa_prefill_mib=s_mem, dense_prefill_mib=d_mem)
            print(f"context {n}: decode step DSA {s_ms:.1f} ms vs dense {d_ms:.1f} ms -> {d_ms / s_ms:.1f}x faster")
            print(f"context {n}: prefill peak memory DSA {s_mem:.0f} MiB vs dense {d_mem:.0f} MiB -> {s_mem / d_mem:.2f}x")
            weights_ms = results.get("floor_step_ms") or decode_weight_floor(sparse)[0]  # measured above with part 1
            scan_ms = indexer_floor_ms(config, n)
            results.update(dsa_floor_ms=weights_ms + scan_ms)
            print(f"DSA step floor at {n}: the weights ({weights_ms:.1f} ms) and the indexer's scan and top-k over "
                  f"every key ({scan_ms:.1f} ms), as bare operations -> at most {d_ms / (weights_ms + scan_ms):.1f}x "
                  f"faster than the dense step above")
    print(json.dumps({k: round(v, 3) for k, v in results.items()}))


if __name__ == "__main__":
    main()
