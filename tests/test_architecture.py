"""The package's shape, read from its own code: layers as ARCHITECTURE.md lists them, front ends
that go through the pipeline, and one definition of each piece of Python-text reading."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "glm5_lsp"
FRONT_ENDS = "front ends"
GROUND = "ground floor"


def _layers() -> list[tuple[str, set[str]]]:
    """``(layer, rooms)`` top to bottom, from ARCHITECTURE.md's ``layers`` block."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    block = re.search(r"```layers\n(.*?)```", text, re.DOTALL)
    assert block, "ARCHITECTURE.md has no ```layers block"
    layers = []
    for line in block.group(1).strip().splitlines():
        name, _, rooms = line.partition(":")
        layers.append((name.strip(), set(rooms.split())))
    return layers


def _room(module: str, placed: set[str]) -> str:
    """``glm5_lsp.server.state`` -> ``server``; ``glm5_lsp.gate.collect`` -> ``gate.collect`` where
    the layers name that module apart from its folder; ``glm5_lsp`` -> ``""``."""
    parts = module.split(".")
    if len(parts) > 2 and f"{parts[1]}.{parts[2]}" in placed:
        return f"{parts[1]}.{parts[2]}"
    return parts[1] if len(parts) > 1 else ""


def _imports(path: Path) -> set[str]:
    """Every glm5_lsp module ``path`` imports, at any depth of the file (TYPE_CHECKING included)."""
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("glm5_lsp")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing module's package
                base = module.split(".")[: -node.level] if path.name != "__init__.py" else module.split(".")[: len(module.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.startswith("glm5_lsp"):
                found.add(name)
                found |= {f"{name}.{alias.name}" for alias in node.names}
    return found


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _rooms_on_disk() -> set[str]:
    return {p.name if p.is_dir() else p.stem for p in PACKAGE.iterdir()
            if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}


def test_every_room_is_in_one_layer() -> None:
    placed: dict[str, str] = {}
    for layer, rooms in _layers():
        for room in rooms:
            assert room not in placed, f"{room} is in two layers: {placed[room]} and {layer}"
            placed[room] = layer
    missing = _rooms_on_disk() - {room.split(".")[0] for room in placed}
    assert not missing, f"rooms ARCHITECTURE.md's layers do not list: {sorted(missing)}"


def test_no_import_runs_up_and_front_ends_use_only_the_pipeline() -> None:
    layers = _layers()
    index = {room: i for i, (_, rooms) in enumerate(layers) for room in rooms}
    layer_of = {room: name for name, rooms in layers for room in rooms}
    pipeline_layer = index["pipeline"]
    problems = []
    for path in _modules():
        rel = path.relative_to(ROOT)
        own = _room(".".join(rel.with_suffix("").parts), set(index))
        if own in ("", "__init__"):
            continue
        for target in _imports(path):
            room = _room(target, set(index))
            if not room or room == own or room not in index:
                continue  # the package itself, its own room, or a name imported from a module
            if layer_of[own] == FRONT_ENDS:
                if not (index[room] == pipeline_layer or layer_of[room] == GROUND):
                    problems.append(f"{rel}: front end imports {target} (below the pipeline)")
            elif index[room] < index[own]:
                problems.append(f"{rel} ({layer_of[own]}) imports {target} ({layer_of[room]})")
    assert not problems, "\n".join(sorted(problems))


# -- one definition each ---------------------------------------------------------------------

def _sources() -> dict[Path, str]:
    return {p: p.read_text(encoding="utf-8") for p in _modules()}


def _defining(pattern: str) -> list[str]:
    rx = re.compile(pattern, re.MULTILINE)
    return sorted(str(p.relative_to(ROOT)) for p, text in _sources().items() if rx.search(text))


@pytest.mark.parametrize(
    ("what", "pattern", "where"),
    [
        # a compiled pattern that reads a def/class header
        ("the header pattern", r"re\.compile\(.*\((?:\?:|\?P<\w+>)?(?:def\|class|class\|def)\)(?:\\b)?\[ \\t\]\+", ["glm5_lsp/pysource.py"]),
        ("the top-level cut", r"^def (?:top_level_pieces|top_level_cuts|definition_starts)\(", ["glm5_lsp/pysource.py"]),
        ("the block tree", r"^class _?Block\b", ["glm5_lsp/pysource.py"]),
        ("the string blanker", r"^STRING_OR_COMMENT = |^_STRING_OR_COMMENT = |^def _?blank\(", ["glm5_lsp/pysource.py"]),
        ("names in scope", r"^def names_in_scope\(", ["glm5_lsp/pynames/scope.py"]),
        ("the jedi environment", r"InterpreterEnvironment\(|jedi\.(?:api\.)?environment\.|get_default_environment\(", ["glm5_lsp/pynames/jedi.py"]),
        ("the one way into jedi", r"(?:\bjedi|\(\))\.(?:Script|Project)\(", ["glm5_lsp/pynames/jedi.py"]),
    ],
)
def test_one_definition(what: str, pattern: str, where: list[str]) -> None:
    assert _defining(pattern) == where, what


# -- one post-processing pass and one check per completion -------------------------------------

def test_a_completion_is_post_processed_once_and_checked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipeline post-processes a candidate once and judges it once; the server adds neither
    (it used to run the rules again, re-indent and judge the text a second time)."""
    import importlib.util

    from glm5_lsp.pipeline import Pipeline, PipelineSettings
    from glm5_lsp.pipeline import core as pipeline_core
    from glm5_lsp.repair import loop as repair_loop

    spec = importlib.util.spec_from_file_location("scripted_backend", ROOT / "tests" / "data" / "batch" / "scripted_backend.py")
    assert spec and spec.loader
    scripted = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scripted)

    counts = {"postprocess": 0, "judge": 0}
    postprocess, judge = pipeline_core.Pipeline.postprocess, repair_loop.judge

    def counted_postprocess(self, text, task):
        counts["postprocess"] += 1
        return postprocess(self, text, task)

    def counted_judge(*args, **kwargs):
        counts["judge"] += 1
        return judge(*args, **kwargs)

    monkeypatch.setattr(pipeline_core.Pipeline, "postprocess", counted_postprocess)
    monkeypatch.setattr(repair_loop, "judge", counted_judge)
    document = "def area(r):\n    return \n"
    offset = document.index("return ") + len("return ")
    pipeline = Pipeline(scripted.ScriptedBackend("3.14 * r * r"), settings=PipelineSettings(reindent=True))
    result = pipeline.complete(document, offset, path="area.py", language="python")
    assert result.clean and result.text == "3.14 * r * r"
    assert counts == {"postprocess": 1, "judge": 1}

    from glm5_lsp.server import state

    assert not any(hasattr(state, name) for name in ("check_edit", "clean_completion", "tidy")), \
        "the server's completion path post-processes or checks the pipeline's text again"
