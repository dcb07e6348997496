"""The benchmarks' language servers run the checkout they are asked for (``benchmarks/lsp_latency.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from lsp_latency import glm5_server


def test_a_server_for_another_checkout_imports_that_checkout_even_when_started_inside_this_one(tmp_path: Path) -> None:
    """``python -m`` puts the working directory ahead of PYTHONPATH: a server for another checkout,
    started from this repository's root (as the benchmarks' docstrings run them), imported this
    repository's package, and ``lines.py --baseline`` / ``lsp_latency.py --versus`` compared a checkout
    with itself."""
    other = tmp_path / "other"
    (other / "glm5_lsp").mkdir(parents=True)
    (other / "glm5_lsp" / "__init__.py").write_text("", encoding="utf-8")
    server = glm5_server("glm5-lsp@other", other, 1, {})
    assert server.command[1:4] == ["-m", "glm5_lsp.cli", "serve"]
    found = subprocess.run([sys.executable, "-c", "import glm5_lsp; print(glm5_lsp.__file__)"], env=server.env,
                           cwd=server.cwd or str(ROOT), capture_output=True, text=True, check=True).stdout.strip()
    assert Path(found).resolve() == (other / "glm5_lsp" / "__init__.py").resolve()
