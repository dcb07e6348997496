"""The workspace memory: a folder indexed, documents changed, deleted, renamed or changed on disk,
the cursor's own line never predicting itself, and the libraries' shard cached by content."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from glm5_lsp.memory.libraries import Library, LibraryCache, imported_modules, libraries_for, local_modules
from glm5_lsp.memory.mixing import continuation_text
from glm5_lsp.memory.workspace import MemorySettings, WorkspaceMemory, as_key, tokenizer_digest
from glm5_lsp.model import default_model_path, load_tokenizer

HELPER = '''def scale_point(point, factor):
    """Scale a point."""
    return Point(point.x * factor, point.y * factor, label="scaled")
'''
MAIN = '''from shapes.helper import scale_point


def grow(point):
    return Point(point.x * 2, point.y * 2, label="grown")
'''


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(default_model_path())


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "shapes").mkdir(parents=True)
    (root / "shapes" / "helper.py").write_text(HELPER, encoding="utf-8")
    (root / "shapes" / "main.py").write_text(MAIN, encoding="utf-8")
    (root / ".git").mkdir()
    (root / ".git" / "junk.py").write_text("never = indexed\n", encoding="utf-8")
    return root


def memory_for(tokenizer, root: Path) -> WorkspaceMemory:
    memory = WorkspaceMemory(tokenizer, MemorySettings(libraries=False, stdlib=False))
    memory.index_folder(root)
    return memory


def memory_says(memory: WorkspaceMemory, tokenizer, text: str) -> str:
    """The memory's own continuation of ``text`` (no document: nothing excluded)."""
    return continuation_text(memory, tokenizer, None, text, len(text), max_tokens=12)


def test_a_folder_is_indexed_and_continues_what_it_holds(tokenizer, workspace: Path) -> None:
    memory = memory_for(tokenizer, workspace)
    assert memory.documents() == sorted(as_key(p) for p in (workspace / "shapes").glob("*.py"))
    assert memory.stats.files == 2 and memory.stats.tokens > 40 and memory.stats.bytes > 0
    assert memory_says(memory, tokenizer, "    return Point(point.x * factor, point.y * fa") == 'ctor, label="scaled")'


def test_an_edited_document_is_matched_as_it_now_reads(tokenizer, workspace: Path) -> None:
    memory = memory_for(tokenizer, workspace)
    key = as_key(workspace / "shapes" / "helper.py")
    memory.update(key, HELPER.replace('label="scaled"', 'label="resized"'))
    assert memory_says(memory, tokenizer, "point.y * factor, la") == 'bel="resized")'
    memory.update(key, HELPER.replace('label="scaled"', 'label="third"'))  # the hot document again
    assert memory_says(memory, tokenizer, "point.y * factor, la") == 'bel="third")'
    other = as_key(workspace / "shapes" / "main.py")
    memory.update(other, MAIN.replace('label="grown"', 'label="big"'))  # helper.py goes to ``recent``
    assert memory_says(memory, tokenizer, "point.y * factor, la") == 'bel="third")'
    assert memory_says(memory, tokenizer, "point.y * 2, la") == 'bel="big")'
    assert memory.text_of(key) == HELPER.replace('label="scaled"', 'label="third"')


def test_the_document_being_edited_goes_on_as_it_does_itself(tokenizer, workspace: Path) -> None:
    for number in range(3):  # three more files say label="scaled" where main.py says label="grown"
        (workspace / "shapes" / f"more{number}.py").write_text(MAIN.replace("grown", "scaled"), encoding="utf-8")
    memory = memory_for(tokenizer, workspace)
    key = as_key(workspace / "shapes" / "main.py")
    typed = MAIN + "\n\ndef grow(point):\n    return Point(point.x * 2, point.y * 2, la"
    assert memory_says(memory, tokenizer, typed) == 'bel="scaled")'  # no document: the workspace's three
    assert continuation_text(memory, tokenizer, key, typed + "\n", len(typed), max_tokens=12) == 'bel="grown")'


def test_a_deleted_document_is_forgotten(tokenizer, workspace: Path) -> None:
    memory = memory_for(tokenizer, workspace)
    path = workspace / "shapes" / "helper.py"
    path.unlink()
    assert memory.refresh(as_key(path))  # changed outside the editor: gone from disk
    assert as_key(path) not in memory
    assert "scaled" not in memory_says(memory, tokenizer, "point.y * factor, la")
    assert not memory.remove(as_key(path))  # already gone: nothing to do


