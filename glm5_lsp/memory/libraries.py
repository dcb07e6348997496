"""The memory's libraries: the standard library and the installed distributions a workspace imports.

Built once per set of libraries and kept on disk under the user's cache directory
(``$GLM5_LSP_CACHE_DIR`` or platformdirs', beside the doc index), keyed by the content hash of every
file that went in and of the tokenizer, so every workspace on the machine that imports the same
libraries shares one build, and a library upgrade makes a new one. Two layers: each library's token
ids (``units/``), and the suffix array over a set of them (``shards/``); a workspace importing one
more library re-tokenizes only that one.

A module the workspace defines itself is never a library (a package checked out and installed in
development mode, or a copy of an installed package: its installed files would hold the very lines
being written). Vendored copies and test folders are skipped, and so are files over
``max_file_bytes`` or with lines over ``MAX_LINE_CHARS`` (data, minified code).
"""

from __future__ import annotations

import hashlib
import logging
import re
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import ClassVar

import numpy as np

from glm5_lsp.memory.index import SuffixIndex, release_freed_memory
from glm5_lsp.memory.tokens import Encoder, encode_batch, token_dtype

log = logging.getLogger(__name__)

CACHE_LAYOUT = 1  # bump when the files under the cache change shape
SKIPPED_DIRS = frozenset({"__pycache__", "site-packages", "dist-packages", "test", "tests", "idle_test",
                          "_vendor", "vendor", "vendored", "_vendored", "third_party", "_bundled", "extern"})
