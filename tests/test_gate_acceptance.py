"""The acceptance log: what was shown, accepted, typed over, or accepted and removed within 30 s; its
reader; the tracker the server drives from ``didChange`` (``glm5_lsp.gate.acceptance``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from glm5_lsp.gate.acceptance import (
    RETENTION_S,
    AcceptanceLog,
    SuggestionTracker,
    default_log_path,
    read_outcomes,
    read_records,
)

FEATURES = {"lp_mean": -1.5, "steps": 3.0, "line_count": float("nan")}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _log(tmp_path: Path, clock: Clock, **options) -> AcceptanceLog:
    return AcceptanceLog(tmp_path / "acceptance.jsonl", clock=clock, **options)


def _shown(log: AcceptanceLog, key: str) -> None:
    log.shown(key, features=FEATURES, score=0.7, threshold=0.4, text="lue)\n", language="python", model="abc")


def test_the_log_lives_in_the_users_data_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = default_log_path()
    assert path.name == "acceptance.jsonl" and "glm5-lsp" in path.parts
    AcceptanceLog(clock=Clock()).accepted("x")
    assert path.is_file() and str(path).startswith(str(tmp_path))


def test_records_are_one_json_line_each_with_numbers_only(tmp_path: Path) -> None:
    clock = Clock()
    log = _log(tmp_path, clock)
    _shown(log, "a")
    clock.now += 2
    log.accepted("a")
    log.typed_over("b")
    log.removed("a", 12.5)
    lines = (tmp_path / "acceptance.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["event"] for r in records] == ["shown", "accepted", "typed_over", "removed"]
    shown = records[0]
    assert shown == {"v": 1, "event": "shown", "id": "a", "t": 1000.0, "language": "python", "score": 0.7,
                     "threshold": 0.4, "chars": 5, "lines": 2, "model": "abc",
                     "features": {"lp_mean": -1.5, "steps": 3.0, "line_count": None}}
    assert "lue" not in lines[0]  # no code is written
    assert records[3]["after_s"] == 12.5
    with pytest.raises(ValueError, match="unknown acceptance event"):
        log.write("clicked", "a")


def test_the_setting_off_writes_nothing(tmp_path: Path) -> None:
    log = _log(tmp_path, Clock(), enabled=False)
    _shown(log, "a")
    log.accepted("a")
    tracker = SuggestionTracker(log, clock=Clock())
    tracker.shown("file:///m.py", "x = va\n", 6, "lue", features=FEATURES, score=0.5, threshold=0.4, language="python")
    assert not (tmp_path / "acceptance.jsonl").exists()


def test_the_log_rotates_and_is_read_across_the_rotation(tmp_path: Path) -> None:
    clock = Clock()
    log = _log(tmp_path, clock, max_bytes=2000)
    for i in range(30):
        _shown(log, f"s{i}")
        clock.now += 1
    assert (tmp_path / "acceptance.1.jsonl").is_file()
    assert (tmp_path / "acceptance.jsonl").stat().st_size <= 2000
    ids = [r["id"] for r in read_records(tmp_path / "acceptance.jsonl")]
    assert ids == [f"s{i}" for i in range(30 - len(ids), 30)] and len(ids) > 10


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_log_that_cannot_be_written_turns_itself_off(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    log = AcceptanceLog(folder / "sub" / "acceptance.jsonl", clock=Clock())
    log.accepted("a")  # no exception
    assert not log.enabled


def test_a_log_that_cannot_be_written_turns_itself_off_even_as_root(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    log = AcceptanceLog(tmp_path / "file" / "acceptance.jsonl", clock=Clock())  # a file where a folder must be
    log.accepted("a")
    assert not log.enabled


def test_outcomes(tmp_path: Path) -> None:
    clock = Clock()
    log = _log(tmp_path, clock)
    for key in ("kept", "removed", "typed", "ignored", "recent", "accepted_late"):
        _shown(log, key)
    clock.now += 1
    log.accepted("kept")
    log.accepted("removed")
    log.typed_over("typed")
    clock.now += 10
    log.removed("removed", 10)
    log.accepted("accepted_late")
    clock.now += RETENTION_S
    _shown(log, "recent")  # shown again, just now: undecided
    log.accepted("orphan")  # no shown record: ignored
    with (tmp_path / "acceptance.jsonl").open("a") as handle:
        handle.write('{"v": 1, "event": "shown", "id": "cut short\n')  # a crash mid-line
    clock.now += 5
    log.accepted("recent")
    outcomes = {o.id: o for o in read_outcomes(tmp_path / "acceptance.jsonl")}
    assert set(outcomes) == {"kept", "removed", "typed", "ignored", "accepted_late"}
    assert outcomes["kept"].kept and outcomes["kept"].why == "accepted"
    assert not outcomes["removed"].kept and outcomes["removed"].why == "removed"
    assert not outcomes["typed"].kept and outcomes["typed"].why == "typed_over"
    assert not outcomes["ignored"].kept and outcomes["ignored"].why == "ignored"
    assert outcomes["accepted_late"].kept  # accepted 11 s after being shown, then left alone for 30 s
    assert outcomes["kept"].features["lp_mean"] == -1.5 and outcomes["kept"].features["line_count"] is None
    assert outcomes["kept"].score == 0.7 and outcomes["kept"].model == "abc"
    assert not read_outcomes(tmp_path / "absent.jsonl")


URI = "file:///w/m.py"
BEFORE = "import os\n\nx = va\ny = 2\n"
CURSOR = BEFORE.index("va") + 2


def _tracker(tmp_path: Path) -> tuple[SuggestionTracker, Clock, Path]:
    clock = Clock()
    path = tmp_path / "acceptance.jsonl"
    return SuggestionTracker(AcceptanceLog(path, clock=clock), clock=clock), clock, path


def _events(path: Path) -> list[tuple[str, str]]:
    return [(r["event"], r["id"]) for r in read_records(path)]


def test_typing_the_suggestion_through_is_not_typing_over(tmp_path: Path) -> None:
    tracker, clock, path = _tracker(tmp_path)
    key = tracker.shown(URI, BEFORE, CURSOR, "lue + 1", features=FEATURES, score=0.6, threshold=0.4, language="python")
    text = BEFORE
    for typed in ("l", "u"):
        at = text.index("va") + 2 + (1 if typed == "u" else 0)
        text = text[:at] + typed + text[at:]
        clock.now += 0.2
        tracker.changed(URI, text)
    assert _events(path) == [("shown", key)]
    at = text.index("valu") + 4
    tracker.changed(URI, text[:at] + "X" + text[at:])  # not what was suggested
    assert _events(path) == [("shown", key), ("typed_over", key)]


def test_an_edit_elsewhere_does_not_touch_a_shown_suggestion(tmp_path: Path) -> None:
    tracker, _, path = _tracker(tmp_path)
    key = tracker.shown(URI, BEFORE, CURSOR, "lue", features=FEATURES, score=0.6, threshold=0.4, language="python")
    tracker.changed(URI, BEFORE.replace("y = 2", "y = 3"))  # below
    tracker.changed(URI, "# head\n" + BEFORE.replace("y = 2", "y = 3"))  # above: the cursor moves along
    assert tracker.accepted(key)
    assert _events(path) == [("shown", key), ("accepted", key)]
    assert not tracker.accepted(key)  # once
    assert not tracker.accepted("unknown")


def test_accepted_then_removed_within_30_s(tmp_path: Path) -> None:
    tracker, clock, path = _tracker(tmp_path)
    key = tracker.shown(URI, BEFORE, CURSOR, "lue", features=FEATURES, score=0.6, threshold=0.4, language="python")
    accepted = BEFORE[:CURSOR] + "lue" + BEFORE[CURSOR:]
    clock.now += 1
    tracker.accepted(key)
    tracker.changed(URI, accepted)
    clock.now += 3
    tracker.changed(URI, "# a comment\n" + accepted)  # an edit above it: it moves, still there
    moved = "# a comment\n" + accepted
    clock.now += 3
    tracker.changed(URI, moved.replace("x = value\n", "x = value  # ok\n"))  # typing on after it
    assert _events(path) == [("shown", key), ("accepted", key)]
    clock.now += 5
    tracker.changed(URI, moved.replace("x = value\n", "x = va  # ok\n"))  # the accepted text deleted
    events = list(read_records(path))
    assert [(r["event"], r["id"]) for r in events] == [("shown", key), ("accepted", key), ("removed", key)]
    assert events[-1]["after_s"] == pytest.approx(11.0)
    outcome = read_outcomes(path, now=clock.now + 60)[0]
    assert outcome.id == key and not outcome.kept


def test_accepted_and_left_for_30_s_is_kept(tmp_path: Path) -> None:
    tracker, clock, path = _tracker(tmp_path)
    key = tracker.shown(URI, BEFORE, CURSOR, "lue", features=FEATURES, score=0.6, threshold=0.4, language="python")
    accepted = BEFORE[:CURSOR] + "lue" + BEFORE[CURSOR:]
    tracker.accepted(key)
    tracker.changed(URI, accepted)
    clock.now += RETENTION_S + 1
    tracker.changed(URI, accepted.replace("x = value", "x = va"))  # deleted, but too late to count
    assert _events(path) == [("shown", key), ("accepted", key)]
    outcome = read_outcomes(path, now=clock.now)[0]
    assert outcome.kept and outcome.why == "accepted"


def test_a_newer_suggestion_replaces_one_not_taken(tmp_path: Path) -> None:
    tracker, clock, path = _tracker(tmp_path)
    first = tracker.shown(URI, BEFORE, CURSOR, "lue", features=FEATURES, score=0.6, threshold=0.4, language="python")
    second = tracker.shown(URI, BEFORE, CURSOR, "riable", features=FEATURES, score=0.6, threshold=0.4,
                           language="python")
    assert not tracker.accepted(first) and tracker.accepted(second)
    clock.now += RETENTION_S + 1
    outcomes = {o.id: o.kept for o in read_outcomes(path, now=clock.now)}
    assert outcomes == {first: False, second: True}


@pytest.mark.parametrize("edit_first", [True, False])
def test_the_editors_edit_may_come_before_or_after_the_accept_command(tmp_path: Path, edit_first: bool) -> None:
    tracker, clock, path = _tracker(tmp_path)
    key = tracker.shown(URI, BEFORE, CURSOR, "lue", features=FEATURES, score=0.6, threshold=0.4, language="python")
    accepted = BEFORE[:CURSOR] + "lue" + BEFORE[CURSOR:]
    if edit_first:
        tracker.changed(URI, accepted)
        assert tracker.accepted(key)
    else:
        assert tracker.accepted(key)
        tracker.changed(URI, accepted)
    clock.now += 2
    tracker.changed(URI, accepted.replace("x = value", "x = other"))  # rewritten
    assert _events(path) == [("shown", key), ("accepted", key), ("removed", key)]


def test_the_same_suggestion_asked_again_or_typed_through_keeps_its_id(tmp_path: Path) -> None:
    tracker, _, path = _tracker(tmp_path)
    assert not tracker.follows(URI)
    key = tracker.shown(URI, BEFORE, CURSOR, "lue + 1", features=FEATURES, score=0.6, threshold=0.4, language="python")
    assert tracker.follows(URI) and not tracker.follows("file:///other.py")
    assert tracker.current(URI, CURSOR, "lue + 1") == key  # asked again at the same place
    typed = BEFORE[:CURSOR] + "l" + BEFORE[CURSOR:]
    tracker.changed(URI, typed)
    assert tracker.current(URI, CURSOR + 1, "ue + 1") == key  # its rest, typed through
    assert tracker.current(URI, CURSOR + 1, "ue") is None and tracker.current(URI, CURSOR, "lue + 1") is None
    assert tracker.accepted(key)
    assert tracker.current(URI, CURSOR + 1, "ue + 1") is None  # accepted: no longer on offer
    tracker.forget(URI)
    assert not tracker.follows(URI)
    assert _events(path) == [("shown", key), ("accepted", key)]
