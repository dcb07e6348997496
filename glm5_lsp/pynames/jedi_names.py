"""Python imports resolved with jedi: what ``json.dumps`` or ``from os import path`` refers to.

Jedi is accurate but slow when cold (0.3-2 s for a first lookup), so nothing on the keystroke path
calls it: :meth:`JediResolver.cached` answers from memory, and :meth:`JediResolver.resolve` (called
from warm-up and indexing) fills the memory and disk caches. Results are keyed by the dotted target
name and the interpreter version, so a restart does not ask jedi again. Names jedi cannot resolve are
remembered as such and never raise.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from glm5_lsp.disk_cache import JsonCache
from glm5_lsp.pynames import jedi

log = logging.getLogger(__name__)
_MAX_SIGNATURE = 240
_MAX_DOC = 400


@dataclass(frozen=True)
class ResolvedName:
    """A dotted name as jedi sees it. ``kind`` is jedi's type (module, class, function, instance...)."""

    target: str
    kind: str
    signatures: tuple[str, ...]
    doc: str  # first paragraph of the docstring
    found: bool = True
    module_path: str = ""  # where the definition lives ('' for compiled code)
    line: int = 0  # its 1-based line there (0: unknown)

    def render(self) -> str:
        """One source-like line: ``def json.dumps(obj, *, skipkeys=False, ...) -> str``."""
        if not self.found:
            return ""
        head = self.target.rsplit(".", 1)[0] + "." if "." in self.target else ""
        if self.signatures:
            sig = head + self.signatures[0]
            keyword = "class " if self.kind == "class" else "def "
            line = keyword + sig
        else:
            line = ("import " if self.kind == "module" else "") + self.target
        return line if len(line) <= _MAX_SIGNATURE else line[: _MAX_SIGNATURE - 3] + "..."


class JediResolver:
    """Resolves dotted names with jedi, caching answers in memory and on disk."""

    def __init__(self, workspace_root: str | os.PathLike[str] | None, cache_dir: str | os.PathLike[str] | None = None):
        self.root = Path(workspace_root) if workspace_root else None
        self._disk = JsonCache(cache_dir, f"jedi-py{sys.version_info[0]}{sys.version_info[1]}")
        self._memory: dict[str, ResolvedName] = {}
        self._members: dict[str, list[str]] = {}
        self._unknown: set[str] = set()  # targets with no disk record yet (saves a disk read per keystroke)
        self._lock = threading.Lock()
        self._project = None

    def cached(self, target: str) -> ResolvedName | None:
        """The answer if already known (memory or disk); never calls jedi."""
        hit = self._memory.get(target)
        if hit is None and target not in self._unknown:
            data = self._disk.get(_key(target))
            if data is None:
                self._unknown.add(target)
            if data is not None:
                hit = ResolvedName(data["target"], data["kind"], tuple(data["signatures"]), data["doc"], data["found"],
                                   data.get("module_path", ""), data.get("line", 0))
                self._memory[target] = hit
        return hit

    def resolve(self, target: str) -> ResolvedName:
        """Resolve ``target`` (e.g. ``os.path.join``), asking jedi when it is not cached."""
        hit = self.cached(target)
        if hit is not None:
            return hit
        with self._lock:
            resolved = self._ask_jedi(target)
        self._memory[target] = resolved
        self._unknown.discard(target)
        self._disk.put(_key(target), asdict(resolved))
        return resolved

    def members(self, target: str) -> list[str]:
        """Public attribute names of a module or class (``[]`` when jedi cannot resolve it)."""
        if target in self._members:
            return self._members[target]
        data = self._disk.get(_key("members:" + target))
        if data is None:
            with self._lock:
                data = self._complete(target)
            self._disk.put(_key("members:" + target), data)
        self._members[target] = list(data)
        return self._members[target]

    # -- jedi -------------------------------------------------------------------------------
    def _script(self, code: str):
        if self._project is None and self.root is not None:
            self._project = jedi.project(self.root)
        return jedi.script(code, project=self._project)

    @jedi.one_at_a_time
    def _ask_jedi(self, target: str) -> ResolvedName:
        module = target.rpartition(".")[0]
        code = f"import {module}\n{target}" if module else f"import {target}\n{target}"
        try:
            names = self._script(code).infer(2, len(target))
        except Exception as err:  # noqa: BLE001 - jedi raises many kinds of errors on odd code; never fatal
            log.info("jedi could not resolve %s (%s)", target, err)
            names = []
        if not names:
            return ResolvedName(target, "", (), "", found=False)
        name = names[0]
        try:
            signatures = tuple(s.to_string() for s in name.get_signatures()[:2])
            doc = name.docstring(raw=True).strip().split("\n\n", 1)[0][:_MAX_DOC]
        except Exception as err:  # noqa: BLE001 - never fatal
            log.info("jedi failed on the signature of %s (%s)", target, err)
            signatures, doc = (), ""
        try:  # follow the import to the definition itself
            definition = (name.goto(follow_imports=True) or [name])[0]
        except Exception:  # noqa: BLE001 - never fatal
            definition = name
        path = definition.module_path
        return ResolvedName(target, name.type, signatures, doc, True, str(path) if path else "", definition.line or 0)

    @jedi.one_at_a_time
    def _complete(self, target: str) -> list[str]:
        module = target.split(".")[0]
        code = f"import {module}\n{target}."
        try:
            completions = self._script(code).complete(2, len(target) + 1)
        except Exception as err:  # noqa: BLE001 - never fatal
            log.info("jedi could not list members of %s (%s)", target, err)
            return []
        return sorted({c.name for c in completions if not c.name.startswith("_")})


def _key(target: str) -> str:
    from glm5_lsp.disk_cache import content_hash

    return content_hash(target.encode("utf-8"))
