"""What the docs tell a new user to run exists: there is no PyPI release, so every install
instruction is a checkout's ``pip install -e .``; the README says why the llama.cpp test does not
run in CI with the build time BENCHMARKS.md measured; the editors' docs name every served backend."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTENSION_DOCS = [ROOT / "extension" / "vscode" / "README.md", ROOT / "extension" / "nvim" / "README.md",
                  ROOT / "extension" / "nvim" / "lsp" / "glm5.lua"]


def test_no_doc_installs_a_release_that_does_not_exist() -> None:
    for path in [ROOT / "README.md", ROOT / "extension" / "vscode" / "package.json", *EXTENSION_DOCS]:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"pip install\s+['\"]?(glm5-lsp|glm5_lsp|git\+)", text), path


def test_the_extension_docs_install_from_a_checkout() -> None:
    for path in EXTENSION_DOCS:
        text = path.read_text(encoding="utf-8")
        installs = re.findall(r"pip install[^\n`]*", text)
        assert installs, f"{path} says nothing about installing the server"
        assert all(re.search(r"-e \.(\s|$)", line) for line in installs), (path, installs)
        assert "not on PyPI" in text, path


def test_the_readme_says_why_the_llamacpp_test_skips_in_ci() -> None:
    measured = re.search(r"Building `llama-server` took (\d+) minutes", (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8"))
    assert measured, "BENCHMARKS.md no longer records the llama-server build time"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    why = readme[readme.index("**Why the llama.cpp test does not run in CI.**"):][:1200]
    assert f"took {measured[1]} minutes" in why and "scripts/build_llama_server.sh" in why
    assert "$GLM5_LLAMA_SERVER" in why and "tests/test_llamacpp_server.py" in why
    assert f"# {measured[1]} minutes" in (ROOT / "scripts" / "build_llama_server.sh").read_text(encoding="utf-8")


def test_the_editor_docs_name_every_served_backend() -> None:
    import dataclasses

    from glm5_lsp.server.settings import ModelSettings

    kinds = next(f for f in dataclasses.fields(ModelSettings) if f.name == "backend").metadata["choices"]
    for path in [ROOT / "README.md", *EXTENSION_DOCS[:2]]:
        text = path.read_text(encoding="utf-8")
        for kind in kinds:
            if kind != "local":
                assert f"`{kind}`" in text or f"'{kind}'" in text, (path, kind)