def test_a_renamed_document_keeps_its_text_under_the_new_name(tokenizer, workspace: Path) -> None:
    memory = memory_for(tokenizer, workspace)
    old, new = as_key(workspace / "shapes" / "helper.py"), as_key(workspace / "shapes" / "moved.py")
    memory.rename(old, new)
    assert old not in memory and new in memory
    assert memory_says(memory, tokenizer, "point.y * factor, la") == 'bel="scaled")'


def test_a_change_on_disk_is_read_again(tokenizer, workspace: Path) -> None:
    memory = memory_for(tokenizer, workspace)
    path = workspace / "shapes" / "helper.py"
    path.write_text(HELPER.replace("scaled", "from_disk"), encoding="utf-8")
    assert memory.refresh(as_key(path))
    assert memory_says(memory, tokenizer, "point.y * factor, la") == 'bel="from_disk")'
    assert not memory.refresh(as_key(path))  # no change the second time


def test_a_file_grown_past_the_size_limit_on_disk_leaves_the_memory(tokenizer, workspace: Path) -> None:
    # refresh reads as the first build does: a file the build would leave out is not indexed on refresh
    memory = WorkspaceMemory(tokenizer, MemorySettings(libraries=False, stdlib=False, max_file_bytes=2_000))
    memory.index_folder(workspace)
    path = workspace / "shapes" / "helper.py"
    assert as_key(path) in memory
    path.write_text(HELPER.replace("scaled", "from_disk") + "# padding\n" * 300, encoding="utf-8")
    assert memory.refresh(as_key(path))
    assert as_key(path) not in memory
    assert "from_disk" not in memory_says(memory, tokenizer, "point.y * factor, la")
    fresh = WorkspaceMemory(tokenizer, MemorySettings(libraries=False, stdlib=False, max_file_bytes=2_000))
    fresh.index_folder(workspace)
    assert fresh.documents() == memory.documents()


def test_compact_keeps_every_live_document(tokenizer, workspace: Path) -> None:
    memory = memory_for(tokenizer, workspace)
    key = as_key(workspace / "shapes" / "helper.py")
    memory.update(key, HELPER.replace("scaled", "compacted"))
    memory.update(as_key(workspace / "new.py"), "value = compute_total(items)\n")
    memory.compact()
    assert memory.stats.dead_tokens == 0 and len(memory.documents()) == 3
    assert memory_says(memory, tokenizer, "point.y * factor, la") == 'bel="compacted")'
    assert memory_says(memory, tokenizer, "value = compute_to") == "tal(items)"


def test_the_cursor_line_does_not_predict_itself(tokenizer, workspace: Path) -> None:
    """The document holds the cut line and the lines below: matching the prefix to itself would
    propose what follows the cursor (the next line) instead of the line's rest."""
    memory = memory_for(tokenizer, workspace)
    key = as_key(workspace / "shapes" / "main.py")
    cut = MAIN.index("point.y * 2") + len("point.y * 2")
    document = MAIN[:cut] + "\n" + MAIN[MAIN.index("\n", cut) + 1:]  # the rest of the line removed
    memory.update(key, document)
    text = continuation_text(memory, tokenizer, key, document, cut, max_tokens=12)
    assert not text.startswith("\n") and text.strip() != ""


def test_imports_and_local_modules(tmp_path: Path) -> None:
    texts = ["import os, json as j\nfrom collections.abc import Sequence\nfrom . import sibling\nimport shapes.helper\n"]
    assert imported_modules(texts) == {"os", "json", "collections", "shapes"}
    files = [tmp_path / "shapes" / "helper.py", tmp_path / "tool.py", tmp_path / "src" / "pkg" / "a.py"]
    assert {"shapes", "tool", "pkg"} <= local_modules(tmp_path, files)
    chosen = libraries_for({"iniconfig", "os"}, local={"iniconfig"}, stdlib=False)
    assert all(lib.name.lower() != "iniconfig" for lib in chosen)  # the workspace's own package


