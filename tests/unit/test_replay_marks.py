"""The replay marks file: whole entries (an id alone, as earlier versions wrote) and entries
replayed in part (an id and the record indexes written), read back as one set per entry."""

from __future__ import annotations

from pathlib import Path

from kvproxy.commands.replay import replay_records, told_refused
from kvproxy.journal.replay_marks import mark_line, read_marks, replayed_in_full
from kvproxy.protocol.records import build_batch, read_batches
from tests.harness.quarantine import new_entry

ROWS = [(b"k", f"v{i}".encode(), None, 1_700_000_000_000 + i) for i in range(4)]


def test_marks_of_whole_and_partial_entries_read_back(tmp_path: Path) -> None:
    path = tmp_path / "replayed.ids"
    path.write_text(
        "old\n" + mark_line("part", frozenset({3, 1})) + mark_line("part", frozenset({0}))
    )
    assert mark_line("part", frozenset({3, 1})) == "part 1,3\n"
    marks = read_marks(path, whole=["journal-mark"])
    assert marks == {"old": None, "part": frozenset({0, 1, 3}), "journal-mark": None}
    assert replayed_in_full(marks) == {"old", "journal-mark"}


def test_what_the_client_was_told_decides_and_replayed_records_are_left_out() -> None:
    records = build_batch(ROWS)
    v7 = new_entry("rejected", "t", 0, records=records, record_indexes=(1,), produce_version=7)
    v9 = new_entry("rejected", "t", 0, records=records, record_indexes=(1,), produce_version=9)
    assert (told_refused(v7), told_refused(v9)) == (None, (1,))
    first = replay_records(v9)
    assert not isinstance(first, str) and first.indexes == (1,)
    rest = replay_records(v9, all_records=True, replayed=frozenset({1}))
    assert not isinstance(rest, str) and (rest.count, rest.indexes) == (3, (0, 2, 3))
    assert [r.value for b in read_batches(rest.records) for r in b.records()] == [
        b"v0",
        b"v2",
        b"v3",
    ]
    done = replay_records(v7, replayed=None)
    assert not isinstance(done, str) and (done.count, done.records) == (0, b"")
