"""The workspace memory's core: chunked tokenization equals the whole text's, suffix-array queries
equal brute force, the matcher's longest suffix equals a brute-force search, and edits re-tokenize."""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from glm5_lsp.memory.index import SuffixIndex, _suffix_array_numpy, suffix_array
from glm5_lsp.memory.matcher import Matcher, Source
from glm5_lsp.memory.tokens import TokenizedText, chunk_starts, last_chunk_start, token_dtype
from glm5_lsp.model import default_model_path, load_tokenizer

STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(default_model_path())


def stdlib_texts(count: int) -> list[str]:
    files = sorted(STDLIB.glob("*.py"))[:count]
    return [f.read_text(encoding="utf-8") for f in files]


def test_chunks_laid_end_to_end_are_the_whole_texts_tokens(tokenizer) -> None:
    for text in [*stdlib_texts(25), "x = 1  \n\n\n    y\t\n", "", "\n", "a\n\nb", "é = 'ü'\n  \n\tz"]:
        whole = np.asarray(tokenizer.encode(text), dtype=token_dtype(tokenizer.vocab_size))
        assert np.array_equal(TokenizedText(tokenizer, text).ids, whole)
        ids, offsets = tokenizer.encode_with_offsets(text)
        assert np.array_equal(TokenizedText(tokenizer, text, ids, [o[0] for o in offsets]).ids, whole)


def test_last_chunk_start_is_the_last_of_chunk_starts() -> None:
    for text in ["", "a", "a\n", "a\nb", "a \n b\n\n c", "x\n\n\n", "\n\nq"]:
        assert last_chunk_start(text) == chunk_starts(text)[-1], text


def test_edits_retokenize_to_the_whole_texts_tokens(tokenizer) -> None:
    rng = random.Random(3)
    text = stdlib_texts(3)[2][:6000]
    doc = TokenizedText(tokenizer, text)
    pieces = ["", "x", "\n", "  ", "\n\n    def f(self):\n        return 1\n", "foo.bar(", "'''", "é"]
    for _ in range(60):
        start = rng.randrange(len(text) + 1)
        end = min(len(text), start + rng.choice([0, 0, 1, 3, 40]))
        text = text[:start] + rng.choice(pieces) + text[end:]
        start_token, removed, added = doc.update(text)
        assert np.array_equal(doc.ids, np.asarray(tokenizer.encode(text), dtype=doc.ids.dtype))
        assert removed >= 0 and added >= 0 and start_token >= 0


def test_token_at_finds_the_token_holding_a_character(tokenizer) -> None:
    text = "class A:\n    def f(self, x):\n        return self.value + x\n"
    doc = TokenizedText(tokenizer, text)
    _, offsets = tokenizer.encode_with_offsets(text)
    for offset in range(len(text)):
        i = doc.token_at(offset)
        assert offsets[i][0] <= offset < offsets[i][1]
    assert doc.token_at(len(text)) == len(doc.ids)


