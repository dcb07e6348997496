"""ruff's checks from one long-lived ``ruff server``: the same answers as one ``ruff check`` a check,
one process across checks and threads, and a server that hangs, dies, fails or cannot start costs
one check (named in the error), never the next one."""

from __future__ import annotations

import logging
import shutil
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from glm5_lsp.checks.providers import RuffProvider, RuffServerProvider, default_providers
from glm5_lsp.checks.providers.compile_worker import worker_available
from glm5_lsp.checks.providers.ruff_server import OPEN_DOCUMENTS
from glm5_lsp.diagnostics import Diagnostic

pytestmark = [
    pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed"),
    pytest.mark.skipif(not worker_available(), reason="the server is read through select() on pipes (POSIX)"),
]

EMOJI_LINE = "s = '\U0001F600\U0001F600'; t = undefined_name\n"  # two characters past U+FFFF before the error
CASES = [  # (path, text)
    ("", "def f(:\n    pass\n"),
    ("a.py", "print(undefined_name)\n"),
    ("a.py", "import os\n"),
    ("a.py", "def f():\n    unused = 1\n    return 2\n"),  # F841: info
    ("a.py", "x = f'{'\n"),
    ("a.py", "x = f'{1 +}'\ny = nope\n"),
    ("a.py", "if True:\n\tx = 1\n        y = 2\n"),
    ("a.py", "x = 1\n\tif x:\n  pass\n"),
    ("a.py", EMOJI_LINE),
    ("a.py", "s = '\U0001F600'; t = (\n"),
    ("a.py", "s = 'caf\u00e9'\nprint(nope)\n"),
    ("a.py", ""),
    ("a.py", "import os\r\nx = (\r\n"),
    ("pkg/__init__.py", "from . import sibling\nimport os\n"),
    ("pkg/module.py", "from . import sibling\nimport os\n"),
    ("stub.pyi", "import os\ndef f() -> Later: ...\nclass Later: ...\n"),
    ("/tmp/project/.venv/lib/a.py", "import os\n"),  # a path ruff excludes by default: checked all the same
    ("", "def f():\n    return\nreturn 1\nbreak\n"),
]


def by_position(found: list[Diagnostic]) -> list[Diagnostic]:
    return sorted(found, key=lambda d: (d.line, d.col, d.code, d.message))


@pytest.fixture(scope="module")
def cli() -> RuffProvider:
    return RuffProvider()


@pytest.fixture
def server() -> RuffServerProvider:
    made = RuffServerProvider()
    yield made
    made.close()


def test_the_server_answers_as_ruff_check(server: RuffServerProvider, cli: RuffProvider) -> None:
    for path, text in CASES:
        assert by_position(server.diagnose(text, path, "python")) == by_position(cli.diagnose(text, path, "python")), text
    assert server.started == 1 and server.fallback is None and server.position_encoding == "utf-32"
    (unused,) = server.diagnose(CASES[3][1], "a.py", "python")
    assert (unused.code, unused.severity, unused.source) == ("F841", "info", "ruff")
    (undefined,) = server.diagnose(EMOJI_LINE, "a.py", "python")
    assert EMOJI_LINE[undefined.col:undefined.end_col] == "undefined_name" and undefined.severity == "error"


def test_the_path_matters_as_it_does_to_ruff_check(server: RuffServerProvider) -> None:
    text = "from . import sibling\n"
    (in_package,) = server.diagnose(text, "pkg/__init__.py", "python")
    (in_module,) = server.diagnose(text, "pkg/module.py", "python")
    assert in_package.code == in_module.code == "F401"
    assert "__all__" in in_package.message and "__all__" not in in_module.message


