"""Cursor-query signals read from the document itself, and how the API-doc index re-ranks with them:
the enclosing function's name, a condition (a predicate is wanted), and calls on the same receiver
in lines shaped like the cursor's. Data: ``tests/data/context/ws/``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from glm5_lsp.context import apidocs
from glm5_lsp.context.apidoc_sources import Chunk
from glm5_lsp.context.apidocs import ApiDocIndex, cursor_factor, is_predicate
from glm5_lsp.context.cursor_query import build_query
from glm5_lsp.context.engine import ContextEngine

WS = Path(__file__).parent / "data" / "context" / "ws"
OS = {"os": "os"}


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> ApiDocIndex:
    root = tmp_path_factory.mktemp("cursor_query")
    shutil.copytree(WS, root / "ws")
    index = ApiDocIndex(root / "ws", cache_dir=root / "cache")
    index.index_workspace(["os.path", "re"])
    return index


def _names(index: ApiDocIndex, code: str, k: int = 5) -> list[str]:
    return [c.name for c, _ in index.search(build_query(code, len(code), OS), k)]


def _function(code: str) -> str:
    return build_query(code, len(code), OS).function


def test_enclosing_function_is_the_nearest_less_indented_def():
    assert _function("import os\ndef create_home_path(self):\n    home = os.path.") == "create_home_path"
    method = "class C:\n    def a(self):\n        pass\n\n    def b(self):\n        if x:\n            y = os."
    assert _function(method) == "b"
    assert _function("def a():\n    pass\nif x:\n    y = os.") == ""  # top-level code after a function
    assert _function("def a():\n    pass\nclass C:\n    y = os.") == ""  # a class body
    assert _function("def a():\n    x = 1\n\n    ") == "a"  # a blank line inside the body


def test_enclosing_function_name_joins_the_query(index):
    body = "\n    a = 1" * 4  # the def line is beyond the nearby lines
    code = f"import os\ndef user_home_folder(name):{body}\n    return os.path."
    query = build_query(code, len(code), OS)
    assert {"user", "home", "folder"} <= set(query.tokens()) and "user" not in query.nearby
    assert _names(index, code, 1) == ["expanduser"]
    assert _names(index, f"import os\ndef run(name):{body}\n    return os.path.", 1) != ["expanduser"]


@pytest.mark.parametrize(
    "lead, condition",
    [("if ", True), ("if not ", True), ("while x and ", True), ("ok = a or not (", True),
     ("if (not ", True), ("y = b if ", True), ("p = ", False), ("if now - ", False), ("f(", False)],
)
def test_condition_is_read_from_the_words_before_the_receiver(lead, condition):
    code = f"import os\n{lead}os.path."
    assert build_query(code, len(code), OS).condition is condition


def test_predicates_are_recognised_from_signature_name_and_docs():
    def chunk(name: str, text: str = "", title: str = "") -> Chunk:
        return Chunk(title or f"m.{name}(x)", text, "m", name, "function", "package:m")

    assert is_predicate(chunk("isfile", "Test whether a path is a regular file"))
    assert is_predicate(chunk("exists", "Test whether a path exists."))
    assert is_predicate(chunk("ready", "Return True if the job finished."))
    assert is_predicate(chunk("ready", title="m.ready(x) -> bool"))
    assert is_predicate(chunk("has_key")) and is_predicate(chunk("isEmpty"))
    assert not is_predicate(chunk("join", "Join two or more pathname components"))
    assert not is_predicate(chunk("island", "Return the island."))
    assert not is_predicate(Chunk("m.isfile", "Test whether", "m", "isfile", "module", "package:m"))


def test_a_condition_ranks_predicates_first(index, monkeypatch):
    in_condition = "import os\nif not os.path."
    assert all(is_predicate(c) for c, _ in index.search(build_query(in_condition, len(in_condition), OS), 3))
    assert not is_predicate(index.search(build_query("import os\np = os.path.", 22, OS), 1)[0][0])
    monkeypatch.setattr(apidocs, "PREDICATE_BOOST", 1.0)  # without the signal the same query does not
    assert not is_predicate(index.search(build_query(in_condition, len(in_condition), OS), 1)[0][0])


def test_calls_in_lines_shaped_like_the_cursor_line_are_counted():
    far = "\nx = 1" * 6  # more lines than the nearby words reach
    code = f"import os\nkey = os.path.normcase(a)\nprint(os.path.basename(b)){far}\nkey = os.path."
    query = build_query(code, len(code), OS)
    assert query.shaped_calls == {"os.path.normcase": 1.0}  # basename's line shares nothing with "key = "
    line = "key = os.path.normcase(a)\n"
    on_cursor_line = build_query(line, len("key = os.path."), OS)
    assert on_cursor_line.shaped_calls == {}  # the cursor's own line is not a call made elsewhere
    aliased = "import os.path as osp\nif osp.isdir(d):\n    pass\nif not osp."
    assert build_query(aliased, len(aliased), {"osp": "os.path"}).shaped_calls == {"os.path.isdir": 0.5}


def test_same_shaped_calls_rerank(index):
    far = "\nx = 1" * 6
    code = f"import os\nkey = os.path.normcase(a){far}\nkey = os.path."
    assert _names(index, code, 1) == ["normcase"]
    assert _names(index, f"import os\n{far}\nkey = os.path.", 5).count("normcase") == 0


def test_document_signals_never_raise_a_name_the_typed_letters_rule_out():
    code = "import os\nif os.path.normcase(a) == b:\n    pass\nif os.path.isdir(d):\n    pass\nif not os.path.no"
    query = build_query(code, len(code), OS)
    assert query.condition and query.shaped_calls == {"os.path.normcase": 0.5, "os.path.isdir": 0.5}
    normcase = Chunk("os.path.normcase(s)", "Normalize case", "os.path", "normcase", "function", "package:os.path")
    isdir = Chunk("os.path.isdir(s)", "Return true if ...", "os.path", "isdir", "function", "package:os.path")
    assert cursor_factor(normcase, query) > 1.0
    assert cursor_factor(isdir, query) == 1.0  # a same-shaped predicate in a condition, but not "no..."


def test_the_server_path_uses_the_document_signals(tmp_path):
    """ContextEngine.build_prompt -> cursor query -> ApiDocIndex.search: the best chunk (last in the
    api section) is the predicate, and the same line outside a condition gets another one."""
    shutil.copytree(WS, tmp_path / "ws")
    engine = ContextEngine(tmp_path / "ws", cache_dir=tmp_path / "cache")
    engine.apidocs.index_workspace(["os.path"])
    path = tmp_path / "ws" / "walk.py"

    def best_api(text: str) -> str:
        prompt = engine.build_prompt(text, len(text), path=path, budget_tokens=2000)
        whole = prompt.text()
        api = next(s for s in prompt.spans if s.role == "api_doc")
        titles = [t for t in whole[api.start : api.end].splitlines() if t.startswith("# os.path.")]
        return titles[-1].removeprefix("# ").split("(")[0]

    assert best_api("import os\n\ndef walk(top):\n    if not os.path.") in {
        "os.path.isabs", "os.path.isdir", "os.path.isfile", "os.path.islink", "os.path.exists", "os.path.ismount",
        "os.path.isjunction", "os.path.lexists"}
    far = "\n    x = 1" * 6
    assert best_api(f"import os\n\ndef walk(top):\n    key = os.path.normcase(top){far}\n    key = os.path.") == (
        "os.path.normcase")
