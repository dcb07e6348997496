"""Watching a generation as it streams: end a multi-line one once it leaves its block, and one caught
in a loop where the repetition began.

The repair loop sends each round's request through a :class:`BlockWatch` (``LoopTask.watch``): the
text streams through it (and on to the caller's ``on_text``); once
:func:`~glm5_lsp.postprocess.cut_at_block_end` would cut it, the generation is cancelled and reported
as a normal ``stop``. So is a generation caught in a loop
(:func:`~glm5_lsp.postprocess.repetition_start`: ``_to_to_to_to_to``), its text cut where the
repetition began.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from glm5_lsp.backends.base import Backend, Completion, CompletionRequest
from glm5_lsp.postprocess import cut_at_block_end, repetition_start, strip_special_tokens


class BlockWatch:
    """Stop rule for one request: ``multiline`` text ends with the block that ``block_prefix``'s last
    line opens (``language``'s rules); any text ends where it starts repeating itself."""

    def __init__(self, multiline: bool, block_prefix: str, language: str,
                 on_text: Callable[[str], None] | None = None) -> None:
        self.multiline = multiline
        self.block_prefix = block_prefix
        self.language = language
        self.on_text = on_text

    def complete(self, backend: Backend, request: CompletionRequest) -> Completion:
        """``backend.complete(request)``, watched."""
        streamed: list[str] = []
        done = [False]
        outer_cancel = request.should_cancel

        def watch(piece: str) -> None:
            streamed.append(piece)
            if self.on_text is not None:
                self.on_text(piece)
            if done[0]:
                return
            text = strip_special_tokens("".join(streamed))
            if repetition_start(text) is not None:
                done[0] = True  # stuck: the rest would be more of the same
            elif self.multiline and "\n" in text.lstrip("\n"):
                done[0] = len(cut_at_block_end(text, self.block_prefix, self.language)) < len(text.rstrip())

        def cancel() -> bool:
            return done[0] or bool(outer_cancel and outer_cancel())

        completion = backend.complete(replace(request, on_text=watch, should_cancel=cancel))
        if done[0] and completion.finish_reason == "cancelled":
            completion = replace(completion, finish_reason="stop")
        stuck = repetition_start(completion.text)
        if stuck is not None:
            completion = replace(completion, text=completion.text[:stuck], finish_reason="stop")
        return completion
