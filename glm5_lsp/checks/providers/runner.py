"""Run a set of providers on a text: each with a time limit, a failing one skipped with a log line.

The same text is often checked twice within a second: a completion checks the document while the
model writes (the repair loop's baseline) and the server checks it again to publish its
diagnostics; repair rounds judge the same candidate again. Complete reports (no provider skipped)
are remembered for the last few texts (``RECENT``), keyed by the provider instances, so every runner
over the same providers shares them.

A provider that raises, or runs past ``timeout_s``, contributes nothing to this call and is named in
``DiagnosisReport.skipped``; the other providers' diagnostics still come back. A provider that may
run on indefinitely (in-process) runs on a daemon thread of its own, so a hung one cannot hold up
the caller (the thread is abandoned); one that stops itself within the time limit (``bounded_s``: a
helper process asked with a deadline) is called in the calling thread while those threads run
(which may then wait for the helper to finish another thread's check first: twice the limit at the
most). A check from a helper takes about a millisecond, and handing it to a thread and back cost
more than that: two checks of a 500-line file, 2.7-3.4 ms on threads against 1.0 ms in the caller
(BENCHMARKS.md, "Checks in the calling thread"). Such a checker with a ``submit`` (the compile
helper, ``ruff server``) is sent its check before any answer is read, so the helpers work at once,
each on its own process, while the caller runs the remaining checkers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import TypeVar

from glm5_lsp.diagnostics import Diagnostic, DiagnosticProvider, sort_diagnostics
from glm5_lsp.lru import LRUCache

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class DiagnosisReport:
    diagnostics: list[Diagnostic] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "name: why" for each provider that gave up


RecentReports = LRUCache[tuple[Diagnostic, ...]]
RECENT: RecentReports = LRUCache(16)  # by (providers, path, language, text); the providers themselves are
# in the key (compared by identity), so a provider's address cannot be reused while its reports are kept


class DiagnosticRunner:
    """The providers for one language family, run together."""

    def __init__(self, providers: Sequence[DiagnosticProvider], timeout_s: float = 10.0,
                 recent: RecentReports | None = RECENT) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.providers = list(providers)
        self.timeout_s = timeout_s
        self.recent = recent

    def diagnose(self, text: str, path: str, language: str) -> DiagnosisReport:
        """Every provider for ``language`` at once (a subprocess checker such as ruff overlaps the
        in-process ones), each within ``timeout_s`` of the start; results in provider order. A text
        checked recently by the same providers is answered from memory."""
        chosen = tuple(provider for provider in self.providers if language in provider.languages)
        key = (chosen, path, language, text)
        if self.recent is not None:
            remembered = self.recent.get(key)
            if remembered is not None:
                return DiagnosisReport(list(remembered))
        report = self._run(chosen, text, path, language)
        if self.recent is not None and not report.skipped:  # a timeout may not happen again: not kept
            self.recent.put(key, tuple(report.diagnostics))
        return report

    def _run(self, providers: Sequence[DiagnosticProvider], text: str, path: str, language: str) -> DiagnosisReport:
        report = DiagnosisReport()
        started = time.monotonic()
        inline = [self.bounded(provider) for provider in providers]
        running: list[tuple[DiagnosticProvider, Future[list[Diagnostic]] | None]] = [
            (provider, None if here else in_background(_diagnostics_of, provider, text, path, language,
                                                       name=f"diagnose-{provider.name}"))
            for provider, here in zip(providers, inline)]
        outcomes: dict[int, tuple[list[Diagnostic], str | None]] = {}
        submitted: dict[int, Callable[[], list[Diagnostic]]] = {}
        try:  # stops itself in time: no thread to hand it to and back from
            for number, (provider, job) in enumerate(running):  # helpers first, all at once
                submit = getattr(provider, "submit", None)
                if job is None and submit is not None:
                    try:
                        submitted[number] = submit(text, path, language)
                    except Exception as error:  # noqa: BLE001 -- any failure of a checker is reported, never raised
                        outcomes[number] = [], _why(error)
            for number, (provider, job) in enumerate(running):  # then the rest here while they work
                if job is None and number not in submitted and number not in outcomes:
                    outcomes[number] = _called(provider.diagnose, text, path, language)
        finally:  # every submitted check is answered, so each lets go of its helper
            for number, answer in submitted.items():
                outcomes[number] = _called(answer)
        for number, (provider, job) in enumerate(running):
            if job is not None:
                outcomes[number] = _outcome(job, max(0.0, started + self.timeout_s - time.monotonic()), self.timeout_s)
        for number, (provider, _job) in enumerate(running):
            found, why = outcomes[number]
            if why is not None:
                log.warning("diagnostic provider %s skipped: %s", provider.name, why)
                report.skipped.append(f"{provider.name}: {why}")
                continue
            report.diagnostics.extend(found)
        report.diagnostics = sort_diagnostics(report.diagnostics)
        return report

    def bounded(self, provider: DiagnosticProvider) -> bool:
        """Whether ``provider`` returns or raises on its own within this runner's time limit."""
        bound = getattr(provider, "bounded_s", None)
        return bound is not None and bound <= self.timeout_s


def _called(fn: Callable[..., Sequence[Diagnostic]], *args: str) -> tuple[list[Diagnostic], str | None]:
    """``fn(*args)``'s diagnostics in the calling thread (a provider's ``diagnose``, or a submitted
    check's answer), as :func:`_outcome` reports a thread's."""
    try:
        return list(fn(*args)), None
    except Exception as error:  # noqa: BLE001 -- any failure of a checker is reported, never raised
        return [], _why(error)


def _why(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def in_background(fn: Callable[..., T], *args: object, name: str = "background") -> Future[T]:
    """``fn(*args)`` on a daemon thread (abandoned, not joined, if nobody waits for it); its result
    or exception through the returned future."""
    future: Future[T] = Future()

    def work() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as error:  # noqa: BLE001 -- handed to whoever asks for the result
            future.set_exception(error)

    threading.Thread(target=work, name=name, daemon=True).start()
    return future


def _diagnostics_of(provider: DiagnosticProvider, text: str, path: str, language: str) -> list[Diagnostic]:
    return list(provider.diagnose(text, path, language))


def _outcome(job: Future[list[Diagnostic]], wait_s: float, timeout_s: float) -> tuple[list[Diagnostic], str | None]:
    """``(diagnostics, None)`` on success, ``([], reason)`` when it raised or ran out of time."""
    try:
        error = job.exception(timeout=wait_s)  # any failure of a checker is reported, never raised
    except FutureTimeout:
        return [], f"timed out after {timeout_s:g}s"
    if error is not None:
        return [], _why(error)
    return job.result(), None
