"""Reading workspace files safely: size limit, binary detection, UTF-8 with replacement.

Every skip or lossy decode is logged once with the path, so a bad file never loses the rest of
the workspace and never goes silently missing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 1 << 20  # files over 1 MiB are skipped
_SNIFF_BYTES = 8192

# Directories never worth indexing (virtual environments, build output, VCS, caches).
SKIP_DIRS = frozenset(
    {
        ".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", "venv", "env", ".tox", ".nox",
        ".mypy_cache", ".pytest_cache", ".ruff_cache", "build", "dist", "target", "site-packages",
        ".idea", ".vscode", ".eggs",
    }
)


@dataclass(frozen=True)
class Source:
    """A file's decoded text plus what was lost on the way (``lossy``: invalid UTF-8 was replaced)."""

    path: Path
    text: str
    data: bytes
    lossy: bool


def is_binary(data: bytes) -> bool:
    """A NUL byte in the first 8 KiB marks a binary file (what git and grep do)."""
    return b"\0" in data[:_SNIFF_BYTES]


def decode(data: bytes, path: str | os.PathLike[str] = "<buffer>") -> tuple[str, bool]:
    """UTF-8 text of ``data`` (a BOM is dropped); invalid bytes become U+FFFD and are logged."""
    try:
        return data.decode("utf-8-sig"), False
    except UnicodeDecodeError as err:
        log.warning("%s: not valid UTF-8 (%s); decoding with replacement characters", path, err.reason)
        return data.decode("utf-8-sig", errors="replace"), True


def read_source(path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES) -> Source | None:
    """Read one file for indexing, or return ``None`` (with a log line) when it must be skipped."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            log.info("%s: skipped, %d bytes is over the %d-byte limit", path, size, max_bytes)
            return None
        data = path.read_bytes()
    except OSError as err:
        log.info("%s: skipped, cannot read (%s)", path, err)
        return None
    if is_binary(data):
        log.info("%s: skipped, binary file", path)
        return None
    text, lossy = decode(data, path)
    return Source(path, text, data, lossy)


def walk_files(root: str | os.PathLike[str], suffixes: frozenset[str] | None = None) -> Iterator[Path]:
    """Files under ``root`` in a stable order, skipping hidden and build/VCS/venv directories."""
    root = Path(root)
    if root.is_file():
        yield root
        return
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            if suffixes is None or Path(name).suffix.lower() in suffixes:
                yield Path(dirpath, name)
