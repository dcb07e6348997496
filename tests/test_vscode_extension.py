"""The VS Code extension (``extension/vscode``): its settings match the server's, and it builds to a .vsix."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from glm5_lsp.server.commands import COMMANDS
from glm5_lsp.server.settings import Settings, camel, parse_settings, to_json

EXTENSION = Path(__file__).resolve().parents[1] / "extension" / "vscode"


def _package() -> dict[str, Any]:
    return json.loads((EXTENSION / "package.json").read_text(encoding="utf-8"))


def _server_fields(obj: Any, prefix: str = "") -> dict[str, dataclasses.Field]:
    found: dict[str, dataclasses.Field] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = prefix + camel(f.name)
        if dataclasses.is_dataclass(value):
            found.update(_server_fields(value, key + "."))
        else:
            found[key] = f
    return found


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def test_every_server_setting_is_exposed_with_its_default_and_bounds() -> None:
    properties = _package()["contributes"]["configuration"]["properties"]
    fields = _server_fields(Settings())
    server_keys = {key for key in properties if not key.startswith(("glm5.server.", "glm5.trace."))}
    assert server_keys == {f"glm5.{key}" for key in fields}
    defaults = _flatten(to_json(Settings()))
    for key, f in fields.items():
        prop = properties[f"glm5.{key}"]
        assert prop["default"] == defaults[key], key
        assert prop.get("enum") == (list(f.metadata["choices"]) if "choices" in f.metadata else None), key
        if "range" in f.metadata:
            assert (prop["minimum"], prop["maximum"]) == tuple(f.metadata["range"]), key
        assert prop["description"], key


def test_package_json_defaults_parse_cleanly_on_the_server() -> None:
    """What the extension sends (the glm5 section minus server/trace) is valid server settings."""
    nested: dict[str, Any] = {}
    for key, prop in _package()["contributes"]["configuration"]["properties"].items():
        parts = key.split(".")[1:]
        if parts[0] in ("server", "trace"):
            continue
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = prop["default"]
    settings, problems = parse_settings({"glm5": nested})
    assert problems == [] and settings == Settings()


def test_trace_setting_commands_and_languages() -> None:
    package = _package()
    trace = package["contributes"]["configuration"]["properties"]["glm5.trace.server"]
    assert trace["enum"] == ["off", "messages", "verbose"]
    palette = {c["command"] for c in package["contributes"]["commands"]}
    assert {"glm5.fixDocument", "glm5.generateAtCursor", "glm5.reindexWorkspace", "glm5.restartServer"} <= palette
    assert not palette & set(COMMANDS), "server commands are registered by the language client itself"
    source = (EXTENSION / "src" / "extension.ts").read_text(encoding="utf-8")
    for command in COMMANDS:
        assert f'"{command}"' in source
    assert '["-m", "glm5_lsp.cli", "serve"]' in source
    assert "onDidChangeConfiguration" in source and "restart(" in source
    assert (EXTENSION / "package-lock.json").is_file()


@pytest.mark.slow
def test_npm_builds_the_extension_into_a_vsix(tmp_path: Path) -> None:
    npm = shutil.which("npm")
    if npm is None or shutil.which("npx") is None:
        pytest.skip("npm is not installed: the VS Code extension cannot be built here")
    work = tmp_path / "vscode"
    shutil.copytree(EXTENSION, work, ignore=shutil.ignore_patterns("node_modules", "out", "*.vsix"))

    def run(*command: str) -> None:
        done = subprocess.run(command, check=False, cwd=work, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"

    run(npm, "ci", "--no-audit", "--no-fund")
    run(npm, "run", "compile")
    run("npx", "@vscode/vsce", "package", "--out", "glm5-lsp.vsix")
    with zipfile.ZipFile(work / "glm5-lsp.vsix") as vsix:
        names = set(vsix.namelist())
        assert {"extension/out/extension.js", "extension/package.json"} <= names
        assert any(name.startswith("extension/node_modules/vscode-languageclient/") for name in names)
        assert not any(name.startswith("extension/src/") for name in names)
        packaged = json.loads(vsix.read("extension/package.json"))
    assert packaged["contributes"]["configuration"]["properties"]["glm5.trace.server"]["default"] == "off"
