"""What a run leaves beside the weights for people: the loss-curve PNG and ``MODEL_CARD.md``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from glm5_lsp.train.samples import Sample
from glm5_lsp.train.schedule import STAGES

_COLOURS = {"dense": "tab:blue", "indexer_warmup": "tab:orange", "sparse": "tab:green"}


def plot_loss(records: list[dict[str, Any]], path: Path) -> Path:
    """Training loss (and the indexer's KL) against tokens seen, one colour per stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r for r in records if r.get("kind") == "step"]
    fig, (ax_loss, ax_kl) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=(3, 2))
    for stage in STAGES:
        points = [r for r in steps if r["stage"] == stage]
        if points:
            xs = [r["tokens"] for r in points]
            if stage != "indexer_warmup":
                ax_loss.plot(
                    xs, [r["loss"] for r in points], color=_COLOURS[stage], label=f"{stage} (cross-entropy)"
                )
            if stage != "dense":
                ax_kl.plot(
                    xs,
                    [r["indexer_kl"] for r in points],
                    color=_COLOURS[stage],
                    label=f"{stage} (indexer KL)",
                )
    for r in records:
        if r.get("kind") == "eval" and "heldout_loss" in r:
            ax_loss.scatter([r["tokens"]], [r["heldout_loss"]], color="black", zorder=3, s=18)
    ax_loss.set_ylabel("loss (nats/token)")
    ax_loss.set_title("Training loss; black dots: held-out loss")
    ax_loss.legend(loc="upper right", fontsize=8)
    ax_kl.set_ylabel("indexer KL")
    ax_kl.set_xlabel("tokens seen")
    if ax_kl.lines:
        ax_kl.legend(loc="upper right", fontsize=8)
    ax_loss.grid(alpha=0.3)
    ax_kl.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _examined(totals: dict[str, Any]) -> str:
    """How much of the installed source was looked at, when the corpus was subsampled."""
    examined, candidates = totals.get("examined_files"), totals.get("candidate_files")
    if examined is None or examined == candidates:
        return ""
    return (
        f" (the corpus is a seeded sample: {examined:,} of {candidates:,} candidate files were examined"
        " until the byte budget was filled)"
    )


