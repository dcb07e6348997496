"""The gate's features: the request read from the document, the candidate's shape, its generation's
steps (the healed word's forced tokens apart), NaN for whatever is unknown (``glm5_lsp.gate.features``)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from glm5_lsp.gate.features import (
    CATEGORICAL,
    FEATURES,
    FINISH_REASONS,
    LINE_KINDS,
    features,
    request_info,
    vector,
)
from glm5_lsp.gate.stats import DecodeStats

DOCUMENT = '''import os


class Reader:
    def read(self, path):
        with open(path) as handle:
            data = handle.re
        return data
'''
CURSOR = DOCUMENT.index("handle.re") + len("handle.re")


def result(text: str, **fields) -> SimpleNamespace:
    base = {"text": text, "rounds": 1, "finish_reason": "stop", "finished_word": False, "clean": True,
            "prompt_tokens": 120, "completion_tokens": 4}
    return SimpleNamespace(**{**base, **fields})


def test_the_request_is_read_from_the_document() -> None:
    info = request_info(DOCUMENT, CURSOR, language="python", multiline=False, trigger="automatic")
    assert info.typed_word == "re" and info.healed == "re"
    assert info.cursor_column == len("            data = handle.re") and info.line_indent == 12
    assert info.line_number == 6 and info.lines_from_block_start == 1  # under the `with` line
    assert info.line_kind == "assign" and info.after_dot and not info.in_string and info.open_brackets == 0
    assert info.next_line_indent_delta == -4 and info.suffix_line_chars == 0
    assert not request_info(DOCUMENT, CURSOR, language="python", multiline=False, healing=False).healed


@pytest.mark.parametrize(("line", "kind", "brackets", "in_string"), [
    ("def f(a, b", "def", 1, False),
    ("    return sorted(x", "return", 1, False),
    ("from os import pa", "from", 0, False),
    ("print('hello wor", "call", 1, True),
    ("@pytest.mark.para", "decorator", 0, False),
    ("total += valu", "assign", 0, False),
    ("if x == 1 and y", "if", 0, False),
    ("something", "other", 0, False),
])
def test_the_line_at_the_cursor(line: str, kind: str, brackets: int, in_string: bool) -> None:
    info = request_info(line, len(line), language="python", multiline=False)
    assert (info.line_kind, info.open_brackets, info.in_string) == (kind, brackets, in_string)


def test_what_the_workspace_memory_said_is_read_against_the_candidate() -> None:
    from glm5_lsp.pipeline.memory import Recollection

    # The cursor is after ``handle.re``: token healing writes ``re`` again, so the memory's views
    # (insertion text at the healed word's start) begin with it; the candidate is text after the cursor.
    info = request_info(DOCUMENT, CURSOR, language="python", multiline=False)
    assert info.healed == "re"
    recalled = Recollection("read()\n", "readline()", line_count=3, line_total=4, line_distinct=2)
    values = features(result("ad()", recalled=recalled), info)
    assert values["memory_equal"] == 1.0 and values["memory_agree_chars"] == 4 and values["memory_chars"] == 4
    assert values["line_equal"] == 0.0 and values["line_agree_chars"] == 2 and values["line_chars"] == 8
    assert (values["line_count"], values["line_total"], values["line_distinct"]) == (3, 4, 2)
    assert values["line_share"] == 0.75 and values["memory_views_agree"] == 0.0
    as_row = features(result("ad()", recalled={"continuation": "", "line": "read()", "line_count": 1,
                                               "line_total": 1, "line_distinct": 1}), info)  # a row's raw dict
    assert math.isnan(as_row["memory_equal"]) and as_row["line_equal"] == 1.0 and as_row["memory_chars"] == 0
    # a view that rewrites the typed word agrees on nothing
    other = features(result("ad()", recalled=Recollection("rad()", "")), info)
    assert other["memory_equal"] == 0.0 and other["memory_agree_chars"] == 0
    # without healing (a backend with no forced prefix) both are text after the cursor already
    plain = request_info(DOCUMENT, CURSOR, language="python", multiline=False, healing=False)
    assert features(result("ad()", recalled=Recollection("ad()", "ad()")), plain)["memory_views_agree"] == 1.0


def test_every_feature_is_present_and_what_is_unknown_is_nan() -> None:
    info = request_info(DOCUMENT, CURSOR, language="python", multiline=False)
    values = features(result("ad()"), info)  # no generation statistics (a served model)
    assert list(values) == list(FEATURES)
    assert math.isnan(values["lp_mean"]) and math.isnan(values["line_count"])
    assert math.isnan(values["dsa_concentration_mean"]) and math.isnan(values["truncated"])
    assert math.isnan(values["trigger"])  # not given
    assert values["finish_reason"] == FINISH_REASONS.index("stop")
    assert values["line_kind"] == LINE_KINDS.index("assign")
    assert values["chars"] == 4 and values["lines"] == 1 and values["word_chars"] == len("read")
    assert values["closes_line"] == 1.0 and values["net_brackets"] == 0 and values["ending"] == 2  # "close"
    assert set(CATEGORICAL) <= set(FEATURES)


def test_a_completed_line_seen_elsewhere_in_the_document_counts() -> None:
    document = "x = compute(a)\ny = 1\nx = compute(a)\nx = co"
    info = request_info(document, len(document), language="python", multiline=False)
    assert features(result("mpute(a)"), info)["line_seen"] == 2
    assert features(result("nfig"), info)["line_seen"] == 0


def test_step_features_leave_the_healed_words_forced_tokens_out() -> None:
    # healed "re", generated "re" + "ad" + "()" + "\n": the first token only retypes the word
    stats = DecodeStats(logprobs=[-6.0, -0.5, -1.5, -0.1], entropies=[1.0, 2.0, 3.0, 0.5],
                        top_probs=[0.5, 0.6, 0.3, 0.9], margins=[0.1, 0.2, 0.05, 0.8],
                        end_probs=[0.01, 0.02, 0.03, 0.9], chars=[2, 2, 2, 1])
    info = request_info(DOCUMENT, CURSOR, language="python", multiline=False)
    values = features(result("ad()"), info, stats)
    assert values["healed_steps"] == 1 and values["healed_lp_sum"] == -6.0
    assert values["kept_steps"] == 2 and values["lp_mean"] == pytest.approx(-1.0)
    assert values["lp_min"] == -1.5 and values["lp_first"] == -0.5 and values["lp_last"] == -1.5
    assert values["all_lp_mean"] == pytest.approx(-8.1 / 4)
    assert values["end_prob_after"] == 0.9  # the step after the kept text ended the line
    assert values["ent_max"] == 3.0 and values["top_min"] == 0.3 and values["margin_min"] == 0.05
    assert values["cut_chars"] == 1  # the line break
    # a served model's log-probability of the whole completion, when it gives one
    assert features(result("ad()", logprob=-2.0), info, stats)["completion_logprob"] == -2.0


def test_a_multi_line_candidate_gets_per_line_figures() -> None:
    document = "def f(x):\n    "
    stats = DecodeStats(logprobs=[-0.5, -0.2, -3.0, -2.0], entropies=[1.0] * 4, top_probs=[0.5] * 4,
                        margins=[0.1] * 4, end_probs=[0.0] * 4, chars=[6, 3, 6, 3])  # "y = 1\n" "z =" " y + 1" "\n"
    info = request_info(document, len(document), language="python", multiline=True)
    values = features(result("y = 1\nz = y + 1"), info, stats)
    assert values["lines"] == 2 and values["multiline"] == 1.0
    assert values["line1_lp_mean"] == -0.5 and values["line1_chars"] == 5
    assert values["line2_lp_mean"] == pytest.approx((-0.2 - 3.0) / 2) and values["line2_chars"] == 9
    assert math.isnan(values["line3_lp_mean"])


def test_the_runtimes_internals_are_pooled_by_depth_once_given() -> None:
    stats = DecodeStats(logprobs=[-1.0], entropies=[1.0], top_probs=[0.5], margins=[0.1], end_probs=[0.1],
                        chars=[3], per_layer={"moe_router_entropy": [[1.0, 2.0, 3.0, 4.0]]},
                        per_step={"hidden_norm": [7.0]})
    info = request_info("x = 1\ny = ", 10, language="python", multiline=False)
    values = features(result("abc"), info, stats)
    assert values["moe_router_entropy_mean"] == 2.5
    assert [values[f"moe_router_entropy_d{k}"] for k in (0, 2, 4, 6)] == [1.0, 2.0, 3.0, 4.0]
    assert math.isnan(values["moe_router_entropy_d1"]) and math.isnan(values["dsa_concentration_mean"])
    assert values["hidden_norm_last"] == 7.0


def test_vectors_follow_the_gates_names_and_fill_what_is_missing() -> None:
    row = vector({"a": 1.0, "b": None, "c": 3.0}, ["c", "a", "b", "d"])
    assert row[:2] == [3.0, 1.0] and math.isnan(row[2]) and math.isnan(row[3])


@pytest.mark.parametrize(("typed", "text", "complete"), [
    ("    return fo", "ur", 1.0),  # a return, inside a function
    ("        el", "se:", 1.0),  # an else, after the if it continues
    ("    fi", "nally:", 1.0),
    ("@ov", "erload", 1.0),
    ("import do", "ctest", 1.0),
    ("        br", "eak", 1.0),
    ("x = f(a, ", "b", 0.0),  # a bracket left open
    ("if x an", "d", 0.0),
    ("def f(a, b", "):", 1.0),
])
def test_whether_the_completed_line_is_a_whole_statement(typed: str, text: str, complete: float) -> None:
    info = request_info(typed, len(typed), language="python", multiline=False)
    assert features(result(text), info)["line_complete"] == complete
    other = request_info(typed, len(typed), language="go", multiline=False)
    assert math.isnan(features(result(text), other)["line_complete"])
