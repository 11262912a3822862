"""Which records of which journal entries replay has written: the marks file beside the journal.

A line is an entry id, for every record of the entry, or an id and the 0-based indexes written
(`<id> 0,3`), for an entry replayed in part: its other records can still be replayed later
(`--all-records`), and are not written twice."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

EVERY_RECORD = None
"""The mark of an entry whose every record was replayed."""

Replayed = frozenset[int] | None


def read_marks(path: Path, whole: Iterable[str] = ()) -> dict[str, Replayed]:
    """Entry id -> the record indexes replayed (None: every one). `whole`: ids replayed whole
    by other means (the journal's "replayed" marks)."""
    marks: dict[str, Replayed] = dict.fromkeys(whole, EVERY_RECORD)
    if not path.exists():
        return marks
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if not fields:
            continue
        entry_id = fields[0]
        if len(fields) == 1:
            marks[entry_id] = EVERY_RECORD
            continue
        try:
            indexes = frozenset(int(i) for i in fields[1].split(",") if i)
        except ValueError:  # a line this version does not read: the entry counts as replayed
            marks[entry_id] = EVERY_RECORD
            continue
        marks[entry_id] = union(marks.get(entry_id, frozenset()), indexes)
    return marks


def union(first: Replayed, second: Replayed) -> Replayed:
    if first is EVERY_RECORD or second is EVERY_RECORD:
        return EVERY_RECORD
    return first | second


def mark_line(entry_id: str, indexes: Replayed) -> str:
    if indexes is EVERY_RECORD:
        return entry_id + "\n"
    return f"{entry_id} {','.join(str(i) for i in sorted(indexes))}\n"


def replayed_in_full(marks: Mapping[str, Replayed]) -> set[str]:
    return {entry_id for entry_id, indexes in marks.items() if indexes is EVERY_RECORD}
