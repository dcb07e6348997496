"""The workspace memory wired into what the user gets: the pipeline mixes it into the in-process
model's decoding (around the decoding monitor), offers its continuation as one more judged
candidate for a served model, and follows documents as the editor and the disk change them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from glm5_lsp.backends.base import Completion, CompletionRequest
from glm5_lsp.backends.local import LocalBackend
from glm5_lsp.memory.mixing import COUNT_EDGES, LENGTH_EDGES, SHARE_EDGES, Interpolation, MemoryProcessor
from glm5_lsp.model import default_model_path, load_tokenizer
from glm5_lsp.pipeline import Pipeline, PipelineSettings, RepairSettings
from glm5_lsp.pipeline.memory import IndexCancelled, MemorySettings, SessionMemory

LIBRARY = '''def compute_total(items, discount=0.0, rounding="plain"):
    return sum(items) * (1 - discount)


def invoice(items):
    return compute_total(items, discount=0.25, rounding="banker")
'''
TYPED = '''from billing import compute_total


def quote(items):
    return compute_total(items, dis'''
DOCUMENT = TYPED + "\n"
EXPECTED = 'count=0.25, rounding="banker")'
# Two more lines that start as the typed one does and go on otherwise: the workspace's lines then say
# "count=0.5)" (two to one) where the token-level match (longest in billing.py) says EXPECTED, so the
# memory's two views disagree and the model is asked.
DISPUTED = '''def legacy(things):
    return compute_total(items, discount=0.5)


def older(things):
    return compute_total(items, discount=0.5)
'''


def strong() -> Interpolation:
    """The memory all but certain wherever it matches at least four ids (what a long, unanimous match
    gets), and nothing for a shorter one (as a fitted table all but ignores a token or two of context)."""
    return Interpolation([[[0.97 if length >= 4 else 0.0] * len(SHARE_EDGES) for _ in COUNT_EDGES]
                          for length in LENGTH_EDGES], "test")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "billing.py").write_text(LIBRARY, encoding="utf-8")
    (root / "quote.py").write_text(DOCUMENT, encoding="utf-8")
    return root


@pytest.fixture
def disputed(workspace: Path) -> Path:
    (workspace / "legacy.py").write_text(DISPUTED, encoding="utf-8")
    return workspace


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(default_model_path())


def session_memory(tokenizer, root: Path | None = None) -> SessionMemory:
    memory = SessionMemory(tokenizer, MemorySettings(libraries=False, stdlib=False))
    if root is not None:
        memory.index(str(root))
    return memory


@dataclass
class Served:
    """A served model (no logits): it answers the given text and records what it was asked."""

    text: str
    name: str = "served"
    supports_internals: bool = False
    requests: list[CompletionRequest] = field(default_factory=list)

    def complete(self, request: CompletionRequest) -> Completion:
        self.requests.append(request)
        return Completion(self.text, "stop", logprob=-1.0, completion_tokens=3)


def settings() -> PipelineSettings:
    return PipelineSettings(max_tokens=24, repair=RepairSettings(max_rounds=1, time_budget_s=30))


def test_a_served_models_unclean_answer_gives_way_to_the_memorys_continuation(tokenizer, workspace: Path) -> None:
    memory = session_memory(tokenizer, workspace)
    path = str(workspace / "quote.py")
    with_memory = Pipeline(Served("count=)))("), settings(), memory=memory)
    result = with_memory.complete(DOCUMENT, len(TYPED), path=path, language="python", multiline=False)
    assert result.clean and result.text == EXPECTED
    alone = Pipeline(Served("count=)))("), settings())
    assert not alone.complete(DOCUMENT, len(TYPED), path=path, language="python", multiline=False).clean


def test_a_served_models_clean_answer_is_kept(tokenizer, disputed: Path) -> None:
    memory = session_memory(tokenizer, disputed)
    pipeline = Pipeline(Served("count=0.75)"), settings(), memory=memory)
    result = pipeline.complete(DOCUMENT, len(TYPED), path=str(disputed / "quote.py"), language="python",
                               multiline=False)
    assert result.clean and result.text == "count=0.75)"


@pytest.mark.parametrize("backend_kind", ["served", "in-process"])
def test_where_the_memorys_two_views_agree_the_model_is_not_asked(tokenizer, workspace: Path,
                                                                  backend_kind: str) -> None:
    backend = Served("count=0.75)") if backend_kind == "served" else InProcess("count=0.75)")
    memory = session_memory(tokenizer, workspace)
    path = str(workspace / "quote.py")
    result = Pipeline(backend, settings(), memory=memory).complete(DOCUMENT, len(TYPED), path=path,
                                                                   language="python", multiline=False)
    assert result.clean and result.text == EXPECTED and result.vouched
    assert backend.requests == []  # answered from the workspace alone
    block = Pipeline(backend, settings(), memory=memory).complete(DOCUMENT, len(TYPED), path=path,
                                                                  language="python", multiline=True)
    assert len(backend.requests) == 1 and block.text != EXPECTED  # a multi-line request asks the model


def test_fixes_and_other_languages_never_get_the_memorys_candidate(tokenizer, workspace: Path) -> None:
    memory = session_memory(tokenizer, workspace)
    backend = Served("count=)))(")
    pipeline = Pipeline(backend, settings(), memory=memory)
    js = pipeline.complete(DOCUMENT, len(TYPED), path=str(workspace / "quote.js"), language="javascript",
                           multiline=False)
    assert js.text != EXPECTED
    assert pipeline.repair.alternative is not None and pipeline.repair.memory_factory is None
    pipeline.memory = None  # taken off again
    assert pipeline.repair.alternative is None


def test_the_in_process_model_decodes_with_the_memory_around_the_monitor(tiny_checkpoint: Path, tmp_path: Path) -> None:
    backend = LocalBackend(model_path=str(tiny_checkpoint))
    backend.load()
    root = tmp_path / "ws"
    root.mkdir()
    (root / "billing.py").write_text(LIBRARY, encoding="utf-8")
    (root / "legacy.py").write_text(DISPUTED, encoding="utf-8")
    memory = SessionMemory(backend.tokenizer, MemorySettings(libraries=False, stdlib=False))
    memory.factory.interpolation = strong()
    memory.index(str(root))
    seen: list[object] = []
    path = str(root / "quote.py")
    pipeline = Pipeline(backend, settings(), memory=memory)
    inner = pipeline.repair.memory_factory
    assert inner is not None

    def spy(target, monitor):
        processor = inner(target, monitor)
        seen.append(processor)
        return processor

    pipeline.repair.memory_factory = spy
    result = pipeline.complete(DOCUMENT, len(TYPED), path=path, language="python", multiline=False)
    assert result.text == EXPECTED  # the random model alone never writes this
    processor = seen[0]
    assert isinstance(processor, MemoryProcessor) and processor.mixed_steps > 0
    assert processor.then is not None  # the decoding monitor runs after the mixing
    # One matcher per request: the generation decodes with the one the memory's up-front continuation
    # walked (bound to the document's code before the cursor), not a second one bound to the prompt.
    recall = pipeline.repair.recall
    assert recall is not None and recall._text is not None
    assert all(p.text is recall._text[1] and p.prebound for p in seen)
    assert recall._text[1].code == TYPED[: len(TYPED) - len("dis")]  # less the healed word
    alone = Pipeline(backend, settings()).complete(DOCUMENT, len(TYPED), path=path, language="python",
                                                   multiline=False)
    assert alone.text != EXPECTED


def test_a_one_line_edit_is_in_the_memory(tokenizer, workspace: Path) -> None:
    memory = session_memory(tokenizer, workspace)
    path = str(workspace / "billing.py")
    memory.update(path, LIBRARY.replace('rounding="banker"', 'rounding="bankers_rule"'))
    typed = "    return compute_total(items, discount=0.25, roun"
    assert memory.continuation(None, typed, len(typed)) == 'ding="bankers_rule")'


def test_files_deleted_renamed_and_changed_outside_the_editor(tokenizer, workspace: Path) -> None:
    memory = session_memory(tokenizer, workspace)
    billing = workspace / "billing.py"
    typed = "    return compute_total(items, discount=0.25, roun"
    billing.write_text(LIBRARY.replace('"banker"', '"up"'), encoding="utf-8")
    assert memory.refresh(str(billing))
    assert memory.continuation(None, typed, len(typed)) == 'ding="up")'
    moved = workspace / "pkg" / "money.py"
    moved.parent.mkdir()
    billing.rename(moved)
    memory.rename(str(billing), str(moved))
    assert str(moved) in memory and str(billing) not in memory
    assert memory.continuation(None, typed, len(typed)) == 'ding="up")'
    folder = workspace / "pkg"
    memory.rename(str(folder), str(workspace / "lib"))  # a folder moved: every file under it
    assert str(workspace / "lib" / "money.py") in memory
    memory.remove(str(workspace / "lib"))  # a folder deleted
    assert str(workspace / "lib" / "money.py") not in memory
    assert memory.continuation(None, typed, len(typed)) == ""
    (workspace / "notes.txt").write_text("not python\n", encoding="utf-8")
    assert not memory.refresh(str(workspace / "notes.txt"))


def test_the_line_being_typed_never_matches_itself(tokenizer, tmp_path: Path) -> None:
    """``import ty`` is ``import``, `` t``, ``y``: the context is matched up to ``import`` (the word is
    pending), which ended before the cursor's token and so found itself in the document being edited,
    whose next line break made the continuation empty (found on rsa's ``import typing``)."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.py").write_text("import typing\nimport typing\n", encoding="utf-8")
    memory = session_memory(tokenizer, root)
    document = "import os\nimport ty\nx = 1\n"
    offset = document.index("import ty") + len("import ty")
    assert [tokenizer.decode([t]) for t in tokenizer.encode("import ty")] == ["import", " t", "y"]
    assert memory.continuation(str(root / "b.py"), document, offset) == "ping"


def test_a_build_can_be_stopped_and_reports_progress(tokenizer, workspace: Path) -> None:
    memory = session_memory(tokenizer)
    steps: list[tuple[str, int]] = []
    stats = memory.index(str(workspace), progress=lambda message, percent: steps.append((message, percent)))
    assert stats["files"] == 2 and steps[-1] == ("memory ready", 100)
    assert all(0 <= p <= 100 for _, p in steps)
    with pytest.raises(IndexCancelled):
        memory.index(str(workspace), cancelled=lambda: True)
    assert memory.stats["files"] == 2  # what it held is kept


def test_snippets_of_recently_edited_files_are_their_own_role_in_the_prompt(tokenizer, workspace: Path) -> None:
    from glm5_lsp.context import ContextEngine

    memory = session_memory(tokenizer, workspace)
    billing = str(workspace / "billing.py")
    memory.update(billing, LIBRARY.replace("banker", "edited_in_the_editor"))  # edited, then closed
    engine = ContextEngine(workspace_root=None, token_budget=512, memory=memory, snippet_tokens=128)
    path = str(workspace / "quote.py")
    prompt = engine.build_prompt(DOCUMENT, len(TYPED), path=path, language="python")
    spans = [s for s in prompt.spans if s.role == "snippet"]
    assert len(spans) == 1
    shown = prompt.text()[spans[0].start:spans[0].end]
    assert "billing.py" in shown and "edited_in_the_editor" in shown
    assert prompt.prefix.endswith(TYPED.rsplit("\n", 1)[-1])  # the code still ends the prefix
    asked = []
    looked_up = memory.snippets
    memory.snippets = lambda *args, **kwargs: asked.append(1) or looked_up(*args, **kwargs)
    small = engine.build_prompt(DOCUMENT, len(TYPED), path=path, language="python", budget_tokens=128)
    assert not [s for s in small.spans if s.role == "snippet"]  # a line's prompt keeps its room for code
    assert not asked  # ... and no time is spent looking for snippets that could not fit
    capped = ContextEngine(workspace_root=None, token_budget=512, memory=memory, snippet_tokens=0)
    assert not [s for s in capped.build_prompt(DOCUMENT, len(TYPED), path=path, language="python").spans
                if s.role == "snippet"]


def test_glm5_lsp_index_builds_the_memory_ahead_of_time(workspace: Path, tmp_path: Path, capsys) -> None:
    import argparse

    from glm5_lsp.context import index_command

    parser = argparse.ArgumentParser()
    index_command.add_arguments(parser)
    args = parser.parse_args([str(workspace), "--cache-dir", str(tmp_path / "cache"), "--no-packages"])
    assert index_command.run(args) == 0
    out = capsys.readouterr().out
    assert "memory: 2 files" in out and "libraries: none" in out
    assert index_command.run(parser.parse_args([str(workspace), "--cache-dir", str(tmp_path / "cache"),
                                                "--no-packages", "--no-memory"])) == 0
    assert "memory:" not in capsys.readouterr().out


@dataclass
class InProcess(Served):
    """A model that gives logits (the memory is mixed in, and extends or vouches for its answers)."""

    supports_internals: bool = True


@pytest.mark.parametrize("answer, shown, vouched", [
    ("count=0.25", EXPECTED, True),  # stopped short where unsure: the workspace says the rest
    (EXPECTED, EXPECTED, True),  # the two agree
    ("count=0.5)", "count=0.5)", True),  # what the workspace's lines say
    ("count=0.5", "count=0.5)", True),  # ... going on into it
    ("count=0.75)", "count=0.75)", False),  # neither view: the gate decides
])
def test_the_memory_extends_or_vouches_for_the_in_process_models_answer(tokenizer, disputed: Path, answer: str,
                                                                        shown: str, vouched: bool) -> None:
    memory = session_memory(tokenizer, disputed)
    pipeline = Pipeline(InProcess(answer), settings(), memory=memory)
    result = pipeline.complete(DOCUMENT, len(TYPED), path=str(disputed / "quote.py"), language="python",
                               multiline=False)
    assert result.clean and result.text == shown and result.vouched is vouched


class Recording:
    """A completion gate that withholds everything it is asked about, keeping what it was shown."""

    threshold = 1.0
    wants_internals = False

    def __init__(self) -> None:
        self.judged: list = []

    def install(self, pipeline) -> None:
        pass

    def begin(self) -> None:
        pass

    def judge(self, result, *args, **kwargs):
        from types import SimpleNamespace

        self.judged.append((result.text, result.vouched, result.recalled))
        return SimpleNamespace(show=False, score=0.0, features={}, text="", strategy="silent")


def test_the_gate_judges_every_answer_knowing_what_the_memory_said(tokenizer, disputed: Path) -> None:
    memory = session_memory(tokenizer, disputed)
    path = str(disputed / "quote.py")
    for answer, vouched in (("count=0.25", True), ("count=0.75)", False)):
        gate = Recording()
        pipeline = Pipeline(InProcess(answer), settings(), memory=memory)
        pipeline.install_gate(gate)
        result = pipeline.complete(DOCUMENT, len(TYPED), path=path, language="python", multiline=False, gated=True)
        # withheld, vouched for or not; both of the memory's views begin with "count": the memory's
        # line, which goes on from it, is shown instead
        assert result.text == EXPECTED and result.remembered and result.withheld == ""
        (text, was_vouched, recalled), *stand_ins = gate.judged
        assert text == (EXPECTED if vouched else answer) and was_vouched is vouched and recalled.continuation == EXPECTED and recalled.line == "count=0.5)"
        assert (recalled.line_count, recalled.line_total, recalled.line_distinct) == (2, 3, 2)
        # then the memory's continuation, where it is not what was withheld (withheld too, here), and
        # the shown line's own features for the acceptance log
        assert [t for t, _, _ in stand_ins] == ([] if vouched else [EXPECTED]) + [EXPECTED]


class Remembering(Recording):
    """A gate that withholds what the model wrote and shows what it did not (the memory's)."""

    def judge(self, result, *args, generated=True, **kwargs):
        from types import SimpleNamespace

        self.judged.append((result.text, generated, result.remembered))
        show = not generated
        return SimpleNamespace(show=show, score=0.9 if show else 0.1, features={"remembered": 1.0},
                               text=result.text if show else "", strategy="silent")


@pytest.mark.parametrize("answer", ["count=0.75)", "count=)))("])  # rejected by the gate; no clean answer
def test_where_the_gate_withholds_the_models_answer_it_may_show_the_memorys(tokenizer, disputed: Path,
                                                                           answer: str) -> None:
    memory = session_memory(tokenizer, disputed)  # the workspace's lines are not settled here
    gate = Remembering()
    pipeline = Pipeline(InProcess(answer), settings(), memory=memory)
    pipeline.install_gate(gate)
    result = pipeline.complete(DOCUMENT, len(TYPED), path=str(disputed / "quote.py"), language="python",
                               multiline=False, gated=True)
    assert result.text == EXPECTED and result.clean and result.remembered and not result.from_lines
    assert result.finish_reason == "memory" and result.score == 0.9 and result.withheld == ""
    assert gate.judged[-1] == (EXPECTED, False, True)  # judged as a text the model did not write
    block = pipeline.complete(DOCUMENT, len(TYPED), path=str(disputed / "quote.py"), language="python",
                              multiline=True, gated=True)
    assert not block.remembered  # a multi-line request never gets a single line in its place


def test_a_finished_word_the_memorys_continuation_begins_with_is_shown_whatever_the_head_chose(
        tokenizer, workspace: Path) -> None:
    memory = session_memory(tokenizer, workspace)
    document = TYPED.replace("\n\ndef quote", "\ndiscount = 0.1\n\n\ndef quote")  # the finisher's "discount"
    pipeline = Pipeline(InProcess("count=0.75)"), settings(), memory=memory)
    gate = Recording()  # withholds everything; its strategy: silent
    pipeline.install_gate(gate)
    result = pipeline.complete(document + "\n", len(document), path=str(workspace / "quote.py"), language="python",
                               multiline=False, gated=True)
    assert result.recalled.continuation == EXPECTED and result.recalled.line == EXPECTED  # one view: no words of two
    # the memory's line goes on from the word the two agree on: it is shown, the word with it
    assert result.text == EXPECTED and result.remembered and not result.finished_word and result.withheld == ""
    assert gate.judged[-1][0] == EXPECTED  # the acceptance log's features are the shown line's
    other = TYPED.replace("\n\ndef quote", "\ndistance = 0.1\n\n\ndef quote")  # the finisher's "distance"
    result = pipeline.complete(other + "\n", len(other), path=str(workspace / "quote.py"), language="python",
                               multiline=False, gated=True)
    assert result.text == "" and "silent" in result.withheld


def test_the_word_the_finisher_and_memory_agree_on_is_shown_where_the_model_wrote_just_it(tokenizer,
                                                                                       workspace: Path) -> None:
    memory = session_memory(tokenizer, workspace)
    head = TYPED.replace("\n\ndef quote", "\ndiscount = 0.1\n\n\ndef quote")  # the finisher's "discount"
    document = head + ".real)\n"  # the memory's whole line would break the file here; its word does not
    pipeline = Pipeline(InProcess("count"), settings(), memory=memory)  # the model: the word alone
    gate = Recording()  # withholds it, judged as a line; its strategy: silent
    pipeline.install_gate(gate)
    result = pipeline.complete(document, len(head), path=str(workspace / "quote.py"), language="python",
                               multiline=False, gated=True)
    assert gate.judged[0][0] == "count"  # the model's word was judged and withheld
    # the finisher's likeliest word and the memory's first word agree on "discount": it is shown
    assert result.text == "count" and result.finished_word and result.withheld == ""


# A third line going on as two of the others do: the workspace's lines now say "count=0.5)" three
# times in four, enough to stand in for a withheld answer (``pipeline.gating.LINE_MIN_SHARE``).
SETTLED = DISPUTED + '''

def oldest(things):
    return compute_total(items, discount=0.5)
'''


@pytest.fixture
def settled(workspace: Path) -> Path:
    (workspace / "legacy.py").write_text(SETTLED, encoding="utf-8")
    return workspace


@pytest.mark.parametrize("answer", ["count=0.75)", "count=)))("])  # rejected by the gate; no clean answer
def test_where_the_gate_withholds_the_workspaces_settled_line_is_shown(tokenizer, settled: Path, answer: str) -> None:
    memory = session_memory(tokenizer, settled)
    path = str(settled / "quote.py")
    gate = Recording()
    pipeline = Pipeline(InProcess(answer), settings(), memory=memory)
    pipeline.install_gate(gate)
    result = pipeline.complete(DOCUMENT, len(TYPED), path=path, language="python", multiline=False, gated=True)
    assert result.recalled.continuation == EXPECTED  # the token-level view disagrees: the model was asked
    assert (result.recalled.line_count, result.recalled.line_total) == (3, 4)
    assert result.text == "count=0.5)" and result.clean and result.from_lines and result.withheld == ""
    assert gate.judged[-1][0] == "count=0.5)"  # the acceptance log's features are the shown line's
    block = pipeline.complete(DOCUMENT, len(TYPED), path=path, language="python", multiline=True, gated=True)
    assert not block.from_lines  # a multi-line request never gets a single line in its place


def test_a_line_too_few_of_the_workspaces_lines_share_is_not_shown(tokenizer, disputed: Path) -> None:
    memory = session_memory(tokenizer, disputed)  # "count=0.5)" two times in three: under the share
    pipeline = Pipeline(InProcess("count=0.75)"), settings(), memory=memory)
    pipeline.install_gate(Recording())
    result = pipeline.complete(DOCUMENT, len(TYPED), path=str(disputed / "quote.py"), language="python",
                               multiline=False, gated=True)
    assert not result.from_lines and result.text == EXPECTED  # the memory's line after the word both begin with
    assert result.remembered and not result.finished_word


@pytest.mark.parametrize("first, second, typed, words", [
    ("return self.x", "return self.y", "", "return self"),
    ("count=0.25, r", "count=0.5)", "", "count"),  # a number is whole or not at all
    ("discount=1", "discount=2", "dis", "discount"),  # the healed word is typed already
    ("rtedSet([1, 2, 3, 6])", "rtedSet([1, 2, 3, 4])", "", "rtedSet([1, 2, 3"),
    ("port base64_encode", "port base64_encode as b", "", "port base64_encode"),  # one view ends there
    ("port base64_enc", "port base64_encode", "", "port"),  # a name cut short is not the other's name
    ("(x", "(y", "", ""),  # no name in common
    ("abc", "abd", "", ""),
    ("dis", "dis", "dis", ""),  # nothing beyond what is typed
    ("count", "total", "co", ""),  # not what was typed
])
def test_the_words_two_views_share_are_whole_pieces_cut_after_a_name(first: str, second: str, typed: str,
                                                                     words: str) -> None:
    from glm5_lsp.pipeline.gating import agreed_words

    assert agreed_words(first, second, typed) == words


@pytest.mark.parametrize("block, line, continuation, line_view, words", [
    ("if x:\n        return 1", "    el", "else:  # the other way", "else:", "se"),  # "else" waits for its colon
    ("try:\n        return 1", "    ex", "except OSError as error:", "except OSError:", "cept OSError"),
    ("if x:\n        return 1", "    y = el", "else:  # the other way", "else:", ""),  # a keyword that cannot be there
])
def test_words_that_begin_a_keywords_statement_may_leave_it_waiting(tokenizer, block: str, line: str,
                                                                   continuation: str, line_view: str,
                                                                   words: str) -> None:
    from glm5_lsp.pipeline.gating import memory_words
    from glm5_lsp.pipeline.memory import Recollection
    from glm5_lsp.repair.loop import RepairTarget

    pipeline = Pipeline(InProcess("x"), settings())
    document = f"def pick(x):\n    {block}\n{line}\n"
    cursor = document.index(line) + len(line)
    typed = line[-2:]  # the healed word: the views are insertion text at its start, with it
    target = RepairTarget(document, cursor - len(typed), cursor, "pick.py", "python")
    recalled = Recollection(continuation=typed + continuation[2:], line=typed + line_view[2:])
    assert memory_words(pipeline.repair, target, recalled, typed) == words


def test_words_the_memorys_views_agree_on_are_not_shown_where_they_break_the_file(tokenizer, disputed: Path) -> None:
    memory = session_memory(tokenizer, disputed)
    pipeline = Pipeline(InProcess("count=0.75)"), settings(), memory=memory)
    pipeline.install_gate(Recording())
    path = str(disputed / "quote.py")
    typed = TYPED[: -len("dis")]  # after the space: both views begin with "discount"
    fine = pipeline.complete(typed + "\n", len(typed), path=path, language="python", multiline=False, gated=True)
    assert fine.text == "dis" + EXPECTED and fine.remembered  # the memory's line, which goes on from "discount"
    document = typed + " x)\n"  # "items, discount x)": a name then a name is no argument
    result = pipeline.complete(document, len(typed), path=path, language="python", multiline=False, gated=True)
    assert result.text == "" and not result.finished_word
    block = pipeline.complete(DOCUMENT, len(TYPED), path=path, language="python", multiline=True, gated=True)
    assert block.text == "" and not block.finished_word  # a multi-line request never gets them


def test_the_finished_word_stays_alone_where_the_memorys_line_would_break_the_file(tokenizer, workspace: Path) -> None:
    memory = session_memory(tokenizer, workspace)
    head = TYPED.replace("\n\ndef quote", "\ndiscount = 0.1\n\n\ndef quote")  # the finisher's "discount"
    document = head + ".real)\n"  # "discount.real)" is fine; the memory's line would leave ".real)" dangling
    pipeline = Pipeline(InProcess("count=0.75)"), settings(), memory=memory)
    pipeline.install_gate(Recording())
    result = pipeline.complete(document, len(head), path=str(workspace / "quote.py"), language="python",
                               multiline=False, gated=True)
    assert result.recalled.continuation.startswith("count")
    assert result.text == "count" and result.finished_word and not result.remembered


def test_a_settled_line_is_post_processed_as_a_candidate_is(tokenizer, settled: Path) -> None:
    memory = session_memory(tokenizer, settled)
    document = TYPED + ")\n"  # the call already closed after the cursor: "count=0.5)" would close it twice
    pipeline = Pipeline(InProcess("count=0.75)"), settings(), memory=memory)
    pipeline.install_gate(Recording())
    result = pipeline.complete(document, len(TYPED), path=str(settled / "quote.py"), language="python",
                               multiline=False, gated=True)
    assert result.recalled.line == "count=0.5" and result.from_lines and result.text == "count=0.5"


def test_a_settled_line_that_breaks_the_file_is_not_shown(tokenizer, settled: Path) -> None:
    memory = session_memory(tokenizer, settled)
    document = TYPED + " 1)\n"  # "discount=0.5) 1)": no post-processing mends that
    pipeline = Pipeline(InProcess("count=0.75)"), settings(), memory=memory)
    pipeline.install_gate(Recording())
    result = pipeline.complete(document, len(TYPED), path=str(settled / "quote.py"), language="python",
                               multiline=False, gated=True)
    assert result.recalled.line == "count=0.5)" and not result.from_lines
    assert result.text == "count" and result.finished_word  # the word alone adds no error of its own


def test_edits_are_folded_back_into_one_shard_now_and_then(tokenizer, workspace: Path) -> None:
    from glm5_lsp.pipeline.memory import COMPACT_EVERY

    memory = session_memory(tokenizer, workspace)
    paths = [str(workspace / "billing.py"), str(workspace / "quote.py")]
    for number in range(COMPACT_EVERY):  # the first makes a document hot: then COMPACT_EVERY - 1 switches
        memory.update(paths[number % 2], LIBRARY + f"# edit {number}\n")
    assert memory.memory.recent is not None  # edits kept beside the base shard
    memory.update(paths[COMPACT_EVERY % 2], LIBRARY + "# the last edit\n")
    assert memory.memory.recent is None and not memory.memory.frozen  # folded into the base
    assert memory.text_of(paths[COMPACT_EVERY % 2]) == LIBRARY + "# the last edit\n"
    typed = "    return compute_total(items, discount=0.25, roun"
    assert memory.continuation(None, typed, len(typed)) == 'ding="banker")'


@dataclass
class Healing(InProcess):
    """An in-process model that honours token healing: it writes the healed word again, then its answer."""

    supports_forced_prefix: bool = True

    def complete(self, request: CompletionRequest) -> Completion:
        self.requests.append(request)
        return Completion(request.forced_prefix + self.text, "stop", logprob=-1.0, completion_tokens=3)


def test_the_gate_reads_the_memory_in_the_candidates_frame_when_the_word_is_healed(tokenizer, disputed: Path) -> None:
    from glm5_lsp.gate.features import features, request_info

    memory = session_memory(tokenizer, disputed)
    seen = []

    class Reading(Recording):
        def judge(self, result, document, offset, **kwargs):
            info = request_info(document, offset, language="python", multiline=False, healing=True)
            seen.append((result.text, info.healed, features(result, info)))
            return super().judge(result, document, offset, **kwargs)

    backend = Healing(EXPECTED)
    pipeline = Pipeline(backend, settings(), memory=memory)
    pipeline.install_gate(Reading())
    pipeline.complete(DOCUMENT, len(TYPED), path=str(disputed / "quote.py"), language="python", multiline=False,
                      gated=True)
    assert backend.requests[0].forced_prefix == "dis"  # the typed word was healed
    (text, healed, values), (shown, _, _) = seen  # the candidate, then what is shown in its place
    assert shown == EXPECTED  # the memory's line after the word the views agree on (the withheld candidate)
    assert (text, healed) == (EXPECTED, "dis")  # the candidate is text after the cursor
    assert values["memory_equal"] == 1.0 and values["memory_agree_chars"] == len(EXPECTED)
    assert values["line_equal"] == 0.0 and values["line_agree_chars"] == len("count=0.")


READER = '''class Reader:
    def size(self):
        here = self._buffer.tell()
        self._buffer.seek(0, 2)
        end = self._buffer.tell()
        self._buffer.seek(here)
        return end

    def rewind(self):
        self.tearDown_handlers = []
        return True
'''
SPAWNED = "def measure(spawn):\n    buf_len = spawn._buffer.te"


def test_a_healed_word_gets_the_memorys_continuation_at_the_cursor(tokenizer, tmp_path: Path) -> None:
    """The model writes a healed word again, the memory must not: what the memory says after it (its
    continuation, the drafts and mixing after the word) is what it says at the cursor itself, where
    the typed ``te`` is matched inside ``tell`` (before the fix, ``te`` as a generation had written it
    matched ``tearDown_handlers`` only)."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "reader.py").write_text(READER, encoding="utf-8")
    memory = session_memory(tokenizer, root)
    path = str(root / "measure.py")
    document = SPAWNED + "\n"
    assert memory.continuation(path, document, len(SPAWNED)) == "ll()"
    backend = Healing("ll()")
    pipeline = Pipeline(backend, settings(), memory=memory)
    result = pipeline.complete(document, len(SPAWNED), path=path, language="python", multiline=False)
    assert backend.requests[0].forced_prefix == "te"
    assert result.recalled.continuation == "tell()" and result.text == "ll()" and result.vouched
    # the matcher the generation decodes with, bound before the word: after the typed word as at the cursor
    start = len(SPAWNED) - 2
    assert memory.bound(path, document, start, "te").continuation("te", 4) == memory.bound(
        path, document, len(SPAWNED)).continuation("", 4)


def test_before_a_healed_word_the_estimate_is_the_prompts_own_end(tokenizer) -> None:
    """The first generated token (forced to agree with the healed word) is mixed with what followed the
    code before the word, found as at any prompt's end (the slow way where its last piece is pending),
    whether or not a healed word follows: at every indented word of this package's own mixing module,
    the memory holding its folder (a generation's path differed at 7 of 150)."""
    import re

    from glm5_lsp.memory.mixing import bound_text
    from glm5_lsp.memory.workspace import WorkspaceMemory, as_key

    root = Path(__file__).resolve().parents[1] / "glm5_lsp" / "memory"
    memory = WorkspaceMemory(tokenizer, MemorySettings(libraries=False, stdlib=False))
    memory.index_folder(root)
    path = root / "mixing.py"
    lines = path.read_text(encoding="utf-8").split("\n")
    differ = []
    for number, line in enumerate(lines):
        word = re.match(r"\s+[A-Za-z_]\w", line)
        if word is None:
            continue
        before = "\n".join([*lines[:number], word.group(0)])
        document, start = before + "\n" + "\n".join(lines[number + 1:]), len(before) - 2
        healed = bound_text(memory, tokenizer, as_key(path), document, start, before[start:]).estimate("", within_piece=True)
        plain = bound_text(memory, tokenizer, as_key(path), document, start).estimate("", within_piece=True)
        if healed.top() != plain.top() or healed.match.length != plain.match.length:
            differ.append(number)
    assert differ == []
