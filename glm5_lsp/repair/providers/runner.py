"""Run a set of providers on a text: each with a time limit, a failing one skipped with a log line.

The providers run concurrently. A provider that raises, or runs past ``timeout_s``, contributes nothing to this call and is named in
``DiagnosisReport.skipped``; the other providers' diagnostics still come back. In-process providers
run on a daemon worker thread so a hung one cannot hold up the caller (the thread is abandoned).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from glm5_lsp.repair.diagnostics import Diagnostic, DiagnosticProvider, sort_diagnostics

log = logging.getLogger(__name__)


@dataclass
class DiagnosisReport:
    diagnostics: list[Diagnostic] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "name: why" for each provider that gave up


class DiagnosticRunner:
    """The providers for one language family, run together."""

    def __init__(self, providers: Sequence[DiagnosticProvider], timeout_s: float = 10.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.providers = list(providers)
        self.timeout_s = timeout_s

    def diagnose(self, text: str, path: str, language: str) -> DiagnosisReport:
        """Every provider for ``language`` at once (a subprocess checker such as ruff overlaps the
        in-process ones), each within ``timeout_s`` of the start; results in provider order."""
        report = DiagnosisReport()
        started = time.monotonic()
        running = [(provider, _start(provider, text, path, language))
                   for provider in self.providers if language in provider.languages]
        for provider, (worker, box) in running:
            worker.join(max(0.0, started + self.timeout_s - time.monotonic()))
            found, why = _outcome(worker, box, self.timeout_s)
            if why is not None:
                log.warning("diagnostic provider %s skipped: %s", provider.name, why)
                report.skipped.append(f"{provider.name}: {why}")
                continue
            report.diagnostics.extend(found)
        report.diagnostics = sort_diagnostics(report.diagnostics)
        return report


def _start(provider: DiagnosticProvider, text: str, path: str, language: str
           ) -> tuple[threading.Thread, dict[str, object]]:
    """The provider running on a daemon thread, and the box its result or error will land in."""
    box: dict[str, object] = {}

    def work() -> None:
        try:
            box["result"] = list(provider.diagnose(text, path, language))
        except BaseException as exc:  # noqa: BLE001 -- any failure of a checker is reported, never raised
            box["error"] = exc

    worker = threading.Thread(target=work, name=f"diagnose-{provider.name}", daemon=True)
    worker.start()
    return worker, box


def _outcome(worker: threading.Thread, box: dict[str, object], timeout_s: float
             ) -> tuple[list[Diagnostic], str | None]:
    """``(diagnostics, None)`` on success, ``([], reason)`` when it raised or ran out of time."""
    if worker.is_alive():
        return [], f"timed out after {timeout_s:g}s"
    if "error" in box:
        exc = box["error"]
        return [], f"{type(exc).__name__}: {exc}"
    return box["result"], None  # type: ignore[return-value]
