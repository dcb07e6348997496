"""The workspace symbol table: indexing with the disk cache, the query API, budgeted rendering.

Data: ``tests/data/context/ws/`` (copied to a temporary folder so tests can change files).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from glm5_lsp.context.documents import Document, Edit
from glm5_lsp.context.engine import ContextEngine
from glm5_lsp.context.symbols import PYTHON_BUILTINS, SymbolTable
from glm5_lsp.context.tokens import TokenCounter

WS = Path(__file__).parent / "data" / "context" / "ws"


@pytest.fixture()
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    shutil.copytree(WS, root)
    return root


@pytest.fixture()
def table(workspace: Path, tmp_path: Path) -> SymbolTable:
    table = SymbolTable(workspace, cache_dir=tmp_path / "cache")
    table.index_workspace()
    return table


def test_index_workspace_counts_and_skips_bad_files(workspace, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    table = SymbolTable(workspace, cache_dir=tmp_path / "cache")
    stats = table.index_workspace()
    assert stats.skipped == 1  # binary.py
    assert stats.parsed == stats.files - 1 and stats.from_cache == 0
    assert {"python", "javascript", "typescript", "go", "rust", "c", "cpp"} <= set(stats.languages)
    assert "binary file" in caplog.text and "not valid UTF-8" in caplog.text
    assert str(workspace / "latin1.py") in table.files  # decoded with replacement, not lost


def test_restart_on_unchanged_workspace_parses_nothing(workspace, tmp_path):
    """Acceptance 3: a second engine on the same workspace and cache re-parses no file."""
    first = SymbolTable(workspace, cache_dir=tmp_path / "cache")
    first.index_workspace()
    before = Document.parse_count
    second = SymbolTable(workspace, cache_dir=tmp_path / "cache")
    stats = second.index_workspace()
    assert Document.parse_count == before
    assert stats.parsed == 0 and stats.from_cache == stats.files - stats.skipped
    assert {p: s.symbols for p, s in second.files.items()} == {p: s.symbols for p, s in first.files.items()}
    # A changed file is the only one parsed again.
    (workspace / "app.py").write_text("def only_me():\n    return 1\n")
    third = SymbolTable(workspace, cache_dir=tmp_path / "cache")
    stats = third.index_workspace()
    assert stats.parsed == 1 and Document.parse_count == before + 1
    assert third.lookup("only_me") is not None


def test_lookup_in_file_imports_and_workspace(table, workspace):
    shapes = str(workspace / "pkg" / "shapes.py")
    util = str(workspace / "pkg" / "util.py")
    assert table.lookup("Square", shapes).kind == "class"
    assert table.lookup("Square.to_json", shapes).signature == "def to_json(self) -> str"
    assert table.lookup("regex", shapes).kind == "import" and table.lookup("regex", shapes).qualname == "re"
    imported = table.lookup("parse_shape", util)
    assert imported.kind == "import" and imported.qualname == "pkg.shapes.parse_shape"
    assert table.lookup("parse_shape.nothing", util) is None
    assert table.lookup("Square.area", util).signature == "def area(self) -> float"
    assert table.lookup("total_area").path == util  # workspace top level, no path
    assert table.lookup("no_such_name", shapes) is None
    assert table.lookup("Shape.no_such_member", shapes) is None


def test_members_include_workspace_bases_and_workspace_modules(table, workspace):
    shapes = str(workspace / "pkg" / "shapes.py")
    assert {"area", "describe", "sides", "side", "to_json", "checked"} <= set(table.members("Square", shapes))
    assert table.members("Shape", shapes) == ["area", "describe", "sides"]
    assert {"Square", "parse_shape", "UNIT"} <= set(table.members("pkg.shapes"))
    assert table.members("nothing_here", str(workspace / "web" / "app.js")) == []


def test_names_in_scope_follow_python_scoping(table, workspace):
    shapes = str(workspace / "pkg" / "shapes.py")
    inside_parse = table.visible_names(shapes, 40, 8)  # body of parse_shape
    assert {"text", "match", "size", "Square", "UNIT", "json", "regex", "len"} <= inside_parse
    in_method = table.visible_names(shapes, 16, 8)  # body of Shape.area
    assert "self" in in_method and "sides" not in in_method  # class names are not visible in methods
    in_class_body = table.visible_names(shapes, 12, 4)
    assert "sides" in in_class_body
    assert "len" in PYTHON_BUILTINS
    go = table.visible_names(str(workspace / "gosrc" / "main.go"), 19, 4)
    assert {"s", "verbose", "Server", "NewServer", "fmt", "str"} <= go and "len" not in go


def test_render_is_nearest_first_and_within_budget(table, workspace):
    util = str(workspace / "pkg" / "util.py")
    count = TokenCounter()
    lines = table.render(util, 14, 400, count)
    assert lines[0].startswith("def load(")  # nearest definition to line 14
    assert "def total_area(shapes: list) -> float" in lines
    assert any(line.startswith("def parse_shape(") for line in lines)  # used here, defined in shapes.py
    small = table.render(util, 14, 12, count)
    assert sum(count(line) + 1 for line in small) <= 12 and small == lines[: len(small)]
    skipped = table.render(util, 14, 400, count, skip_lines=(12, 17))
    assert not any(line.startswith("def load(") for line in skipped)


def test_class_entries_render_members_indented(table, workspace):
    shapes = str(workspace / "pkg" / "shapes.py")
    lines = table.render(shapes, 0, 1000, TokenCounter())
    at = lines.index("class Square(Shape)")
    assert lines[at + 1 : at + 3] == ["    side: float", "    def __post_init__(self) -> None"]


def test_engine_edits_keep_the_table_current(workspace, tmp_path):
    engine = ContextEngine(workspace, cache_dir=tmp_path / "cache")
    path = workspace / "pkg" / "util.py"
    engine.open_document(path, path.read_text())
    engine.update_document(path, [Edit(4, 0, 4, 0, "def added(n: int) -> int:\n    return n\n\n\n")])
    found = engine.symbols.lookup("added", str(path))
    assert found is not None and found.line == 4 and found.signature == "def added(n: int) -> int"
    assert engine.symbols.lookup("total_area", str(path)).line == 10
    names = [s.name for s in engine.names_at(None, len(path.read_text()), path=path)]
    assert "added" in names
    engine.close_document(path)
    assert engine.symbols.lookup("added", str(path)) is None  # back to the file on disk


@pytest.mark.slow
def test_jedi_resolves_imported_python_names(table, workspace):
    shapes = str(workspace / "pkg" / "shapes.py")
    assert table.warm(shapes) >= 2
    dumps = table.lookup("json.dumps", shapes)
    assert dumps.kind == "import" and dumps.signature.startswith("def json.dumps(obj")
    assert "Serialize" in dumps.doc
    assert "dumps" in table.members("json", shapes)
    assert table.resolver.resolve("no_such_module_xyz").found is False


@pytest.mark.slow
def test_jedi_reports_where_an_import_is_defined(table):
    resolved = table.resolver.resolve("json.dumps")
    assert resolved.module_path.endswith("json/__init__.py") and resolved.line > 0
    assert resolved.render().startswith("def json.dumps(obj")


def test_api_usage_resolves_dotted_calls_through_imports(table, workspace):
    usage = table.api_usage()
    assert usage["re.match"] == 1 and usage["json.dumps"] == 1 and usage["os.path.basename"] == 1
    assert "re.match" not in table.api_usage(exclude=str(workspace / "pkg" / "shapes.py"))


def test_queries_refresh_a_stale_summary(workspace, tmp_path, monkeypatch):
    from glm5_lsp.context import summary as summary_module

    monkeypatch.setattr(summary_module, "MAX_REGION_BYTES", 16)  # every restructuring edit goes stale
    engine = ContextEngine(workspace, cache_dir=tmp_path / "cache")
    path = str(workspace / "pkg" / "shapes.py")
    text = Path(path).read_text()
    engine.open_document(path, text)
    # Half-typed code at column 0 inside a class body restructures what follows it.
    engine.update_document(path, [Edit(16, 0, 16, 0, "x = (\n")])
    stale = engine.symbols.files[path]
    assert stale.stale and {"Square", "Square.to_json"} <= {s.qualname for s in stale.symbols}
    engine.update_document(path, [Edit(16, 0, 17, 0, "")])
    found = engine.symbols.lookup("Square.to_json", path)  # a query re-reads the stale summary in full
    assert found is not None and found.line == text.splitlines().index("    def to_json(self) -> str:")
    assert not engine.symbols.files[path].stale
