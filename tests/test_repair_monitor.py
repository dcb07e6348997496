"""The decoding monitor: with a small BPE tokenizer (trained here with ``tokenizers`` on
``tests/data/repair/monitor_corpus.py``, merging across dots so tokens like ``.append`` exist) and
logits crafted to favour an invalid attribute, greedy decoding never produces one where valid
attributes are known."""

from __future__ import annotations

import builtins
import keyword
import random
import re
import sysconfig
import time
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from glm5_lsp.pynames.jedi import warm_jedi
from glm5_lsp.repair.monitor import (
    _IDENT_WORD,
    JediAttributes,
    ModuleAttributes,
    MonitorSettings,
    NameMonitor,
    NameTrie,
    TokenIndex,
    _rebound,
    decoding_state,
    identifiers,
    import_aliases,
    python_monitor_factory,
)

CORPUS = (Path(__file__).parent / "data" / "repair" / "monitor_corpus.py").read_text()
OS_NAMES = ["path", "getcwd", "listdir", "environ", "sep", "pathsep", "getenv"]
LIST_NAMES = ["append", "extend", "pop", "clear"]
PATH_NAMES = ["join", "exists", "isdir", "split", "basename"]


@pytest.fixture(scope="module")
def strings() -> list[str]:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"], show_progress=False)
    tok.train_from_iterator([CORPUS] * 20, trainer)
    return [tok.decode([i]) if i else "" for i in range(tok.get_vocab_size())]


def fake_attributes(text: str) -> list[str]:
    """Attributes by receiver, like the symbol table would give them."""
    if text.endswith("os.path."):
        return PATH_NAMES
    if text.endswith("os."):
        return OS_NAMES
    if text.endswith("items."):
        return LIST_NAMES
    return []


def favouring(strings: list[str], wanted: str, generator: torch.Generator) -> torch.Tensor:
    """Logits that spell ``wanted`` greedily: the longest token matching its start wins."""
    logits = torch.randn(len(strings), generator=generator)
    for i, s in enumerate(strings):
        if s and wanted.startswith(s):
            logits[i] = 10.0 + 2.0 * len(s)
    return logits


def greedy(monitor: NameMonitor, strings: list[str], wanted: str, steps: int = 12, seed: int = 0) -> str:
    generator = torch.Generator().manual_seed(seed)
    ids: list[int] = []
    produced = ""
    for _ in range(steps):
        remaining = wanted.removeprefix(produced)
        logits = monitor(ids, favouring(strings, remaining or wanted, generator))
        token = int(torch.argmax(logits))
        ids.append(token)
        produced += strings[token]
    return produced


def spell(strings: list[str], text: str) -> list[int]:
    """Token ids that spell ``text``, longest token first."""
    ids: list[int] = []
    while text:
        token = max((i for i, s in enumerate(strings) if s and text.startswith(s)), key=lambda i: len(strings[i]))
        ids.append(token)
        text = text[len(strings[token]):]
    return ids


def attributes_written(text: str) -> list[tuple[str, str]]:
    return re.findall(r"(os\.path|os|items)\.([A-Za-z_][A-Za-z0-9_]*)", text)


VALID = {"os": OS_NAMES, "os.path": PATH_NAMES, "items": LIST_NAMES}


@pytest.mark.parametrize("context,wanted", [
    ("import os\nvalue = os.", "pathx\n"),
    ("import os\nvalue = os.", "getcwdd()\n"),
    ("import os\nvalue = os.", "fetch_data()\n"),
    ("import os\nvalue = os.get", "cwdd()\n"),
    ("import os\nvalue = os.path.", "joinx(a)\n"),
    ("import os\nitems = []\nitems", ".appendx(value)\n"),
    ("import os\nitems = []\nitems", ".foo(value)\n"),
    ("import os\nvalue = ", "os.pathx.foo\n"),
])
def test_monitor_never_lets_an_invalid_attribute_through(strings: list[str], context: str, wanted: str) -> None:
    index = TokenIndex(strings)
    for seed in range(5):
        monitor = NameMonitor(index, fake_attributes, context)
        produced = greedy(monitor, strings, wanted, seed=seed)
        written = attributes_written(context + produced)
        assert written, context + produced
        for receiver, name in written:
            tail = (context + produced).split(receiver + "." + name, 1)[1]
            if not tail or tail[0].isalnum() or tail[0] == "_":
                continue  # still being written when the steps ran out
            assert name in VALID[receiver], (context + produced)
    # without the monitor the same logits do write the invalid name
    generator = torch.Generator().manual_seed(0)
    plain = strings[int(torch.argmax(favouring(strings, wanted, generator)))]
    assert wanted.startswith(plain) and plain


