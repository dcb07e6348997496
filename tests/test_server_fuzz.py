"""A seeded fuzzer against the real ``glm5-lsp serve``: hostile and careless messages of every kind,
framing lies each followed by a health probe, and the accounting that matters.

Passes when the server never dies, answers every request it could read exactly once (with the
error code its fault deserves, never -32603), answers each framing lie's probe, and shuts down
cleanly. ``GLM5_FUZZ_MESSAGES`` sets how many messages (default 400), ``GLM5_FUZZ_SEED`` the seed.
The model is the ``openai`` backend on the scripted server of ``tests/data/server``, then the
embedded default (the workspace memory, the gate and the model's own threads beside the server's).
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "data" / "server"))
from lsp_raw import RawServer, frame, message
from scripted_openai import ScriptedOpenAI

DATA = Path(__file__).resolve().parent / "data" / "server"
SEED = int(os.environ.get("GLM5_FUZZ_SEED", "19"))
COUNT = int(os.environ.get("GLM5_FUZZ_MESSAGES", "400"))
DOCS = {
    "file:///tmp/glm5_fuzz/a.py": "import os\n\ndef total(items):\n    \n\nfast = \nx = 1\x0c\ny = 2\u2028z\n",
    "file:///tmp/glm5_fuzz/b.py": "class A:\n    def m(self):\n        return self.\n😀 = 'é'\r\nslow =\r\n",
    "file:///tmp/glm5_fuzz/c.js": "function f(a) {\n  return a +\n}\n",
}
BAD_VALUES = [-1, -2**63, 2**31, 2**31 + 5, 10**30, 1.5, -0.5, "3", "", True, False, None, [], {}, [1], {"a": 1},
              float("1e308")]
REQUIRED = {"textDocument", "uri", "position", "line", "character", "range", "start", "end", "triggerKind",
            "diagnostics"}
RESULT = None  # an id expected to be answered with a result
MAY_CANCEL = -32800  # any request may be cancelled by a fuzzed $/cancelRequest


class Plan:
    """What is sent and what each request must be answered with."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.chunks: list[bytes] = []
        self.expect: dict[Any, set[int | None]] = {}  # id -> allowed answers (None: a result)
        self.maybe: set[Any] = set()  # ids inside framing lies: answered or not
        self.probes: list[Any] = []
        self.null_min = 0  # bodies that must each get an error with "id": null
        self.kinds: Counter[str] = Counter()
        self._id = 1000
        self.open: dict[str, str] = dict(DOCS)
        self.version = 1

    def new_id(self) -> Any:
        self._id += 1
        return self._id if self.rng.random() < 0.7 else f"s-{self._id}"

    def send(self, payload: Any, kind: str) -> None:
        self.chunks.append(message(payload))
        self.kinds[kind] += 1

    def request(self, method: str, params: Any, allowed: set[int | None], kind: str) -> Any:
        msg_id = self.new_id()
        payload: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None or self.rng.random() < 0.5:
            payload["params"] = params
        self.expect[msg_id] = allowed | {MAY_CANCEL}
        self.send(payload, kind)
        return msg_id

    # ---- valid requests -------------------------------------------------------------------------

    def position(self, uri: str) -> dict[str, int]:
        lines = self.open.get(uri, "").split("\n")
        line = self.rng.randrange(len(lines) + (1 if self.rng.random() < 0.1 else 0))
        character = self.rng.randint(0, 12) if self.rng.random() < 0.9 else 2**31 - 1
        return {"line": line if self.rng.random() < 0.97 else 2**31 - 1, "character": character}

    def valid_params(self) -> tuple[str, dict[str, Any]]:
        uri = self.rng.choice([*self.open, "file:///tmp/glm5_fuzz/never_opened.py"])
        document = {"uri": uri}
        method = self.rng.choice(["textDocument/inlineCompletion", "textDocument/completion",
                                  "textDocument/codeAction", "workspace/executeCommand"])
        if method == "textDocument/inlineCompletion":
            return method, {"textDocument": document, "position": self.position(uri), "context": {"triggerKind": 1}}
        if method == "textDocument/completion":
            return method, {"textDocument": document, "position": self.position(uri)}
        if method == "textDocument/codeAction":
            start = self.position(uri)
            return method, {"textDocument": document, "range": {"start": start, "end": start},
                            "context": {"diagnostics": [], "only": self.rng.choice([None, ["quickfix"], ["refactor"]])}}
        arguments = self.rng.choice([[], ["not an object"], [{"uri": uri, "position": {"line": -1, "character": 0}}],
                                     [{"uri": 7}], [{"uri": uri}]])
        return method, {"command": self.rng.choice(["glm5.generate", "glm5.fix"]), "arguments": arguments}

    def valid_request(self) -> None:
        method, params = self.valid_params()
        self.request(method, params, {RESULT}, "valid request")

    def probe(self) -> None:
        uri = self.rng.choice(list(self.open))
        self.probes.append(self.request("textDocument/codeAction", {
            "textDocument": {"uri": uri}, "range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 1}},
            "context": {"diagnostics": [], "only": ["refactor"]}}, {RESULT}, "health probe"))

    # ---- invalid params -------------------------------------------------------------------------

    def invalid_params(self) -> None:
        method, params = self.valid_params()
        if method == "workspace/executeCommand":
            params = self.rng.choice([{"command": 5}, {"arguments": []}, {"command": "glm5.none", "arguments": []}])
            self.request(method, params, {-32602}, "invalid params")
            return
        broken = copy.deepcopy(params)
        paths = list(_paths(broken))
        path = self.rng.choice(paths)
        container, key = _walk(broken, path)
        if self.rng.random() < 0.25 and isinstance(container, dict):
            del container[key]
            required = key in REQUIRED or (key == "context" and method != "textDocument/completion")
            self.request(method, broken, {-32602} if required else {RESULT}, "invalid params: a field removed")
            return
        value = self.rng.choice(BAD_VALUES)
        if _accepts(path, value):
            return
        container[key] = value
        self.request(method, broken, {-32602}, "invalid params: wrong value")

    def deep(self, depth: int) -> None:
        msg_id = self.new_id()
        opening, closing = ("[", "]") if self.rng.random() < 0.5 else ('{"a":', "}")
        body = (f'{{"jsonrpc": "2.0", "id": {json.dumps(msg_id)}, "method": "textDocument/inlineCompletion", '
                f'"params": {opening * depth}1{closing * depth}}}')
        self.expect[msg_id] = {-32602, MAY_CANCEL}
        self.chunks.append(frame(body))
        self.kinds[f"params nested {depth} deep"] += 1

    # ---- not requests ---------------------------------------------------------------------------

    def not_json(self) -> None:
        body = self.rng.choice([
            b"not json", b"{", b'{"jsonrpc": "2.0", "id": 1, "method": ', b"\xff\xfe\x00garbage", b"NaN",
            b'{"jsonrpc": "2.0", "id": 5, "params": Infinity, "method": "x"}', b"", bytes(self.rng.randrange(256)
                                                                                       for _ in range(40)),
        ])
        self.chunks.append(frame(body))
        self.null_min += 1
        self.kinds["not JSON"] += 1

    def not_a_request(self) -> None:
        choice = self.rng.randrange(8)
        if choice < 4:
            body = [b"[1, 2, 3]", b"[]", b"42", b'"a string"', b"null", b"{}", b'{"jsonrpc": "2.0"}',
                    b'{"jsonrpc": "2.0", "id": 1.5, "method": "textDocument/completion"}',
                    b'{"jsonrpc": "2.0", "id": [1], "method": "shutdown"}',
                    b'{"jsonrpc": "2.0", "id": false, "method": "shutdown"}',
                    b'{"jsonrpc": "2.0", "method": {"a": 1}}'][self.rng.randrange(11)]
            self.chunks.append(frame(body))
            self.null_min += 1
            self.kinds["not a request (no usable id)"] += 1
            return
        msg_id = self.new_id()
        payload = self.rng.choice([
            {"jsonrpc": "1.0", "id": msg_id, "method": "textDocument/completion"},
            {"id": msg_id, "method": "textDocument/completion"},
            {"jsonrpc": "2.0", "id": msg_id},
        ])
        self.expect[msg_id] = {-32600, MAY_CANCEL}
        self.send(payload, "not a request (id kept)")

    def unknown_method(self) -> None:
        method = self.rng.choice(["glm5/unknown", "$/unknown", "textDocument/hover", "workspace/symbol", ""])
        self.request(method, {}, {-32601}, "unknown method")

    # ---- notifications --------------------------------------------------------------------------

    def notification(self) -> None:
        choice = self.rng.randrange(6)
        uri = self.rng.choice(list(self.open))
        if choice == 0:  # a valid change
            self.version += 1
            lines = self.open.get(uri, "").split("\n")
            line = self.rng.randrange(len(lines))
            text = self.rng.choice(["x", "\n", "\r\n", "\x0c", "\u2028", "😀", "", "\ud800", "def g():\n    "])
            self.send({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {
                "textDocument": {"uri": uri, "version": self.version},
                "contentChanges": [{"range": {"start": {"line": line, "character": 0},
                                              "end": {"line": line, "character": 0}}, "text": text}]}},
                      "notification: didChange")
            self.open[uri] = "\n".join(lines[:line] + [text + lines[line]] + lines[line + 1:]).replace("\r", "")
        elif choice == 1:  # a broken change
            self.send({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": self.rng.choice([
                {"textDocument": {"uri": uri}}, {"contentChanges": "x"}, [], {"textDocument": {"uri": uri, "version": "9"},
                                                                             "contentChanges": [{"range": 1, "text": 2}]}])},
                      "notification: broken")
        elif choice == 2:
            self.send({"jsonrpc": "2.0", "method": self.rng.choice(["glm5/whatever", "$/progress", "textDocument/didSave"]),
                       "params": {"x": 1}}, "notification: unknown")
        elif choice == 3:  # cancel something recent (or nothing)
            recent = [i for i in list(self.expect)[-5:] if i not in self.probes]
            target = self.rng.choice([*recent, 999_999, "nope"])
            self.send({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": target}}, "notification: cancel")
        elif choice == 4:  # open another document, sometimes with a lone surrogate
            new = f"file:///tmp/glm5_fuzz/extra{self.rng.randrange(4)}.py"
            text = self.rng.choice(["fast = \n", "s = '\ud800'\nfast = \n", "", "\x0b\x0c\x1c\x1d\x1e\x85\n"])
            self.send({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {
                "uri": new, "languageId": "python", "version": 1, "text": text}}}, "notification: didOpen")
            self.open[new] = text
        else:
            self.send({"jsonrpc": "2.0", "method": "workspace/didChangeConfiguration",
                       "params": {"settings": self.rng.choice([{"glm5": {"completion": {"maxTokens": "lots"}}}, 5, None,
                                                               {"glm5": {"logLevel": "info"}}])}},
                      "notification: configuration")

    # ---- framing lies ---------------------------------------------------------------------------

    def framing_lie(self) -> None:
        msg_id = self.new_id()
        body = json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": "textDocument/completion",
                           "params": {"textDocument": {"uri": "file:///tmp/glm5_fuzz/a.py"},
                                      "position": {"line": 0, "character": 0}}}).encode()
        kind, data = self.rng.choice([
            ("too short", frame(body, max(1, len(body) - self.rng.randint(1, len(body) - 1)))),
            ("too long", frame(body, len(body) + self.rng.randint(1, 5000))),
            ("not a number", b"Content-Length: twelve\r\n\r\n" + body),
            ("negative", f"Content-Length: -{len(body)}\r\n\r\n".encode() + body),
            ("missing", b"Content-Type: application/vscode-jsonrpc\r\n\r\n" + body),
            ("lowercase", frame(body, name="content-length")),
            ("huge", b"Content-Length: 99999999999\r\n\r\n" + body),
            ("no blank line", f"Content-Length: {len(body)}\r\n".encode() + body),
            ("garbage before", b"\x00\x01 hello " + message({"jsonrpc": "2.0", "id": msg_id, "method": "shutdown!"})),
        ])
        if kind == "lowercase":
            self.expect[msg_id] = {RESULT, MAY_CANCEL}
        else:
            self.maybe.add(msg_id)
        self.chunks.append(data)
        self.kinds[f"framing lie: {kind}"] += 1
        self.probe()


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, item in items:
        found.append((*prefix, key))
        found += _paths(item, (*prefix, key))
    return found


