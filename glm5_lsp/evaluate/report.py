"""The evaluation's JSON report and Markdown table."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from glm5_lsp.evaluate.runner import EvalResult


def build_report(result: EvalResult, ks: list[int], meta: dict[str, Any]) -> dict[str, Any]:
    """Everything needed to trust (and redo) the figures: settings, summary, every sample."""
    return {**meta, "summary": result.summary(ks), "samples": [asdict(sample) for sample in result.samples]}


def markdown_table(report: dict[str, Any]) -> str:
    """One header row plus one row for this run (rows of several runs can be stacked)."""
    summary = report["summary"]
    pass_keys = [key for key in summary if key.startswith("pass@")]
    benchmark = report["benchmark"] + (f" ({report['subset']})" if report.get("subset") else "")
    headers = ["benchmark", "model", "backend", "problems", "n", *pass_keys, "clean", "s/sample"]
    row = [
        benchmark, report["model"], report["backend"], str(summary["problems"]), str(summary["samples_per_problem"]),
        *[f"{summary[key]:.3f}" for key in pass_keys], f"{summary['clean_rate']:.2f}",
        f"{summary['seconds_per_sample']:.2f}",
    ]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|",
             "| " + " | ".join(row) + " |"]
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], folder: Path) -> tuple[Path, Path]:
    """``report.json`` and ``report.md`` in ``folder`` (created)."""
    folder.mkdir(parents=True, exist_ok=True)
    json_path, md_path = folder / "report.json", folder / "report.md"
    json_path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    command = report.get("command")
    md = markdown_table(report) + (f"\nCommand: `{command}`\n" if command else "")
    md_path.write_text(md, encoding="utf-8")
    return json_path, md_path