def test_monitor_with_jedi_attributes(strings: list[str]) -> None:
    context = "import os\n\nvalue = os."
    monitor = NameMonitor(TokenIndex(strings), JediAttributes(), context, MonitorSettings(provider_seconds=60.0))  # cold jedi
    produced = greedy(monitor, strings, "pathx\n", steps=6)
    name = re.match(r"[A-Za-z_]\w*", produced).group()
    assert name in dir(__import__("os")) and name != "pathx", produced


def test_free_names_are_biased_not_masked(strings: list[str]) -> None:
    """Where a new name may be bound (a loop variable): known names are favoured, nothing is masked."""
    monitor = NameMonitor(TokenIndex(strings), fake_attributes, "value = 1\nfor val",
                          MonitorSettings(free_name_bias=3.0))
    logits = torch.zeros(len(strings))
    out = monitor([], logits)
    boosted = {strings[i] for i in torch.nonzero(out > 0).flatten().tolist()}
    # "val" continues to "value" (from the document) and to builtins such as "vars"... no: only "value"
    assert boosted and all("ue".startswith(s) or s.startswith("ue") for s in boosted), boosted
    assert torch.isfinite(out[[i for i, s in enumerate(strings) if "." not in s]]).all()  # no name masked


@pytest.mark.parametrize("context,annotated", [
    ("value = 1\nval", False),
    ("def f():\n    value = 1\n    val", False),
    ("class C:\n    value = 1\n    val", True),
])
def test_at_a_statement_start_an_unknown_name_can_only_be_bound(strings: list[str], context: str, annotated: bool) -> None:
    """``val`` at a statement's start is read (``value(...)``, ``value.x = ``) or bound (``valx = ``):
    ending it as an unknown name any other way (``valx(``) is masked; ``value(`` and ``valx =`` are not.
    Only in a class body may the new name end with ``:`` (an annotated field)."""
    index = TokenIndex(strings)
    monitor = NameMonitor(index, fake_attributes, context, MonitorSettings())
    out = monitor([], torch.zeros(len(strings)))
    assert monitor.name_masked_steps == 1
    known = {"value"} | set(dir(builtins)) | set(keyword.kwlist)
    verdicts = set()
    for token_id, token in enumerate(strings):
        run = re.match(r"[A-Za-z0-9_]*", token).group()  # type: ignore[union-attr]
        rest = token[len(run):]
        if not token or not rest or "." in token:
            continue  # a name still growing, or an attribute opener (their own rule)
        name = "val" + run
        enders = r"(?:[-+*/%&|^@]|//|\*\*|>>|<<)?=(?!=)|[,:]" if annotated else r"(?:[-+*/%&|^@]|//|\*\*|>>|<<)?=(?!=)|,"
        binds = not rest.strip(" ") or bool(re.match(enders, rest.lstrip(" ")))
        allowed = name in known or binds
        assert bool(torch.isfinite(out[token_id])) == allowed, token
        verdicts.add(allowed)
    assert verdicts == {True, False}


def two_attributes(token: str) -> bool:
    """Tokens like ``os.path.join``: two attribute accesses in one token, never checkable."""
    return len(re.findall(r"\.[A-Za-z_]", token)) >= 2


def uncheckable(token: str, context: str) -> bool:
    """Openers the monitor masks without asking: two attributes, or a receiver that is not a dotted
    name (``).strip`` after ``make()``: a new receiver text at every step); and right after a dot,
    anything that starts with white space."""
    if context.endswith(".") and token[:1].isspace():
        return True
    head = token[: re.search(r"\.[A-Za-z_]", token).start()] if re.search(r"\.[A-Za-z_]", token) else None
    return two_attributes(token) or (head is not None and not re.search(
        r"(?<![\w.)\]])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\.$", context + head + "."))