def test_columns_are_code_points_when_the_server_counts_utf16(cli: RuffProvider) -> None:
    server = RuffServerProvider()
    server.position_encodings = ["utf-16"]
    try:
        for text in (EMOJI_LINE, "s = '\U0001F600'; t = (\n", "x = '\U0001F600' + nope + '\U0001F600' + more\n"):
            assert by_position(server.diagnose(text, "a.py", "python")) == by_position(cli.diagnose(text, "a.py", "python"))
        assert server.position_encoding == "utf-16"
    finally:
        server.close()


def test_one_process_many_checks_and_at_most_a_few_open_documents(server: RuffServerProvider,
                                                                 cli: RuffProvider) -> None:
    paths = [f"/tmp/virtual/m{i}.py" for i in range(OPEN_DOCUMENTS + 4)]
    for round_ in range(2):
        for i, path in enumerate(paths):
            text = f"import m{i}\nvalue = {'nope' if (i + round_) % 2 else '1'}\n"
            assert by_position(server.diagnose(text, path, "python")) == by_position(cli.diagnose(text, path, "python"))
    assert server.started == 1 and server.answered == 2 * len(paths)
    assert server.open_documents == tuple(paths[-OPEN_DOCUMENTS:])


def test_the_same_path_with_new_texts_is_never_answered_from_an_old_one(server: RuffServerProvider,
                                                                       cli: RuffProvider) -> None:
    texts = ["x = (\n", "x = 1\n", "import os\n", "import os\n", "x = 1\n", "", "def f():\n    y = 1\n"]
    for text in texts:
        assert by_position(server.diagnose(text, "same.py", "python")) == by_position(cli.diagnose(text, "same.py", "python"))
    assert server.started == 1


def test_a_lone_surrogate_fails_that_check_like_ruff_check_and_nothing_more(server: RuffServerProvider,
                                                                           cli: RuffProvider) -> None:
    server.diagnose("x = 1\n", "a.py", "python")
    for provider in (cli, server):
        with pytest.raises(UnicodeEncodeError):
            provider.diagnose("s = '\ud800'\n", "a.py", "python")
    assert server.diagnose("x = (\n", "a.py", "python")[0].code == "invalid-syntax"
    assert server.started == 1


def test_project_configuration_does_not_leak_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                cli: RuffProvider) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.ruff]\nline-length = 10\n[tool.ruff.lint]\nselect = ["E501", "I"]\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "ruff.toml").write_text('line-length = 10\n[lint]\nselect = ["E501", "I", "F"]\nignore = ["F401"]\n')
    monkeypatch.chdir(tmp_path)
    server = RuffServerProvider()
    try:
        text = "import sys\nimport os\nvery_long_name = undefined_value_with_a_long_name\n"
        for path in (tmp_path / "sub" / "mod.py", tmp_path / "mod.py", Path("sub/other.py")):
            found = server.diagnose(text, str(path), "python")
            assert [d.code for d in by_position(found)] == ["F401", "F401", "F821"], path
            assert by_position(found) == by_position(cli.diagnose(text, str(path), "python"))
    finally:
        server.close()


def test_a_hanging_server_is_killed_and_the_next_check_starts_another() -> None:
    server = RuffServerProvider(timeout_s=0.3)
    real = server.argv
    server.argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(TimeoutError, match="no answer within 0.3s"):
        server.diagnose("x = 1\n", "a.py", "python")
    server.argv = real
    server.timeout_s = 10.0
    assert server.diagnose("x = (\n", "a.py", "python")[0].code == "invalid-syntax"
    assert server.started == 2 and server.fallback is None
    server.close()


def test_a_server_that_dies_is_named_with_its_exit_status_and_replaced() -> None:
    server = RuffServerProvider()
    assert server.diagnose("x = 1\n", "a.py", "python") == []
    real = server.argv
    server.close()
    server.argv = [sys.executable, "-c", "import sys; sys.stdin.buffer.read(1); sys.exit(3)"]
    with pytest.raises(RuntimeError, match=r"ruff server stopped \(exit status 3\)"):
        server.diagnose("x = 2\n", "a.py", "python")
    server.argv = real
    assert server.diagnose("x = nope\n", "a.py", "python")[0].code == "F821"
    assert server.started == 3 and server.fallback is None
    server.close()