def model_card(info: dict[str, Any], samples: list[Sample]) -> str:
    """The model card's Markdown from a run summary (see ``pipeline.summarise``)."""
    cfg = info["config"]
    corpus = info["corpus"]
    ev = info["eval"]
    lines = [
        f"# {info['name']}",
        "",
        info["headline"],
        "",
        "## Model",
        "",
        (
            "- Architecture: GLM-5 (`glm_moe_dsa`): MLA attention, MoE, DSA lightning indexer; "
            "run by this project's runtime (`glm5_lsp.model`), loaded with `load_model`."
        ),
        f"- Parameters: {_fmt(info['parameters'])} in all; about {_fmt(info['active_parameters'])} used per token.",
        (
            f"- Shape: {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, {cfg['num_attention_heads']} heads "
            f"(q LoRA {cfg['q_lora_rank']}, KV latent {cfg['kv_lora_rank']}, nope/rope/v {cfg['qk_nope_head_dim']}/"
            f"{cfg['qk_rope_head_dim']}/{cfg['v_head_dim']}); first layer dense MLP {cfg['intermediate_size']}, then "
            f"{cfg['n_routed_experts']} routed experts (top-{cfg['num_experts_per_tok']}) + {cfg['n_shared_experts']} shared, "
            f"width {cfg['moe_intermediate_size']}; indexer {cfg['index_n_heads']} heads x {cfg['index_head_dim']}, "
            f"top-k {cfg['index_topk']}."
        ),
        (
            f"- Vocabulary: {_fmt(cfg['vocab_size'])} byte-level BPE tokens; `<|endoftext|>`=0, `<|code_prefix|>`=1, "
            f"`<|code_suffix|>`=2, `<|code_middle|>`=3 (GLM's infilling names)."
        ),
        f"- Weights: safetensors, {info['save_dtype']}, {_fmt(info['weights_bytes'])} bytes.",
        "",
        "## Training",
        "",
        f"- Hardware: {info['hardware']}.",
        (
            f"- Context: {info['seq_len']} tokens per sequence, batch {info['batch_size']}; "
            f"fill-in-the-middle on {info['fim_rate']:.0%} of documents (PSM and SPM, character- and line-level cuts)."
        ),
        (
            "- DSA recipe of DeepSeek-V3.2, scaled down: dense, then indexer warm-up by KL with everything else "
            "frozen, then sparse attention over the indexer's top-k."
        ),
        "",
        "| stage | steps | tokens | seconds | last loss | last indexer KL |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for st in info["stages"]:
        lines.append(
            f"| {st['stage']} | {_fmt(st['steps'])} | {_fmt(st['tokens'])} | {st['seconds']:.0f} | "
            f"{st['last_loss']:.3f} | {st['last_indexer_kl']:.4f} |"
        )
    lines += [
        "",
        (
            f"Tokens seen: {_fmt(info['tokens_seen'])}. Budget: {info['budget_minutes']} minutes of training, "
            f"sized from measured step times ({', '.join(f'{k} {v:.3f} s' for k, v in info['seconds_per_step'].items())})."
        ),
        "The loss curve is `loss_curve.png`; every step is in `train_log.jsonl`.",
        "",
        *_continued(info),
        "## Data",
        "",
        (
            f"Python source installed on the training machine (Python {corpus['python']}): the standard library and "
            f"site-packages distributions whose metadata declares a permissive licence (MIT, BSD, Apache, PSF, ISC). "
            f"Vendored, generated, minified, undecodable and unparsable files dropped, exact duplicates removed, "
            f"and any file containing HumanEval prompt text dropped. `corpus_manifest.json` lists every package "
            f"with version, licence, files and bytes."
        ),
        "",
        (
            f"- Training: {_fmt(corpus['totals']['train_files'])} files, {_fmt(corpus['totals']['train_bytes'])} bytes "
            f"from {len(corpus['sources'])} packages ({_fmt(info['train_tokens'])} tokens after FIM)."
        ),
        (
            f"- Held out (whole packages, evaluation only): {', '.join(r['package'] for r in corpus['heldout']) or 'none'}; "
            f"{_fmt(corpus['totals']['heldout_files'])} files, {_fmt(corpus['totals']['heldout_bytes'])} bytes."
        ),
        (
            f"- Refused for their licence: {len(corpus['refused_licence'])} distributions. "
            f"Files dropped: {', '.join(f'{k} {v}' for k, v in corpus['dropped_files'].items()) or 'none'}"
            + _examined(corpus["totals"])
            + "."
        ),
        "",
        "## Measured on the held-out packages",
        "",
        "| figure | value |",
        "| --- | ---: |",
    ]
    for row in ev["table"]:
        lines.append(f"| {row[0]} | {row[1]} |")
    lines += [
        "",
        ev["note"],
        "",
        "HumanEval and HumanEval single-line infilling pass@1 come from the evaluation harness "
        "(`glm5-lsp eval`), not from the training run"
        + (":" if info.get("humaneval") else ": not yet measured for these weights."),
        "",
        *(info.get("humaneval") or []),
        "## Greedy samples (DSA attention, unedited)",
        "",
    ]
    for s in samples:
        kind = "infill" if s.suffix else "complete"
        lines += [
            f"{kind}, prompt:",
            "",
            "```python",
            s.prefix + ("<CURSOR>" + s.suffix if s.suffix else ""),
            "```",
            "",
            "model:",
            "",
            "```python",
            s.completion,
            "```",
            "",
        ]
    lines += ["## Reproduce", "", "```sh", info["command"], "```", ""]
    return "\n".join(lines)


def _continued(info: dict[str, Any]) -> list[str]:
    """The continued-training section: where the stream stands, and one row per promotion."""
    history = info.get("history")
    if not history:
        return []
    cont = info.get("continued") or {}
    lines = [
        "### Continued training",
        "",
        (
            f"Then continued on the whole permissive corpus ({_fmt(cont.get('corpus_files', 0))} files, "
            f"{_fmt(cont.get('corpus_bytes', 0))} bytes), streamed in shuffled shards, at low priority in the "
            f"background (`scripts/cpu_train.sh`): batch {cont.get('batch_size')} x {cont.get('seq_len')} tokens, "
            f"AdamW at {cont.get('lr')} with a warm-up per run and an inverse-square-root decay, every "
            f"{cont.get('sparse_every')}th step through DSA's top-k with the indexers' KL, the other steps dense; "
            f"{_averages(cont)} kept beside them; a promotion ships the best on held-out "
            f"perplexity of the weights, the averages and the shipped weights averaged with the run's. Runs resume from "
            f"checkpoints; each session reads on from the position recorded in `metrics.json` ({cont.get('position')})."
        ),
        "",
        "#### Promotions",
        "",
        "| date | tokens seen | held-out perplexity, DSA, 512 tokens (8 rows) | (64 rows) | weights | HumanEval pass@1 | single-line infilling pass@1 (200) |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for h in history:
        lines.append(
            f"| {h.get('date') or ''} | {_fmt(h.get('tokens_seen') or 0)} | {_fmt(h.get('ppl_dsa_512'))} | "
            f"{_fmt(h.get('ppl_dsa_512_64rows')) if h.get('ppl_dsa_512_64rows') else ''} | {h.get('weights', '')} | "
            f"{_fmt(h['humaneval'], 4) if h.get('humaneval') is not None else ''} | "
            f"{_fmt(h['infilling'], 4) if h.get('infilling') is not None else ''} |"
        )
    return [*lines, ""]


def eval_rows(reports: list[dict[str, Any]]) -> list[str]:
    """A Markdown table of ``glm5-lsp eval`` reports (``report.json``), one row per benchmark run."""
    lines = [
        "| benchmark | problems | pass@1 | samples | temperature | repair rounds | command |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in reports:
        summary = r["summary"]
        name = r["benchmark"] + (f" ({r['subset']})" if r.get("subset") else "")
        lines.append(
            f"| {name} | {summary['problems']} | {summary['pass@1']:.4f} | {r.get('n_samples', 1)} | "
            f"{r.get('temperature', 0.0)} | {r.get('repair_rounds', '?')} | `{r.get('command') or ''}` |"
        )
    return [*lines, ""]


def refresh_card(folder: Path, report_paths: list[Path]) -> Path:
    """Re-write a trained model's ``MODEL_CARD.md`` (and ``metrics.json``) with evaluation reports added."""
    metrics_path = folder / "metrics.json"
    if not metrics_path.is_file():
        raise FileNotFoundError(f"no metrics.json in {folder}: not a folder written by glm5-lsp train")
    summary = json.loads(metrics_path.read_text(encoding="utf-8"))
    reports = []
    for path in report_paths:
        report = json.loads(path.read_text(encoding="utf-8"))
        if "summary" not in report or "pass@1" not in report["summary"]:
            raise ValueError(f"{path} is not a glm5-lsp eval report with pass@1")
        reports.append(report)
    summary["humaneval"] = eval_rows(reports)
    if summary.get("history"):  # the latest promotion's row gets these weights' pass@1 figures
        for r in reports:
            key = "humaneval" if r["benchmark"] == "humaneval" else "infilling"
            summary["history"][-1][key] = r["summary"]["pass@1"]
    metrics_path.write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")
    summary["corpus"] = json.loads((folder / "corpus_manifest.json").read_text(encoding="utf-8"))
    samples = [Sample(**s) for s in summary["samples"]]
    card = folder / "MODEL_CARD.md"
    card.write_text(model_card(summary, samples), encoding="utf-8")
    return card


def _averages(cont: dict) -> str:
    """The continued run's moving averages of the weights, as the card names them."""
    if cont.get("slow_ema_decay") is not None:
        return (f"two moving averages of the weights (decay {cont.get('ema_decay')}, and a slow one at "
                f"{cont['slow_ema_decay']})")
    return f"a moving average of the weights (decay {cont.get('ema_decay')})"