def test_suffix_array_is_sorted_and_matches_the_numpy_fallback() -> None:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 6, 3000).astype(np.uint16)
    tokens[1000:1500] = tokens[0:500]  # long repeats
    sa = suffix_array(tokens)
    assert np.array_equal(sa, _suffix_array_numpy(tokens))
    suffixes = [tuple(tokens[i:i + 40]) for i in sa]
    assert suffixes == sorted(suffixes)


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_the_suffix_array_cut_to_whole_tokens_a_chunk_at_a_time_is_pydivsufsorts(dtype, monkeypatch) -> None:
    from pydivsufsort import divsufsort

    from glm5_lsp.memory import index as index_module

    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 600, 5000).astype(dtype)  # ids past one byte: both bytes matter
    tokens[::97] = np.iinfo(dtype).max  # separators, the largest id
    tokens[3000:3600] = tokens[100:700]
    monkeypatch.setattr(index_module, "ALIGN_CHUNK", 7)  # chunk edges everywhere
    sa = suffix_array(tokens)
    assert sa.dtype == np.int32 and np.array_equal(sa, divsufsort(tokens))
    assert np.array_equal(sa, _suffix_array_numpy(tokens))
    kept = tokens.copy()
    in_place = suffix_array(tokens, in_place=True)  # the ids byte-swapped under it, and back
    assert np.array_equal(in_place, sa) and np.array_equal(tokens, kept)
    assert in_place.flags.owndata and in_place.base is None  # the byte positions' array, shrunk to the tokens'
    frozen = kept.copy()
    frozen.flags.writeable = False
    assert np.array_equal(suffix_array(frozen, in_place=True), sa)  # read-only: copied, not swapped
    monkeypatch.setattr(index_module, "_divsufsort_into", lambda data: None)  # pydivsufsort's own way
    assert np.array_equal(suffix_array(tokens), sa)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_where_each_first_id_starts_is_counted_without_gathering_the_ids(dtype) -> None:
    rng = np.random.default_rng(5)
    docs = [(str(i), rng.integers(0, 40, size=int(rng.integers(1, 300))).astype(dtype)) for i in range(20)]
    index = SuffixIndex.build(docs, np.dtype(dtype))
    expected = np.searchsorted(index.tokens[index.sa], np.arange(index.sep + 2), side="left")
    assert index.first is not None and np.array_equal(index.first, expected)


def test_a_consumed_build_empties_the_callers_list_and_indexes_the_same() -> None:
    docs = [("a", np.array([1, 2, 3], dtype=np.uint16)), ("b", np.array([2, 3], dtype=np.uint16))]
    kept = SuffixIndex.build(list(docs), np.dtype(np.uint16))
    consumed = list(docs)
    index = SuffixIndex.build(consumed, np.dtype(np.uint16), consume=True)
    assert consumed == [] and index.keys == kept.keys
    assert np.array_equal(index.tokens, kept.tokens) and np.array_equal(index.sa, kept.sa)


def brute_count(tokens: np.ndarray, pattern: list[int]) -> int:
    n = len(pattern)
    return sum(1 for i in range(len(tokens) - n + 1) if list(tokens[i:i + n]) == pattern)


def test_find_counts_every_occurrence(tokenizer) -> None:
    dtype = token_dtype(tokenizer.vocab_size)
    docs = [(str(i), np.asarray(tokenizer.encode(t), dtype=dtype)) for i, t in enumerate(stdlib_texts(4))]
    index = SuffixIndex.build(docs, dtype)
    rng = random.Random(1)
    for _ in range(150):
        doc = rng.choice(docs)[1]
        start = rng.randrange(len(doc) - 8)
        pattern = [int(t) for t in doc[start:start + rng.randint(1, 7)]]
        lo, hi = index.find(pattern)
        assert hi - lo == brute_count(index.tokens, pattern)
        assert all(list(index.tokens[index.sa[i]:index.sa[i] + len(pattern)]) == pattern for i in range(lo, hi))
    assert index.find([index.sep - 1, 3]) == (0, 0) or index.find([index.sep - 1, 3])[0] == index.find([index.sep - 1, 3])[1]


def brute_longest(docs: list[list[int]], context: list[int], dead: set[int] = frozenset()) -> tuple[int, dict[int, int]]:
    """The longest suffix of ``context`` found in the live documents, and what followed it."""
    best, follow = 0, {}
    for length in range(1, len(context) + 1):
        suffix = context[-length:]
        found: dict[int, int] = {}
        hit = False
        for number, doc in enumerate(docs):
            if number in dead:
                continue
            for i in range(len(doc) - length + 1):
                if doc[i:i + length] == suffix:
                    hit = True
                    if i + length < len(doc):
                        found[doc[i + length]] = found.get(doc[i + length], 0) + 1
        if not hit:
            break
        best, follow = length, found
    return best, follow