def unchecked_plain(strings: list[str]) -> list[int]:
    """Tokens an unchecked attribute position leaves alone: neither openers such as ``.x`` (their own
    rule) nor tokens led by white space (never right after a dot)."""
    return [i for i, s in enumerate(strings) if "." not in s and not s[:1].isspace()]


def changed_tokens(strings: list[str], before: torch.Tensor, after: torch.Tensor) -> set[str]:
    return {strings[i] for i in torch.nonzero(before != after).flatten().tolist()}


def test_unknown_receiver_leaves_logits_alone(strings: list[str]) -> None:
    # every attribute-opening token checked (none is known): only uncheckable tokens are removed
    context = "thing = make()\nthing."
    monitor = NameMonitor(TokenIndex(strings), lambda text: [], context,
                          MonitorSettings(check_top_k=len(strings), check_margin=float("inf"), check_receivers=len(strings)))
    logits = torch.randn(len(strings))
    changed = changed_tokens(strings, logits, monitor([], logits))
    assert changed and all(uncheckable(s, context) for s in changed)
    monitor.settings.enabled = False
    assert torch.equal(monitor([], logits), logits)


def test_failing_provider_means_no_restriction(strings: list[str]) -> None:
    def broken(text: str) -> list[str]:
        raise RuntimeError("symbol table unavailable")

    monitor = NameMonitor(TokenIndex(strings), broken, "import os\nos.", MonitorSettings(check_top_k=len(strings), check_margin=float("inf"), check_receivers=len(strings)))
    logits = torch.randn(len(strings))
    assert all(uncheckable(s, "import os\nos.") for s in changed_tokens(strings, logits, monitor([], logits)))


def test_provider_time_is_bounded_per_request(strings: list[str]) -> None:
    """Past ``provider_seconds`` the monitor stops asking: later receivers go unchecked, cached ones
    stay checked."""
    asked: list[str] = []

    def slow(text: str) -> list[str]:
        asked.append(text)
        time.sleep(0.03)
        return fake_attributes(text)

    monitor = NameMonitor(TokenIndex(strings), slow, "import os\nitems = []\nos.", MonitorSettings(provider_seconds=0.02))
    logits = torch.zeros(len(strings))
    first = monitor([], logits)  # asks about os. (runs over the budget)
    assert asked == ["import os\nitems = []\nos."] and monitor.provider_seconds >= 0.02
    assert torch.isinf(first).any()  # os. is restricted to its names
    monitor.context = "import os\nitems = []\nitems."
    out = monitor([], logits)  # a new receiver past the budget: not asked, not restricted
    assert len(asked) == 1 and monitor.provider_skipped >= 1
    assert not torch.isinf(out[unchecked_plain(strings)]).any()
    assert torch.isinf(out[[i for i, s in enumerate(strings) if s[:1].isspace()]]).all()  # but not ``items.  x``
    monitor.context = "import os\nitems = []\nos."
    assert torch.equal(monitor([], logits), first)  # the cached receiver is still checked


def test_openers_on_a_call_result_are_masked_unasked(strings: list[str]) -> None:
    asked: list[str] = []

    def provider(text: str) -> list[str]:
        asked.append(text)
        return LIST_NAMES

    monitor = NameMonitor(TokenIndex(strings), provider, "x = make()",
                          MonitorSettings(check_top_k=len(strings), check_margin=float("inf"), check_receivers=len(strings)))
    openers = [i for i, s in enumerate(strings) if re.match(r"\.[A-Za-z_]", s)]
    assert openers
    out = monitor([], torch.zeros(len(strings)))
    assert torch.isinf(out[openers]).all() and not any(text.endswith(")" + ".") for text in asked)


@pytest.mark.parametrize("text,kind,partial", [
    ("x = os.pa", "attribute", "pa"),
    ("x = os.", "attribute", ""),
    ("x = 1.", "other", ""),
    ("x = 'a.b", "other", ""),
    ("# see os.pa", "other", ""),
    ("x = valu", "name", "valu"),
    ("x = (", "other", ""),
    ("x = 12", "other", ""),
])
def test_decoding_state(text: str, kind: str, partial: str) -> None:
    state = decoding_state(text)
    assert (state.kind, state.partial) == (kind, partial)


