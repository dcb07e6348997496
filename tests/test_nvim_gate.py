"""Issue 23, acceptance 5: in real Neovim 0.12 (headless) with extension/nvim, one inline suggestion is
accepted (Neovim runs the item's command, ``glm5.accepted``) and one is typed over; the server's
acceptance log, in the user's data folder, records both as what they were; with
``completion.acceptanceLog`` off nothing is written.

The model is the scripted OpenAI-compatible server (``tests/data/server/scripted_openai.py``), judged by
the shipped gate (``completion.gatePath``; a served model gives no log-probabilities, so those features
are missing) at ``completion.minQuality`` 0, so what is shown is known. The driver is
``tests/data/server/nvim_acceptance.lua``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_nvim_client import DATA, REPO, _nvim

from glm5_lsp.gate.acceptance import RETENTION_S, read_outcomes, read_records

sys.path.insert(0, str(DATA))

from scripted_openai import ScriptedOpenAI

GATE = REPO / "glm5_lsp" / "weights" / "glm5-code-tiny" / "gate"


def run_acceptance(tmp_path: Path, logging: bool) -> tuple[dict, Path]:
    nvim = _nvim()
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (tmp_path / "greet.py").write_text("def greet(name):\n    message\n    return message\n\n\nfast\n")
    data = tmp_path / "data"
    log = data / "glm5-lsp" / "acceptance.jsonl"
    scripted = ScriptedOpenAI.from_file(DATA / "script.json")
    url = scripted.start()
    result_file = tmp_path / "result.json"
    env = {
        **os.environ,
        "GLM5_ACCEPTANCE_LOG": "on" if logging else "off",
        "GLM5_EXTENSION": str(REPO / "extension" / "nvim"),
        "GLM5_PYTHON": sys.executable,
        "GLM5_REPO": str(REPO),
        "GLM5_URL": url,
        "GLM5_GATE": str(GATE),
        "GLM5_LOG": str(log),
        "GLM5_WORKDIR": str(tmp_path),
        "GLM5_RESULT": str(result_file),
        "XDG_DATA_HOME": str(data),  # the user's data folder: the log goes here
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    try:
        run = subprocess.run([nvim, "--headless", "--clean", "-c", f"luafile {DATA / 'nvim_acceptance.lua'}"],
                             check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150)
    finally:
        scripted.stop()
    assert result_file.exists(), f"the driver wrote no result (rc {run.returncode}): {run.stderr[-2000:]}"
    result = json.loads(result_file.read_text())
    assert result["ok"], f"{result.get('why')}: {result}"
    assert run.returncode == 0
    return result, log


@pytest.mark.slow
def test_neovim_accepts_one_suggestion_and_types_over_another_and_the_log_says_so(tmp_path: Path) -> None:
    result, log = run_acceptance(tmp_path, logging=True)
    assert result["steps"] == ["attached", "greet shown", "greet accepted", "fast shown", "fast typed_over"]
    assert result["greet"] == '    message = "Hello, " + name + "!"'
    assert result["ghost"]["fast"] == "'quick'"
    assert result["buffer"] == ["def greet(name):", '    message = "Hello, " + name + "!"', "    return message", "", "",
                                "fast = 1"]
    records = list(read_records(log))
    shown = [r for r in records if r["event"] == "shown"]
    accepted = [r["id"] for r in records if r["event"] == "accepted"]
    typed_over = [r["id"] for r in records if r["event"] == "typed_over"]
    assert len(accepted) == 1 and len(typed_over) == 1 and accepted != typed_over
    by_id = {r["id"]: r for r in shown}
    greet, fast = by_id[accepted[0]], by_id[typed_over[0]]
    assert greet["chars"] == len('"Hello, " + name + "!"') and fast["chars"] == len("'quick'")
    for record in (greet, fast):  # the gate judged them: a score, its threshold, the features as numbers
        assert 0.0 <= record["score"] <= 1.0 and record["threshold"] == 0.0 and record["language"] == "python"
        assert record["features"]["cursor_column"] is not None
        assert record["features"]["lp_mean"] is None  # a served model: no log-probabilities
    text = log.read_text()
    assert "Hello" not in text and "quick" not in text and "greet" not in text, "no code, no file names"
    # decided once the 30 s of retention have passed: the accepted one kept, the typed-over one not
    outcomes = {o.id: o for o in read_outcomes(log, now=max(r["t"] for r in records) + RETENTION_S + 1)}
    assert outcomes[greet["id"]].kept and outcomes[greet["id"]].why == "accepted"
    assert not outcomes[fast["id"]].kept and outcomes[fast["id"]].why == "typed_over"


@pytest.mark.slow
def test_with_the_acceptance_log_off_nothing_is_written(tmp_path: Path) -> None:
    result, log = run_acceptance(tmp_path, logging=False)
    assert result["steps"] == ["attached", "greet shown", "greet accepted", "fast shown", "fast typed_over"]
    assert result["greet"] == '    message = "Hello, " + name + "!"' and result["buffer"][-1] == "fast = 1"
    assert not log.exists() and not (tmp_path / "data" / "glm5-lsp").exists()