def test_the_matcher_finds_the_longest_suffix_and_its_counts_token_by_token() -> None:
    rng = random.Random(5)
    docs = [[rng.randrange(8) for _ in range(rng.randint(30, 200))] for _ in range(6)]
    docs[2][10:60] = docs[0][5:55]  # a long shared stretch
    dtype = np.dtype(np.uint16)
    first = SuffixIndex.build([(str(i), np.asarray(d, dtype=dtype)) for i, d in enumerate(docs[:3])], dtype)
    second = SuffixIndex.build([(str(i + 3), np.asarray(d, dtype=dtype)) for i, d in enumerate(docs[3:])], dtype)
    first.kill("1")
    matcher = Matcher([Source(first), Source(second)])
    context = docs[0][:20]
    matcher.bind(context)
    for token in docs[0][20:90] + [rng.randrange(8) for _ in range(30)]:
        match = matcher.push(token)
        context.append(token)
        length, follow = brute_longest(docs, context, dead={1})
        assert match.length == length
        assert dict(zip(match.counts.ids.tolist(), match.counts.counts.tolist())) == follow


def test_sync_follows_a_changed_generation_from_where_it_differs() -> None:
    dtype = np.dtype(np.uint16)
    doc = [1, 2, 3, 4, 5, 1, 2, 3, 9, 9]
    index = SuffixIndex.build([("a", np.asarray(doc, dtype=dtype))], dtype)
    matcher = Matcher([Source(index)])
    matcher.bind([1])
    assert matcher.sync([2, 3]).length == 3
    assert matcher.sync([2, 3, 4]).length == 4
    assert matcher.sync([2, 3, 9]).length == 4  # 1 2 3 9 occurs once
    assert matcher.sync([2]).length == 2
    assert matcher.continuation([2, 3, 4], 3) == [5, 1, 2]


def _as_pairs(match) -> tuple[int, dict[int, int]]:
    return match.length, dict(zip(match.counts.ids.tolist(), match.counts.counts.tolist()))


@pytest.mark.parametrize("max_nodes", [3, 50_000])
def test_going_back_and_forth_between_sequences_gives_a_fresh_matchers_estimates(max_nodes, monkeypatch) -> None:
    """The states followed are kept as a tree: a sequence followed before is found again, not searched
    (a draft, the same text with its last piece cut another way, the draft again); pruned past
    ``MAX_NODES`` to the current path. Every answer is a fresh matcher's."""
    from glm5_lsp.memory import matcher as matcher_module

    monkeypatch.setattr(matcher_module, "MAX_NODES", max_nodes)
    rng = random.Random(11)
    doc = [rng.randrange(6) for _ in range(400)]
    dtype = np.dtype(np.uint16)
    index = SuffixIndex.build([("a", np.asarray(doc, dtype=dtype))], dtype)
    other = SuffixIndex.build([("a", np.asarray(doc, dtype=dtype))], dtype)  # the fresh matchers'
    prompt = doc[100:130]
    matcher = Matcher([Source(index)])
    matcher.bind(prompt)
    branches = [doc[130:150], doc[130:140] + [5, 5, 1], doc[130:145], [rng.randrange(6) for _ in range(12)]]
    searches = 0
    real = index.extend

    def counted(*args):
        nonlocal searches
        searches += 1
        return real(*args)

    index.extend = counted
    for _ in range(40):
        generated = rng.choice(branches)[: rng.randint(0, 20)]
        fresh = Matcher([Source(other)])
        fresh.bind(prompt + generated)
        assert _as_pairs(matcher.sync(generated)) == _as_pairs(fresh.match_at(0))
        assert matcher.generated == generated
        length = rng.randint(1, 6)
        fresh.bind(prompt)
        assert _as_pairs(matcher.backoff(generated, length)) == _as_pairs(fresh.backoff(generated, length))
    if max_nodes > 100:
        assert searches <= sum(len(b) for b in branches)  # each sequence's states searched once