def test_trie() -> None:
    trie = NameTrie(["path", "pathsep", "sep"])
    assert trie.has_prefix("pat") and not trie.has_prefix("x")
    assert trie.has_name("path") and not trie.has_name("pat")
    assert sorted(trie.remainders("path")) == ["", "sep"]


def test_factory_builds_a_jedi_monitor_for_a_target(strings: list[str]) -> None:
    class Target:
        document, start, end, path = "import os\nos.\n", 13, 13, ""

    monitor = python_monitor_factory(strings)(Target())
    assert isinstance(monitor, NameMonitor) and monitor.context == "import os\nos."
    Target.language = "javascript"
    assert python_monitor_factory(strings)(Target()) is None


def test_attribute_answers_are_remembered_across_requests_per_scope() -> None:
    from glm5_lsp.repair.monitor import RememberedAttributes

    asked: list[str] = []

    def provider(text: str) -> list[str]:
        asked.append(text)
        return ["append"]

    now = [0.0]
    memory = RememberedAttributes(ttl_s=10.0, clock=lambda: now[0])
    first = memory.bind(provider, "a.py")
    code = "class A:\n    def f(self):\n        self.items = []\n        self."
    assert first(code) == ["append"] and len(asked) == 1
    assert memory.bind(provider, "a.py")(code + "items.append(1)\n        self.") == ["append"]
    assert len(asked) == 1  # the next keystroke, same scope and receiver: remembered
    memory.bind(provider, "b.py")(code)  # another file
    memory.bind(provider, "a.py")(code.replace("def f(self)", "def g(self)"))  # another method
    memory.bind(provider, "a.py")("x = make()\nmake().")  # not a dotted name: always asked
    assert len(asked) == 4
    now[0] = 11.0
    memory.bind(provider, "a.py")(code)  # too old: asked again
    assert len(asked) == 5


def test_no_checks_inside_a_docstring(strings: list[str]) -> None:
    asked: list[str] = []
    context = 'import os\n\ndef f():\n    """Join with os.'
    monitor = NameMonitor(TokenIndex(strings), lambda text: asked.append(text) or OS_NAMES, context,
                          MonitorSettings(check_top_k=len(strings), check_margin=float("inf"), check_receivers=len(strings)))
    logits = torch.randn(len(strings))
    assert torch.equal(monitor([], logits), logits) and asked == []


def test_receivers_the_document_never_binds_are_not_asked(strings: list[str]) -> None:
    asked: list[str] = []

    def provider(text: str) -> list[str]:
        asked.append(text)
        return OS_NAMES

    # ``variate`` came from the model: nothing in the document binds it. The provider's time bound
    # is not what this test is about: on a loaded machine the default 0.2 s, spent by the earlier
    # lookups' threads, left the last receiver unchecked.
    monitor = NameMonitor(TokenIndex(strings), provider, "import os\nvalue = ", MonitorSettings(provider_seconds=60.0))
    logits = torch.randn(len(strings))
    out = monitor(spell(strings, "variate."), logits)
    assert not any(text.endswith("variate.") for text in asked)
    assert torch.isfinite(out[unchecked_plain(strings)]).all()  # nothing masked but white space after the dot
    assert torch.isinf(monitor(spell(strings, "os."), logits)).any() and asked[-1].endswith("os.")  # bound: asked
    # a name the completion bound before it is asked about too
    assert torch.isinf(monitor(spell(strings, "os\nfor variate in x:\n    variate."), logits)).any()
    assert asked[-1].endswith("    variate.")
    # another function's local is not in scope here
    elsewhere = NameMonitor(TokenIndex(strings), provider, "def f():\n    variate = 1\n\ndef g():\n    return ")
    elsewhere(spell(strings, "variate."), logits)
    assert not asked[-1].endswith("return variate.")