def test_the_libraries_shard_is_built_once_and_keyed_by_content(tmp_path: Path, tokenizer) -> None:
    lib_dir = tmp_path / "lib"
    lib_dir.mkdir()
    (lib_dir / "a.py").write_text("def library_function(alpha, beta):\n    return alpha + beta\n", encoding="utf-8")
    library = Library("demo", "1.0", (lib_dir / "a.py",))
    cache = LibraryCache(tokenizer, tokenizer_digest(tokenizer), tmp_path / "cache")
    LibraryCache._loaded.clear()
    index, report = cache.shard([library], max_tokens=10_000)
    assert not report["cached"] and report["tokens"] == len(index) > 10
    LibraryCache._loaded.clear()
    again, report = cache.shard([library], max_tokens=10_000)
    assert report["cached"] and np.array_equal(again.sa, index.sa)
    (lib_dir / "a.py").write_text("def other_function():\n    pass\n", encoding="utf-8")
    _, report = cache.shard([library], max_tokens=10_000)
    assert not report["cached"]  # new content, new key
    _, report = cache.shard([library], max_tokens=5)
    assert report.get("left_out") == ["demo"] and report["tokens"] == 0


def test_snippets_are_the_most_similar_windows_of_other_documents(tokenizer, workspace: Path) -> None:
    from glm5_lsp.memory.snippets import similar_snippets

    memory = memory_for(tokenizer, workspace)
    memory.update("/open/geometry.py", "def area(rect):\n    return rect.width * rect.height\n" * 3)
    memory.update("/open/unrelated.py", "import json\nprint(json.dumps({'a': 1}))\n")
    document = "def perimeter(rect):\n    return 2 * (rect.width + rect.height)\n\ndef area(rect):\n    return rect."
    key = "/open/current.py"
    found = similar_snippets(memory, key, document, len(document), max_chars=400)
    assert found and found[0].key == "/open/geometry.py"
    assert len([s for s in found if s.key == "/open/geometry.py"]) == 1  # its windows overlap: the best one
    assert all(s.key != "/open/unrelated.py" for s in found)
    assert sum(len(s.text) for s in found) <= 400
    document = "    return Point(point.x * factor, point.y * factor, la"
    matched = similar_snippets(memory, key, document, len(document))
    assert any(s.origin == "match" and s.key.endswith("helper.py") and "scaled" in s.text for s in matched)


def test_a_missing_folder_is_a_clear_error_and_keeps_what_was_indexed(tokenizer, workspace: Path) -> None:
    memory = memory_for(tokenizer, workspace)
    before = memory.documents()
    with pytest.raises(ValueError, match="not a folder"):
        memory.index_folder(workspace / "missing")
    assert memory.documents() == before


def test_documents_edited_while_the_folder_is_read_keep_the_editors_text(tokenizer, workspace: Path) -> None:
    memory = WorkspaceMemory(tokenizer, MemorySettings(libraries=False, stdlib=False))
    helper, main = as_key(workspace / "shapes" / "helper.py"), as_key(workspace / "shapes" / "main.py")
    memory.update(helper, HELPER.replace('label="scaled"', 'label="opened"'))  # the editor opened it first
    memory.update(main, MAIN.replace('label="grown"', 'label="typed"'))  # and is typing here now
    memory.index_folder(workspace)  # the first build ends after both
    assert memory_says(memory, tokenizer, "point.y * factor, la") == 'bel="opened")'
    assert memory_says(memory, tokenizer, "point.y * 2, la") == 'bel="typed")'
    assert memory.documents() == sorted([helper, main])
    assert memory.text_of(main) == MAIN.replace('label="grown"', 'label="typed"')


def test_a_long_prefix_is_bound_by_its_last_chunks_only(tokenizer, workspace: Path, monkeypatch) -> None:
    """Only the ids a match can reach are encoded (the matcher reads at most ``max_match`` of them):
    the same match and continuation as the whole prefix encoded, from a tail of its ids."""
    from glm5_lsp.memory import align
    from glm5_lsp.memory.align import TextMatcher

    memory = memory_for(tokenizer, workspace)
    filler = "".join(f"value_{i} = compute({i}, 'x')\n" for i in range(300))
    text = filler + "    return Point(point.x * factor, point.y * fa"
    whole = TextMatcher(memory.matcher(), tokenizer)
    monkeypatch.setattr(align, "BIND_WINDOW", 10**9)  # everything encoded
    whole.bind(text)
    monkeypatch.setattr(align, "BIND_WINDOW", 64)  # a few lines, grown until they hold enough ids
    tail = TextMatcher(memory.matcher(), tokenizer)
    tail.bind(text)
    assert len(tail.matcher.context) < len(whole.matcher.context)
    assert len(tail.matcher.context) > tail.matcher.max_match
    assert whole.matcher.context[-len(tail.matcher.context):] == tail.matcher.context
    assert tail.continuation("", 12) == whole.continuation("", 12)
    assert tokenizer.decode(tail.continuation("", 12)).startswith('ctor, label="scaled")')


