"""``glm5-lsp batch`` with the workspace memory, as the editor has it: the workspace's files (and,
by default, its libraries) mixed into decoding, a task's relative path read from ``--workspace``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glm5_lsp import batch
from glm5_lsp.pipeline import Pipeline

REPEATED = 'value = registry.lookup_entry("alpha", strict=True)\n'


def _workspace(root: Path) -> Path:
    root.mkdir()
    (root / "a.py").write_text("class Registry:\n    def lookup_entry(self, name, strict=False):\n"
                               "        return name\n\n\nregistry = Registry()\n" + REPEATED * 3, encoding="utf-8")
    return root


def _run(tmp_path: Path, checkpoint: Path, name: str, *options: str) -> dict:
    from glm5_lsp.cli import main

    root = tmp_path / "ws" if (tmp_path / "ws").is_dir() else _workspace(tmp_path / "ws")
    tasks = tmp_path / "tasks.jsonl"
    prefix = "from a import registry\n\nvalue = registry.looku"
    tasks.write_text(json.dumps({"id": 1, "kind": "complete", "prefix": prefix, "suffix": "\n",
                                 "path": "b.py"}) + "\n", encoding="utf-8")
    out = tmp_path / f"{name}.jsonl"
    code = main(["batch", str(tasks), "-o", str(out), "--model", str(checkpoint), "--workspace", str(root),
                 "--no-libraries", "--no-progress", *options])
    (record,) = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert code in (0, 1) and record["error"] is None, record
    return record


def test_a_line_the_workspace_repeats_is_finished_from_the_memory(tiny_checkpoint: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # The tiny model is random: only the memory (the workspace's three lines, and its longest match)
    # can say how this line goes on. Before the batch opened its pipeline as the server does, it had none.
    monkeypatch.setenv("GLM5_LSP_CACHE_DIR", str(tmp_path / "cache"))
    remembered = _run(tmp_path, tiny_checkpoint, "with")
    assert remembered["text"].split("\n")[0] == 'p_entry("alpha", strict=True)'
    alone = _run(tmp_path, tiny_checkpoint, "without", "--no-memory")
    assert alone["text"].split("\n")[0] != 'p_entry("alpha", strict=True)'


def test_a_relative_task_path_is_read_from_the_workspace(tmp_path: Path) -> None:
    # The memory knows a workspace file by its absolute path: a task naming it relative to the
    # workspace must reach the pipeline as that file, or the file's text on disk (the line being
    # completed, whole) stays in the memory beside the task's own copy.
    seen: list[str | None] = []

    class Recording(Pipeline):
        def complete(self, text: str, offset: int, **options):  # type: ignore[override]
            seen.append(options.get("path"))
            return super().complete(text, offset, **options)

    from tests.test_batch import scripted

    root = tmp_path / "ws"
    elsewhere = str(tmp_path / "elsewhere.py")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(task) + "\n" for task in (
        {"id": 1, "kind": "complete", "prefix": "x = ", "path": "pkg/mod.py"},
        {"id": 2, "kind": "complete", "prefix": "x = ", "path": elsewhere},
        {"id": 3, "kind": "complete", "prefix": "x = "})), encoding="utf-8")
    batch.run_batch(tasks, tmp_path / "out.jsonl", lambda: Recording(scripted.ScriptedBackend(lambda request: "1\n")),
                    progress=False, workspace=root)
    assert seen == [str(root / "pkg" / "mod.py"), elsewhere, None]


def test_a_workspace_that_is_not_a_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from glm5_lsp.cli import main

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": 1, "kind": "complete", "prefix": "x = "}) + "\n", encoding="utf-8")
    assert main(["batch", str(tasks), "-o", str(tmp_path / "o.jsonl"), "--workspace", str(tmp_path / "nope")]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()