def test_a_server_that_cannot_start_leaves_one_ruff_check_a_check(caplog: pytest.LogCaptureFixture,
                                                                  cli: RuffProvider) -> None:
    for argv in (["/nonexistent/ruff", "server"], [shutil.which("ruff"), "no-such-subcommand"]):
        server = RuffServerProvider()
        server.argv = argv
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            for text in ("import os\n", "x = (\n"):
                assert server.diagnose(text, "a.py", "python") == cli.diagnose(text, "a.py", "python")
        assert isinstance(server.fallback, RuffProvider)
        assert caplog.text.count("one `ruff check` a check from now on") == 1
        server.close()


FAKE_SERVER = textwrap.dedent('''
    import json, sys
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer

    def read():
        length = None
        while True:
            line = stdin.readline()
            if not line:
                sys.exit(0)
            if line == b"\\r\\n":
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return json.loads(stdin.read(length))

    def write(message):
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        stdout.write(b"Content-Length: %d\\r\\n\\r\\n" % len(body) + body)
        stdout.flush()

    asked = 1000
    while True:
        message = read()
        method = message.get("method")
        if method == "initialize":
            write({"method": "window/logMessage", "params": {"type": 3, "message": "hello"}})
            write({"id": message["id"], "result": {"capabilities": {"positionEncoding": "utf-16"}}})
        elif method == "shutdown":
            write({"id": message["id"], "result": None})
        elif method == "exit":
            sys.exit(0)
        elif method == "textDocument/diagnostic":
            for asking, params in (("workspace/configuration", {"items": [{"section": "ruff"}, {"section": "x"}]}),
                                   ("window/workDoneProgress/create", {"token": "t"}),
                                   ("client/registerCapability", {"registrations": []}),
                                   ("something/new", None)):
                asked += 1
                write({"id": asked, "method": asking, "params": params})
                reply = read()
                assert reply["id"] == asked and "result" in reply, reply
                if asking == "workspace/configuration":
                    assert reply["result"][0]["configurationPreference"] == "editorOnly", reply
                    assert reply["result"][1] is None, reply
            write({"method": "textDocument/publishDiagnostics", "params": {"uri": "file:///x.py", "diagnostics": []}})
            if sys.argv[1] == "error":
                write({"id": message["id"], "error": {"code": -32603, "message": "boom"}})
            else:  # one finding, its columns in UTF-16 code units
                write({"id": message["id"], "result": {"kind": "full", "items": [{
                    "code": "F821", "message": "Undefined name `undefined_name`\\n\\nhelp: a fix",
                    "range": {"start": {"line": 0, "character": 16}, "end": {"line": 0, "character": 30}}}]}})
''')


def fake_server(tmp_path: Path, mode: str) -> RuffServerProvider:
    script = tmp_path / "fake_ruff_server.py"
    script.write_text(FAKE_SERVER)
    server = RuffServerProvider()
    server.argv = [sys.executable, str(script), mode]
    return server


def test_the_servers_requests_are_answered_and_utf16_columns_converted(tmp_path: Path) -> None:
    server = fake_server(tmp_path, "ok")
    for _ in range(2):
        (found,) = server.diagnose(EMOJI_LINE, "a.py", "python")
        assert found == Diagnostic(0, 14, 0, 28, "Undefined name `undefined_name`", "error", "ruff", "F821")
    assert server.started == 1 and server.position_encoding == "utf-16"
    server.close()


def test_an_error_answer_is_raised_with_its_words_and_the_server_kept(tmp_path: Path) -> None:
    server = fake_server(tmp_path, "error")
    for _ in range(2):
        with pytest.raises(RuntimeError, match=r"ruff server failed: boom \(code -32603\)"):
            server.diagnose("x = 1\n", "a.py", "python")
    assert server.started == 1 and server.fallback is None
    server.close()


