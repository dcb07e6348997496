"""The decoding monitor: while the model writes a name, keep it to names that exist there.

A :class:`~glm5_lsp.backends.base.LogitsProcessor`. At each step it reads the text so far (the
document up to the cursor plus the decoded tokens) and decides where decoding stands:

- **after a dot** (``receiver.`` + a partial name ``p``): the receiver's attributes come from an
  ``AttributeProvider`` (jedi's completions for Python, or the symbol table; a method's ``self.``
  is read from the file's text, :mod:`~glm5_lsp.pynames.members`), asked once per receiver. When it
  knows any, every token that cannot continue ``p`` into one of them is masked
  (``-inf``): a token is kept if its identifier characters extend ``p`` to a prefix of a valid name
  and, when the token goes on past the name (``append(``), only if the name is then complete.
- **inside a free name** (``p`` not after a dot): where a new name may be bound (a statement's start,
  after ``for``/``as``/``import``/``def``..., a ``lambda``'s or a ``def``'s line), nothing is masked;
  tokens that continue a name already known (identifiers of the document or of the completion so
  far, builtins, keywords) get ``free_name_bias`` added. Where the name can only be *read*
  (:func:`name_context`: after an operator, ``=``, ``[``, ``return``, ``if``, ``in``...), a name
  that appears nowhere is undefined for sure, so while ``p`` can still become a known name, tokens
  that would end it anywhere else are masked (``undefined_names``). Just inside brackets (after
  ``(``, ``[``, ``{`` or a ``,`` in them) an unknown name may still be a keyword argument (``key=``)
  or a comprehension's variable (``[item for item in ...]``): there it may grow into anything, but
  unless it is known it can only end with ``=`` or a space. The word the user was typing at the
  cursor is held to a narrower set there: the names visible at the cursor
  (:func:`~glm5_lsp.pynames.scope.names_in_scope`, read from the text in milliseconds), so ``if na``
  does not become another function's local. A document with a star import is left alone.
- **tokens that open an attribute themselves** (``.append``, ``).strip``, in any state): the
  ``check_top_k`` likeliest such tokens within ``check_margin`` of the step's best logit are each
  checked against their receiver's attributes, for at most ``check_receivers`` distinct receivers
  per step; the others are masked unchecked (the model can still spell the same code in smaller
  tokens), so no unchecked attribute can be produced and the provider is asked about few receivers.
  An opener whose receiver is not a dotted name (``).strip`` after a call) is masked unasked: its
  receiver text would be new at every step. Inside a string or a comment they are left alone.
- **a time bound**: the provider may spend ``provider_seconds`` per request (jedi takes tens of
  milliseconds a receiver on a large file, now and then a second); a lookup still running when that
  time is spent is stopped (:func:`~glm5_lsp.deadline.call_with_timeout`) and receivers met after
  it go unchecked, so the monitor never costs a completion more than that.

Valid names are matched through a character trie (:class:`NameTrie`) walked against an index of the
vocabulary's token strings (``Tokenizer.token_strings()``), so a step costs in the number of valid
names, not in the vocabulary size. With no names known (jedi cannot infer the receiver, a string or
comment) the logits pass through unchanged.
"""

from __future__ import annotations

import array
import bisect
import builtins
import functools
import keyword
import logging
import re
import sysconfig
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from glm5_lsp.deadline import call_with_timeout
from glm5_lsp.postprocess import IDENTIFIER_CHARS, ends_in_code, open_brackets
from glm5_lsp.pynames.jedi import exclusive, module_members
from glm5_lsp.pynames.jedi import script as jedi_script
from glm5_lsp.pynames.members import self_attributes
from glm5_lsp.pynames.scope import MODULE_ATTRIBUTES, scope_at
from glm5_lsp.pysource import HEADER_LINE, STAR_IMPORT, open_triple_quote, piece, top_level_pieces
from glm5_lsp.quickfix.imports import find_module, is_module

log = logging.getLogger(__name__)

AttributeProvider = Callable[[str], Sequence[str]]  # text ending with "." -> attribute names valid there

