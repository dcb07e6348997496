"""One call that wires the repair loop with every rule: style, exception templates, the monitor.

``standard_loop(backend, settings, token_strings=..., known_exceptions=...)`` gives a
:class:`~glm5_lsp.repair.loop.RepairLoop` with

- rewriters: the file's style fixes (``style.StyleConsistency.rewrite``) and the narrowing of broad
  ``except`` clauses (``templates.exception_rewriter``, jedi + the document by default);
- penalties: the style breaks left (``StyleConsistency.penalty``);
- warmers: the file's style conventions, read when it opens (``StyleConsistency.profile``), and
  what the decoding monitor reads from the whole file (``monitor.warm_monitor``);
- the decoding monitor for Python (``monitor.python_monitor_factory``) when the vocabulary's token
  strings are given (``Tokenizer.token_strings()``; a backend without internals ignores it anyway);
- the word finisher (``words.finishing_words``): an as-you-type completion with no clean candidate
  may finish the typed word from the names around it;
- the word check (``words.unknown_word``): an as-you-type completion may not finish the typed word
  as a name nothing binds (what the checkers cannot see while the document does not parse).
"""

from __future__ import annotations

from collections.abc import Sequence

from glm5_lsp.backends.base import Backend
from glm5_lsp.checks.providers import DiagnosticRunner
from glm5_lsp.pynames.words import finishing_words, unknown_word
from glm5_lsp.repair.exceptions import (
    CombinedExceptions,
    DocumentExceptions,
    JediExceptions,
    KnownExceptions,
    exception_rewriter,
)
from glm5_lsp.repair.loop import RepairLoop, RepairSettings
from glm5_lsp.repair.monitor import MonitorSettings, python_monitor_factory, warm_monitor
from glm5_lsp.repair.style import StyleConsistency


def standard_loop(backend: Backend, settings: RepairSettings | None = None, *,
                  token_strings: Sequence[str] | None = None, known_exceptions: KnownExceptions | None = None,
                  monitor_settings: MonitorSettings | None = None, runner: DiagnosticRunner | None = None,
                  style: bool = True,
                  exception_fill: bool = True) -> RepairLoop:
    """A repair loop with the style, exception-template and monitor rules attached (see above)."""
    rewriters = []
    penalties = []
    warmers = []
    if style:
        consistency = StyleConsistency()
        rewriters.append(consistency.rewrite)
        penalties.append(consistency.penalty)
        warmers.append(consistency.profile)
    if exception_fill:
        known = known_exceptions or CombinedExceptions([DocumentExceptions(), JediExceptions()])
        rewriters.append(exception_rewriter(known))
    factory = python_monitor_factory(token_strings, monitor_settings) if token_strings is not None else None
    if factory is not None:
        warmers.append(warm_monitor)
    return RepairLoop(backend, settings, runner, rewriters=rewriters, penalties=penalties,
                      monitor_factory=factory, finisher=finishing_words,
                      word_check=unknown_word, warmers=warmers)