def _walk(value: Any, path: tuple[Any, ...]) -> tuple[Any, Any]:
    for key in path[:-1]:
        value = value[key]
    return value, path[-1]


def _accepts(path: tuple[Any, ...], value: Any) -> bool:
    """Whether ``value`` is a valid replacement at ``path`` (then it is no invalid param)."""
    leaf = path[-1]
    if leaf == "only":
        return value is None or value == []
    if leaf == "context" and path == ("context",):
        return False
    if leaf == "diagnostics":
        return value == []
    if leaf in ("line", "character"):
        return type(value) is int and 0 <= value < 2**31
    if leaf == "triggerKind":
        return value in (1, 2) and type(value) is int
    if leaf == "uri":
        return isinstance(value, str)
    if isinstance(leaf, int):  # an element of "only"
        return isinstance(value, str)
    return False


def build(rng: random.Random, count: int) -> Plan:
    plan = Plan(rng)
    kinds = [(plan.valid_request, 22), (plan.invalid_params, 25), (plan.not_json, 8), (plan.not_a_request, 10),
             (plan.unknown_method, 5), (plan.notification, 18), (plan.framing_lie, 10)]
    actions, weights = zip(*kinds, strict=True)
    plan.deep(100_000)
    for _ in range(count - 1):
        if rng.random() < 0.01:
            plan.deep(rng.choice([200, 900, 5000]))
        else:
            rng.choices(actions, weights)[0]()
    plan.probe()
    return plan


