"""The repair loop with a scripted backend (a test double returning canned candidates): repair on
round 2, the repair prompt's hints and error_context spans, round and time budgets, unclean
candidates withheld by default, crashing providers skipped."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field

import pytest

from glm5_lsp.backends.base import BackendError, Completion, CompletionRequest
from glm5_lsp.checks.introduced import Splice, judge
from glm5_lsp.checks.providers import DiagnosticRunner, default_providers
from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.repair.loop import RepairLoop, RepairSettings, RepairTarget
from glm5_lsp.spans import Prompt, Span

DOCUMENT = "import math\n\n\ndef area(radius):\n    return \n\n\nprint(area(2))\n"
CURSOR = DOCUMENT.index("return ") + len("return ")
RUNNER = DiagnosticRunner(default_providers("python", use_external=False), timeout_s=10)


@dataclass
class ScriptedBackend:
    """Returns the given texts in order (the last one again when it runs out) and records requests."""

    texts: list[str]
    logprobs: list[float] | None = None
    seconds_per_call: float = 0.0
    clock: FakeClock | None = None
    requests: list[CompletionRequest] = field(default_factory=list)
    name: str = "scripted"
    supports_internals: bool = True

    def complete(self, request: CompletionRequest) -> Completion:
        index = min(len(self.requests), len(self.texts) - 1)
        self.requests.append(request)
        if self.clock is not None:
            self.clock.now += self.seconds_per_call
        logprob = self.logprobs[index] if self.logprobs else -1.0
        return Completion(self.texts[index], "stop", logprob=logprob, completion_tokens=4)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def request() -> CompletionRequest:
    prefix, suffix = DOCUMENT[:CURSOR], DOCUMENT[CURSOR:]
    return CompletionRequest(Prompt(prefix, suffix, [Span(prefix.index("def"), CURSOR, "current_block")]))


def target() -> RepairTarget:
    return RepairTarget(DOCUMENT, CURSOR, CURSOR, "geometry.py", "python")


def test_broken_first_candidate_is_repaired_on_round_two() -> None:
    backend = ScriptedBackend(["math.pi * radius **", "math.pi * radius ** 2"])
    result = RepairLoop(backend, RepairSettings(max_rounds=3), RUNNER).run(request(), target())
    assert result.text == "math.pi * radius ** 2"
    assert result.clean and result.rounds == 2 and result.candidates_tried == 2
    assert result.diagnostics_after == []
    assert [d.code for d in result.diagnostics_before] == ["UnusedImport"]  # the candidate uses math
    assert result.tokens == 8
    assert result.candidates[0].blocking and not result.candidates[1].blocking


def test_repair_prompt_carries_the_hint_and_error_context_spans() -> None:
    backend = ScriptedBackend(["math.pi * radus ** 2", "math.pi * radius ** 2"])
    RepairLoop(backend, RepairSettings(), RUNNER).run(request(), target())
    first, second = backend.requests
    assert first.prompt.prefix == DOCUMENT[:CURSOR]  # round 1 is the caller's prompt
    prompt = second.prompt
    hint = "# error (pyflakes) line 5: undefined name 'radus': `return math.pi * radus ** 2`"
    assert hint in prompt.prefix
    block_start = prompt.prefix.index("    # The previous completion")
    assert prompt.prefix[:block_start] == DOCUMENT[:DOCUMENT.index("    return")]  # cache-friendly
    assert prompt.prefix.endswith("\n    return ")
    error_spans = [s for s in prompt.spans if s.role == "error_context"]
    assert any(s.start == block_start and prompt.text()[s.start:s.end].rstrip().endswith(hint) for s in error_spans)
    assert all(prompt.role_at(i) == "error_context" for i in range(block_start, block_start + len(hint)))
    # the caller's span still covers the same code, now including the block it straddles
    (block_span,) = [s for s in prompt.spans if s.role == "current_block"]
    assert prompt.text()[block_span.start:block_span.end].startswith("def area(radius):")
    assert prompt.text()[block_span.end - 11:block_span.end] == "    return "
    assert second.temperature == pytest.approx(0.3)


def test_offending_suffix_line_is_marked_error_context() -> None:
    # the candidate deletes `area`, so the document's own line after the cursor fails
    backend = ScriptedBackend(["radius\n\n\narea = 1\ndel area", "1.0"])
    RepairLoop(backend, RepairSettings(max_rounds=2), RUNNER).run(request(), target())
    prompt = backend.requests[1].prompt
    marked = [prompt.text()[s.start:s.end] for s in prompt.spans if s.role == "error_context"]
    assert any("print(area(2))" in text and "#" not in text for text in marked), marked


def test_rounds_budget_and_unclean_withheld_by_default() -> None:
    backend = ScriptedBackend(["radius +", "radius -", "radius *", "radius ** 2"])
    result = RepairLoop(backend, RepairSettings(max_rounds=3), RUNNER).run(request(), target())
    assert len(backend.requests) == 3 and result.rounds == 3
    assert result.text is None and not result.clean
    assert result.diagnostics_after == []


def test_return_unclean_gives_the_best_with_its_diagnostics() -> None:
    backend = ScriptedBackend(["radius +", "radius + nope", "radius + (("], logprobs=[-9.0, -1.0, -2.0])
    settings = RepairSettings(max_rounds=3, return_unclean=True)
    result = RepairLoop(backend, settings, RUNNER).run(request(), target())
    assert not result.clean
    # each has one blocking problem except "((" (compile + tree-sitter): the likelier of the others wins
    assert result.text == "radius + nope"
    assert [d.code for d in result.diagnostics_after] == ["UndefinedName"]


def test_the_best_unclean_candidate_is_text_before_nothing() -> None:
    """An empty candidate has no diagnostics but is no answer: asked for the best unclean one, the
    loop returns the text that has some, not nothing."""
    backend = ScriptedBackend(["", "radius +", "  "])
    result = RepairLoop(backend, RepairSettings(max_rounds=3, return_unclean=True), RUNNER).run(request(), target())
    assert result.text == "radius +" and not result.clean and result.diagnostics_after


def test_time_budget_stops_the_loop_and_cancels_generation() -> None:
    clock = FakeClock()
    backend = ScriptedBackend(["radius +"], seconds_per_call=4.0, clock=clock)
    loop = RepairLoop(backend, RepairSettings(max_rounds=10, time_budget_s=10.0), RUNNER, clock=clock)
    result = loop.run(request(), target())
    assert len(backend.requests) == 3  # started at t=0, 4, 8; t=12 is past the budget
    assert result.rounds == 3 and result.text is None
    assert backend.requests[-1].should_cancel is not None and backend.requests[-1].should_cancel()


def test_past_the_deadline_only_the_first_word_is_tried_as_a_clean_prefix() -> None:
    """A broken candidate is cut back to a clean prefix, longest first; each try checks the whole
    document, so once the time is up only the shortest (the first word) is still tried."""
    on_time = RepairLoop(ScriptedBackend(["math.pi * radius ** ("]), RepairSettings(max_rounds=1, max_truncations=4),
                         RUNNER).run(request(), target())
    assert on_time.text == "math.pi * radius"
    clock = FakeClock()
    late = RepairLoop(ScriptedBackend(["math.pi * radius ** ("], seconds_per_call=2.0, clock=clock),
                      RepairSettings(max_rounds=1, max_truncations=4, time_budget_s=1.0), RUNNER, clock=clock)
    result = late.run(request(), target())
    assert result.text == "math" and result.clean


def test_caller_cancellation_stops_further_rounds() -> None:
    backend = ScriptedBackend(["radius +", "radius * 2"])
    cancelled = request()
    cancelled.should_cancel = lambda: True
    result = RepairLoop(backend, RepairSettings(max_rounds=3), RUNNER).run(cancelled, target())
    assert len(backend.requests) == 1 and result.text is None


def test_the_best_clean_candidate_is_kept_and_empty_is_not_clean() -> None:
    backend = ScriptedBackend(["", "radius * 2"])
    result = RepairLoop(backend, RepairSettings(), RUNNER).run(request(), target())
    assert result.text == "radius * 2" and result.rounds == 2
    assert "the completion was empty" in backend.requests[1].prompt.prefix


def test_rewriters_are_kept_only_when_they_add_nothing() -> None:
    backend = ScriptedBackend(["math.pi*radius**2"])
    good = lambda text, _t: text.replace("*", " * ").replace(" *  * ", " ** ")
    bad = lambda text, _t: text + " +"
    result = RepairLoop(backend, RepairSettings(), RUNNER, rewriters=[bad, good]).run(request(), target())
    assert result.text == "math.pi * radius ** 2"
    worse = lambda text, _t: text.replace("**", "*")
    result = RepairLoop(ScriptedBackend(["radius**2"]), RepairSettings(), RUNNER, rewriters=[worse]).run(
        request(), target())
    assert result.text == "radius*2"


def test_crashing_provider_is_skipped_and_the_loop_goes_on() -> None:
    class Crashing:
        name = "crashing"
        languages = frozenset({"python"})

        def diagnose(self, text: str, path: str, language: str) -> list[Diagnostic]:
            if "radius" in text.split("return", 1)[1].split("\n")[0]:
                raise RuntimeError("provider crashed on this candidate")
            return []

    runner = DiagnosticRunner([Crashing(), *default_providers("python", use_external=False)], timeout_s=5)
    backend = ScriptedBackend(["radius +", "radius * 2"])
    result = RepairLoop(backend, RepairSettings(), runner).run(request(), target())
    assert result.text == "radius * 2" and result.clean
    assert any(s.startswith("crashing: RuntimeError") for s in result.skipped_providers)


def test_hanging_provider_is_skipped_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    class Hanging:
        name = "hanging"
        languages = frozenset({"python"})

        def diagnose(self, text: str, path: str, language: str) -> list[Diagnostic]:
            if "slow" in text:
                time.sleep(3)
            return []

    runner = DiagnosticRunner([Hanging(), *default_providers("python", use_external=False)], timeout_s=0.3)
    backend = ScriptedBackend(["radius + slow", "radius * 2"])
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        result = RepairLoop(backend, RepairSettings(), runner).run(request(), target())
    assert time.monotonic() - started < 2.5
    assert result.text == "radius * 2" and result.rounds == 2  # round 1 still failed on pyflakes
    assert any(s.startswith("hanging: timed out") for s in result.skipped_providers)
    assert "hanging skipped" in caplog.text


def test_monitor_factory_is_attached_for_python_only_by_default() -> None:
    seen: list[object] = []
    backend = ScriptedBackend(["radius * 2"])
    marker = lambda ids, logits: logits
    loop = RepairLoop(backend, RepairSettings(), RUNNER, monitor_factory=lambda t: seen.append(t) or marker)
    loop.run(request(), target())
    assert backend.requests[0].logits_processor is marker and len(seen) == 1
    loop.settings = RepairSettings(monitor=False)
    loop.run(request(), target())
    assert backend.requests[1].logits_processor is None


def test_the_monitor_is_told_of_a_healed_word_and_not_of_a_healed_space() -> None:
    """A healed word is a name being typed, which the monitor checks as it is written again; a
    healed space (`` return ``) is no name: told of it, the monitor banned ``return`` as undefined."""
    class Monitor:
        def __init__(self) -> None:
            self.words: list[str] = []

        def expect_word(self, word: str) -> None:
            self.words.append(word)

        def __call__(self, ids, logits):
            return logits

    for forced, told in (("rad", ["rad"]), (" return ", [])):
        made: list[Monitor] = []
        loop = RepairLoop(ScriptedBackend([forced + "ius * 2"]), RepairSettings(max_rounds=1), RUNNER,
                          monitor_factory=lambda t, made=made: made.append(Monitor()) or made[-1])
        loop.run(dataclasses.replace(request(), forced_prefix=forced), target())
        assert made and all(m.words == told for m in made), (forced, [m.words for m in made])


def test_backend_error_on_a_later_round_keeps_what_was_found() -> None:
    class FailsSecond(ScriptedBackend):
        def complete(self, request: CompletionRequest) -> Completion:
            if self.requests:
                raise BackendError("server went away")
            return super().complete(request)

    result = RepairLoop(FailsSecond(["radius +"]), RepairSettings(return_unclean=True), RUNNER).run(request(), target())
    assert result.text == "radius +" and not result.clean


def test_backend_error_on_the_first_round_is_raised() -> None:
    class Fails(ScriptedBackend):
        def complete(self, request: CompletionRequest) -> Completion:
            raise BackendError("no model")

    with pytest.raises(BackendError):
        RepairLoop(Fails(["x"]), RepairSettings(), RUNNER).run(request(), target())


def test_settings_validation() -> None:
    with pytest.raises(ValueError):
        RepairSettings(max_rounds=0)
    with pytest.raises(ValueError):
        RepairSettings(time_budget_s=0)


def test_with_nothing_clean_an_as_you_type_completion_finishes_the_typed_word() -> None:
    """``    rad`` typed, the model writes junk: the answer is the word finished from the names around
    it (``radius``, the parameter), judged like any candidate, before a second generation (which
    runs only when no finished word is clean). Only for completions that may be cut short
    (``max_truncations``); a fix or a generated body gets nothing instead."""
    from glm5_lsp.pynames.words import finishing_words

    document = "import math\n\n\ndef area(radius):\n    rad\n\n\nprint(area(2))\n"
    cursor = document.index("rad\n") + 3
    where = RepairTarget(document, cursor - 3, cursor, "geometry.py", "python")  # healed: "rad" is rewritten
    healed = CompletionRequest(Prompt(document[: cursor - 3], document[cursor:], []), forced_prefix="rad")
    junk = ScriptedBackend(["radx y z", "radx y z"])
    result = RepairLoop(junk, RepairSettings(max_rounds=2, max_truncations=2), RUNNER,
                        finisher=finishing_words).run(healed, where)
    assert result.clean and result.text == "radius"
    assert result.candidates[-1].finished_word and result.candidates[-1].round == 0
    assert len(junk.requests) == 1  # the finished word came before a second generation
    nothing = "import math\n\n\ndef area(radius):\n    zq\n"  # no name starts with "zq"
    cursor = nothing.index("zq\n") + 2
    stuck = ScriptedBackend(["zqx y z", "zqx y z"])
    result = RepairLoop(stuck, RepairSettings(max_rounds=2, max_truncations=2), RUNNER, finisher=finishing_words).run(
        CompletionRequest(Prompt(nothing[: cursor - 2], nothing[cursor:], []), forced_prefix="zq"),
        RepairTarget(nothing, cursor - 2, cursor, "geometry.py", "python"))
    assert result.text is None and len(stuck.requests) == 2  # no finished word: the model's second round
    whole = RepairLoop(ScriptedBackend(["radx y z"]), RepairSettings(max_rounds=1, max_truncations=0), RUNNER,
                       finisher=finishing_words).run(healed, where)
    assert whole.text is None and not whole.clean


def test_a_word_nothing_binds_is_rejected_where_the_document_does_not_parse() -> None:
    """``to`` typed in a line cut short (the indented line under it no longer parses, so no checker sees
    names): ``total_count`` passes every checker but nothing binds it. The word check rejects it and
    the finished word (``total``) is the answer; without the check the made-up name is returned."""
    from glm5_lsp.pynames.words import finishing_words, unknown_word

    document = "def count(items):\n    total = 0\n    for item in items:\n        to\n            total += 1\n    return total\n"
    cursor = document.index("to\n") + 2
    where = RepairTarget(document, cursor, cursor, "counting.py", "python")
    request = CompletionRequest(Prompt(document[:cursor], document[cursor:], []))
    unchecked = RepairLoop(ScriptedBackend(["tal_count"]), RepairSettings(max_rounds=1, max_truncations=2), RUNNER,
                           finisher=finishing_words).run(request, where)
    assert unchecked.clean and unchecked.text == "tal_count"
    model = ScriptedBackend(["tal_count", "tal_count"])
    checked = RepairLoop(model, RepairSettings(max_rounds=2, max_truncations=2),
                         RUNNER, finisher=finishing_words, word_check=unknown_word).run(request, where)
    assert checked.clean and checked.text == "tal" and checked.candidates[-1].finished_word
    assert len(model.requests) == 1  # only the word was wrong: finished at once, no second generation
    (problem,) = checked.candidates[0].blocking
    assert (problem.source, problem.code, problem.line, problem.col) == ("names", "undefined-name", 3, 8)
    assert "'total_count'" in problem.message
    # A fix or a generated body (no truncation: not as-you-type) is not checked this way.
    body = RepairLoop(ScriptedBackend(["tal_count"]), RepairSettings(max_rounds=1), RUNNER,
                      word_check=unknown_word).run(request, where)
    assert body.clean and body.text == "tal_count"


def test_unknown_word_flags_only_names_read_that_nothing_binds() -> None:
    from glm5_lsp.pynames.words import unknown_word

    before = "import os\n\ndef f(items):\n    total = 0\n    "
    after = "\n        total += 1\n    return total\n"
    assert unknown_word(before, "el", "e_to", after, "python") == "ele_to"
    assert unknown_word(before, "zz", "top(1)", after, "python") == "zztop"
    for typed, text in [("wh", "ile True:"), ("to", "tal"), ("it", "ems"), ("pr", "int(total)"),  # keyword, local, parameter, builtin
                        ("co", "unt = 0"), ("co", "unt, x = 1, 2"), ("co", "unt += 1"), ("na", "me: int"), ("ma", "tch := 3")]:  # bound here
        assert unknown_word(before, typed, text, after, "python") is None, (typed, text)
    assert unknown_word(before + "for ", "ab", "c in items:", after, "python") is None  # a loop variable
    assert unknown_word(before + "total = [", "it", "em * 2 for item in items]", after, "python") is None  # bound later
    assert unknown_word(before + "os.", "pa", "th", after, "python") is None  # an attribute: jedi's business
    assert unknown_word(before, "la", "ter", after + "later = 3\n", "python") is None  # bound further down
    assert unknown_word("from x import *\n" + before, "zz", "top(1)", after, "python") is None
    assert unknown_word(before, "zz", "top(1)", after, "javascript") is None
    assert unknown_word(before + '"""Count the ', "wo", "lds.", after, "python") is None  # prose in a docstring
    assert unknown_word(before + "x = 1  # the ", "wo", "lds", after, "python") is None  # ... in a comment
    assert unknown_word(before + 'raise ValueError("Extra ', "da", "tibility", after, "python") is None  # ... a string
    assert unknown_word(before, "", "zztop", after, "python") is None  # nothing typed: not a word being finished


