"""Synthetic gate rows in ``glm5_lsp.gate.collect``'s format, for the gate's tests: made on the spot.

Whether a candidate is exact depends on ``lp_mean`` (and a little on ``end_prob_after``), as a
confident model's candidates are more often right; the other features are noise. ``relation`` picks
which feature carries the signal, so a test can make the relation change (a new model under the gate).
"""

from __future__ import annotations

import math
import random
from typing import Any

from glm5_lsp.train.corpus import BENCHMARK_FIT

NOISE = ("cursor_column", "line_indent", "typed_word_chars", "ent_mean", "chars")


def features(rng: random.Random, shift: float = 0.0) -> dict[str, float | None]:
    out: dict[str, float | None] = {
        "lp_mean": rng.gauss(-3.0 + shift, 1.0),
        "end_prob_after": rng.random(),
        "top_mean": rng.gauss(0.3 + 0.1 * shift, 0.1),
        "finish_reason": float(rng.randrange(4)),
        "line_kind": float(rng.randrange(5)),
    }
    for name in NOISE:
        out[name] = rng.gauss(10.0, 3.0)
    out["line_count"] = None  # no memory: missing
    return out


def exact(values: dict[str, float | None], rng: random.Random, relation: str = "lp_mean") -> bool:
    if relation == "lp_mean":
        z = 3.0 * (float(values["lp_mean"]) + 2.0) + 1.5 * float(values["end_prob_after"]) - 1.0
    else:  # the same strength of signal, carried by another feature
        z = float(values[relation]) - 11.0
    return rng.random() < 1 / (1 + math.exp(-z))


def rows(count: int = 600, seed: int = 0, packages: tuple[str, ...] = BENCHMARK_FIT, shift: float = 0.0,
         relation: str = "lp_mean") -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        values = features(rng, shift)
        is_exact = exact(values, rng, relation)
        shown = rng.random() < 0.9
        multi = rng.random() < 0.5
        block_values = dict(values, lines=3.0 if multi else 1.0, line2_lp_mean=rng.gauss(-3.0, 1.0))
        good_second = multi and float(block_values["line2_lp_mean"]) > -2.5
        options = {"line": 0.5, "lines2": 0.8 if good_second else 0.3, "lines3": 0.7 if good_second else 0.2,
                   "block": 0.6 if good_second else 0.1} if multi else dict.fromkeys(("line", "lines2", "lines3", "block"), 0.5)
        regen_exact = rng.random() < (0.3 if float(values["top_mean"]) > 0.35 else 0.02)
        out.append({
            "package": packages[i % len(packages)], "path": f"m{i % 7}.py", "line": i, "offset": 0,
            "typed_line": "x = va", "rest": "lue", "word": "value",
            "single": {"text": "lue" if is_exact else "lid", "features": values, "shown": shown,
                       "exact": shown and is_exact, "similarity": 1.0 if is_exact else 0.4, "right_word": is_exact},
            "regen": {"text": "lue", "exact": regen_exact, "similarity": 1.0 if regen_exact else 0.3,
                      "right_word": regen_exact},
            "finish": {"word": "value", "right": float(values["line_kind"] or 0) < 2},
            "block": {"text": "lue\n    a\n    b" if multi else "lue", "truth": "lue\n    a", "features": block_values,
                      "options": options},
        })
    return out
