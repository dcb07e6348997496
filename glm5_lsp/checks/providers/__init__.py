"""Diagnostic providers, one per module, and the set to use for a language.

``default_providers(language)`` returns every provider that can check that language on this
machine: the in-process ones always (compile, tree-sitter, pyflakes), the external tools (ruff,
gcc/g++, node, go) only when ``shutil.which`` finds them. Python's ruff checks go to one long-lived
``ruff server`` (:mod:`.ruff_server`) where pipes can be read with a timeout (POSIX), else to one
``ruff check`` process a check (:mod:`.ruff`); both report the same.
"""

from __future__ import annotations

import functools
import logging

from glm5_lsp.checks.providers.compile import PythonCompileProvider
from glm5_lsp.checks.providers.compile_worker import worker_available
from glm5_lsp.checks.providers.gcc import GccProvider
from glm5_lsp.checks.providers.go_vet import GoVetProvider
from glm5_lsp.checks.providers.node import NodeCheckProvider
from glm5_lsp.checks.providers.pyflakes import PyflakesProvider
from glm5_lsp.checks.providers.ruff import RuffProvider
from glm5_lsp.checks.providers.ruff_server import RuffServerProvider
from glm5_lsp.checks.providers.runner import DiagnosisReport, DiagnosticRunner
from glm5_lsp.checks.providers.tree_sitter import TreeSitterProvider
from glm5_lsp.diagnostics import DiagnosticProvider

log = logging.getLogger(__name__)

__all__ = [
    "DiagnosisReport", "DiagnosticRunner", "GccProvider", "GoVetProvider", "NodeCheckProvider",
    "PyflakesProvider", "PythonCompileProvider", "RuffProvider", "RuffServerProvider", "TreeSitterProvider",
    "default_providers", "default_runner",
]


def default_providers(language: str, use_external: bool = True) -> list[DiagnosticProvider]:
    """Every provider for ``language`` available here (external tools only with ``use_external``).

    For Python, ruff (when installed and allowed) stands in for pyflakes: its ``F`` rules are
    pyflakes' checks, and on a 2,600-line file it takes 9 ms as a fresh ``ruff check`` and about
    4 ms from a running ``ruff server`` (started here, like the compile helper) where pyflakes takes
    90 ms, which every candidate of every completion pays. It stands in for tree-sitter too: its
    parser recovers from a syntax error and reports every one, which is what tree-sitter's error
    nodes add to ``compile`` (the first error only). Both in-process checkers hold the interpreter
    lock for their whole run (20-25 ms on that file), stopping the model's thread, which is also why
    Python's compiler runs in a helper process (:mod:`.compile_worker`).
    """
    providers: list[DiagnosticProvider] = []
    ruff: DiagnosticProvider | None = None
    if language == "python" and use_external:
        try:
            ruff = _python_ruff()
        except FileNotFoundError as exc:
            log.info("no ruff, pyflakes checks Python names: %s", exc)
    if language == "python":
        compiler = PythonCompileProvider(in_worker=True)
        if compiler.worker is not None:
            compiler.worker.start()
        providers += [compiler] if ruff is not None else [compiler, PyflakesProvider()]
    tree_sitter = TreeSitterProvider()
    if language in tree_sitter.languages and ruff is None:
        providers.append(tree_sitter)
    if not use_external:
        return providers
    if ruff is not None:
        return [*providers, ruff]
    external = {
        "c": lambda: GccProvider("c"),
        "cpp": lambda: GccProvider("cpp"),
        "javascript": lambda: NodeCheckProvider(),
        "go": lambda: GoVetProvider(),
    }
    if language in external:
        try:
            providers.append(external[language]())
        except FileNotFoundError as exc:
            log.info("no external checker for %s: %s", language, exc)
    return providers


def _python_ruff() -> DiagnosticProvider:
    """The ruff checks for Python: a ``ruff server`` started now (so the first check does not wait
    for it) where its pipes can be read with a timeout, else ``ruff check`` a check."""
    if not worker_available():
        return RuffProvider()
    server = RuffServerProvider()
    server.start()
    return server


@functools.cache
def _shared_providers(language: str, use_external: bool) -> tuple[DiagnosticProvider, ...]:
    return tuple(default_providers(language, use_external))


def default_runner(language: str, timeout_s: float = 10.0, use_external: bool = True) -> DiagnosticRunner:
    """A runner over this process's shared provider instances for ``language``: every runner made
    here (the repair loop's, the server's own diagnostics') then shares the providers' recent parses
    and the runner's memory of recent reports (``DiagnosticRunner.diagnose``)."""
    return DiagnosticRunner(_shared_providers(language, use_external), timeout_s)