def test_finishing_words_prefers_the_names_used_near_the_cursor() -> None:
    from glm5_lsp.pynames.words import finishing_words

    far = "values = 1\n" + "pass\n" * 1000 + "def other():\n    valued = 2\n"  # far from the cursor
    before = far + "def f(valid, value):\n    total = value + value + valid\n    "
    assert finishing_words(before, "val", "\n", "python") == ["value", "valid", "values"]
    assert finishing_words(before, "value", "\n", "python") == ["values"]  # not the typed word, not other()'s local
    assert "return" in finishing_words("def f():\n    ", "ret", "\n", "python")
    branch = "def f(x):\n    if x:\n        return 1\n    "
    assert "else:" in finishing_words(branch, "el", "\n        return 2\n", "python")  # alone on its line
    assert "else" in finishing_words(branch + "y = 1 if x ", "el", " 2\n", "python")  # inside an expression
    assert finishing_words("int count = 0;\nco", "co", "\n", "c") == ["count"]
    assert finishing_words("x = 1\n", "", "", "python") == []


@pytest.mark.parametrize("before, typed, after, expected, absent", [
    # keywords that only begin a statement are no word inside one (the cut line already fails to
    # parse, so the checks would let ``if not def`` through)
    ("decoded = 1\nif not ", "de", ":\n    pass\n", "decoded", "def"),
    ("frames = []\nmatches = ", "fr", "\n", "frames", "from"),
    ("four = 4\ndef f():\n    return ", "fo", "\n", "four", "for"),
    ("def f():\n    yield ", "fr", "\n", "from", None),  # ``yield from``
    ("from typing ", "im", "\n", "import", None),
    ("from typing import ", "As", "\n", None, "assert"),  # a name the module exports, never a keyword
    # a method's first parameter; a classmethod's
    ("class A:\n    set_x = 1\n    def raw(", "se", ") -> int:\n        pass\n", "self", None),
    ("class A:\n    @classmethod\n    def make(", "cl", "):\n        pass\n", "cls", None),
    # prose: the document's words (``content``, said below), not the names in scope (``continue``)
    ('def f():\n    """The amount of co', "co", 'ntent."""\n    # the content\n', "content", "continue"),
    # the name a ``def`` binds: another definition's, a special method, what is called, never an import
    ("from __future__ import annotations\n\nclass E(Exception):\n    def __", "__", "\n", "__init__", "__future__"),
    ("class E:\n    def __init__(self):\n        pass\n\n    def __", "__", "\n", "__repr__", "__init__"),
    ("class E:\n    def __init__(self):\n        self.reset()\n\n    def re", "re", "\n", "reset", None),
    ("import os\n\ndef ru", "ru", "\n\nrun(os.sep)\n", "run", None),
    ("import os\nfrom os import path as pa\n\ndef pa", "pa", "\n", None, "path"),
    ("def load(p):\n    pass\n\ndef lo", "lo", "\n", None, "load"),  # defined already: not again
    ("x = 1\ndef pr", "pr", "\nprint(x)\n", None, "print"),  # a builtin's name
])
def test_finishing_words_fit_where_the_word_is(before: str, typed: str, after: str, expected: str | None,
                                               absent: str | None) -> None:
    from glm5_lsp.pynames.words import finishing_words

    words = finishing_words(before, typed, after, "python")
    if expected is not None:
        assert words[:1] == [expected]
    if absent is not None:
        assert absent not in words