def test_module_paths_in_an_import_are_asked_about(strings: list[str]) -> None:
    asked: list[str] = []

    def provider(text: str) -> list[str]:
        asked.append(text)
        return PATH_NAMES

    monitor = NameMonitor(TokenIndex(strings), provider, "x = 1\nfrom os.", known_names=["x"])
    assert torch.isinf(monitor([], torch.zeros(len(strings)))).any() and asked == ["x = 1\nfrom os."]


def test_a_name_that_is_only_read_must_become_a_known_name(strings: list[str]) -> None:
    """After ``=``/an operator/``if``..., a name nobody binds is undefined: tokens that would end the
    name early or lead it astray are masked while it can still become a known one."""
    context = "value = 1\nresult = 2\nx = result + val"
    monitor = NameMonitor(TokenIndex(strings), fake_attributes, context, MonitorSettings())
    out = monitor([], torch.zeros(len(strings)))
    assert monitor.name_masked_steps == 1
    for i, token in enumerate(strings):
        if not torch.isfinite(out[i]):
            continue
        ident = re.match(r"[A-Za-z0-9_]*", token).group()
        name = "val" + ident
        if ident == token:  # the name goes on: it must still lead to a known name
            assert "value".startswith(name) or any(n.startswith(name) for n in dir(__builtins__)), token
        else:  # the token ends the name: it must then be complete
            assert name in {"value", "vars"} or name in dir(__builtins__), token
    # Greedy decoding that favours an unknown name ends up spelling a known one.
    written = greedy(NameMonitor(TokenIndex(strings), fake_attributes, context, MonitorSettings()), strings, "vald)\n", 4)
    assert not re.match(r"vald\b", written) and re.match(r"(ue|ars)\b", written), written


@pytest.mark.parametrize("context", [
    "for val",  # a loop variable
    "def f(val",  # a parameter
    "f = lambda val",
    "from os import val",
    "a, val",  # tuple targets
])
def test_a_name_that_may_be_bound_is_not_masked(strings: list[str], context: str) -> None:
    monitor = NameMonitor(TokenIndex(strings), fake_attributes, "value = 1\n" + context, MonitorSettings())
    out = monitor([], torch.zeros(len(strings)))
    assert monitor.name_masked_steps == 0
    assert torch.isfinite(out[[i for i, s in enumerate(strings) if "." not in s]]).all()


def test_a_call_argument_may_be_a_keyword_name(strings: list[str]) -> None:
    """Inside a call an unknown name may be a keyword argument (or a generator's variable): only ending
    it otherwise than with ``=`` or a space is masked."""
    index = TokenIndex(strings)
    monitor = NameMonitor(index, fake_attributes, "value = 1\nprint(value, val", MonitorSettings())
    out = monitor([], torch.zeros(len(strings)))
    assert monitor.name_masked_steps == 1
    assert all(torch.isfinite(out[i]) for i in index.whole_ids)  # the name may grow into anything ...
    assert all(torch.isfinite(out[i]) for i in index.keyword_enders)  # ... and end as ``key=``
    enders = [i for i, s in enumerate(strings) if s[:1] in ")," and i not in index.keyword_enders]
    assert enders and not any(torch.isfinite(out[i]) for i in enders)  # ``val)`` would be undefined


def test_names_the_completion_bound_count_as_known(strings: list[str]) -> None:
    """A name the completion itself bound earlier (``for item in ...: ... item``) may be read later."""
    index = TokenIndex(strings)
    monitor = NameMonitor(index, fake_attributes, "value = 1\n", MonitorSettings())
    written = [strings.index(ch) for ch in "parts = 1\nx = par"]  # one token per character
    out = monitor(written, torch.zeros(len(strings)))
    assert monitor.name_masked_steps == 1  # "par" can only become "parts", which the completion bound
    assert any(torch.isfinite(out[i]) and strings[i].startswith("ts") for i in range(len(strings)))


def test_a_star_import_turns_the_name_check_off(strings: list[str]) -> None:
    monitor = NameMonitor(TokenIndex(strings), fake_attributes, "from os import *\nx = val", MonitorSettings())
    monitor([], torch.zeros(len(strings)))
    assert monitor.name_masked_steps == 0