def test_a_backoff_reads_the_suffix_of_what_it_is_given_not_of_a_longer_sequence_followed_before() -> None:
    dtype = np.dtype(np.uint16)
    doc = [1, 2, 3, 7, 1, 2, 4, 8, 2, 3, 9]
    index = SuffixIndex.build([("a", np.asarray(doc, dtype=dtype))], dtype)
    matcher = Matcher([Source(index)])
    matcher.bind([1])
    matcher.sync([2, 4])  # followed further first (a token's piece), then asked about [1, 2]'s shorter suffix
    assert _as_pairs(matcher.backoff([2], 1)) == (1, {3: 2, 4: 1})  # what followed "2", not "4"


def test_an_excluded_range_never_counts_as_what_followed() -> None:
    dtype = np.dtype(np.uint16)
    doc = [7, 8, 9, 1, 7, 8, 9, 2]
    index = SuffixIndex.build([("a", np.asarray(doc, dtype=dtype))], dtype)
    matcher = Matcher([Source(index, exclude=(7, 8))])  # the position holding the second "2"
    match = matcher.bind([7, 8, 9])
    assert match.length == 3 and match.counts.ids.tolist() == [1]


def test_the_requests_own_document_decides_and_the_other_shards_break_its_ties() -> None:
    dtype = np.dtype(np.uint16)
    workspace = SuffixIndex.build([("lib", np.asarray([5, 6, 1, 5, 6, 1, 5, 6, 1, 5, 6, 3], dtype=dtype))], dtype)
    own = SuffixIndex.build([("doc", np.asarray([5, 6, 2, 0, 0], dtype=dtype))], dtype)
    match = Matcher([Source(workspace), Source(own, own=True)]).bind([5, 6])
    assert match.top() == (2, pytest.approx(1.0, abs=0.01))  # the document's "2", not the workspace's three "1"s
    assert match.total == 5  # every occurrence still counts for the mixing weight
    summed = Matcher([Source(workspace), Source(own)]).bind([5, 6])
    assert summed.top()[0] == 1  # not the request's own document: counts summed
    tied = SuffixIndex.build([("doc", np.asarray([5, 6, 3, 0, 5, 6, 1, 0], dtype=dtype))], dtype)
    assert Matcher([Source(workspace), Source(tied, own=True)]).bind([5, 6]).top()[0] == 1  # 1 and 3 tie there
    elsewhere = SuffixIndex.build([("doc", np.asarray([4, 6, 2], dtype=dtype))], dtype)
    assert Matcher([Source(workspace), Source(elsewhere, own=True)]).bind([5, 6]).top()[0] == 1  # shorter there


def test_a_saved_shard_loads_the_same(tmp_path, tokenizer) -> None:
    dtype = token_dtype(tokenizer.vocab_size)
    docs = [(f"doc{i}", np.asarray(tokenizer.encode(t), dtype=dtype)) for i, t in enumerate(stdlib_texts(2))]
    index = SuffixIndex.build(docs, dtype)
    index.save(tmp_path / "shard")
    loaded = SuffixIndex.load(tmp_path / "shard")
    assert loaded.keys == index.keys and np.array_equal(loaded.sa, index.sa)
    pattern = [int(t) for t in docs[1][1][40:44]]
    assert loaded.find(pattern) == index.find(pattern)
    (tmp_path / "shard" / "keys.txt").write_text("only-one", encoding="utf-8")
    with pytest.raises(ValueError, match="inconsistent"):
        SuffixIndex.load(tmp_path / "shard")


