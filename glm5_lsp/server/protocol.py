"""The JSON-RPC layer under every feature: each request gets exactly one response, a result or the
error its fault deserves, and nothing a client sends takes the server down.

:class:`Glm5Protocol` (a pygls ``LanguageServerProtocol``) reads each framed body itself, instead
of pygls' ``json.loads(object_hook=...)``, which raised out of the reader with no reply:

- a body that is not JSON (or not UTF-8, or nested past what Python can parse and no ``id`` can be
  read from it): ``-32700`` with ``id: null``;
- not a request, notification or response (an array, a number, a wrong ``jsonrpc``, an ``id`` that
  is not a string or an integer): ``-32600`` (with ``id: null`` unless its ``id`` could be read);
- params that do not fit the method (a missing or mistyped field, a negative position, line 2**31,
  a float or a string where an integer belongs, params nested past the parser's depth):
  ``-32602`` naming the field;
- an unknown method: ``-32601``; a request before ``initialize``: ``-32002``; after ``shutdown``
  (and a second ``initialize``): ``-32600``; a handler that fails: ``-32603`` (logged with its
  traceback); a cancelled one: ``-32800``; a result that cannot be serialised: ``-32603``.

Notifications get no response: one that cannot be read is logged and dropped. ``exit`` ends the
server with 0 after ``shutdown``, else 1. Every string of every message has its lone surrogates
replaced by U+FFFD first (``text.without_lone_surrogates``: same UTF-16 and UTF-32 length), so no
later step meets text it cannot encode. The workspace keeps documents by LSP's line rules
(``text.SyncedWorkspace``).
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import math
import re
import types as types_module
from collections.abc import Callable, MutableSequence
from concurrent.futures import Future
from typing import Any, Union, get_args, get_origin

import cattrs
from cattrs.cols import homogenous_tuple_structure_factory, is_sequence, list_structure_factory
from lsprotocol import types
from pygls.capabilities import ServerCapabilitiesBuilder
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.protocol import (
    JsonRPCNotification,
    JsonRPCRequestMessage,
    LanguageServerProtocol,
    default_converter,
    lsp_method,
)
from pygls.uris import from_fs_path

from glm5_lsp.server.text import SyncedWorkspace, without_lone_surrogates

log = logging.getLogger("glm5_lsp.server")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_NOT_INITIALIZED = -32002
REQUEST_CANCELLED = -32800

_MISSING = object()
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+')


# ---- a converter that does not coerce ------------------------------------------------------------


def _strict(kind: type, name: str) -> Callable[[Any, Any], Any]:
    def structure(value: Any, target: Any) -> Any:
        if type(value) is kind or (kind is float and type(value) is int):
            if kind is float and not math.isfinite(value):
                raise TypeError(f"expected a finite number, got {value!r}")
            return value if target is kind else target(value)  # an IntEnum or a str enum: its member
        raise TypeError(f"expected {name}, got {_kind_of(value)}")

    return structure


def strict_converter() -> cattrs.Converter:
    """pygls' converter, without its silent coercions: ``"3"``, ``1.5`` and ``true`` are not integers,
    ``5`` is not a string, ``"quickfix"`` is not an array (each is an invalid param, not a position
    on line 3 or the kinds "q", "u", "i"...)."""
    converter = default_converter()
    for kind, name in ((int, "an integer"), (str, "a string"), (bool, "true or false"), (float, "a number")):
        converter.register_structure_hook(kind, _strict(kind, name))
    converter.register_structure_hook_factory(_is_array_type, _strict_array)
    converter.register_structure_hook_factory(_is_open_enum, _strict_open_enum)
    return converter


def _open_enum_parts(kind: Any) -> tuple[type, bool] | None:
    """``(str or int, optional)`` for ``Union[SomeEnum, str]`` (an enum a client may extend, like
    ``CodeActionKind``), optionally with None; else None."""
    if get_origin(kind) is not Union and not isinstance(kind, types_module.UnionType):
        return None
    args = [arg for arg in get_args(kind) if arg is not type(None)]
    plain = [arg for arg in args if arg in (str, int)]
    enums = [arg for arg in args if isinstance(arg, type) and issubclass(arg, enum.Enum)]
    if len(plain) != 1 or len(enums) != 1 or len(args) != 2:
        return None
    return plain[0], len(args) < len(get_args(kind))


def _is_open_enum(kind: Any) -> bool:
    return _open_enum_parts(kind) is not None


def _strict_open_enum(kind: Any) -> Callable[[Any, Any], Any]:
    """lsprotocol lets any number, string or boolean through these; a value must be of the type."""
    parts = _open_enum_parts(kind)
    assert parts is not None
    plain, optional = parts

    def structure(value: Any, _target: Any) -> Any:
        if (value is None and optional) or type(value) is plain:
            return value
        raise TypeError(f"expected {'a string' if plain is str else 'an integer'}, got {_kind_of(value)}")

    return structure


def _is_array_type(kind: Any) -> bool:
    return is_sequence(kind) and get_origin(kind) is not tuple


def _strict_array(kind: Any, converter: cattrs.Converter) -> Callable[[Any, Any], Any]:
    """A sequence field takes a JSON array only (cattrs would make ``"ab"`` into ``("a", "b")`` and
    an object into its keys)."""
    make = list_structure_factory if get_origin(kind) in (list, MutableSequence) else homogenous_tuple_structure_factory
    inner = make(kind, converter)

    def structure(value: Any, target: Any) -> Any:
        if not isinstance(value, list):
            raise TypeError(f"expected an array, got {_kind_of(value)}")
        return inner(value, target)

    return structure


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "an object"}.get(type(value), type(value).__name__)


def describe_structure_error(error: BaseException) -> str:
    """A readable account of why params did not fit: each field (as the client spelt it) and what
    was wrong with it."""
    if isinstance(error, RecursionError):
        return "params nested too deeply"
    problems = [f"{_client_path(path)}: {_leaf_message(leaf)}" for path, leaf in _leaves(error, [])]
    if not problems:
        return f"{type(error).__name__}: {error}"
    return "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else "")


def _leaves(error: BaseException, path: list[str]) -> list[tuple[list[str], BaseException]]:
    if not isinstance(error, cattrs.BaseValidationError):
        return [(path, error)]
    found = []
    with_notes, without = error.group_exceptions()
    for sub, note in with_notes:
        step = getattr(note, "name", None)
        if step is None:
            step = f"[{getattr(note, 'index', '?')}]"
        found += _leaves(sub, [*path, str(step)])
    for sub in without:
        found += _leaves(sub, path)
    return found


def _leaf_message(leaf: BaseException) -> str:
    if isinstance(leaf, KeyError):
        return "required field missing"
    text = str(leaf) or type(leaf).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _client_path(path: list[str]) -> str:
    """``["params", "text_document", "uri"]`` -> ``params.textDocument.uri``."""
    parts = [re.sub(r"_([a-z])", lambda m: m.group(1).upper(), part) for part in path]
    return ".".join(parts).replace(".[", "[") or "params"


def _peek_id(body: bytes) -> tuple[Any, Any]:
    """The top-level ``id`` and ``method`` of a JSON object too deep for ``json.loads``, read without
    recursion; ``_MISSING`` where absent or not a plain value."""
    depth, key, expect_value, found = 0, None, False, {}
    for match in _TOKENS.finditer(body):
        token = match.group(0)
        if token in (b"{", b"["):
            if depth == 1 and expect_value:
                expect_value = False
            depth += 1
        elif token in (b"}", b"]"):
            depth -= 1
            if depth <= 0:
                break
        elif depth == 1:
            if token == b":":
                expect_value = True
            elif token == b",":
                key, expect_value = None, False
            elif expect_value:
                if key in ("id", "method"):
                    try:
                        found[key] = json.loads(token)
                    except ValueError:
                        pass
                expect_value = False
            else:
                try:
                    key = json.loads(token) if token.startswith(b'"') else None
                except ValueError:
                    key = None
        if len(found) == 2:
            break
    return found.get("id", _MISSING), found.get("method", _MISSING)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _clean_strings(value: Any) -> Any:
    """``value`` with lone surrogates replaced in every string, without recursion."""
    if isinstance(value, str):
        return without_lone_surrogates(value)
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, item in node.items():
                if isinstance(item, str):
                    node[key] = without_lone_surrogates(item)
                elif isinstance(item, (dict, list)):
                    stack.append(item)
        elif isinstance(node, list):
            for index, item in enumerate(node):
                if isinstance(item, str):
                    node[index] = without_lone_surrogates(item)
                elif isinstance(item, (dict, list)):
                    stack.append(item)
    return value


def _valid_id(value: Any) -> bool:
    return type(value) in (int, str)


# ---- the protocol --------------------------------------------------------------------------------


class Glm5Protocol(LanguageServerProtocol):
    """pygls' LSP protocol with a message layer that answers every request (see the module doc)."""

    def __init__(self, server: Any, converter: cattrs.Converter) -> None:
        super().__init__(server, converter)
        self.initialized = False  # initialize answered
        self.exit_code: int | None = None  # set by ``exit`` (or a client gone): the reader stops
        self._methods: dict[Any, str] = {}  # request id -> method, for the logs

    # ---- receiving ----------------------------------------------------------------------------

    def receive(self, body: bytes) -> None:
        """One framed body: parse, check, dispatch. Never raises."""
        try:
            self._receive(body)
        except Exception:  # a bug here must not stop the reader; the request is answered if we can
            log.exception("could not handle a message")

    def _receive(self, body: bytes) -> None:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as error:
            log.warning("a message that is not UTF-8 (%s): read with replacement characters", error)
            text = body.decode("utf-8", "replace")
        try:
            data = json.loads(text, parse_constant=_reject_constant)
        except RecursionError:
            self._too_deep(body)
            return
        except ValueError as error:
            self.send_error(None, PARSE_ERROR, f"parse error: {error}")
            return
        self.dispatch(data)

    def _too_deep(self, body: bytes) -> None:
        msg_id, method = _peek_id(body)
        if msg_id is _MISSING:
            if method is _MISSING:
                self.send_error(None, PARSE_ERROR, "parse error: nested too deeply to read")
            else:
                log.warning("dropped a %s notification nested too deeply to read", method)
            return
        if not _valid_id(msg_id):
            self.send_error(None, INVALID_REQUEST, "invalid request: id must be a string or an integer")
            return
        self.send_error(msg_id, INVALID_PARAMS, "invalid params: nested too deeply to read")

    def dispatch(self, data: Any) -> None:
        """A parsed message: check its shape and the lifecycle, structure its params, hand it on."""
        if not isinstance(data, dict):
            self.send_error(None, INVALID_REQUEST,
                            f"invalid request: a message is a JSON object, not {_kind_of(data)}")
            return
        msg_id = data.get("id", _MISSING)
        has_id = msg_id is not _MISSING
        reply_id = msg_id if has_id and _valid_id(msg_id) else None
        if data.get("jsonrpc") != "2.0":
            self.send_error(reply_id, INVALID_REQUEST, 'invalid request: "jsonrpc" must be "2.0"')
            return
        method = data.get("method", _MISSING)
        if method is _MISSING:
            if has_id and ("result" in data or "error" in data):
                self._response(data)
            else:
                self.send_error(reply_id, INVALID_REQUEST,
                                "invalid request: neither a request, a notification nor a response")
            return
        if not isinstance(method, str):
            self.send_error(reply_id, INVALID_REQUEST, "invalid request: method must be a string")
            return
        if has_id and not _valid_id(msg_id):
            self.send_error(None, INVALID_REQUEST, "invalid request: id must be a string or an integer")
            return
        params = data.get("params")
        if params is not None and not isinstance(params, (dict, list)):
            self._refuse(has_id, msg_id, method, INVALID_PARAMS,
                         f"invalid params: params must be an object or an array, not {_kind_of(params)}")
            return
        _clean_strings(params)
        if method == types.EXIT:
            self.exit()
            return
        if not self.initialized and method != types.INITIALIZE:
            self._refuse(has_id, msg_id, method, SERVER_NOT_INITIALIZED,
                         f"server not initialized: {method} before initialize")
            return
        if self._shutdown:
            self._refuse(has_id, msg_id, method, INVALID_REQUEST, f"invalid request: {method} after shutdown")
            return
        if method == types.INITIALIZE and self.initialized:
            self._refuse(has_id, msg_id, method, INVALID_REQUEST, "invalid request: initialize was sent already")
            return
        if not self._handles(method):
            if has_id:
                self.send_error(msg_id, METHOD_NOT_FOUND, f"method not found: {method}")
            else:
                log.debug("ignored a notification of an unknown method %r", method)
            return
        if has_id and method not in _REQUEST_METHODS:
            self.send_error(msg_id, INVALID_REQUEST, f"invalid request: {method} is a notification")
            return
        if not has_id and method in _REQUEST_METHODS:
            log.warning("dropped %s sent as a notification (it is a request: it needs an id)", method)
            return
        kind = self.get_message_type(method)
        if kind is None:
            kind = JsonRPCRequestMessage if has_id else JsonRPCNotification
        try:
            message = self._converter.structure(data, kind)
        except Exception as error:  # noqa: BLE001 - any failure to fit is the params' fault, answered -32602
            why = describe_structure_error(error)
            self._refuse(has_id, msg_id, method, INVALID_PARAMS, f"invalid params for {method}: {why}")
            return
        if has_id:
            self._methods[msg_id] = method
        if method == types.INITIALIZE:
            self.initialized = True
        self.handle_message(message)

    def _refuse(self, has_id: bool, msg_id: Any, method: str, code: int, message: str) -> None:
        if has_id:
            self.send_error(msg_id, code, message)
        else:
            log.warning("dropped a %s notification: %s", method, message)

    def _handles(self, method: str) -> bool:
        return (method in self.fm.builtin_features or method in self.fm.features or method == types.CANCEL_REQUEST)

    def _response(self, data: dict[str, Any]) -> None:
        """A response to a request of ours: resolve its future, or fail it if the answer is unreadable."""
        msg_id = data.get("id")
        if not _valid_id(msg_id) or msg_id not in self._request_futures:
            log.warning("a response to an unknown request %r", msg_id)
            return
        try:
            if "error" in data:
                message = self._converter.structure(data, types.ResponseErrorMessage)
            else:
                kind = self._result_types.pop(msg_id, None)
                message = self._converter.structure(data, kind) if kind else _GenericResponse(msg_id, data["result"])
        except Exception as error:  # noqa: BLE001 - the request that waits for it fails instead
            log.warning("an unreadable response to request %r: %s", msg_id, describe_structure_error(error))
            future = self._request_futures.pop(msg_id, None)
            if future is not None and not future.done():
                future.set_exception(JsonRpcInvalidParams(f"unreadable response: {describe_structure_error(error)}"))
            return
        if isinstance(message, types.ResponseErrorMessage):
            self._handle_response(msg_id, None, message.error)
        else:
            self._handle_response(msg_id, message.result)

    def exit(self) -> None:
        """``exit``: 0 after ``shutdown``, else 1 (the protocol's rule); the reader then stops."""
        self.exit_code = 0 if self._shutdown else 1
        log.info("exit%s", "" if self._shutdown else " without shutdown")

    def _check_handler_result(self, future: Future[Any]) -> None:
        """A notification handler's end: a failure is logged with its traceback (no one to answer)."""
        if not future.cancelled() and (error := future.exception()) is not None:
            log.error("a notification handler failed", exc_info=(type(error), error, error.__traceback__))

    def _handle_cancel_notification(self, msg_id: Any) -> None:
        future = self._request_futures.get(msg_id)
        if future is None:
            log.debug("$/cancelRequest for %r, which is not running", msg_id)
            return
        if future.cancel():
            log.debug("cancelled request %r", msg_id)

    # ---- the lifecycle ------------------------------------------------------------------------

    @lsp_method(types.INITIALIZE)
    def lsp_initialize(self, params: types.InitializeParams) -> Any:
        """pygls' initialize with :class:`~glm5_lsp.server.text.SyncedWorkspace` documents."""
        self._server.process_id = params.process_id
        sync_kind = self._server._text_document_sync_kind
        self.client_capabilities = params.capabilities
        encoding = ServerCapabilitiesBuilder.choose_position_encoding(self.client_capabilities)
        root_uri = params.root_uri
        if params.root_path is not None and root_uri is None:
            root_uri = from_fs_path(params.root_path)
        self._workspace = SyncedWorkspace(root_uri, sync_kind, params.workspace_folders or [], encoding)
        if (handler := self.fm.features.get(types.INITIALIZE)) is not None:
            yield handler, (params,), None
        self.server_capabilities = ServerCapabilitiesBuilder(
            self.client_capabilities, set({**self.fm.features, **self.fm.builtin_features}.keys()),
            self.fm.feature_options, list(self.fm.commands.keys()), sync_kind,
            self._server._notebook_document_sync, encoding,
        ).build()
        return types.InitializeResult(capabilities=self.server_capabilities, server_info=self.server_info)

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams) -> Any:
        """Apply the changes, in order; a change to a document that is not open is dropped (logged)."""
        uri = params.text_document.uri
        if self.workspace.text_documents.get(_unquote(uri)) is None:
            log.warning("didChange for %s, which is not open: dropped", uri)
            return
        for change in params.content_changes:
            self.workspace.update_text_document(params.text_document, change)
        if (handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CHANGE)) is not None:
            yield handler, (params,), None

    # ---- answering ----------------------------------------------------------------------------

    def send_error(self, msg_id: Any, code: int, message: str) -> None:
        """A JSON-RPC error response (``msg_id`` None: ``"id": null``)."""
        if msg_id is not None:
            self._request_futures.pop(msg_id, None)
            self._methods.pop(msg_id, None)
        log.debug("answering %r with %d: %s", msg_id, code, message)
        self._write({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}})

    def _send_handler_result(self, future: Future[Any], *, msg_id: Any) -> None:
        """Every request's answer goes through here: its result, or the error its failure deserves."""
        self._request_futures.pop(msg_id, None)
        method = self._methods.pop(msg_id, "request")
        if future.cancelled():
            self.send_error(msg_id, REQUEST_CANCELLED, f"{method} {msg_id!r} was cancelled")
            return
        error = future.exception()
        if error is None:
            self._send_response(msg_id, result=future.result())
        elif isinstance(error, JsonRpcException):
            log.info("%s %r answered %d: %s", method, msg_id, error.code, error.message)
            self.send_error(msg_id, error.code, error.message)
        else:
            log.error("%s failed", method, exc_info=(type(error), error, error.__traceback__))
            self.send_error(msg_id, INTERNAL_ERROR, f"{method} failed: {type(error).__name__}: {error}")

    def _send_data(self, data: Any) -> None:
        """Serialise and write one message; a response that cannot be serialised becomes an error."""
        if not data:
            return
        try:
            body = json.dumps(data, default=self._serialize_message)
        except Exception as error:
            msg_id = getattr(data, "id", None)
            log.exception("could not serialise a message to the client")
            if msg_id is None or getattr(data, "method", None):
                return
            body = json.dumps({"jsonrpc": "2.0", "id": msg_id, "error": {
                "code": INTERNAL_ERROR, "message": f"the result could not be serialised: {error}"}})
        self._write_body(body)

    def _write(self, payload: dict[str, Any]) -> None:
        self._write_body(json.dumps(payload))

    def _write_body(self, body: str) -> None:
        if self.writer is None:
            log.error("no transport to send a message on")
            return
        data = body.encode("utf-8")
        header = f"Content-Length: {len(data)}\r\nContent-Type: {self.CONTENT_TYPE}; charset={self.CHARSET}\r\n\r\n"
        try:
            result = self.writer.write(header.encode("ascii") + data)
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                asyncio.ensure_future(result)
        except (BrokenPipeError, ConnectionError, ValueError):
            log.warning("the client is gone: a message could not be sent")
            if self.exit_code is None:
                self.exit_code = 0 if self._shutdown else 1


class _GenericResponse:
    def __init__(self, msg_id: Any, result: Any) -> None:
        self.id = msg_id
        self.result = result


def _unquote(uri: str) -> str:
    from urllib.parse import unquote

    return unquote(uri)


# Methods that are requests (they have a response type); the rest of lsprotocol's are notifications.
_REQUEST_METHODS = frozenset(method for method, (_request, response, *_rest) in types.METHOD_TO_TYPES.items()
                             if response is not None)