@pytest.mark.parametrize("before, expected", [
    ("x = ", "load"), ("x = a + ", "load"), ("    if ", "load"), ("    return ", "load"), ("x[", "argument"),
    ("if a == ", "load"), ("raise E from ", "load"), ("@", "load"),
    ("f(", "argument"), ("foo(a, ", "argument"), ("x = [", "argument"), ("{", "argument"),
    ("    ", "target"), ("x = 1\n", "target"), ("y = x[1:", "load"), ("d = {k: ", "load"), ("if x: ", "free"), ("f(a,\n    ", "free"), ("x = 1 + \\\n    ", "free"),
    ("a, ", "free"), ("def f(a, ", "free"), ("for ", "free"), ("[y for ", "free"),
    ("g = lambda ", "free"), ("with open(p) as ", "free"), ("from x import ", "free"), ("x.y ", "free"),
])
def test_name_context(before: str, expected: str) -> None:
    from glm5_lsp.repair.monitor import name_context

    assert name_context("value = 1\n" + before) == expected


def test_an_unknown_call_argument_can_only_end_as_a_keyword(strings: list[str]) -> None:
    """Once an argument's name has left every known name, ending it with ``)`` would read an undefined
    name: only ``=`` (a keyword argument), a space (``x for x in ...``) or more of the name may follow."""
    index = TokenIndex(strings)
    monitor = NameMonitor(index, fake_attributes, "value = 1\nprint(value, zq", MonitorSettings())
    out = monitor([], torch.zeros(len(strings)))
    assert monitor.name_masked_steps == 1
    closers = [i for i, s in enumerate(strings) if s[:1] == ")"]
    assert closers and not any(torch.isfinite(out[i]) for i in closers)
    assert all(torch.isfinite(out[i]) for i in index.keyword_enders)


def test_the_word_at_the_cursor_is_kept_to_the_names_in_scope(strings: list[str]) -> None:
    """The word the user was typing, where it is read, can only become a name visible there (worked
    out from the text, the attribute provider is not asked): a name bound in another function is
    not enough, while one bound further down the module is."""
    context = "def f():\n    values = 1\n\n\ndef g(value):\n    if val"
    asked: list[str] = []

    def provider(text: str) -> list[str]:
        asked.append(text)
        return []

    monitor = NameMonitor(TokenIndex(strings), provider, context, MonitorSettings())
    written = greedy(monitor, strings, "ues:\n", 3)
    assert re.match(r"ue\b", written), written  # "values" is another function's local
    assert asked == []
    later = NameMonitor(TokenIndex(strings), provider, context, MonitorSettings(), after="\n\n\nvalues = 2\n")
    assert greedy(later, strings, "ues:\n", 3).startswith("ues")  # a module global, defined below


def test_the_healed_word_is_checked_as_it_is_written_again(strings: list[str]) -> None:
    """With token healing the typed word (``va``) is cut off the prompt and written again: a token
    that agrees with it but makes a name nobody binds (``value`` where only ``val`` exists) is masked
    where the name is read."""
    index = TokenIndex(strings)
    monitor = NameMonitor(index, fake_attributes, "val = 1\nx = 2 + ", MonitorSettings())
    monitor.expect_word("va")
    out = monitor([], torch.zeros(len(strings)))
    agreeing = [i for i, s in enumerate(strings)  # (tokens with an attribute in them: the opener check's)
                if s and (s.startswith("va") or "va".startswith(s)) and "." not in s]
    known = ("val", "vars")
    for i in agreeing:
        run = re.match(r"[A-Za-z0-9_]*", strings[i]).group()
        ok = any(n.startswith(run) for n in known) if run == strings[i] else run in known
        assert bool(torch.isfinite(out[i])) == ok, strings[i]
    assert any(not torch.isfinite(out[i]) for i in agreeing)  # "value..." tokens: nobody binds that
    free = NameMonitor(index, fake_attributes, "val = 1\n", MonitorSettings())  # a statement's start
    free.expect_word("va")
    assert torch.isfinite(free([], torch.zeros(len(strings)))[agreeing]).all()