MAX_LINE_CHARS = 1_000
_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+([A-Za-z_]\w*)[\w.]*[ \t]+import\b|import[ \t]+([^\n#;]+))", re.MULTILINE)
STDLIB = "python-stdlib"


@dataclass(frozen=True)
class Library:
    """One unit of library code: the standard library or one distribution, with its files."""

    name: str
    version: str
    files: tuple[Path, ...]


def imported_modules(texts: Iterable[str]) -> set[str]:
    """The top-level module names that ``import``/``from ... import`` statements in ``texts`` name
    (relative imports are the workspace's own)."""
    names: set[str] = set()
    for text in texts:
        for match in _IMPORT.finditer(text):
            if match.group(1):
                names.add(match.group(1))
            else:
                for part in match.group(2).split(","):
                    head = part.strip().split(" ")[0].split(".")[0]
                    if head.isidentifier():
                        names.add(head)
    return names


def local_modules(root: Path, files: Iterable[Path]) -> set[str]:
    """Top-level names the workspace itself defines: its top-level ``.py`` files and packages, and
    the same one level down (a ``src/`` layout or a repository holding a package folder)."""
    names: set[str] = set()
    for path in files:
        try:
            parts = path.relative_to(root).parts
        except ValueError:
            continue
        for depth in range(min(2, len(parts))):
            head = parts[depth]
            names.add(head.removesuffix(".py"))
    return names


def stdlib_library(max_file_bytes: int) -> Library:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = tuple(sorted(p for p in root.rglob("*.py") if _keep(p.relative_to(root).parts)
                         and _small(p, max_file_bytes)))
    return Library(STDLIB, sys.version.split()[0], files)


@lru_cache(maxsize=1)
def _distributions_by_module() -> dict[str, list[str]]:
    return {k: list(v) for k, v in metadata.packages_distributions().items()}


def distribution_library(name: str, max_file_bytes: int) -> Library | None:
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    files = []
    for entry in dist.files or ():
        if entry.suffix != ".py" or not _keep(entry.parts):
            continue
        path = Path(dist.locate_file(entry))
        if path.is_file() and _small(path, max_file_bytes):
            files.append(path)
    return Library(dist.metadata.get("Name") or name, dist.version or "", tuple(sorted(files)))


def libraries_for(modules: Iterable[str], local: Iterable[str] = (), max_file_bytes: int = 200_000,
                  stdlib: bool = True) -> list[Library]:
    """The standard library (when ``stdlib``) and each installed distribution that provides one of
    ``modules``, the workspace's own ``local`` names left out."""
    skip = set(local)
    by_module = _distributions_by_module()
    chosen: dict[str, None] = {}
    for module in sorted(set(modules) - skip):
        for dist in by_module.get(module, ()):
            chosen.setdefault(dist)
    out = [stdlib_library(max_file_bytes)] if stdlib else []
    own = {m.lower().replace("_", "-") for m in skip}
    for name in chosen:
        if name.lower().replace("_", "-") in own:
            continue  # the workspace is this distribution (a checkout or a copy)
        library = distribution_library(name, max_file_bytes)
        if library is not None and library.files:
            out.append(library)
    return out


def _keep(parts: Sequence[str]) -> bool:
    return not (set(parts[:-1]) & SKIPPED_DIRS)


def _small(path: Path, max_file_bytes: int) -> bool:
    try:
        return 0 < path.stat().st_size <= max_file_bytes
    except OSError:
        return False


def read_source(path: Path) -> str | None:
    """A file's text when it is UTF-8 source with no very long line, else None."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if any(len(line) > MAX_LINE_CHARS for line in text.splitlines()):
        return None
    return text


class LibraryCache:
    """Library shards on disk (see the module docstring), and in this process once loaded."""

    _loaded: ClassVar[dict[str, SuffixIndex]] = {}  # shared by every workspace memory in the process

    def __init__(self, tokenizer: Encoder, tokenizer_digest: str, root: Path | None = None) -> None:
        from glm5_lsp.disk_cache import default_cache_dir

        self.tokenizer = tokenizer
        self.tokenizer_digest = tokenizer_digest
        self.dir = (root or default_cache_dir()) / f"memory-v{CACHE_LAYOUT}"
        self.dtype = token_dtype(tokenizer.vocab_size)

    def unit_key(self, library: Library) -> tuple[str, list[tuple[str, Path]]]:
        """The content hash of a library (its files' bytes and the tokenizer) and its files'
        ``(key, path)``. The texts are read to be hashed and let go: only a library not cached yet
        reads them again (holding every library's source at once cost a loaded memory 60-100 MB)."""
        digest = hashlib.blake2b(f"{CACHE_LAYOUT}\0{self.tokenizer_digest}\0{library.name}".encode(), digest_size=16)
        docs = []
        for path in library.files:
            text = read_source(path)
            if text is None:
                continue
            digest.update(str(path).encode())
            digest.update(hashlib.blake2b(text.encode(), digest_size=16).digest())
            docs.append((f"{library.name}:{path}", path))
        return digest.hexdigest(), docs

    def shard(self, libraries: Sequence[Library], max_tokens: int,
              progress: Callable[[str, float], None] | None = None) -> tuple[SuffixIndex, dict]:
        """One suffix array over ``libraries`` (at most ``max_tokens`` ids: later libraries are
        dropped past it), loaded from the cache or built and saved; and a report of what it cost."""
        started = time.perf_counter()
        keyed = [(library, *self.unit_key(library)) for library in libraries]
        key = hashlib.blake2b("\0".join([str(max_tokens), *(k for _, k, _ in keyed)]).encode(), digest_size=16).hexdigest()
        report = {"libraries": [f"{lib.name} {lib.version}" for lib, _, _ in keyed], "key": key, "cached": True}
        if key in self._loaded:
            index = self._loaded[key]
        else:
            folder = self.dir / "shards" / key
            index = None
            if (folder / "keys.txt").is_file():
                try:
                    index = SuffixIndex.load(folder)
                except (OSError, ValueError) as error:
                    log.warning("memory cache %s unreadable (%s); rebuilding", folder, error)
            if index is None:
                report["cached"] = False
                docs: list[tuple[str, np.ndarray]] = []
                total = 0
                for number, (library, unit, texts) in enumerate(keyed):
                    if progress is not None:
                        progress(f"tokenizing {library.name}", number / max(len(keyed), 1))
                    unit_docs = self._unit_ids(unit, texts)
                    size = sum(len(ids) + 1 for _, ids in unit_docs)
                    if total + size > max_tokens:
                        log.info("memory: %s left out (the libraries' budget of %d tokens is spent)", library.name, max_tokens)
                        report.setdefault("left_out", []).append(library.name)
                        continue
                    docs.extend(unit_docs)
                    total += size
                if progress is not None:
                    progress("indexing libraries", 0.95)
                release_freed_memory()  # the tokenizer's batches, under the suffix array built next
                index = SuffixIndex.build(docs, self.dtype, consume=True)
                try:
                    index.save(folder)
                except OSError as error:
                    log.warning("cannot cache the libraries' memory at %s (%s)", folder, error)
                release_freed_memory()
            self._loaded[key] = index
        report.update(tokens=len(index), bytes=index.nbytes, seconds=round(time.perf_counter() - started, 3))
        return index, report

    def _unit_ids(self, key: str, docs: list[tuple[str, Path]]) -> list[tuple[str, np.ndarray]]:
        folder = self.dir / "units" / key
        try:
            tokens = np.load(folder / "tokens.npy")
            starts = np.load(folder / "doc_starts.npy")
            keys = (folder / "keys.txt").read_text(encoding="utf-8").split("\n")
            if len(starts) == len(keys) + 1:
                return [(k, tokens[starts[i]:starts[i + 1]]) for i, k in enumerate(keys)]
        except (OSError, ValueError):
            pass
        arrays: list[np.ndarray] = []
        kept: list[tuple[str, Path]] = []
        for start in range(0, len(docs), 128):  # a batch at a time: Python lists of ids are large
            part = [(k, p, read_source(p)) for k, p in docs[start:start + 128]]
            part = [(k, p, t) for k, p, t in part if t is not None]  # gone since it was hashed
            batch = encode_batch(self.tokenizer, [text for _, _, text in part])
            arrays.extend(np.asarray(i, dtype=self.dtype) for i in batch)
            kept.extend((k, p) for k, p, _ in part)
        docs = kept
        starts = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum([len(a) for a in arrays], out=starts[1:])
        try:
            import os
            import tempfile

            folder.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=key + ".tmp"))
            np.save(tmp / "tokens.npy", np.concatenate(arrays) if arrays else np.zeros(0, dtype=self.dtype))
            np.save(tmp / "doc_starts.npy", starts)
            (tmp / "keys.txt").write_text("\n".join(k for k, _ in docs), encoding="utf-8")
            os.replace(tmp, folder)
        except OSError as error:
            log.warning("cannot cache %s's token ids (%s)", key, error)
        return [(k, a) for (k, _), a in zip(docs, arrays)]