def test_a_scanned_document_matches_as_its_suffix_array_does() -> None:
    from glm5_lsp.memory.index import ScanIndex

    rng = random.Random(9)
    doc = [rng.randrange(6) for _ in range(400)]
    doc[200:260] = doc[20:80]
    ids = np.asarray(doc, dtype=np.uint16)
    exclude = (150, 170)
    by_array = Matcher([Source(SuffixIndex.build([("d", ids)], ids.dtype), exclude)])
    by_scan = Matcher([Source(ScanIndex("d", ids), exclude)])
    context = doc[:30]
    a, b = by_array.bind(context), by_scan.bind(context)
    for token in doc[30:120] + [rng.randrange(6) for _ in range(40)]:
        a, b = by_array.push(token), by_scan.push(token)
        assert a.length == b.length
        assert a.counts.ids.tolist() == b.counts.ids.tolist() and a.counts.counts.tolist() == b.counts.counts.tolist()
    assert by_array.backoff([], 3).counts.counts.tolist() == by_scan.backoff([], 3).counts.counts.tolist()


def _walk_id_by_id(tokens: np.ndarray, context: list[int], upper: int,
                   exclude: tuple[int, int] | None) -> tuple[int, list[int]]:
    """The scan's longest match read the plain way: one id further back at a time."""

    def live(e: int) -> bool:
        return exclude is None or e < exclude[0] or e >= exclude[1]

    best: tuple[int, list[int]] = (0, [])
    upper = min(upper, len(context))
    if upper <= 0:
        return best
    ends = np.flatnonzero(tokens == context[-1]) + 1
    for length in range(1, upper + 1):
        if length > 1:
            ends = ends[ends - length >= 0]
            ends = ends[tokens[ends - length] == context[-length]]
        if not any(live(int(e)) for e in ends):
            break
        best = (length, ends.tolist())
    return best