def test_the_typed_word_is_read_from_the_end_as_a_regex_would_find_it() -> None:
    import random
    import re

    from glm5_lsp.postprocess import trailing_identifier

    at_end = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
    rng = random.Random(1)
    for _ in range(5000):
        text = "".join(rng.choice("ab1_ .(\n9Z") for _ in range(rng.randrange(12)))
        found = at_end.search(text)
        assert trailing_identifier(text) == (found.group(0) if found else ""), text


def test_the_loop_hands_its_deadline_to_the_backend() -> None:
    """A served model's retries and circuit breaker go by ``request.deadline``: the loop's time budget
    reaches it as a ``time.monotonic()`` instant (never later than the caller's own deadline)."""
    clock = FakeClock()
    clock.now = 1000.0  # the loop's clock is not time.monotonic(): the deadline is converted
    backend = ScriptedBackend(["math.pi * radius ** 2"], clock=clock)
    loop = RepairLoop(backend, RepairSettings(time_budget_s=2.0), RUNNER, clock=clock)
    before = time.monotonic()
    loop.run(request(), target())
    sent = backend.requests[0].deadline
    assert sent is not None and before + 1.5 <= sent <= time.monotonic() + 2.0
    tighter = request()
    tighter.deadline = time.monotonic() + 0.5
    backend.requests.clear()
    loop.run(tighter, target())
    assert backend.requests[0].deadline == tighter.deadline


