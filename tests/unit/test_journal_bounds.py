"""The journal's queue is bounded in bytes and says it drops once per interval, with counts;
`RecentRefusals` recognises a batch sent again within a bounded window."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvproxy.journal import Journal
from kvproxy.journal import segments as journal_segments
from kvproxy.journal import writer as journal_module
from kvproxy.journal.repeats import RecentRefusals, Refusal, refusal_key
from tests.harness.quarantine import new_entry

KiB = 1024
PARTITION = 256 * KiB
SIZE = PARTITION + journal_module.ENTRY_OVERHEAD_BYTES


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def held_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Journal, list[str], Clock]]:
    """A journal whose writer is held at its first write until the test ends."""
    gate = threading.Event()
    real = journal_segments._write_all

    def held(fd: int, data: bytes) -> None:
        gate.wait(30)
        real(fd, data)

    monkeypatch.setattr(journal_segments, "_write_all", held)
    errors: list[str] = []
    clock = Clock()
    journal = Journal(
        tmp_path / "q",
        queue_bytes=4 * SIZE,
        report_interval_s=10.0,
        clock=clock,
        on_error=errors.append,
    )
    journal.open()
    yield journal, errors, clock
    gate.set()
    journal.close()


def test_the_queue_holds_at_most_its_bytes_and_counts_the_rest(
    held_journal: tuple[Journal, list[str], Clock],
) -> None:
    journal, _, _ = held_journal
    for n in range(40):
        journal.append(new_entry("rejected", "t", n, records=bytes(PARTITION)))
        assert journal.queued_bytes <= journal.queue_bytes
    # the writer holds one entry (its bytes stay counted until written), the queue the others
    assert journal.queued_bytes == 4 * SIZE
    assert journal.dropped == 36
    assert journal.dropped_by_reason == {"queue_full": [36, 36 * SIZE]}


def test_cannot_keep_up_is_said_once_per_interval_with_the_counts(
    held_journal: tuple[Journal, list[str], Clock],
) -> None:
    journal, errors, clock = held_journal
    for n in range(4):
        journal.append(new_entry("rejected", "t", n, records=bytes(PARTITION)))
    assert errors == []
    for n in range(100):  # 100 drops within one interval: one line, for the first
        journal.append(new_entry("rejected", "t", n, records=bytes(PARTITION)))
    assert len(errors) == 1
    assert errors[0].startswith(f"quarantine journal cannot keep up: 1 entries ({SIZE} bytes)")
    clock.now += 9.9
    journal.append(new_entry("rejected", "t", 0, records=bytes(PARTITION)))
    assert len(errors) == 1
    clock.now += 0.1  # the interval is over: the next drop says how many since the last line
    journal.append(new_entry("rejected", "t", 0, records=bytes(PARTITION)))
    assert len(errors) == 2
    assert errors[1].startswith(
        f"quarantine journal cannot keep up: 101 entries ({101 * SIZE} bytes) not kept since the "
        "last report"
    )
    assert journal.dropped == 102


def key(records: bytes | memoryview, **overrides: object) -> bytes:
    fields: dict[str, object] = {
        "topic": "t",
        "partition": 0,
        "client_id": "c",
        "policy": "crc",
        "code": 2,
        **overrides,
    }
    return refusal_key(records, **fields)  # type: ignore[arg-type]


def test_a_batch_is_known_by_its_bytes_topic_partition_client_and_refusal() -> None:
    base = key(b"batch")
    assert key(b"batch") == base
    assert key(memoryview(b"xbatch")[1:]) == base
    for other in (
        key(b"batcH"),
        key(b"batch", topic="u"),
        key(b"batch", partition=1),
        key(b"batch", client_id=None),
        key(b"batch", policy="json"),
        key(b"batch", code=87),
    ):
        assert other != base


def test_recent_refusals_count_attempts_within_a_bounded_window() -> None:
    forgotten: list[tuple[str, int]] = []
    recent = RecentRefusals(
        window_ms=1000,
        capacity=2,
        on_forget=lambda r: forgotten.append((r.entry_id, r.attempts)),
    )

    def seen(name: bytes, now: int) -> Refusal | None:
        return recent.seen(name, now, lambda: Refusal(name.decode(), now, "t", 0))

    assert seen(b"a", 0) is None
    again = seen(b"a", 500)
    assert again is not None and again.attempts == 2
    assert seen(b"a", 999) is not None
    assert seen(b"a", 1000) is None  # the window is over: a new refusal (the old one written down)
    assert forgotten == [("a", 3)]
    assert seen(b"b", 1001) is None
    assert seen(b"c", 1002) is None  # capacity 2: "a" (seen once since) leaves, nothing to write
    assert len(recent) == 2 and forgotten == [("a", 3)]
    assert seen(b"b", 1003) is not None
    recent.forget_all()
    assert forgotten == [("a", 3), ("b", 2)]


def test_a_zero_window_keeps_every_attempt() -> None:
    recent = RecentRefusals(window_ms=0, capacity=10)
    for now in range(3):
        assert recent.seen(b"a", now, lambda: Refusal("a", 0, "t", 0)) is None
    assert len(recent) == 0
