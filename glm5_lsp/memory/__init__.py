"""The workspace memory: the workspace's files and its libraries as the model's token ids, indexed
for longest-suffix matches, mixed into decoding and offered as drafts.

- :mod:`~glm5_lsp.memory.tokens`: a text's ids chunk by chunk (edits re-tokenize what they touch);
- :mod:`~glm5_lsp.memory.index`: a suffix array over documents (``SuffixIndex``) and the scanned
  document being edited (``ScanIndex``);
- :mod:`~glm5_lsp.memory.matcher`: the longest suffix of a growing context over all shards;
- :mod:`~glm5_lsp.memory.align`: the estimate in the model's tokens wherever the text ends;
- :mod:`~glm5_lsp.memory.workspace`: ``WorkspaceMemory`` (documents, shards, libraries, sizes);
- :mod:`~glm5_lsp.memory.libraries`: the standard library and imported distributions, cached on disk;
- :mod:`~glm5_lsp.memory.mixing`: the interpolation table, the logits processor, drafts, and the
  memory's own continuation for a served model;
- :mod:`~glm5_lsp.memory.snippets`: the chunks of other documents most like the code at the cursor;
- :mod:`~glm5_lsp.memory.lines`: the workspace's lines counted, for how the typed line goes on
  (``WorkspaceMemory.line_guess``);
- :mod:`~glm5_lsp.memory.fit`: the table fitted on ``BENCHMARK_FIT`` packages;
- :mod:`~glm5_lsp.memory.heldout`: those packages as workspaces, and seeded cursors.

Wiring (what the server and the pipeline need, in their own files):

1. One ``WorkspaceMemory(tokenizer, MemorySettings(...))`` per workspace root, the tokenizer being
   the local backend's (``backend.tokenizer``; with a served model, the embedded model's:
   ``load_tokenizer(default_model_path())``). Build it off the event loop:
   ``memory.index_folder(root, progress=fn)`` (``fn(message, fraction)``: map onto ``$/progress``);
   ``glm5-lsp index`` can call the same to fill the libraries' disk cache ahead of time.
2. ``didOpen``/``didChange``/``didSave``: ``memory.update(key, text)`` with ``key = as_key(path)``
   (cheap: only the changed lines are re-tokenized). ``didClose``: nothing (the text stays).
   ``workspace/didChangeWatchedFiles``: created or changed -> ``memory.refresh(key)`` (re-read from
   disk), deleted -> ``memory.remove(key)``; ``workspace/didRenameFiles`` -> ``memory.rename(old, new)``.
   Now and then (idle), ``memory.compact()`` folds edits back into one shard.
3. Per completion request (the repair loop's ``_prepare``): with ``factory = ProcessorFactory(memory,
   tokenizer)``, ``processor = factory(as_key(target.path), target.document, target.start,
   then=monitor)`` where ``monitor`` is what ``monitor_factory(target)`` gives today (None where
   the monitor is off). The processor forwards ``expect_word`` and ``time_left`` to the monitor.
   Order: mixing, then the monitor, then token healing's forced prefix (the local backend wraps it).
   The local backend binds the prompt and verifies drafts itself (``LocalBackend.drafts``).
   ``benchmarks/lines.py``'s ``Mixed`` does exactly this through the server's own ``Engine``.
4. With a served model (no logits): ``continuation_text(memory, tokenizer, key, document, offset)``
   is one more candidate for the repair loop to judge.
5. Settings: ``memory.enabled`` (``MemorySettings.enabled``), ``memory.libraries``,
   ``memory.stdlib``, ``memory.maxFiles``, ``memory.maxLibraryTokens``; ``memory.drafts``
   (``DraftSettings.enabled``).
6. Snippets for the prompt: ``similar_snippets(memory, key, document, offset, max_chars)``.
"""

from glm5_lsp.memory.mixing import (
    DraftSettings,
    Interpolation,
    MemoryProcessor,
    ProcessorFactory,
    continuation_text,
)
from glm5_lsp.memory.workspace import MemorySettings, MemoryStats, WorkspaceMemory, as_key

__all__ = [
    "DraftSettings",
    "Interpolation",
    "MemoryProcessor",
    "MemorySettings",
    "MemoryStats",
    "ProcessorFactory",
    "WorkspaceMemory",
    "as_key",
    "continuation_text",
]