_IDENT = re.compile(r"[A-Za-z0-9_]*")
_DOTTED_RECEIVER = re.compile(r"(?<![\w.)\]])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\.$")
_IDENT_WORD = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b(?![\'\"])")  # not a string prefix (r'', b'')
_DOT_NAME = re.compile(r"\.(?=[A-Za-z_])")
_BINDS = re.compile(r"(?:[-+*/%&|^@]|//|\*\*|>>|<<)?=(?!=)|[,:]")  # what may follow a name being bound
_ASSIGNS = re.compile(r"(?:[-+*/%&|^@]|//|\*\*|>>|<<)?=(?!=)|,")  # the same but an annotation (``x: int``)
_TRAILING_WORD = re.compile(r"(?<![A-Za-z0-9_.])[A-Za-z_][A-Za-z0-9_]*$")  # a free name being typed
# Regexes anchored at the end still scan from the start of the string: they get this much of the
# text (a receiver or a partial name longer than that is not one anybody writes).
TAIL_CHARS = 512


def identifiers(text: str) -> set[str]:
    """Every identifier in ``text`` (a string prefix such as ``r''`` apart), read per top-level piece
    (:func:`~glm5_lsp.pysource.top_level_pieces`) and kept, so a request reads only the pieces
    that changed (a 2,600-line file: about 5 ms at once)."""
    found: set[str] = set()
    for text_piece in top_level_pieces(text):
        found |= piece(text_piece).fact(_piece_identifiers)
    return found


def _piece_identifiers(text: str) -> frozenset[str]:
    return frozenset(_IDENT_WORD.findall(text))


def _dotted_receiver(text: str) -> re.Match[str] | None:
    """The dotted name ending ``text`` with its final dot (``self.items.``), if that is how it ends."""
    tail = text[-TAIL_CHARS - 1:]
    return _DOTTED_RECEIVER.search(tail if len(tail) <= TAIL_CHARS else "\n" + tail[1:])


@dataclass
class MonitorSettings:
    enabled: bool = True
    mask_attributes: bool = True  # hard-mask invalid attribute tokens (False: bias instead)
    attribute_bias: float = 8.0  # used when mask_attributes is False
    free_name_bias: float = 2.0  # added to tokens that continue a known free name (0 disables)
    check_top_k: int = 8  # attribute-opening tokens checked per step; the other ones are masked ...
    check_margin: float = 8.0  # ... and so are those this far below the step's best logit (p < e^-8 of it)
    check_receivers: int = 2  # distinct receivers asked about per step; openers of further ones are masked
    provider_seconds: float = 0.2  # attribute-provider time per request; past it, new receivers go unchecked
    undefined_names: bool = True  # where a name is only read, mask tokens that would end it as an unknown name


class NameTrie:
    """Names kept sorted: prefix tests and the completions of a prefix by binary search.

    (A sorted list rather than a character trie: building one over a long module's ~2,500 names
    took 10 ms of Python a request; sorting them takes well under one.)
    """

    def __init__(self, names: Iterable[str]) -> None:
        self.names = sorted(set(names))

    def has_prefix(self, prefix: str) -> bool:
        i = bisect.bisect_left(self.names, prefix)
        return i < len(self.names) and self.names[i].startswith(prefix)

    def has_name(self, name: str) -> bool:
        i = bisect.bisect_left(self.names, name)
        return i < len(self.names) and self.names[i] == name

    def remainders(self, prefix: str, limit: int = 5000) -> list[str]:
        """What can follow ``prefix`` to complete a name ("" when ``prefix`` is itself a name)."""
        names, found = self.names, []
        i = bisect.bisect_left(names, prefix)
        while i < len(names) and len(found) < limit and names[i].startswith(prefix):
            found.append(names[i][len(prefix):])
            i += 1
        return found


class TokenIndex:
    """The vocabulary's token strings, indexed by their leading identifier characters."""

    def __init__(self, token_strings: Sequence[str]) -> None:
        self.strings = list(token_strings)
        self.whole: dict[str, list[int]] = {}  # tokens made only of identifier characters
        self.ending: dict[str, list[int]] = {}  # leading identifier run, then something else (or special)
        self.opening: list[tuple[int, str, str, str]] = []  # (id, before the dot, name after it, rest)
        for token_id, text in enumerate(self.strings):
            dot = _DOT_NAME.search(text)
            if dot is not None:
                after = text[dot.end():]
                name = _IDENT.match(after).group()  # type: ignore[union-attr]
                self.opening.append((token_id, text[: dot.start()], name, after[len(name):]))
                continue
            run = _IDENT.match(text).group()  # type: ignore[union-attr]
            if text and run == text:
                self.whole.setdefault(text, []).append(token_id)
            else:
                self.ending.setdefault(run, []).append(token_id)
        self._openers: dict[int, tuple[list[tuple[int, str, str, str]], object]] = {}
        self.whole_ids: set[int] = {i for ids in self.whole.values() for i in ids}
        self._by_first: dict[str, list[int]] = {}
        for token_id, text in enumerate(self.strings):
            if text:
                self._by_first.setdefault(text[0], []).append(token_id)
        # Tokens that start with white space: never the next thing after an attribute's dot (``x.  y``
        # is Python, but nobody writes it, and it lets a new line's junk parse as an attribute).
        self._space_led = [i for i, text in enumerate(self.strings) if text[:1].isspace()]
        self._space_led_within: dict[int, object] = {}
        # A name's end then ``=`` (not ``==``): a keyword argument ``key=`` whatever ``key`` is; or then a
        # space: ``item for`` (a comprehension's variable, bound after it is used).
        # At a statement's start a new name can only be bound: ``x = ``, ``x += ``, ``x, y = ``, ``x: int``
        # (the name's end, then spaces and one of those, or spaces only, with the operator still to come).
        # Outside class bodies an annotated name (``x: int``) is rare, and a model that ends a new
        # name with ``:`` there mostly writes nothing after it: ``assign_enders`` leave ``:`` out.
        self.keyword_enders: set[int] = set()
        self.target_enders: set[int] = set()
        self.assign_enders: set[int] = set()
        for run, ids in self.ending.items():
            for i in ids:
                rest = self.strings[i][len(run):]
                bare = rest.lstrip(" ")
                if rest[:1] == " " or (bare.startswith("=") and not bare.startswith("==")):
                    self.keyword_enders.add(i)
                if not bare or _BINDS.match(bare):
                    self.target_enders.add(i)
                if not bare or _ASSIGNS.match(bare):
                    self.assign_enders.add(i)

    def openers_within(self, vocab: int) -> tuple[list[tuple[int, str, str, str]], object]:
        """The ``opening`` entries whose ids a ``vocab``-wide logits row has, and those ids as a
        tensor (worked out once per width: the monitor asks at every step)."""
        found = self._openers.get(vocab)
        if found is None:
            import torch

            kept = [entry for entry in self.opening if entry[0] < vocab]
            found = self._openers[vocab] = (kept, torch.tensor([entry[0] for entry in kept], dtype=torch.long))
        return found

    def space_led_within(self, vocab: int) -> object:
        """The white-space-led tokens a ``vocab``-wide logits row has, as an id tensor (once per width)."""
        found = self._space_led_within.get(vocab)
        if found is None:
            import torch

            found = self._space_led_within[vocab] = torch.tensor([i for i in self._space_led if i < vocab],
                                                                 dtype=torch.long)
        return found

    def starting_with(self, char: str) -> list[int]:
        """Tokens whose text starts with ``char``."""
        return self._by_first.get(char, [])

    def continuing(self, partial: str, trie: NameTrie) -> set[int]:
        """Tokens that keep ``partial`` on the way to (or exactly at the end of) a name in ``trie``."""
        allowed: set[int] = set()
        for rest in trie.remainders(partial):
            for k in range(1, len(rest) + 1):
                allowed.update(self.whole.get(rest[:k], ()))
            allowed.update(self.ending.get(rest, ()))
        return allowed


@dataclass
class _State:
    kind: str  # "attribute", "name" or "other"
    partial: str
    receiver: str  # the text up to and including the dot (attribute state)


def decoding_state(text: str) -> _State:
    """Where decoding stands at the end of ``text`` (see the module docstring)."""
    tail_match = re.search(r"[A-Za-z0-9_]*$", text[-TAIL_CHARS:])
    partial = tail_match.group() if tail_match else ""
    before = text[: len(text) - len(partial)]
    if partial[:1].isdigit():
        return _State("other", "", "")
    if before.endswith(".") and not _is_number_dot(before) and not _in_comment_or_string(before):
        return _State("attribute", partial, before)
    if partial and not _in_comment_or_string(before):
        return _State("name", partial, "")
    return _State("other", "", "")


def _in_import(text: str) -> bool:
    """Whether the last line of ``text`` is an import statement (its dotted names are modules,
    which the document need not have bound)."""
    line = text[text.rfind("\n") + 1:].lstrip()
    return line.startswith(("import ", "from "))


_KEYWORDS = frozenset(keyword.kwlist)
EXPRESSION_KEYWORDS = frozenset({"None", "True", "False", "not", "lambda", "await", "yield"})  # may start an operand
STATEMENT_KEYWORDS = _KEYWORDS - EXPRESSION_KEYWORDS
_KEYWORD_TRIE = NameTrie(_KEYWORDS)
_EXPRESSION_KEYWORD_TRIE = NameTrie(EXPRESSION_KEYWORDS)
# Keywords after which a name is read (``for x``, ``as x``, ``global x`` bind one instead).
LOAD_KEYWORDS = frozenset({"return", "if", "elif", "while", "in", "not", "and", "or", "is", "assert", "yield",
                           "await", "raise", "else", "del", "except", "from"})
BINDING_LINES = ("def ", "async def ", "class ", "import ", "from ", "global ", "nonlocal ")
_LAST_WORD = re.compile(r"(?<![A-Za-z0-9_.])([A-Za-z_][A-Za-z0-9_]*)\s*$")


def name_context(before: str) -> str:
    """What a name starting at the end of ``before`` can be: ``"load"`` (only read, so it must exist),
    ``"argument"`` (read, or a keyword argument's or a comprehension variable's name), ``"target"`` (a
    statement's start: read, or bound by an assignment) or ``"free"`` (it may bind a new name).

    Decided on the current line: its start, a ``def``/``class``/``lambda``/import on it, and the code
    just before the name; at a line's start, also whether a bracket or a backslash carries an earlier
    line on. Anything unclear is ``"free"``: the monitor only masks where it is sure.
    """
    line = before[before.rfind("\n") + 1:]
    head = line.lstrip()
    if not head and not before.rstrip(" \t\n").endswith("\\") and not open_brackets(before[-2000:], "python"):
        return "target"  # a statement's start: a name read, or a new one bound (then ``=``, ``,``, ``:``)
    if not head or head.startswith(BINDING_LINES) or "lambda" in _IDENT_WORD.findall(line):
        return "free"  # a continuation line, a definition, an import, a lambda
    word = _LAST_WORD.search(line)
    if word is not None:  # the name follows a word: a keyword that reads it, or anything else
        return "load" if word.group(1) in LOAD_KEYWORDS else "free"
    last = line.rstrip()[-1]
    if last in "=+-*/%&|^~<>!@" or (last == ":" and open_brackets(line, "python")):
        return "load"  # an operand, an assignment's or a keyword argument's value, a decorator, a slice bound
    if last in "([{" or (last == "," and open_brackets(line, "python")):
        return "argument"  # an item or argument, or a keyword argument's or comprehension variable's name
    return "free"  # ``a, b = ...``: targets


def _is_number_dot(before: str) -> bool:
    return bool(re.search(r"(?<![A-Za-z_0-9])\d+\.$", before[-TAIL_CHARS:]))


def _in_comment_or_string(text: str) -> bool:
    """Whether the end of ``text``'s last line is inside a string or a comment (earlier lines are not
    read: a docstring the cursor is in is :func:`open_triple_quote`'s concern)."""
    return not ends_in_code(text[text.rfind("\n") + 1:], "python")




class NameMonitor:
    """The logits processor for one request (``context`` = the document up to the cursor)."""

    def __init__(self, index: TokenIndex, attributes: AttributeProvider, context: str,
                 settings: MonitorSettings | None = None, known_names: Iterable[str] | None = None,
                 cache_size: int = 128, after: str = "") -> None:
        self.index = index
        self.attributes = attributes
        self.context = context
        self.after = after  # the document after the cursor (its module-level names are in scope too)
        self.settings = settings or MonitorSettings()
        if known_names is None:  # the document's identifiers, less the one being typed at the cursor
            # (rstrip drops the typed word; a regex search for it from the end would try every start)
            known_names = identifiers(context.rstrip(IDENTIFIER_CHARS))
        # What the document and Python bind; keywords apart: where a name is only read it is an
        # operand, and a statement keyword (``while``, ``def``) cannot be one.
        self.name_trie = NameTrie((set(known_names) - _KEYWORDS) | set(dir(builtins)) | MODULE_ATTRIBUTES)
        self.free_tries = [self.name_trie, _KEYWORD_TRIE]
        self.read_tries = [self.name_trie, _EXPRESSION_KEYWORD_TRIE]
        self._cache: OrderedDict[str, NameTrie | None] = OrderedDict()
        self._cache_size = cache_size
        self.masked_steps = 0  # steps where an attribute mask was applied (for reports and tests)
        self.provider_seconds = 0.0  # time spent in the attribute provider so far
        self.provider_skipped = 0  # receivers left unchecked because that time ran out
        self._context_quote = open_triple_quote(context)  # a docstring the cursor is inside, if any
        self._star_import = bool(STAR_IMPORT.search(context))  # ``from x import *``: any name may exist
        self._generated_text = ""
        self._generated_names = NameTrie(())
        self.name_masked_steps = 0  # steps where a read name was kept to known names
        self._scope: NameTrie | bool = False  # names in scope at the cursor (False: not worked out yet)
        self._scope_kind = "module"  # the innermost block there: "def", "class" or "module"
        self.pending_word = ""  # see expect_word
        self.time_left: Callable[[], float] = lambda: float("inf")  # the request's (set by the repair loop)

    def __call__(self, generated_ids: Sequence[int], logits: object) -> object:
        import torch

        if not self.settings.enabled:
            return logits
        assert isinstance(logits, torch.Tensor)
        strings = self.index.strings
        generated = "".join(strings[i] if 0 <= i < len(strings) else "" for i in generated_ids)
        if open_triple_quote(generated, self._context_quote):
            return logits  # prose inside a docstring: no names to check
        text = self.context + generated
        state = decoding_state(text)
        out = logits.clone()
        if self.pending_word.startswith(generated) and len(generated) < len(self.pending_word):
            self._check_pending_word(out, text, generated)  # the typed word being written again
        elif state.kind == "attribute":
            trie = self._attribute_trie(state.receiver)
            if trie is not None and trie.has_prefix(state.partial):
                keep = self.index.continuing(state.partial, trie)
                self._restrict(out, keep)
            elif not state.partial:  # names unknown here: at least the name starts right after the dot
                out[self.index.space_led_within(out.shape[-1])] = float("-inf")
        elif state.kind == "name":
            self._check_name(out, text, generated, state.partial)
        self._check_openers(out, text, state)
        return out

    def _check_name(self, logits: object, text: str, generated: str, partial: str) -> None:
        """A free name: masked to known names where it can only be read, else biased towards them."""
        import torch

        assert isinstance(logits, torch.Tensor)
        context = name_context(text[: len(text) - len(partial)])
        read = context != "free" and self.settings.undefined_names and not self._star_import
        statement = context == "target"  # statement keywords are names' neighbours here
        tries = [*(self.free_tries if statement or not read else self.read_tries), self._generated_trie(generated, partial)]
        if read and _IDENT.fullmatch(generated) and (self.pending_word or self.context[-1:].isidentifier()):
            tries = [self._scope_trie()]  # the word the user was typing: the names visible there
            if statement:
                tries.append(_KEYWORD_TRIE)
        keep: set[int] = set()
        for trie in tries:
            keep |= self.index.continuing(partial, trie)
        if read and context in ("argument", "target"):  # ``key=``, ``item for``, ``new = ``: the name need
            # not be known, but then ``=`` or a space (or at a statement's start ``,`` or ``:``) follows
            keep |= self.index.whole_ids | (self._binding_enders() if statement else self.index.keyword_enders)
            self._restrict(logits, keep)
            self.name_masked_steps += 1
        elif read and any(trie.has_prefix(partial) for trie in tries):  # else it is undefined already
            self._restrict(logits, keep)
            self.name_masked_steps += 1
        elif keep and self.settings.free_name_bias:
            ids = torch.tensor(sorted(i for i in keep if i < logits.shape[-1]), dtype=torch.long)
            logits[ids] += self.settings.free_name_bias

    def expect_word(self, word: str) -> None:
        """Decoding starts by writing ``word`` again (token healing: the word typed at the cursor was
        cut off the prompt). Its first tokens are checked as the start of a name."""
        self.pending_word = word

    def _check_pending_word(self, logits: object, text: str, generated: str) -> None:
        """While the typed word is rewritten, a token that agrees with it but would make a name
        nobody can read here (``if it`` + ``ition``) is masked, where the name can only be read."""
        import torch

        assert isinstance(logits, torch.Tensor)
        word_start = len(self.context)
        context = name_context(text[:word_start])
        if context == "free" or not self.settings.undefined_names or self._star_import:
            return
        statement = context == "target"  # where an unknown name may still be bound (``new = ...``)
        tries = [self._scope_trie(), _KEYWORD_TRIE] if statement else [self._scope_trie()]
        rest = self.pending_word[len(generated):]
        agreeing = [i for i in self.index.starting_with(rest[0]) if i < logits.shape[-1]
                    and (self.index.strings[i].startswith(rest) or rest.startswith(self.index.strings[i]))]
        banned = []
        for token_id in agreeing:
            token = self.index.strings[token_id]
            run = _IDENT.match(token).group()  # type: ignore[union-attr]
            word = generated + run
            if statement and (run == token or token_id in self._binding_enders()):
                continue  # still on its way to a name, or a new one bound
            if not any(trie.has_prefix(word) if run == token else trie.has_name(word) for trie in tries):
                banned.append(token_id)
        if banned and len(banned) < len(agreeing):  # never ban every way to write the word
            logits[torch.tensor(banned, dtype=torch.long)] = float("-inf")
            self.name_masked_steps += 1

    def _scope_trie(self) -> NameTrie:
        """Names in scope at the cursor (:func:`scope.names_in_scope`, read from the document's text
        in a few milliseconds; worked out once per request)."""
        if self._scope is False:
            typed = _TRAILING_WORD.search(self.context, max(0, len(self.context) - TAIL_CHARS))  # not all of it
            before = self.context[: typed.start()] if typed else self.context
            names, self._scope_kind = scope_at(before, self.after)
            self._scope = NameTrie(names - STATEMENT_KEYWORDS)
        return self._scope  # type: ignore[return-value]

    def _binding_enders(self) -> set[int]:
        """What may end an unknown name at a statement's start: ``=``, ``+=``, a comma, and in a
        class body also ``:`` (``field: int``)."""
        self._scope_trie()
        return self.index.target_enders if self._scope_kind == "class" else self.index.assign_enders

    def _generated_trie(self, generated: str, partial: str) -> NameTrie:
        """Names the completion itself has written so far (a loop variable it bound, ...)."""
        done = generated[: len(generated) - len(partial)]
        if done != self._generated_text:
            self._generated_text = done
            self._generated_names = NameTrie(set(_IDENT_WORD.findall(done)) - _KEYWORDS)
        return self._generated_names

    def _restrict(self, logits: object, keep: set[int]) -> None:
        import torch

        assert isinstance(logits, torch.Tensor)
        if not keep:
            return
        ids = torch.frombuffer(array.array("q", keep), dtype=torch.long)  # thousands of ids: no Python loop
        ids = ids[ids < logits.shape[-1]]
        if not len(ids):
            return
        mask = torch.ones(logits.shape[-1], dtype=torch.bool)
        mask[ids] = False
        if self.settings.mask_attributes:
            logits.masked_fill_(mask, float("-inf"))
        else:
            logits[~mask] += self.settings.attribute_bias
        self.masked_steps += 1

    def _check_openers(self, logits: object, text: str, state: _State) -> None:
        """Tokens like ``.append``: check the likeliest against their receiver, mask the rest."""
        import torch

        assert isinstance(logits, torch.Tensor)
        opening, ids = self.index.openers_within(logits.shape[-1])
        if not opening or _in_comment_or_string(text):
            return
        scores = logits[ids]
        order = torch.argsort(scores, descending=True).tolist()
        floor = float(logits.max()) - self.settings.check_margin
        banned: list[int] = []
        receivers: set[str] = set()
        for rank, position in enumerate(order):
            token_id, head, name, rest = opening[position]
            score = float(scores[position])
            if score == float("-inf"):
                continue
            if rank >= self.settings.check_top_k or score < floor:
                banned.append(token_id)
                continue
            if head not in receivers and len(receivers) >= self.settings.check_receivers:
                banned.append(token_id)
                continue
            receivers.add(head)
            if not self._opener_ok(text, state, head, name, rest):
                banned.append(token_id)
        if banned:
            logits[torch.tensor(banned, dtype=torch.long)] = float("-inf")

    def _opener_ok(self, text: str, state: _State, head: str, name: str, rest: str) -> bool:
        if _DOT_NAME.search(rest):
            return False  # a second attribute inside one token: not checkable, never needed
        if not _dotted_receiver(text + head + "."):
            return False  # ``f(x).name`` in one token: each step would ask about a new receiver text
        if state.kind == "attribute":  # the head must finish the current attribute name
            trie = self._attribute_trie(state.receiver)
            if trie is not None and not (_IDENT.fullmatch(head) and trie.has_name(state.partial + head)):
                return False
        trie = self._attribute_trie(text + head + ".")
        if trie is None:
            return True
        return trie.has_name(name) if rest else trie.has_prefix(name)

    def _attribute_trie(self, receiver: str) -> NameTrie | None:
        """The trie of attributes valid after ``receiver`` (which ends with a dot); None if unknown.

        Cached by the dotted name before the dot (``self.items.``) when the receiver ends in one:
        within one completion the same expression names the same object, so the attribute provider
        (jedi, tens of milliseconds a call) runs once per expression rather than once per token.
        Once the provider has used ``provider_seconds`` in this request, receivers not yet cached
        are left unchecked (None): the monitor bounds a completion's latency rather than check
        every name of a long one.
        """
        dotted = _dotted_receiver(receiver)
        key = dotted.group(0) if dotted else receiver
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        if dotted is not None and not _in_import(receiver) and not self._readable(key.split(".", 1)[0],
                                                                                receiver[: len(receiver) - len(key)]):
            return None  # a name nothing in sight binds (``variate.``): nothing to look up
        names = self._ask(receiver)
        trie = NameTrie(names) if names else None
        self._cache[key] = trie
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return trie

    def _readable(self, name: str, text: str) -> bool:
        """Whether ``name`` may be read right after ``text`` (the context plus generated text): in scope
        at the cursor or written earlier by the completion (after a star import: any document name)."""
        if self._star_import:
            return self.name_trie.has_name(name)
        return self._scope_trie().has_name(name) or name in _IDENT_WORD.findall(text, min(len(self.context), len(text)))

    def _ask(self, text: str) -> list[str] | None:
        """The provider's names at the end of ``text``; None once its time is used up (unchecked)."""
        if self.provider_seconds >= self.settings.provider_seconds:
            self.provider_skipped += 1
            if self.provider_skipped == 1:
                log.debug("attribute provider used %.0f ms; later receivers go unchecked", self.provider_seconds * 1e3)
            return None
        started = time.perf_counter()
        limit = min(self.settings.provider_seconds - self.provider_seconds, self.time_left())
        try:  # stopped where it stands when the request's provider time (or the request's) runs out
            names = call_with_timeout(lambda: self.attributes(text), limit)
            return [n for n in names if n.isidentifier()]
        except TimeoutError:
            self.provider_skipped += 1
            log.debug("attribute provider stopped after %.0f ms; receiver left unchecked", limit * 1e3)
            return None
        except Exception:
            log.warning("attribute provider failed; not restricting here", exc_info=True)
            return []
        finally:
            self.provider_seconds += time.perf_counter() - started


class JediAttributes:
    """Python attribute names after a dot, from jedi's completions at the end of the text (``pynames.jedi.script``).

    The completion position is the end of the given text (the document up to the cursor plus what
    has been generated); the code after the cursor is not needed to name a receiver's attributes.
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = path

    def __call__(self, text: str) -> list[str]:
        lines = text.split("\n")
        with exclusive():
            script = jedi_script(text, path=self.path)
            return [c.name for c in script.complete(len(lines), len(lines[-1]))]


class TextAttributes:
    """A method's ``self.`` answered from the file's text (:func:`members.self_attributes`: a few
    milliseconds where jedi takes 50-800), any other receiver by ``fallback`` (jedi).

    ``after`` is the document from the cursor on: the class's later methods bind attributes too."""

    def __init__(self, after: str, fallback: AttributeProvider) -> None:
        self.after = after
        self.fallback = fallback

    def __call__(self, text: str) -> Sequence[str]:
        plain = _PLAIN_RECEIVER.search(text, max(0, len(text) - TAIL_CHARS))  # the end only, not all of it
        if plain is not None:
            names = self_attributes(text, self.after, plain.group(1))
            if names is not None:
                return sorted(names)
        return self.fallback(text)


_PLAIN_RECEIVER = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\.\Z")


class ModuleAttributes:
    """A receiver that names an installed module (``re.``, ``os.path.``, ``t.`` after ``import typing
    as t``) answered from the module's listing, kept per process (:func:`~glm5_lsp.pynames.jedi.module_members`:
    listed when a file importing it opens; a fresh jedi lookup costs 20-200 ms, and the shared memory
    of answers is per scope); any other receiver by ``fallback``.

    ``document`` is the whole document: a name counts as a module only where an ``import`` binds it
    to one and nothing else in the document binds it (an assignment, a parameter, a ``def``, a
    ``from`` import, ``as`` outside an import). Modules of the standard library and of
    site-packages only: the workspace's own modules change as the user edits them (jedi reads them
    afresh through ``fallback``)."""

    def __init__(self, document: str, fallback: AttributeProvider) -> None:
        self.document = document
        self.fallback = fallback
        self._aliases: dict[str, str] | None = None  # read on the first lookup, once a request
        self._rebound: dict[str, bool] = {}

    def __call__(self, text: str) -> Sequence[str]:
        dotted = _dotted_receiver(text)
        module = self.module(dotted.group(0)[:-1]) if dotted is not None else None
        names = module_members(module) if module is not None else None
        return sorted(names) if names else self.fallback(text)

    def module(self, receiver: str) -> str | None:
        """The installed module the dotted ``receiver`` (``os.path``) names in the document, or None."""
        head, *attributes = receiver.split(".")
        if self._aliases is None:
            self._aliases = import_aliases(self.document)
        module = self._aliases.get(head)
        if module is None or not _library_module(module):
            return None
        if head not in self._rebound:
            self._rebound[head] = _rebound(self.document, head)
        if self._rebound[head]:
            return None
        for attribute in attributes:  # ``os.path``: each step must be a module too
            if not is_module(f"{module}.{attribute}"):
                return None
            module = f"{module}.{attribute}"
        return module


_IMPORT_WORD = re.compile(r"import[ \t]")
_IMPORT_LINE = re.compile(r"[ \t]*import[ \t]+([\w. \t,]+?)[ \t]*(?:#.*)?$", re.MULTILINE)
_IMPORT_ALIAS = re.compile(r"([A-Za-z_][\w.]*)(?:[ \t]+as[ \t]+([A-Za-z_]\w*))?$")


def import_aliases(document: str) -> dict[str, str]:
    """Name -> module for each name a plain ``import`` line of ``document`` binds (``import os.path``
    binds ``os``; ``import numpy as np``, ``np``); a name two imports bind to different modules is
    left out."""
    aliases: dict[str, str] = {}
    clashing: set[str] = set()
    for keyword_at in _IMPORT_WORD.finditer(document):  # a literal first: a line-anchored search is slower
        line_start = document.rfind("\n", 0, keyword_at.start()) + 1
        line = _IMPORT_LINE.match(document, line_start)
        if line is None or line.start(1) < keyword_at.end():
            continue
        for part in line.group(1).split(","):
            found = _IMPORT_ALIAS.match(part.strip())
            if found is None:
                continue
            module, alias = found.group(1), found.group(2)
            name, bound = (alias, module) if alias else (module.split(".")[0], module.split(".")[0])
            if aliases.get(name, bound) != bound:
                clashing.add(name)
            aliases[name] = bound
    return {name: module for name, module in aliases.items() if name not in clashing}


def _rebound(document: str, name: str) -> bool:
    """Whether anything but a plain ``import`` binds ``name`` somewhere in ``document``, read from the
    text around each place the name stands unread (not followed by a dot): assigned (a keyword
    argument ``name=`` counts too: the lookup then goes to jedi), defined, a parameter, a loop's or a
    lambda's variable, declared, deleted, bound by ``as`` or by a ``from`` import."""
    for start, end in _standing(document, name):
        line_start = document.rfind("\n", 0, start) + 1
        before = document[line_start:start]
        if _PLAIN_IMPORT_START.match(before):
            continue
        if _ASSIGNED.match(document, end) or _BINDS_BEFORE.search(before) \
                or (_LOOP_TARGET.search(before) and _LOOP_IN.match(document, end)):
            return True
        if _LISTED_NAME_END.match(document, end) and _OPEN_LIST.search(document, max(0, start - 400), start):
            return True  # a parameter of a ``def`` or a name of a ``from`` import spread over lines
    return False


def _standing(document: str, name: str) -> Iterator[tuple[int, int]]:
    """Where ``name`` stands as a whole word in ``document``, not after a dot and not read by one
    (``str.find``: a regex with a look-behind searches 100 KB in milliseconds)."""
    start = document.find(name)
    while start >= 0:
        end = start + len(name)
        previous = document[start - 1:start]
        if not (previous.isidentifier() or previous.isdigit() or previous == ".") \
                and not (document[end:end + 1].isidentifier() or document[end:end + 1].isdigit()) \
                and not _READ_BY_DOT.match(document, end):
            yield start, end
        start = document.find(name, end)


_READ_BY_DOT = re.compile(r"[ \t]*\.")
_PLAIN_IMPORT_START = re.compile(r"[ \t]*import\b")
_ASSIGNED = re.compile(r"[ \t]*(?:(?:[-+*/%&|^@]|//|\*\*|>>|<<)?=(?!=)|:[^=\n]*=(?!=)|:=)")
_BINDS_BEFORE = re.compile(r"\b(?:def[ \t]+|class[ \t]+|(?:as|import)[ \t]+(?:\w+[ \t]*,[ \t]*)*)$"
                           r"|\b(?:lambda|global|nonlocal|del)\b[^:]*$")
_LOOP_TARGET = re.compile(r"\bfor\b(?:(?!\bin\b)[^:])*$")
_LOOP_IN = re.compile(r"(?:(?!\bin\b)[^\n:])*\bin\b")
_LISTED_NAME_END = re.compile(r"[ \t]*[,):=\n]")
_OPEN_LIST = re.compile(r"\b(?:def[ \t]+\w+[ \t]*|import[ \t]*)\([^)]*\Z")


@functools.lru_cache(maxsize=512)
def _library_module(module: str) -> bool:
    """Whether ``module``'s top-level package is built in or lies in the standard library or a
    site-packages folder (not the workspace, nor an editable install of it)."""
    spec = find_module(module.split(".")[0])
    if spec is None:
        return False
    origin = getattr(spec, "origin", None)
    if origin in ("built-in", "frozen"):
        return True
    if origin is None:  # a namespace package: its folders
        folders = list(getattr(spec, "submodule_search_locations", None) or ())
        return bool(folders) and all(_library_path(folder) for folder in folders)
    return _library_path(origin)


def _library_path(path: str) -> bool:
    parts = Path(path).parts
    return "site-packages" in parts or "dist-packages" in parts or any(
        Path(path).is_relative_to(root) for root in _stdlib_roots())


@functools.cache
def _stdlib_roots() -> tuple[Path, ...]:
    paths = sysconfig.get_paths()
    return tuple(dict.fromkeys(Path(paths[key]) for key in ("stdlib", "platstdlib") if key in paths))


_INDEXES: dict[int, TokenIndex] = {}


def token_index(token_strings: Sequence[str]) -> TokenIndex:
    """A :class:`TokenIndex` shared by every request over the same vocabulary list."""
    key = id(token_strings)
    if key not in _INDEXES:
        _INDEXES.clear()
        _INDEXES[key] = TokenIndex(token_strings)
    return _INDEXES[key]


class RememberedAttributes:
    """An attribute provider with a memory shared by requests: keystrokes in one file ask about the
    same receivers (``self.``, ``os.path.``) over and over, and jedi answers in tens of milliseconds.

    An answer is kept for ``ttl_s`` under (file, the enclosing ``class`` and ``def`` header lines,
    the dotted receiver): the same expression in the same scope names the same kind of object. A
    receiver that is not a dotted name (``f(x).``) is always asked afresh. The time-to-live bounds how
    long an edit to a class or a function can go unseen.
    """

    def __init__(self, ttl_s: float = 30.0, size: int = 512, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.size = size
        self.clock = clock
        self._memory: OrderedDict[tuple[str, ...], tuple[float, list[str]]] = OrderedDict()

    def bind(self, provider: AttributeProvider, path: str) -> AttributeProvider:
        """``provider`` for one file, answering from the memory where it can."""

        def ask(text: str) -> Sequence[str]:
            dotted = _dotted_receiver(text)
            if dotted is None:
                return provider(text)
            key = (path, *_scope(text), dotted.group(0))
            now = self.clock()
            kept = self._memory.get(key)
            if kept is not None and now - kept[0] <= self.ttl_s:
                self._memory.move_to_end(key)
                return kept[1]
            names = list(provider(text))
            self._memory[key] = (now, names)
            self._memory.move_to_end(key)
            while len(self._memory) > self.size:
                self._memory.popitem(last=False)
            return names

        return ask


def _scope(text: str) -> tuple[str, str]:
    """The nearest ``class`` and ``def`` header lines before the end of ``text`` ("" when none)."""
    found = {"class": "", "def": ""}
    for match in HEADER_LINE.finditer(text, max(0, len(text) - 200_000)):
        found[match.group("kind")] = match.group(0).strip()
    return found["class"], found["def"]


def warm_monitor(document: str, language: str, path: str = "") -> None:
    """What the monitor reads from a whole Python ``document`` in its first request, read when it opens:
    the identifiers and module-level names of its top-level pieces (kept per piece; about 40 ms of the
    first request on a 2,600-line file, a piece or two after)."""
    if language == "python":
        identifiers(document)
        scope_at(document)


def python_monitor_factory(token_strings: Sequence[str], settings: MonitorSettings | None = None,
                           memory: RememberedAttributes | None = None) -> Callable[[object], NameMonitor | None]:
    """For ``RepairLoop(monitor_factory=...)``: a jedi-backed monitor per request target, the
    attribute answers remembered across requests and repair rounds (``memory``)."""
    index = token_index(token_strings)
    memory = memory if memory is not None else RememberedAttributes()

    def make(target: object) -> NameMonitor | None:
        if getattr(target, "language", "python") != "python":
            return None  # jedi knows Python only
        document, start = target.document, target.start  # type: ignore[attr-defined]
        path = getattr(target, "path", None) or None
        provider = memory.bind(TextAttributes(document[target.end:], ModuleAttributes(document, JediAttributes(path=path))),
                               path or "")
        return NameMonitor(index, provider, document[:start], settings, after=document[target.end:])  # type: ignore[attr-defined]

    return make