def test_a_word_typed_after_a_dot_is_finished_as_an_attribute() -> None:
    """``self.fl`` is finished from what follows ``self.`` in the file, never from the scope's names
    (``float`` is a builtin, not an attribute); a receiver with no attributes in sight takes any
    name written after a dot."""
    from glm5_lsp.pynames.words import finishing_words

    code = ("class Test:\n    def test_one(self):\n        width = float(3)\n        self.flakes('x')\n"
            "        self.flush()\n")
    assert sorted(finishing_words(code + "        self.", "fl", "\n", "python")) == ["flakes", "flush"]
    assert finishing_words(code + "        width = ", "fl", "\n", "python") == ["float"]
    assert sorted(finishing_words(code + "        other.", "fl", "\n", "python")) == ["flakes", "flush"]
    assert finishing_words("import os\nos.path.join('a')\nx = os.", "pa", "\n", "python") == ["path"]


def test_a_keyword_finished_may_leave_its_statement_waiting_for_the_rest_of_the_line() -> None:
    """``from os im``: ``import`` is the only word that can go there, but ``from os import`` does not
    parse until a name follows, so the check rejected it and nothing was shown. A keyword whose only
    problem is a syntax error where the line runs out is a statement to come; one that cannot go
    where it is (an error at the keyword itself) and a plain name that breaks the code still fail."""
    from glm5_lsp.checks.providers import default_runner
    from glm5_lsp.pynames.words import finishing_words
    from glm5_lsp.repair.loop import statement_to_come

    python = default_runner("python")  # the checkers a Python document gets (compile, ruff)

    def finished(document: str, typed: str) -> str | None:
        cursor = document.index(typed + "\n") + len(typed)
        where = RepairTarget(document, cursor, cursor, "m.py", "python")
        loop = RepairLoop(ScriptedBackend([]), RepairSettings(max_truncations=2), python, finisher=finishing_words)
        found = loop.finish_word("", where)
        return found.text if found is not None else None

    assert finished("import sys\nfrom os im\nprint(sys.argv)\n", "from os im") == "port"
    chain = "def f(x):\n    if x:\n        return 1\n    el\n        return 2\n    elif x > 1:\n        return 3\n"
    assert finished(chain, "    el") == "if"  # ``else:`` before an ``elif`` does not parse
    assert finished("fr\nx = 1\n", "fr") == "om"  # ``from`` before ``frozenset``: a statement to come
    body = "def g(x):\n    return x\n"
    splice = Splice(body, body.index("x\n"), body.index("x\n"), "for ")  # ``return for x``: wrong at once
    verdict = judge(splice, python, "m.py", "python")
    assert verdict.blocking() and not statement_to_come(splice, verdict.blocking())