def test_a_request_binds_with_the_memorys_own_ids_of_the_document(tokenizer, workspace: Path, monkeypatch) -> None:
    """The document's ids before the cursor's chunk are the memory's already: a request's matcher
    takes them instead of encoding the prefix again, and follows the same context."""
    from glm5_lsp.memory.align import TextMatcher
    from glm5_lsp.memory.mixing import bound_text
    from glm5_lsp.memory.tokens import last_chunk_start

    memory = memory_for(tokenizer, workspace)
    filler = "".join(f"value_{i} = compute({i}, 'x')\n" for i in range(300))
    document = filler + "def scaled(point, factor):\n    return Point(point.x * factor, point.y * fa\n\nx = 1\n"
    offset = document.index("point.y * fa") + len("point.y * fa")
    key = as_key(workspace / "long.py")
    memory.update(key, document)
    encoded = []
    real = tokenizer.encode
    monkeypatch.setattr(tokenizer, "encode", lambda text: encoded.append(len(text)) or real(text))
    bound = bound_text(memory, tokenizer, key, document, offset)
    assert max(encoded, default=0) < 200  # only the cursor's own line was encoded
    again = TextMatcher(memory.matcher(key, document, offset), tokenizer)
    again.bind(document[:offset])  # the prefix encoded
    n = len(bound.matcher.context)
    assert n > bound.matcher.max_match and again.matcher.context[-n:] == bound.matcher.context
    assert bound.continuation("", 8) == again.continuation("", 8)
    # a document the memory holds otherwise (not yet updated) is encoded as before
    end = last_chunk_start(document[:offset])
    assert memory.ids_before(key, document, end, 10**6) is not None
    assert memory.ids_before(key, document.replace("value_3 ", "value_9 "), end, 10**6) is None
    assert memory.ids_before(key, document, end + 1, 8) is None  # not where a chunk starts


def test_within_the_last_piece_the_mixing_gets_what_followed_it_and_a_continuation_does_not(
        tokenizer, tmp_path: Path) -> None:
    """Where no longer context goes on as the text's last piece does, the estimate the mixing asks for
    (``within_piece``) is what followed that piece's ids anywhere; the strict one (a greedy
    continuation's) is empty there."""
    from glm5_lsp.memory.align import TextMatcher

    root = tmp_path / "ws"
    root.mkdir()
    (root / "helper.py").write_text(HELPER, encoding="utf-8")
    memory = memory_for(tokenizer, root)
    text = MAIN
    ids, offsets = tokenizer.encode_with_offsets(text)
    matcher = TextMatcher(memory.matcher(), tokenizer)
    matcher.bind("")
    found = 0
    for t in range(1, len(ids)):
        written = text[: offsets[t][0]]
        strict, loose = matcher.estimate(written), matcher.estimate(written, within_piece=True)
        assert loose.match.length >= strict.match.length or strict.empty
        if strict.empty and not loose.empty:
            found += 1
            assert abs(float(loose.probs.sum()) - 1.0) < 1e-9
            assert loose.match.length >= 1
    assert found > 0
    fresh = TextMatcher(memory.matcher(), tokenizer)
    fresh.bind("")
    assert matcher.continuation(text[:40], 8) == fresh.continuation(text[:40], 8)  # as if never asked loosely


def test_a_matcher_before_an_offset_sees_the_document_above_it_and_nothing_from_there_on(tokenizer,
                                                                                         tmp_path: Path) -> None:
    """``matcher_before`` (perplexity with the file's own text above, ``memory.fit``): a block the
    document repeats is found at its second copy, and no position ever finds itself."""
    from glm5_lsp.memory.align import TextMatcher

    block = 'def frobnicate_widget(widget, level):\n    return widget.twist(level * 7, mode="sideways")\n'
    filler = "".join(f"value_{i} = compute_{i * 31 % 97}(argument_{i})\n" for i in range(12))
    text = block + filler + block
    memory = WorkspaceMemory(tokenizer, MemorySettings(libraries=False, stdlib=False))
    key = as_key(tmp_path / "one.py")
    memory.update(key, text)

    def estimate_at(offset: int):
        matcher = TextMatcher(memory.matcher_before(key, offset), tokenizer)
        matcher.bind(text[:offset])
        return matcher.estimate("", within_piece=True)

    second = text.rindex("widget.twist(")  # in the second copy: the first one is above
    found = estimate_at(second)
    assert found.match.length >= 8
    ids, _ = tokenizer.encode_with_offsets(text[second:])
    assert found.top()[0] == ids[0] and found.top()[1] == 1.0
    first = text.index("widget.twist(")  # the first copy: only its own text could continue it
    assert estimate_at(first).match.length < 8
    for line_start in [0] + [i + 1 for i, c in enumerate(text[:text.rindex(block)]) if c == "\n"]:
        # without the exclusion each prefix would match itself, as long as the whole text before it
        assert estimate_at(line_start).match.length <= 12
    with pytest.raises(ValueError, match="not the document last updated"):
        memory.matcher_before(as_key(tmp_path / "other.py"), 0)


