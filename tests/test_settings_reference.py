"""README.md's settings reference is generated from ``glm5_lsp/server/settings.py`` and must stay in step.

When a test here fails after a settings change, run ``python3 scripts/settings_reference.py --write``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from glm5_lsp.server.settings import Settings, camel

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("settings_reference", ROOT / "scripts" / "settings_reference.py")
assert _spec and _spec.loader
reference = importlib.util.module_from_spec(_spec)
sys.modules["settings_reference"] = reference  # dataclasses look their module up while the script loads
_spec.loader.exec_module(reference)


def _flat(obj: object, path: str = "glm5") -> dict[str, object]:
    out: dict[str, object] = {}
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        key = f"{path}.{camel(f.name)}"
        out.update(_flat(value, key) if dataclasses.is_dataclass(value) else {key: value})
    return out


def test_readme_settings_reference_is_current() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert reference.current(readme) == reference.render(), "run: python3 scripts/settings_reference.py --write"
    assert reference.main(["--check"]) == 0


def test_reference_lists_every_setting_with_its_default() -> None:
    text = reference.render()
    settings = _flat(Settings())
    assert f"All {len(settings)} settings" in text
    for key, default in settings.items():
        assert f"| `{key}` | `{json.dumps(default)}` |" in text, key


def test_vscode_declares_every_server_setting_with_the_same_default() -> None:
    declared = reference.vscode_defaults()
    for key, default in _flat(Settings()).items():
        assert key in declared, f"extension/vscode/package.json does not declare {key}"
        assert declared[key] == default, f"{key}: VS Code's default {declared[key]!r}, the server's {default!r}"


def test_a_setting_is_described_by_its_doc_then_vscode_then_its_comments() -> None:
    @dataclass
    class Example:
        """Example section."""

        # the first line above
        # and the second
        plain: int = field(default=3, metadata={"range": (0, 9)})  # and on its line
        noted: str = field(default="x", metadata={"doc": "From the metadata.", "choices": ("x", "y")})

    comments = reference.field_comments(Example)
    assert comments == {"plain": "the first line above and the second and on its line"}
    assert reference._allowed(int, {"range": (0, 9)}) == "0 to 9"
    assert reference._allowed(str, {"choices": ("x", "y")}) == "`x`, `y`"
    assert reference._allowed(bool, {}) == "`true`, `false`"