@pytest.fixture(scope="module")
def scripted() -> Any:
    server = ScriptedOpenAI.from_file(DATA / "script.json")
    server.url = server.start()  # type: ignore[attr-defined]
    yield server
    server.stop()


@pytest.mark.parametrize("model", ["served", "embedded"])
def test_fuzzed_messages_crash_nothing_and_every_request_is_answered(scripted: Any, tmp_path: Path, model: str) -> None:
    """The served model (scripted), and the embedded default with everything that runs beside it (the
    workspace memory, the gate, TorchScript's forward passes: more threads at once)."""
    plan = build(random.Random(SEED), COUNT)
    server = RawServer(stderr_path=tmp_path / "stderr.txt")
    served = {"model": {"backend": "openai", "url": scripted.url, "name": "scripted", "timeoutSeconds": 5}}
    try:
        server.initialize({**(served if model == "served" else {}),
                           "completion": {"debounceMs": 0}, "budgets": {"completionMs": 2000, "requestTimeoutMs": 5000,
                                                                        "fixTimeoutMs": 5000}})
        server.wait_ready()
        for uri, text in DOCS.items():
            server.open(uri, text, "javascript" if uri.endswith(".js") else "python")
        for chunk in plan.chunks:
            server.send_bytes(chunk)
        for msg_id in plan.expect:
            server.wait_for(msg_id, timeout=120)
        answers = {msg_id: [r.get("error", {}).get("code") for r in replies] for msg_id, replies in server.responses.items()}
        assert server.process.poll() is None, "the server died"
        assert not server.protocol_errors, server.protocol_errors
        unanswered = [i for i in plan.expect if i not in answers]
        assert not unanswered, f"{len(unanswered)} unanswered requests"
        twice = {i: codes for i, codes in answers.items() if len(codes) > 1 and i not in (1, 2)}
        assert not twice, f"answered more than once: {twice}"
        wrong = {i: (answers[i], plan.expect[i], server.responses[i][0].get("error", {}).get("message"))
                 for i in plan.expect if answers[i][0] not in plan.expect[i]}
        assert not wrong, (f"answered with the wrong code (got, allowed, message): {wrong}\n"
                           + _tracebacks(tmp_path / "stderr.txt"))
        stray = set(answers) - set(plan.expect) - plan.maybe - {1}
        assert not stray, f"answers to ids never sent: {stray}"
        internal = [r for replies in server.responses.values() for r in replies if r.get("error", {}).get("code") == -32603]
        internal += [r for r in server.null_errors if r["error"]["code"] == -32603]
        assert not internal, f"internal errors: {internal[:3]}\n" + _tracebacks(tmp_path / "stderr.txt")
        assert len(server.null_errors) >= plan.null_min
        bad_probes = {p: answers[p] for p in plan.probes if answers[p] != [None]}
        assert not bad_probes, f"health probes not answered with a result: {bad_probes}"
        print(f"\nfuzz seed {SEED}: {sum(plan.kinds.values())} messages, {len(plan.expect)} requests answered, "
              f"{len(server.null_errors)} id-null errors, {len(plan.probes)} probes; "
              + ", ".join(f"{k} {v}" for k, v in sorted(plan.kinds.items())))
        assert server.finish() == 0
    finally:
        server.close()


def _tracebacks(stderr: Path, limit: int = 6000) -> str:
    """The server's ERROR records with their tracebacks (a record runs to the next timestamped line)."""
    try:
        lines = stderr.read_text(errors="replace").splitlines()
    except OSError as error:
        return f"(no server log: {error})"
    kept: list[str] = []
    keeping = False
    for line in lines:
        if re.match(r"\d{4}-\d\d-\d\d ", line):
            keeping = " ERROR " in line
        if keeping:
            kept.append(line)
    return "server log, errors:\n" + "\n".join(kept)[-limit:]
