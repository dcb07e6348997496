"""The training log: one JSON object per line, flushed as it goes, readable while a run is going."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class RunLog:
    """Append-only JSONL: every record has ``kind`` and ``time`` (seconds since the log was opened)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._start = time.monotonic()
        self._handle = path.open("a", encoding="utf-8")

    def write(self, kind: str, **fields: Any) -> dict[str, Any]:
        record = {"kind": kind, "time": round(time.monotonic() - self._start, 3), **fields}
        self._handle.write(json.dumps(record, default=str) + "\n")
        self._handle.flush()
        return record

    def close(self) -> None:
        self._handle.close()


def read_log(path: Path) -> list[dict[str, Any]]:
    """All records of a log (a torn last line from a killed run is skipped)."""
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
