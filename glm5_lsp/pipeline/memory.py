"""The workspace memory as a session holds it: one per workspace root, reached by path.

:class:`SessionMemory` wraps a :class:`~glm5_lsp.memory.WorkspaceMemory` for the front ends (which
import only the pipeline): documents by path as the editor names them (``update`` on open, change and
save; ``refresh`` for a file changed outside the editor, ``remove`` for one deleted, ``rename``), the
first build of a folder (``index``, slow: the front end runs it off its event loop, with progress,
and may cancel it), and what the pipeline asks of it per request:

- with the in-process model, a logits processor that mixes the memory's next-token estimate into
  the model's and proposes drafts (:meth:`processor`, wrapping the decoding monitor);
- with a served model (no logits), the memory's own continuation, one more candidate the repair loop
  judges like any other (:meth:`continuation`);
- snippets for the prompt: the windows of other edited documents most like the code at the cursor,
  and the text around the memory's longest match in another file (:meth:`snippets`).

The memory indexes Python (its interpolation table was fitted on Python); a request in another
language gets the monitor alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from glm5_lsp.memory import (
    DraftSettings,
    Interpolation,
    MemorySettings,
    ProcessorFactory,
    WorkspaceMemory,
    as_key,
    continuation_text,
)
from glm5_lsp.memory.align import TextMatcher
from glm5_lsp.memory.lines import LineGuess
from glm5_lsp.memory.mixing import bound_text, continue_text
from glm5_lsp.memory.snippets import Snippet, similar_snippets
from glm5_lsp.memory.workspace import keys_under

log = logging.getLogger(__name__)

MEMORY_LANGUAGES = frozenset({"python"})
SNIPPET_LINES = 8  # a prompt's snippet room is a tenth to a fifth of a few hundred tokens
COMPACT_EVERY = 64  # documents moved out of ``hot``: then the edits are folded back into one shard


class IndexCancelled(Exception):
    """The first build was stopped (the server is shutting down, or a newer build began)."""


class SessionMemory:
    """See the module docstring. Thread-safe (the memory holds its own lock)."""

    def __init__(self, tokenizer: Any, settings: MemorySettings | None = None, *, drafts: bool = True,
                 cache_dir: Any = None) -> None:
        self.settings = settings or MemorySettings()
        self.tokenizer = tokenizer
        self.memory = WorkspaceMemory(tokenizer, self.settings, cache_dir=cache_dir)
        self.factory = ProcessorFactory(self.memory, tokenizer, Interpolation.default(self.settings.shorter_suffixes),
                                        drafts=DraftSettings(enabled=drafts))
        self.root: str | None = None
        self.indexed = False  # the first build of ``root`` has finished
        self._builds = 0  # each ``index`` call's number: an older one still running stops
        self._switches = 0
        self._lock = threading.Lock()

    # ---- the first build ----------------------------------------------------------------------

    def index(self, root: str, progress: Callable[[str, int], None] | None = None,
              cancelled: Callable[[], bool] | None = None, recursive: bool = True) -> dict[str, Any]:
        """Index the folder ``root`` (its files, with ``recursive`` those of its folders too, and, per
        the settings, the libraries they import): the memory's stats as a dict. ``progress(message,
        percent)``; ``cancelled()`` polled at each progress step (:class:`IndexCancelled` is raised
        then, the memory left as it was)."""
        with self._lock:
            self._builds += 1
            number = self._builds

        def step(message: str, fraction: float) -> None:
            if number != self._builds or (cancelled is not None and cancelled()):
                raise IndexCancelled(root)
            if progress is not None:
                progress(message, max(0, min(100, round(100 * fraction))))

        started = time.perf_counter()
        stats = self.memory.index_folder(root, progress=step, recursive=recursive)
        self.root, self.indexed = str(root), True
        log.info("workspace memory: %d files, %d tokens, %d library tokens (%s), %.0f MB, built in %.1f s",
                 stats.files, stats.tokens, stats.library_tokens, ", ".join(stats.libraries) or "no libraries",
                 stats.bytes / 1e6, time.perf_counter() - started)
        return stats.to_dict()

    def index_libraries(self) -> dict[str, Any]:
        """No workspace folder (a batch of loose tasks): the standard library alone, per the settings
        (``stdlib``); the memory's stats as a dict."""
        started = time.perf_counter()
        if self.settings.stdlib:
            self.memory.load_libraries((), distributions=False)
        self.indexed = True
        stats = self.memory.stats
        log.info("workspace memory: no folder, %d library tokens (%s), built in %.1f s", stats.library_tokens,
                 ", ".join(stats.libraries) or "no libraries", time.perf_counter() - started)
        return stats.to_dict()

    def cancel(self) -> None:
        """Stop a build that is running (at its next progress step)."""
        with self._lock:
            self._builds += 1

    # ---- documents ----------------------------------------------------------------------------

    def update(self, path: str | None, text: str) -> bool:
        """The document at ``path`` now reads ``text``; False when the memory held that already."""
        key = as_key(path)
        before = self.memory._hot_key
        changed = self.memory.update(key, text)
        if changed and before is not None and before != key:
            self._switches += 1
            if self._switches % COMPACT_EVERY == 0:
                self.memory.compact()
        return changed

    def refresh(self, path: str) -> bool:
        """The file changed (or appeared, or went) outside the editor: read again from disk. A file
        the memory does not index (not Python source) is left out."""
        key = as_key(path)
        if not key.endswith(self.settings.suffixes) and key not in self.memory:
            return False
        return self.memory.refresh(key)

    def remove(self, path: str) -> bool:
        """Forget a deleted file, or every file under a deleted folder."""
        key = as_key(path)
        if key in self.memory:
            return self.memory.remove(key)
        removed = [self.memory.remove(k) for k in keys_under(self.memory, key)]
        return any(removed)

    def rename(self, old: str, new: str) -> None:
        """A file, or a folder and every file under it, moved: their text is kept under the new names."""
        old_key, new_key = as_key(old), as_key(new)
        if old_key in self.memory:
            self.memory.rename(old_key, new_key)
            return
        for key in keys_under(self.memory, old_key):
            self.memory.rename(key, new_key + key[len(old_key):])

    def text_of(self, path: str) -> str | None:
        return self.memory.text_of(as_key(path))

    def __contains__(self, path: str) -> bool:
        return as_key(path) in self.memory

    @property
    def stats(self) -> dict[str, Any]:
        return self.memory.stats.to_dict()

    # ---- per request --------------------------------------------------------------------------

    def applies(self, language: str) -> bool:
        return self.settings.enabled and language in MEMORY_LANGUAGES

    def processor(self, path: str | None, document: str, prefix_end: int, then: Any = None,
                  text: TextMatcher | None = None) -> Any:
        """The mixing processor for a request whose prompt's code ends at ``prefix_end`` of
        ``document`` (the cursor, less a healed word), ``then`` (the decoding monitor) after it;
        ``text``: the request's matcher from :meth:`bound` (otherwise one bound to the prompt's code)."""
        return self.factory(as_key(path), document, prefix_end, then=then, text=text)

    def bound(self, path: str | None, document: str, prefix_end: int, typed: str = "") -> TextMatcher:
        """The memory's matcher for a request, bound to ``document[:prefix_end]`` (``typed``: the healed
        word after it): the up-front continuation and the mixing processor of the same request share
        it (and what it walked)."""
        return bound_text(self.memory, self.tokenizer, as_key(path), document, prefix_end, typed)

    def continuation(self, path: str | None, document: str, offset: int, *, multiline: bool = False,
                     max_tokens: int = 48) -> str:
        """The memory's own continuation at ``offset`` (no model): to the line's end, or for a
        multi-line request up to ``max_tokens`` ids (the pipeline's post-processing cuts the block)."""
        return continuation_text(self.memory, self.tokenizer, as_key(path), document, offset,
                                 max_tokens=max_tokens, stop="" if multiline else "\n")

    def line_guess(self, path: str | None, document: str, offset: int) -> LineGuess | None:
        """How the workspace's other lines go on from the cursor's line (``memory.lines``)."""
        return self.memory.line_guess(as_key(path), document, offset)

    def snippets(self, path: str | None, document: str, offset: int, max_chars: int) -> list[Snippet]:
        if max_chars <= 0:
            return []
        return similar_snippets(self.memory, as_key(path), document, offset, max_chars=max_chars,
                                window_lines=SNIPPET_LINES, stride=SNIPPET_LINES // 2)


@dataclass(frozen=True)
class Recollection:
    """What the memory says at one request's cursor, as insertion text at the repair target's start (the
    healed word's, so a healed word comes first; "" for nothing): its token-level
    continuation and the workspace's lines' most frequent rest (``memory.lines``), with how many of
    those lines go on that way, out of how many that start as the typed one, in how many ways."""

    continuation: str
    line: str
    line_count: int = 0
    line_total: int = 0
    line_distinct: int = 0

    @property
    def agreed(self) -> bool:
        return bool(self.continuation.strip()) and self.continuation.rstrip() == self.line.rstrip()

    def tidied(self, tidy: Callable[[str], str]) -> Recollection:
        """The two views post-processed as a candidate is (``tidy``: the request's post-processing, which
        gives a single-line request's first line), so that a candidate is compared with them, and stood
        in for by them, like with like."""
        return replace(self, continuation=tidy(self.continuation) if self.continuation else "",
                       line=tidy(self.line) if self.line else "")


class _Recall:
    """A :class:`Recollection` per request, computed once however many rules ask (the last request's
    kept). The workspace's lines are asked first (a millisecond); the token-level continuation (tens of
    milliseconds) only when needed: ``agreed`` skips it where the lines say nothing."""

    def __init__(self, memory: SessionMemory) -> None:
        self.memory = memory
        self._key: tuple[Any, Any] | None = None  # (request, target) of what is kept
        self._guess: Any = None
        self._recalled: Recollection | None = None
        self._text: tuple[Any, TextMatcher] | None = None  # (target, its bound matcher)

    def text(self, target: Any) -> TextMatcher:
        """The request's memory matcher, bound to the code before ``target.start`` (the cursor less a
        healed word, where the prompt's code ends): made once per target, shared by the continuation
        below and the mixing processor of each generation for it."""
        kept = self._text
        if kept is None or kept[0] is not target:
            kept = self._text = (target, self.memory.bound(target.path, target.document, target.start,
                                                           target.document[target.start:target.end]))
        return kept[1]

    def _for(self, request: Any, target: Any) -> None:
        if self._key is not None and self._key[0] is request and self._key[1] is target:
            return
        self._key, self._recalled = (request, target), None
        self._guess = self.memory.line_guess(target.path, target.document, target.end)

    def line(self, request: Any, target: Any) -> str:
        """The workspace's lines' rest of the line as insertion text ("" for none)."""
        if not self.memory.applies(target.language):
            return ""
        self._for(request, target)
        return request.forced_prefix + self._guess.rest if self._guess is not None else ""

    def __call__(self, request: Any, target: Any) -> Recollection | None:
        if not self.memory.applies(target.language):
            return None
        self._for(request, target)
        if self._recalled is None:
            multiline = "\n" not in request.stop
            # A healed word (``forced_prefix``) is typed already: the memory goes on after it.
            heal = request.forced_prefix
            max_tokens = min(request.max_tokens, 64)
            if target.document[target.start:target.end] == heal:  # the matcher the generation decodes with
                text = continue_text(self.text(target), self.memory.tokenizer, heal, max_tokens,
                                     stop="" if multiline else "\n")
            else:
                text = self.memory.continuation(target.path, target.document, target.end, multiline=multiline,
                                                max_tokens=max_tokens)
            guess = self._guess
            self._recalled = Recollection(
                heal + text if text else "", heal + guess.rest if guess is not None else "",
                *((guess.count, guess.total, guess.distinct) if guess is not None else ()))
        return self._recalled


def wire_memory(loop: Any, backend: Any, memory: SessionMemory | None) -> None:
    """Attach ``memory`` to a repair loop's rules for ``backend``:

    - where the memory's two views (its token-level continuation and the workspace's lines) give the
      same rest of the line, that answer is checked and shown without asking the model
      (``loop.agreed``);
    - with the in-process model (it has logits) the mixing processor around the decoding monitor, and
      the two views as texts a clean answer may agree with or go on into (``loop.extension``);
    - with a served model the memory's continuation as one more candidate (``loop.alternative``).

    None takes them off."""
    loop.memory_factory = loop.alternative = loop.extension = loop.agreed = loop.recall = None
    if memory is None:
        return
    recall = _Recall(memory)
    loop.recall = recall  # what the memory said, on the loop's result (``RepairResult.recalled``)

    def agreed(request: Any, target: Any) -> str | None:
        if "\n" not in request.stop or not recall.line(request, target):
            return None
        recalled = recall(request, target)
        return recalled.continuation if recalled is not None and recalled.agreed else None

    loop.agreed = agreed
    if getattr(backend, "supports_internals", False):
        def mixing(target: Any, monitor: Any) -> Any:
            if not memory.applies(target.language):
                return monitor
            return memory.processor(target.path, target.document, target.start, then=monitor,
                                    text=recall.text(target))

        def extensions(request: Any, target: Any) -> list[str]:
            recalled = recall(request, target)
            if recalled is None:
                return []
            return [recalled.continuation, recalled.line] if "\n" in request.stop else [recalled.continuation]

        loop.memory_factory = mixing
        loop.extension = extensions  # where the model stopped short of what the workspace says
        return

    def continuation(request: Any, target: Any) -> str | None:
        recalled = recall(request, target)
        return recalled.continuation if recalled is not None and recalled.continuation else None

    loop.alternative = continuation