def test_checks_from_several_threads_get_their_own_answers(server: RuffServerProvider, cli: RuffProvider) -> None:
    jobs = [(f"/tmp/virtual/t{i % 6}.py", f"import os\nx{i} = {'(' if i % 3 == 0 else 'nope' if i % 3 == 1 else '1'}\n")
            for i in range(40)]
    expected = [by_position(cli.diagnose(text, path, "python")) for path, text in jobs]
    with ThreadPoolExecutor(4) as pool:
        found = list(pool.map(lambda job: by_position(server.diagnose(job[1], job[0], "python")), jobs))
    assert found == expected
    assert server.started == 1


def test_close_shuts_the_server_down_and_a_later_check_starts_another(server: RuffServerProvider) -> None:
    server.diagnose("x = 1\n", "a.py", "python")
    process = server._process
    assert process is not None
    server.close()
    assert process.poll() == 0  # it took the shutdown and exit, not a kill
    assert server.diagnose("x = nope\n", "a.py", "python")[0].code == "F821"
    assert server.started == 2


def test_python_checks_ask_a_ruff_server_started_at_once() -> None:
    providers = default_providers("python")
    (ruff,) = [p for p in providers if p.name == "ruff"]
    assert isinstance(ruff, RuffServerProvider) and ruff.started == 1
    assert ruff.diagnose("import os\n", "a.py", "python")[0].code == "F401"
    assert ruff.started == 1
    ruff.close()
    for provider in providers:  # the compile helper started with it
        worker = getattr(provider, "worker", None)
        if worker is not None:
            worker.close()


def test_a_submitted_check_is_answered_as_diagnose_and_failures_let_go_of_the_server(
        server: RuffServerProvider) -> None:
    for path, text in CASES[:6]:
        assert by_position(server.submit(text, path, "python")()) == by_position(server.diagnose(text, path, "python"))
    hanging = RuffServerProvider(timeout_s=0.3)
    real = hanging.argv
    hanging.argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    answer = hanging.submit("x = 1\n", "a.py", "python")
    with pytest.raises(TimeoutError, match="no answer within 0.3s"):
        answer()
    hanging.argv = real
    hanging.timeout_s = 10.0
    assert hanging.diagnose("x = nope\n", "a.py", "python")[0].code == "F821"  # the lock was let go
    hanging.close()


def test_a_changed_text_is_sent_as_its_range_and_answered_as_the_whole(server: RuffServerProvider,
                                                                        cli: RuffProvider) -> None:
    import random

    rng = random.Random(5)
    text = "import os\n\ndef f(x):\n    s = '\U0001F600 caf\u00e9'\n    return x + 1\n\n\nprint(f(2))\n"
    pieces = ["nope", "\n", "(", "    y = s\n", "\U0001F600", "'", "import sys\n", "", "x"]
    assert server.diagnose(text, "e.py", "python") == cli.diagnose(text, "e.py", "python")
    assert server._change(text, text.replace("x + 1", "x + 2"))["range"] == {  # what a candidate's check sends
        "start": {"line": 4, "character": 15}, "end": {"line": 4, "character": 16}}
    for _ in range(60):
        start = rng.randrange(len(text) + 1)
        end = min(len(text), start + rng.choice([0, 0, 1, 3, 12]))
        text = text[:start] + rng.choice(pieces) + text[end:]
        assert by_position(server.diagnose(text, "e.py", "python")) == by_position(cli.diagnose(text, "e.py", "python")), text
    crlf = text.replace("\n", "\r\n")
    assert "range" not in server._change(text, crlf)  # carriage returns: the whole text
    assert by_position(server.diagnose(crlf, "e.py", "python")) == by_position(cli.diagnose(crlf, "e.py", "python"))
    assert server.started == 1
