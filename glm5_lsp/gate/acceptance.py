"""The acceptance log: which shown suggestions the user kept, written locally, never sent anywhere.

One JSON object per line in ``<user data dir>/glm5-lsp/acceptance.jsonl`` (platformdirs; rotated to
``acceptance.1.jsonl`` past :data:`MAX_BYTES`), off with the setting that turns it off (the server
then makes no :class:`AcceptanceLog`, or one with ``enabled=False``, which writes nothing). Records:

- ``{"v": 1, "event": "shown", "id", "t", "language", "score", "threshold", "chars", "lines", "model",
  "features": {name: number or null}}``: a suggestion the editor was sent;
- ``{"v": 1, "event": "accepted", "id", "t"}``: the inline item's ``command`` ran (the user took it);
- ``{"v": 1, "event": "typed_over", "id", "t"}``: the user typed something else where it was shown;
- ``{"v": 1, "event": "removed", "id", "t", "after_s"}``: accepted, then deleted or rewritten within
  :data:`RETENTION_S` seconds.

No code and no file names are written: the features are numbers. :func:`read_outcomes` turns the
records into one :class:`Outcome` per suggestion: kept when accepted and not removed; not kept when
typed over, removed, or never accepted within :data:`RETENTION_S` of being shown. Suggestions still
undecided (shown or accepted less than that before the log's last record) are left out.

:class:`SuggestionTracker` is what the server drives: ``shown`` when it answers with a suggestion,
``accepted`` from the item's command, ``changed`` on every ``didChange`` (the document's new text),
which records ``typed_over`` and ``removed``.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glm5_lsp.textdiff import diff_region

log = logging.getLogger(__name__)

VERSION = 1
RETENTION_S = 30.0  # accepted then removed within this long: not kept (Copilot's retention check)
MAX_BYTES = 20 * 1024 * 1024
FILE_NAME = "acceptance.jsonl"
EVENTS = ("shown", "accepted", "typed_over", "removed")
KEPT_SIMILARITY = 0.5  # accepted text later edited: kept while what stands there is at least this like it


def default_log_path() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("glm5-lsp", appauthor=False)) / FILE_NAME


def _clean_number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return round(number, 6) if math.isfinite(number) else None


class AcceptanceLog:
    """Appends records to the log file (one line each, written whole). Thread-safe. A write that fails
    (a full disk, a read-only home) is logged once and the log turns itself off: the editor never
    notices."""

    def __init__(self, path: str | Path | None = None, *, enabled: bool = True, max_bytes: int = MAX_BYTES,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path) if path is not None else default_log_path()
        self.enabled = enabled
        self.max_bytes = max_bytes
        self.clock = clock
        self._lock = threading.Lock()

    def write(self, event: str, suggestion: str, **fields: Any) -> None:
        if event not in EVENTS:
            raise ValueError(f"unknown acceptance event {event!r} (one of {', '.join(EVENTS)})")
        if not self.enabled:
            return
        record = {"v": VERSION, "event": event, "id": suggestion, "t": round(self.clock(), 3), **fields}
        line = json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n"
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                if self.path.exists() and self.path.stat().st_size + len(line) > self.max_bytes:
                    self.path.replace(self.path.with_name(self.path.stem + ".1" + self.path.suffix))
                with self.path.open("a", encoding="utf-8") as handle:
                    handle.write(line)
            except OSError as error:
                log.warning("the acceptance log cannot be written (%s): it is off until the server restarts", error)
                self.enabled = False

    def shown(self, suggestion: str, *, features: Mapping[str, float], score: float | None, threshold: float | None,
              text: str, language: str, model: str | None = None) -> None:
        self.write("shown", suggestion, language=language, score=_clean_number(score),
                   threshold=_clean_number(threshold), chars=len(text), lines=text.count("\n") + 1, model=model,
                   features={k: _clean_number(v) for k, v in features.items()})

    def accepted(self, suggestion: str) -> None:
        self.write("accepted", suggestion)

    def typed_over(self, suggestion: str) -> None:
        self.write("typed_over", suggestion)

    def removed(self, suggestion: str, after_s: float) -> None:
        self.write("removed", suggestion, after_s=round(after_s, 3))


@dataclass
class Outcome:
    """One shown suggestion and whether it was kept."""

    id: str
    kept: bool
    shown_at: float
    features: dict[str, float | None] = field(default_factory=dict)
    score: float | None = None
    language: str = ""
    model: str | None = None
    why: str = ""  # "accepted", "typed_over", "removed", "ignored"


def read_records(path: str | Path) -> Iterator[dict[str, Any]]:
    """The log's records, oldest first (the rotated file's first); lines that are not records are skipped."""
    path = Path(path)
    for part in (path.with_name(path.stem + ".1" + path.suffix), path):
        if not part.is_file():
            continue
        with part.open(encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a crash
                if isinstance(record, dict) and record.get("v") == VERSION and record.get("event") in EVENTS \
                        and isinstance(record.get("id"), str) and isinstance(record.get("t"), (int, float)):
                    yield record


def read_outcomes(path: str | Path, retention_s: float = RETENTION_S, now: float | None = None) -> list[Outcome]:
    """One outcome per shown suggestion that is decided by ``now`` (by default the last record's time)."""
    shown: dict[str, dict[str, Any]] = {}
    accepted: dict[str, float] = {}
    ended: dict[str, str] = {}
    last = 0.0
    for record in read_records(path):
        key, t = record["id"], float(record["t"])
        last = max(last, t)
        event = record["event"]
        if event == "shown":
            shown[key] = record
        elif key not in shown:
            continue
        elif event == "accepted":
            accepted.setdefault(key, t)
        elif event in ("typed_over", "removed"):
            ended.setdefault(key, event)
    now = last if now is None else now
    out = []
    for key, record in shown.items():
        t = float(record["t"])
        if key in ended and not (ended[key] == "typed_over" and key in accepted):
            kept, why = False, ended[key]
        elif key in accepted:
            if now - accepted[key] < retention_s:
                continue  # may still be removed
            kept, why = True, "accepted"
        elif now - t >= retention_s:
            kept, why = False, "ignored"
        else:
            continue  # may still be accepted
        features = record.get("features") if isinstance(record.get("features"), dict) else {}
        out.append(Outcome(key, kept, t, dict(features), _clean_number(record.get("score")),
                           str(record.get("language", "")), record.get("model"), why))
    return out


@dataclass
class _Pending:
    uri: str
    start: int  # where the suggestion goes (the cursor) in the document's current text
    text: str
    shown_at: float
    accepted_at: float | None = None
    typed: str = ""  # typed over the suggestion's start so far (typing it through is not typing over)
    inserted: bool = False  # accepted and in the document (the editor's edit may come before or after the command)


class SuggestionTracker:
    """Follows shown suggestions through the document's changes and writes what became of them.

    ``shown(uri, text, offset, suggestion_text, ...)`` -> an id (for the inline item's ``command``);
    ``accepted(id)``; ``changed(uri, new_text)`` on every change. A shown suggestion the user types
    past differently is ``typed_over``; typing its first characters is not (the suggestion still
    stands). An accepted one whose text is deleted or rewritten (less than :data:`KEPT_SIMILARITY` like
    it) within :data:`RETENTION_S` is ``removed``; after that it is no longer followed.
    """

    def __init__(self, log: AcceptanceLog, *, clock: Callable[[], float] = time.time,
                 retention_s: float = RETENTION_S) -> None:
        self.log = log
        self.clock = clock
        self.retention_s = retention_s
        self._pending: dict[str, _Pending] = {}
        self._texts: dict[str, str] = {}
        self._lock = threading.Lock()

    def shown(self, uri: str, document: str, offset: int, text: str, *, features: Mapping[str, float],
              score: float | None, threshold: float | None, language: str, model: str | None = None) -> str:
        key = uuid.uuid4().hex[:16]
        with self._lock:
            for other, pending in list(self._pending.items()):
                if pending.uri == uri and pending.accepted_at is None:
                    del self._pending[other]  # a newer suggestion replaces one not taken ("ignored" when read)
            self._pending[key] = _Pending(uri, offset, text, self.clock())
            self._texts[uri] = document
        self.log.shown(key, features=features, score=score, threshold=threshold, text=text, language=language,
                       model=model)
        return key

    def accepted(self, key: str) -> bool:
        """The item's command ran; False for an id no longer followed."""
        with self._lock:
            pending = self._pending.get(key)
            if pending is None or pending.accepted_at is not None:
                return False
            pending.accepted_at = self.clock()
            pending.inserted = pending.typed == pending.text  # the editor's edit came first
        self.log.accepted(key)
        return True

    def changed(self, uri: str, document: str) -> None:
        """The document's new text (after a ``didChange``)."""
        now = self.clock()
        events: list[tuple[str, str, float]] = []
        with self._lock:
            old = self._texts.get(uri)
            self._texts[uri] = document
            if old is None or old == document:
                return
            start, end, inserted = diff_region(old, document)
            for key, pending in list(self._pending.items()):
                if pending.uri != uri:
                    continue
                if pending.accepted_at is None:
                    verdict = self._before_accept(pending, start, end, inserted)
                else:
                    verdict = self._after_accept(pending, start, end, inserted, document, now)
                if verdict is not None:
                    del self._pending[key]
                    if verdict:
                        events.append((verdict, key, now - (pending.accepted_at or now)))
        for event, key, after in events:
            if event == "typed_over":
                self.log.typed_over(key)
            else:
                self.log.removed(key, after)

    def _before_accept(self, pending: _Pending, start: int, end: int, inserted: str) -> str | None:
        """'' to stop following (the suggestion went away), 'typed_over', or None (still shown)."""
        if end <= pending.start and start < pending.start:  # an edit above: the cursor moves with it
            pending.start += len(inserted) - (end - start)
            return None
        if start == pending.start + len(pending.typed) and end == start:  # typed (or inserted) at the suggestion
            typed = pending.typed + inserted
            if pending.text.startswith(typed):
                pending.typed = typed  # all of it: the editor inserted it (the command follows) or it was typed
                return None
            return "typed_over"
        if start > pending.start + len(pending.typed):
            return None  # an edit after it (another line): it still stands
        return "typed_over" if pending.typed else ""  # deleted back, or an edit elsewhere moved the cursor

    def _after_accept(self, pending: _Pending, start: int, end: int, inserted: str, document: str,
                      now: float) -> str | None:
        if pending.accepted_at is not None and now - pending.accepted_at > self.retention_s:
            return ""  # kept: no longer followed
        if not pending.inserted:
            done = len(pending.typed)
            if start == end == pending.start + done and inserted == pending.text[done:]:
                pending.inserted = True  # the accepted text going in
                return None
            pending.inserted = True  # something else happened first: judge the document as it is
        span_end = pending.start + len(pending.text)
        if end <= pending.start and (start < pending.start or start == end):  # above it
            pending.start += len(inserted) - (end - start)
            return None
        if start >= span_end:  # after it (typing on after the accepted text)
            return None
        # the edit touches the accepted text: what stands there now
        new_end = span_end + len(inserted) - (end - start)
        region = document[min(pending.start, start): max(new_end, start + len(inserted))]
        from glm5_lsp.gate.labels import edit_similarity

        if pending.text in region or edit_similarity(region[: 2 * len(pending.text) + 8], pending.text) >= KEPT_SIMILARITY:
            pending.start = min(pending.start, start) + max(0, region.find(pending.text))
            return None
        return "removed"

    def follows(self, uri: str) -> bool:
        """Whether a suggestion in ``uri`` is followed (its changes matter: :meth:`changed`)."""
        with self._lock:
            return any(pending.uri == uri for pending in self._pending.values())

    def current(self, uri: str, offset: int, text: str) -> str | None:
        """The id of the suggestion not yet accepted whose rest at ``offset`` is ``text`` (the same
        suggestion asked for again, or its rest while the user types it through), or None."""
        with self._lock:
            for key, pending in self._pending.items():
                done = len(pending.typed)
                if pending.uri == uri and pending.accepted_at is None and offset == pending.start + done \
                        and pending.text[done:] == text:
                    return key
        return None

    def forget(self, uri: str) -> None:
        """A closed document: its suggestions are no longer followed (decided by time when read)."""
        with self._lock:
            for key, pending in list(self._pending.items()):
                if pending.uri == uri:
                    del self._pending[key]
            self._texts.pop(uri, None)

    def expire(self) -> None:
        """Forget suggestions past the retention time (accepted ones are kept; unaccepted ones ignored)."""
        now = self.clock()
        with self._lock:
            for key, pending in list(self._pending.items()):
                since = pending.accepted_at if pending.accepted_at is not None else pending.shown_at
                if now - since > self.retention_s:
                    del self._pending[key]