def test_a_comprehension_variable_may_be_used_before_it_is_bound(strings: list[str]) -> None:
    """``[item for item in items]`` reads ``item`` before the ``for`` binds it: ending the unknown name
    with a space stays possible just inside a bracket, and ``]`` does not."""
    index = TokenIndex(strings)
    monitor = NameMonitor(index, fake_attributes, "values = 1\nx = [zq", MonitorSettings())
    out = monitor([], torch.zeros(len(strings)))
    spaced = [i for i in index.keyword_enders if strings[i][len(re.match(r"[A-Za-z0-9_]*", strings[i]).group()):][:1] == " "]
    assert spaced and all(torch.isfinite(out[i]) for i in spaced)
    closers = [i for i, s in enumerate(strings) if s[:1] == "]"]
    assert closers and not any(torch.isfinite(out[i]) for i in closers)


def test_a_local_of_an_enclosing_function_counts(strings: list[str]) -> None:
    """A local of the function (and of the function around it) is in scope for the cursor's word."""
    context = "def g():\n    values = 1\n    def h():\n        x = 2 + val"
    monitor = NameMonitor(TokenIndex(strings), lambda text: [], context, MonitorSettings())
    written = greedy(monitor, strings, "ues\n", 3)
    assert written.startswith("ues"), written


def test_warm_jedi_lists_the_imported_modules_but_not_relative_ones(monkeypatch) -> None:
    from glm5_lsp.pynames import jedi as monitor

    monkeypatch.setattr(monitor, "_WARMED", set())  # as in a fresh process
    monkeypatch.setattr(monitor, "_MEMBERS", {})
    code = "import os\nimport json.decoder\nfrom . import sibling\nfrom os import path\n\nvalue = os.path\n"
    assert warm_jedi(code) == 2  # os and json.decoder, each once
    assert "join" in JediAttributes()(code + "os.path.")
    assert warm_jedi(code + "import textwrap\n") == 1  # only the module not listed before
    assert sorted(monitor._MEMBERS) == ["json.decoder", "os", "textwrap"]
    assert "path" in monitor._MEMBERS["os"] and "JSONDecoder" in monitor._MEMBERS["json.decoder"]


def test_a_module_receiver_is_answered_from_the_listing_kept_when_the_file_opened(monkeypatch) -> None:
    """``re.``, ``os.path.``, ``t.`` (``import typing as t``): the module's names as jedi lists them in
    the document, without asking jedi again (20-200 ms a lookup, once per scope before)."""
    from glm5_lsp.pynames import jedi

    monkeypatch.setattr(jedi, "_MEMBERS", {})
    code = "import os\nimport re\nimport typing as t\n\n\ndef f(pattern):\n    return "
    warm_jedi(code)
    asked: list[str] = []
    provider = ModuleAttributes(code, lambda text: asked.append(text) or ["fallback"])
    for receiver in ("re.", "os.path.", "t."):
        assert sorted(provider(code + receiver)) == sorted(JediAttributes()(code + receiver)), receiver

    def no_jedi() -> None:
        raise AssertionError("jedi asked again")

    monkeypatch.setattr(jedi, "_jedi", no_jedi)
    assert "compile" in provider(code + "re.") and "join" in provider(code + "os.path.")
    assert "Any" in provider(code + "t.") and not asked


@pytest.mark.parametrize("text", [
    "x = t.Any.",  # an attribute of the module that is no module
    "x = pattern.",  # not imported
    "x = np.",  # rebound below
    "x = mine.",  # the workspace's own module
    "x = json.",  # bound by ``from``
])
def test_receivers_that_are_not_installed_modules_go_to_the_fallback(tmp_path, monkeypatch, text: str) -> None:
    (tmp_path / "mine_workspace_module.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code = ("import typing as t\nimport numpy as np\nimport mine_workspace_module as mine\nfrom x import json\n"
            "np = None\n")
    provider = ModuleAttributes(code, lambda asked: ["fallback"])
    assert provider(code + text) == ["fallback"]