def test_a_scan_reads_long_matches_at_once_as_id_by_id_would() -> None:
    from glm5_lsp.memory import index as index_module
    from glm5_lsp.memory.index import ScanIndex

    rng = random.Random(21)
    for trial in range(60):
        alphabet = rng.choice([2, 3, 5, 40])
        doc = [rng.randrange(alphabet) for _ in range(rng.randrange(50, 900))]
        start = rng.randrange(len(doc) // 2)  # a long repeat: matches far longer than the block's narrowing
        span = rng.randrange(1, len(doc) // 2)
        doc[len(doc) - span:] = doc[start:start + span][: span]
        scan = ScanIndex("d", np.asarray(doc, dtype=np.uint16))
        exclude = None if trial % 3 == 0 else tuple(sorted(rng.sample(range(len(doc) + 1), 2)))
        for _ in range(8):
            cut = rng.randrange(1, len(doc) + 1)
            context = doc[:cut] if rng.random() < 0.7 else [rng.randrange(alphabet) for _ in range(rng.randrange(1, 60))]
            upper = rng.choice([1, 3, 17, 256, 1000])
            for block in (1, 4, index_module.SCAN_BLOCK):
                index_module.SCAN_BLOCK, saved = block, index_module.SCAN_BLOCK
                try:
                    state = scan.longest(context, upper, exclude)
                finally:
                    index_module.SCAN_BLOCK = saved
                length, ends = _walk_id_by_id(scan.tokens, context, upper, exclude)
                assert state.length == length, (trial, block)
                assert (state.ends.tolist() if state.ends is not None else []) == ends, (trial, block)


@pytest.mark.parametrize(("token_type", "sa_type"), [(np.uint16, np.int32), (np.uint32, np.int64), (np.uint8, np.int32)])
def test_the_c_searches_give_the_numpy_searches_ranges(token_type, sa_type, monkeypatch) -> None:
    """``find`` and ``narrow`` in C (``glm5_lsp/native.c``) against the numpy searches they stand in
    for: every range the same, present patterns and absent ones, long and short, from every depth."""
    import glm5_lsp.memory.index as index_module

    if index_module._native is None:
        pytest.skip("the C searches were not built (no compiler)")
    rng = np.random.default_rng(7)
    sep = int(np.iinfo(token_type).max)
    docs = [(str(i), rng.integers(0, 6, size=int(rng.integers(1, 400))).astype(token_type)) for i in range(30)]
    tokens = SuffixIndex.build(docs, np.dtype(token_type)).tokens
    sa = suffix_array(tokens).astype(sa_type)
    with_c = SuffixIndex(tokens, sa, np.zeros(1, dtype=np.int64), [])
    monkeypatch.setenv("GLM5_NATIVE", "0")
    in_numpy = SuffixIndex(tokens, sa, np.zeros(1, dtype=np.int64), [])
    assert with_c._shard is not None and in_numpy._shard is None
    checked = 0
    def same(a: tuple[int, int], b: tuple[int, int]) -> bool:  # where an empty range lies does not matter
        return a == b or (a[1] <= a[0] and b[1] <= b[0])

    for _ in range(600):
        doc = docs[int(rng.integers(len(docs)))][1]
        start = int(rng.integers(len(doc)))
        pattern = [int(t) for t in doc[start:start + int(rng.integers(1, 12))]]
        if rng.random() < 0.3:  # absent ones too
            pattern[int(rng.integers(len(pattern)))] = int(rng.integers(0, 9))
        assert same(with_c.find(pattern), in_numpy.find(pattern))
        depth = int(rng.integers(len(pattern)))
        lo, hi = in_numpy.find(pattern[:depth])
        assert same(with_c.find(pattern, lo, hi, depth), in_numpy.find(pattern, lo, hi, depth))
        assert same(with_c.narrow(lo, hi, depth, pattern[depth]), in_numpy.narrow(lo, hi, depth, pattern[depth]))
        checked += hi > lo
    assert checked > 300
    assert same(with_c.find([sep]), in_numpy.find([sep]))  # the separators' own range
    assert with_c.find([sep])[1] > with_c.find([sep])[0]
    assert same(with_c.find([3, sep - 1]), in_numpy.find([3, sep - 1]))


def test_the_longest_live_suffix_in_c_is_the_numpy_searches(monkeypatch) -> None:
    """``longest`` as one C call (``sa_longest``) against the search over the length in numpy: the
    same length and range for contexts from the shards' own text and changed ones, with documents
    dead and a range of positions excluded (an occurrence followed only by those does not count)."""
    import glm5_lsp.memory.index as index_module

    if index_module._native is None:
        pytest.skip("the C searches were not built (no compiler)")
    rng = np.random.default_rng(11)
    docs = [(str(i), rng.integers(0, 5, size=int(rng.integers(1, 300))).astype(np.uint16)) for i in range(25)]
    with_c = SuffixIndex.build(docs, np.dtype(np.uint16))
    monkeypatch.setenv("GLM5_NATIVE", "0")
    in_numpy = SuffixIndex.build(docs, np.dtype(np.uint16))
    assert with_c._shard is not None and in_numpy._shard is None
    longer = 0
    for trial in range(500):
        if trial == 250:  # some documents dead from here on
            for key in ("3", "7", "12"):
                assert with_c.kill(key) and in_numpy.kill(key)
        doc = docs[int(rng.integers(len(docs)))][1]
        end = int(rng.integers(1, len(doc) + 1))
        context = [int(t) for t in doc[max(0, end - int(rng.integers(1, 40))):end]]
        if rng.random() < 0.3:
            context[int(rng.integers(len(context)))] = int(rng.integers(0, 7))
        exclude = None
        if rng.random() < 0.5:
            start = int(rng.integers(len(with_c.tokens)))
            exclude = (start, start + int(rng.integers(1, 50)))
        upper = int(rng.integers(0, len(context) + 1))
        got, want = with_c.longest(context, upper, exclude), in_numpy.longest(context, upper, exclude)
        assert (got.length, got.lo, got.hi) == (want.length, want.lo, want.hi), trial
        longer += got.length > 3
    assert longer > 100