def test_the_documents_own_check_waits_for_the_prefill_and_the_memorys_line() -> None:
    """The prompt's prefill goes to the backend first, and the document's own check (the baseline:
    two helper processes) only after the memory's line is worked out: started earlier, its helpers
    took the core the prefill runs on (the prefill's wait 2.6-2.9 -> 1.5-1.7 ms at the median, 48
    FIT cursors in process). It is still done before the first candidate is judged."""
    events: list[str] = []

    class Recording(DiagnosticRunner):
        def diagnose(self, text: str, path: str, language: str):
            events.append("check the document" if text == DOCUMENT else "check a candidate")
            return super().diagnose(text, path, language)

    class Prefetching(ScriptedBackend):
        def prefetch(self, request: CompletionRequest) -> bool:
            events.append("prefetch")
            return True

        def complete(self, request: CompletionRequest) -> Completion:
            time.sleep(0.2)  # the baseline's thread has long started by the time the model is done
            events.append("complete")
            return super().complete(request)

    loop = RepairLoop(Prefetching(["math.pi * radius ** 2"]), RepairSettings(max_rounds=1, max_truncations=3),
                      Recording(default_providers("python", use_external=False), timeout_s=10, recent=None))
    loop.agreed = lambda request, target: events.append("the memory's line") or ""
    result = loop.run(dataclasses.replace(request(), stop=["\n"]), target())  # a one-line request
    assert result.text == "math.pi * radius ** 2" and result.clean
    assert events[:3] == ["prefetch", "the memory's line", "check the document"]
    assert events.index("complete") < events.index("check a candidate")
