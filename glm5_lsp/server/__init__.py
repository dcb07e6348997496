"""The language server: the only package that knows LSP types (pygls/lsprotocol).

``settings`` (client settings), ``convert`` (LSP <-> plain values), ``syntax`` (single- or
multi-line, empty bodies), ``postprocess`` (clean a completion), ``symbols`` (names for list
completions), ``checks`` (our diagnostics; an edit is checked before it is offered), ``engine``
(backend + pipeline + context engine, loaded in the background), ``jobs`` (cancellation,
supersession), ``cache``, ``progress`` (``$/progress``, ``window/logMessage``), ``state`` (the
``LanguageServer`` subclass owning all of it), the features ``completions``, ``actions`` and
``commands``, ``server`` (``build_server``) and ``cli`` (``glm5-lsp serve``).
"""
