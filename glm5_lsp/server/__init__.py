"""The language server: the only package that knows LSP types (pygls/lsprotocol).

``settings`` (client settings), ``convert`` (LSP <-> plain values), ``syntax`` (single- or
multi-line, empty bodies), ``postprocess`` (clean a completion), ``symbols`` (names for list
completions), ``checks`` (an edit is checked before it is offered), ``engine`` (backend +
pipeline, loaded in the background), ``jobs`` (cancellation, supersession), ``cache``,
``progress`` (``$/progress``, ``window/logMessage``), ``server`` (the features), ``cli``
(``glm5-lsp serve``).
"""
