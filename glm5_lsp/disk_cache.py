"""The on-disk cache: small JSON records keyed by content hash, under the user's cache directory.

Location: the ``cache_dir`` argument, else ``$GLM5_LSP_CACHE_DIR``, else
``platformdirs.user_cache_dir("glm5-lsp")``. Writes are atomic (temp file + rename), so a crash
or a second server never leaves a half-written record; an unreadable record is treated as a miss.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CACHE_ENV = "GLM5_LSP_CACHE_DIR"
# Bump when the layout of cached records changes; old records are then ignored.
CACHE_VERSION = 1


def default_cache_dir() -> Path:
    """``$GLM5_LSP_CACHE_DIR`` if set, else the platform's user cache directory for glm5-lsp."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("glm5-lsp"))


def write_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it renamed into place: a reader in
    another process sees the old file or the new one, never a part of one. The temporary file is
    removed when writing fails; the error (``OSError``) is the caller's."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.fspath(path)) or ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def content_hash(data: bytes) -> str:
    """A short, stable digest of a file's bytes (the cache key)."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class JsonCache:
    """A directory of JSON records, one file per key, in a versioned namespace."""

    def __init__(self, root: str | os.PathLike[str] | None, namespace: str) -> None:
        base = Path(root) if root is not None else default_cache_dir()
        self.dir = base / f"v{CACHE_VERSION}" / namespace

    def _path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.json"

    def get(self, key: str) -> Any | None:
        path = self._path(key)
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            log.warning("cache record %s is unreadable (%s); ignoring it", path, err)
            return None

    def put(self, key: str, value: Any) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, json.dumps(value, separators=(",", ":")).encode("utf-8"))
        except OSError as err:
            log.warning("cannot write cache record %s (%s); continuing without it", path, err)