@pytest.mark.parametrize(("line", "rebound"), [
    ("def f(a, t):", True), ("def f(\n    a,\n    t,\n):", True), ("for a, t in x:", True), ("t = 1", True),
    ("t: int = 1", True), ("t += 1", True), ("f(t=1)", True), ("with open(p) as t:", True), ("from a import t", True),
    ("from a import (b,\n   t)", True), ("from a import b as t", True), ("del t", True), ("lambda t: 1", True),
    ("if (t := 3):", True), ("class t:", True), ("global t", True), ("y = [t for t in z]", True),
    ("def f(a: t.Any):", False), ("def f(\n    a: t.Any,\n) -> t.Any:", False), ("for x in t.items():", False),
    ("x = t.cast(int, y)", False), ("import t", False), ("del t.x", False), ("x == t", False), ("print(t)", False),
    ("x = [y for y in t]", False), ("tt = 1\nt2 = 3\nx.t = 4", False), ("f(\n  t,\n)", False),
])
def test_what_rebinds_an_imported_name(line: str, rebound: bool) -> None:
    assert _rebound(f"import typing as t\n{line}\n", "t") is rebound


def test_import_aliases() -> None:
    code = "import os, sys as s\n  import json # c\nimport a.b\nimport a.c as ac\nx = 1; import no\nimport q as s\n"
    assert import_aliases(code) == {"os": "os", "json": "json", "a": "a", "ac": "a.c"}  # ``s`` is two modules


def test_a_lookup_still_running_at_the_request_deadline_is_stopped(strings: list[str]) -> None:
    """The provider's time is also bounded by the request's (``time_left``, set by the repair loop):
    a lookup that would run on is stopped there and its receiver left unchecked."""
    def slow(text: str) -> list[str]:
        end = time.perf_counter() + 2.0
        while time.perf_counter() < end:
            pass
        return OS_NAMES

    monitor = NameMonitor(TokenIndex(strings), slow, "import os\nvalue = os.", MonitorSettings(provider_seconds=5.0))
    deadline = time.perf_counter() + 0.05
    monitor.time_left = lambda: deadline - time.perf_counter()
    logits = torch.randn(len(strings))
    started = time.perf_counter()
    out = monitor([], logits)
    assert time.perf_counter() - started < 1.0
    plain = unchecked_plain(strings)
    assert torch.equal(out[plain], logits[plain]) and monitor.provider_skipped >= 1  # unchecked: no mask


def test_identifiers_read_in_kept_pieces_are_every_identifier_of_the_text() -> None:
    path = Path(sysconfig.get_paths()["stdlib"]) / "argparse.py"
    if not path.is_file():
        pytest.skip(f"{path} is not on this machine")
    text = path.read_text(encoding="utf-8")
    rng = random.Random(5)
    for _ in range(10):
        cut = text[: rng.randrange(len(text))]
        assert identifiers(cut) == set(_IDENT_WORD.findall(cut))
    assert identifiers("x = r'raw'\ndef f(a):\n    return a\n") == {"x", "def", "f", "a", "return"}


def test_nothing_led_by_white_space_follows_a_dot(strings: list[str]) -> None:
    """Even where the receiver's names are unknown (a lookup cut off at the request's time), the name
    starts right after the dot: ``self.items.        self.set = x`` parses, and the checkers pass it."""
    spaced = [i for i, s in enumerate(strings) if s[:1].isspace()]
    assert spaced
    monitor = NameMonitor(TokenIndex(strings), lambda text: [], "thing = make()\nthing.", MonitorSettings())
    logits = torch.zeros(len(strings))
    logits[spaced] = 10.0
    out = monitor([], logits)
    assert torch.isinf(out[spaced]).all() and not strings[int(torch.argmax(out))][:1].isspace()


def test_what_the_monitor_reads_from_the_whole_file_is_read_when_it_opens(strings: list[str], monkeypatch) -> None:
    import glm5_lsp.repair.monitor as monitor_module
    from glm5_lsp.repair.standard import standard_loop

    read: list[tuple[str, str]] = []
    monkeypatch.setattr(monitor_module, "identifiers", lambda text: read.append(("identifiers", text)) or set())
    monkeypatch.setattr(monitor_module, "scope_at", lambda before, after="": read.append(("scope", before)))
    loop = standard_loop(object(), token_strings=strings, exception_fill=False)
    loop.warm("def f(x):\n    return x\n", "python", "m.py")
    assert read == [("identifiers", "def f(x):\n    return x\n"), ("scope", "def f(x):\n    return x\n")]
    loop.warm("let x = 1;\n", "javascript", "m.js")
    assert len(read) == 2
