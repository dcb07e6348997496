"""The rest of a suggestion the user is typing through, answered without the model (``TypedThrough``).
A repeated completion request is answered by ``glm5_lsp.lru.LRUCache``."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable


class TypedThrough:
    """The suggestion last shown per key (document, request kind): when the user types its first
    characters, the rest of it is still the answer, at once and without the model.

    It is exactly as checked as when it was shown: the document with the typed characters plus the
    rest is the document the whole suggestion made. Only the text around the cursor is compared
    (by length and hash), so nothing else may have changed in between.
    """

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._shown: OrderedDict[Hashable, tuple[int, int, int, str]] = OrderedDict()

    def remember(self, key: Hashable, document: str, offset: int, text: str) -> None:
        if not text:
            self._shown.pop(key, None)
            return
        self._shown[key] = (offset, hash(document[:offset]), hash(document[offset:]), text)
        self._shown.move_to_end(key)
        while len(self._shown) > self.size:
            self._shown.popitem(last=False)

    def forget(self, matches: Callable[[Hashable], bool]) -> None:
        """Drop the suggestions whose key ``matches`` (a closed document's)."""
        for key in [key for key in self._shown if matches(key)]:
            del self._shown[key]

    def rest(self, key: Hashable, document: str, offset: int) -> str | None:
        """What remains of the shown suggestion after what was typed since, or None."""
        shown = self._shown.get(key)
        if shown is None:
            return None
        start, before, after, text = shown
        typed = document[start:offset]
        if (not typed or offset <= start or not text.startswith(typed) or len(typed) >= len(text)
                or hash(document[offset:]) != after or hash(document[:start]) != before):
            return None
        return text[len(typed):]