def test_a_request_s_matcher_is_made_whole_while_other_documents_change(tokenizer, workspace: Path) -> None:
    """The server's memory work updates other documents on its own threads. Between a request's
    update of its document and the exclusion of its cursor line, two such updates can move that
    document out of the hot shard into a frozen one (and out of the edited documents): the matcher
    is made under one hold of the lock, so they wait, and the cursor line stays excluded."""
    memory = WorkspaceMemory(tokenizer, MemorySettings(libraries=False, stdlib=False, recent_tokens=1))
    memory.index_folder(workspace)
    key = as_key(workspace / "shapes" / "main.py")
    others = [as_key(workspace / "shapes" / name) for name in ("a.py", "b.py")]
    cut = MAIN.index("point.y * 2") + len("point.y * 2")
    document = MAIN[:cut] + "\n" + MAIN[MAIN.index("\n", cut) + 1:]
    update = memory.update

    def update_then_others(changed: str, text: str) -> bool:
        done = update(changed, text)
        if changed == key:  # the other documents' updates, on another thread, while this one goes on
            worker = threading.Thread(target=lambda: [update(other, HELPER + "\n# " + other) for other in others])
            worker.start()
            worker.join(timeout=0.3)  # done by now unless they wait for this request's hold of the lock
        return done

    memory.update = update_then_others  # type: ignore[method-assign]
    matcher = memory.matcher(key, document, cut)
    own = [source for source in matcher.sources if source.own]
    assert own and own[0].exclude is not None  # the request's document, its cursor line excluded


def test_the_walk_at_the_cursor_follows_each_sequence_once_and_estimates_as_before(tokenizer, tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """Where the text ends mid-word or after white space, the estimate backs off over shorter contexts
    and follows the ids the pending text runs past; each shorter context most often follows the same
    id again. Those answers are kept for the walk: the same estimates, far fewer walks."""
    from glm5_lsp.memory.align import TextMatcher

    class Unkept(TextMatcher):  # every sub-walk worked out again
        def _agrees(self, ids, match, pending, depth, walked):
            return super()._agrees(ids, match, pending, depth, {})

    root = tmp_path / "ws"
    root.mkdir()
    lines = [f"    result_{i} = compute(value_{i % 7}, 'mode_{i % 3}')  # step {i}\n" for i in range(60)]
    (root / "steps.py").write_text("def run():\n" + "".join(lines) + "\n    if ready:\n        return result_1\n",
                                   encoding="utf-8")
    memory = memory_for(tokenizer, root)
    walks = {TextMatcher: 0, Unkept: 0}
    real = TextMatcher._walk

    def counted(self, *args):
        walks[type(self)] += 1
        return real(self, *args)

    monkeypatch.setattr(TextMatcher, "_walk", counted)
    for text in ("def run():\n    result_3 = compute(val", "    result_9 = comp", "    result_1 = compute(value_1, 'mo",
                 "def run():\n    ", "    result_2 = compute(value_2,  ", "x = 1\n        ",
                 "    if ready:\n            "):  # (the last: 12 spaces where the memory has 8)
        kept, unkept = TextMatcher(memory.matcher(), tokenizer), Unkept(memory.matcher(), tokenizer)
        kept.bind(text)
        unkept.bind(text)
        a, b = kept.estimate(""), unkept.estimate("")
        assert a.ids.tolist() == b.ids.tolist() and np.allclose(a.probs, b.probs) and a.match.length == b.match.length
    assert 0 < walks[TextMatcher] < walks[Unkept]
