"""journal/: the journal on disk (segments, roll, retention, recovery, write errors)."""

from __future__ import annotations

import errno
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvproxy.journal import Journal, JournalReader, QuarantineEntry, segment_name
from kvproxy.journal import segments as journal_segments
from kvproxy.protocol.journal import encode_entry
from tests.harness.journal_entries import BATCH, entry
from tests.harness.quarantine import new_entry, replay_mark

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def errors() -> list[str]:
    return []


@pytest.fixture
def journal_factory(tmp_path: Path, errors: list[str]) -> Iterator[Callable[..., Journal]]:
    opened: list[Journal] = []

    def make(**kwargs: object) -> Journal:
        kwargs.setdefault("on_error", errors.append)
        journal = Journal(tmp_path / "q", **kwargs)  # type: ignore[arg-type]
        opened.append(journal)
        return journal

    yield make
    for journal in opened:
        journal.close()


def segment_sizes(directory: Path) -> list[int]:
    return [path.stat().st_size for path in sorted(directory.glob("*.kvq"))]


def read(journal: Journal) -> JournalReader:
    """What is on disk in `journal`'s directory (call `flush()` first to see every append)."""
    return JournalReader(journal.directory)


# -- round trip --------------------------------------------------------------------------------


def test_append_flush_entries_round_trip(journal_factory: Callable[..., Journal]) -> None:
    journal = journal_factory()
    report = journal.open()
    assert (report.segments, report.entries, report.truncated_bytes) == (0, 0, 0)
    written = [entry(n) for n in range(20)]
    written.append(entry(20, kind="warned", topic="logs", client_id=None, policy=None))
    for item in written:
        journal.append(item)
    assert journal.flush(timeout=10)
    assert list(read(journal).entries()) == written
    assert journal.written == 21
    assert (journal.failed_writes, journal.dropped, journal.degraded) == (0, 0, None)
    assert list(read(journal).entries(topic="logs")) == [written[-1]]
    assert list(read(journal).entries(kinds=("warned",))) == [written[-1]]
    base = 1_800_000_000_000
    assert [e.id for e in read(journal).entries(since_ms=base + 5, until_ms=base + 8)] == [
        f"{n:032x}" for n in (5, 6, 7)
    ]
    journal.close()
    assert list(read(journal).entries()) == written  # and again after close


def test_metadata_is_plain_json_with_the_documented_keys() -> None:
    metadata = entry(1).to_metadata()
    assert set(metadata) == {
        "v",
        "id",
        "time_ms",
        "kind",
        "topic",
        "partition",
        "client_id",
        "client_address",
        "produce_version",
        "policy",
        "code",
        "message",
        "record_indexes",
        "replayed_id",
    }
    assert metadata["record_indexes"] == [0, 1]
    assert QuarantineEntry.from_metadata(metadata, BATCH) == entry(1)


def test_from_metadata_tolerates_missing_optional_and_unknown_keys() -> None:
    minimal = {"id": "x", "time_ms": 5, "kind": "warned", "topic": "t", "partition": 0}
    got = QuarantineEntry.from_metadata({**minimal, "future_key": [1]})
    assert got == QuarantineEntry("x", 5, "warned", "t", 0)
    for key, bad in [("partition", "0"), ("time_ms", True), ("record_indexes", [1, "a"])]:
        with pytest.raises(ValueError):
            QuarantineEntry.from_metadata({**minimal, key: bad})


def test_create_and_replay_marks(journal_factory: Callable[..., Journal]) -> None:
    clock = Clock()
    journal = journal_factory(clock=clock)
    journal.open()
    first = new_entry("rejected", "orders", 1, clock=clock, records=BATCH, code=87)
    second = new_entry("warned", "orders", 2, clock=clock)
    assert len(first.id) == 32 and first.id != second.id
    assert first.time_ms == int(clock.now * 1000)
    journal.append(first)
    journal.append(second)
    journal.append(replay_mark(first, clock=clock))
    assert journal.flush(timeout=10)
    assert read(journal).replayed_ids() == {first.id}
    assert list(read(journal).entries()) == [first, second]  # marks are not listed by default
    (mark,) = read(journal).entries(kinds=("replayed",))
    assert (mark.topic, mark.partition, mark.records, mark.replayed_id) == (
        "orders",
        1,
        b"",
        first.id,
    )
    assert len(list(read(journal).entries(kinds=None))) == 3


# -- segments, roll and retention --------------------------------------------------------------


def test_rolls_by_size_and_reads_across_segments(journal_factory: Callable[..., Journal]) -> None:
    size = len(encode_entry(entry(0).to_metadata(), BATCH))
    journal = journal_factory(segment_bytes=3 * size + 10)
    journal.open()
    written = [entry(n) for n in range(10)]
    for item in written:
        journal.append(item)
    assert journal.flush(timeout=10)
    names = [path.name for path in read(journal).segments()]
    assert names == [segment_name(n) for n in range(4)]
    assert segment_sizes(journal.directory) == [3 * size, 3 * size, 3 * size, size]
    assert list(read(journal).entries()) == written
    journal.close()
    # Reopened, it goes on appending to the last segment, which has room.
    again = journal_factory(segment_bytes=3 * size + 10)
    assert again.open().entries == 10
    again.append(entry(10))
    assert again.flush(timeout=10)
    assert segment_sizes(again.directory) == [3 * size] * 3 + [2 * size]


def test_an_entry_larger_than_a_segment_gets_its_own(
    journal_factory: Callable[..., Journal],
) -> None:
    journal = journal_factory(segment_bytes=100)
    journal.open()
    for n in range(3):
        journal.append(entry(n))
    assert journal.flush(timeout=10)
    assert len(read(journal).segments()) == 3
    assert len(list(read(journal).entries())) == 3


def test_retention_by_bytes_deletes_oldest_segments_never_the_active(
    journal_factory: Callable[..., Journal],
) -> None:
    size = len(encode_entry(entry(0).to_metadata(), BATCH))
    journal = journal_factory(segment_bytes=2 * size, retention_bytes=5 * size)
    journal.open()
    for n in range(12):
        journal.append(entry(n))
    assert journal.flush(timeout=10)
    # Checked on each roll (when the new segment is still empty): the total stays within
    # retention_bytes + segment_bytes. Segments 0-2 went; 3, 4 and the active 5 remain.
    assert segment_sizes(journal.directory) == [2 * size] * 3
    kept = [e.id for e in read(journal).entries()]
    assert kept == [f"{n:032x}" for n in range(6, 12)]
    assert read(journal).segments()[-1].name == segment_name(5)
    # Tiny retention: everything but the active segment goes; the active one stays.
    journal.close()
    tiny = journal_factory(segment_bytes=2 * size, retention_bytes=1)
    report = tiny.open()
    assert report.segments >= 2
    assert [path.name for path in read(tiny).segments()] == [segment_name(5)]


def test_retention_by_age_on_roll_and_on_open(journal_factory: Callable[..., Journal]) -> None:
    clock = Clock()
    now_ms = int(clock.now * 1000)
    size = len(encode_entry(entry(0).to_metadata(), BATCH))
    hour = 3_600_000
    journal = journal_factory(segment_bytes=size, retention_ms=24 * hour, clock=clock)
    journal.open()
    journal.append(entry(0, time_ms=now_ms - 30 * hour))  # segment 0: too old
    journal.append(entry(1, time_ms=now_ms - 2 * hour))  # segment 1: young
    journal.append(entry(2, time_ms=now_ms))  # segment 2: rolls, retention runs
    assert journal.flush(timeout=10)
    assert [e.partition for e in read(journal).entries()] == [1, 2]
    journal.close()
    clock.now += 23 * 3600  # entry 1 is now 25 h old, entry 2 is 23 h old
    later = journal_factory(segment_bytes=size, retention_ms=24 * hour, clock=clock)
    later.open()
    assert [e.partition for e in read(later).entries()] == [2]
    clock.now += 10 * 3600  # everything is old, but the active segment is never deleted
    last = journal_factory(segment_bytes=size, retention_ms=24 * hour, clock=clock)
    later.close()
    last.open()
    assert [e.partition for e in read(last).entries()] == [2]


# -- recovery ----------------------------------------------------------------------------------


def _fill(journal_factory: Callable[..., Journal], count: int, **kwargs: object) -> Journal:
    journal = journal_factory(**kwargs)
    journal.open()
    for n in range(count):
        journal.append(entry(n))
    assert journal.flush(timeout=10)
    journal.close()
    return journal


def test_torn_tail_is_truncated_on_open(journal_factory: Callable[..., Journal]) -> None:
    journal = _fill(journal_factory, 5)
    (path,) = read(journal).segments()
    good = path.stat().st_size
    last_entry = len(encode_entry(entry(4).to_metadata(), BATCH))
    with open(path, "r+b") as file:
        file.truncate(good - 7)  # the last entry loses its last 7 bytes
    reopened = journal_factory()
    report = reopened.open()
    assert report.entries == 4
    assert report.truncated_bytes == last_entry - 7
    assert report.truncated_segment == path.name
    assert path.stat().st_size == good - last_entry
    reopened.append(entry(99))
    assert reopened.flush(timeout=10)
    assert [e.id for e in read(reopened).entries()] == [f"{n:032x}" for n in (0, 1, 2, 3, 99)]


@pytest.mark.parametrize(
    "garbage", [b"\x00" * 100, b"KVQ1\x00\x00\x10\x00", b"KV", random.Random(64).randbytes(64)]
)
def test_garbage_after_the_last_entry_is_truncated(
    journal_factory: Callable[..., Journal], garbage: bytes
) -> None:
    journal = _fill(journal_factory, 3)
    (path,) = read(journal).segments()
    good = path.stat().st_size
    with open(path, "ab") as file:
        file.write(garbage)
    reopened = journal_factory()
    report = reopened.open()
    assert (report.entries, report.truncated_bytes) == (3, len(garbage))
    assert path.stat().st_size == good
    assert len(list(read(reopened).entries())) == 3


def test_corrupt_entry_in_an_older_segment_is_reported_and_kept(
    journal_factory: Callable[..., Journal],
) -> None:
    size = len(encode_entry(entry(0).to_metadata(), BATCH))
    journal = _fill(journal_factory, 6, segment_bytes=2 * size)
    first = read(journal).segments()[0]
    data = bytearray(first.read_bytes())
    data[size + 40] ^= 0xFF  # the second entry of segment 0
    first.write_bytes(bytes(data))
    reopened = journal_factory(segment_bytes=2 * size)
    report = reopened.open()
    assert report.corrupt_segments == (first.name,)
    assert (report.entries, report.truncated_bytes, report.truncated_segment) == (5, 0, None)
    assert first.stat().st_size == 2 * size  # left alone
    assert [e.partition for e in read(reopened).entries()] == [n % 3 for n in (0, 2, 3, 4, 5)]


def test_reader_never_truncates_and_reports_the_torn_tail(
    journal_factory: Callable[..., Journal],
) -> None:
    journal = _fill(journal_factory, 2)
    (path,) = read(journal).segments()
    with open(path, "ab") as file:
        file.write(encode_entry(entry(2).to_metadata(), BATCH)[:30])  # being written
    size = path.stat().st_size
    reader = read(journal)
    assert len(list(reader.entries())) == 2
    (problem,) = reader.problems
    assert problem.torn_tail and problem.segment == path.name
    assert path.stat().st_size == size
    assert list(JournalReader(journal.directory / "absent").entries()) == []


CHILD = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from kvproxy.journal import segments as journal_segments
    from kvproxy.journal.writer import Journal
    from tests.harness.journal_entries import entry

    directory, mode = Path(sys.argv[1]), sys.argv[2]
    journal = Journal(directory, flush_interval_ms=10)
    journal.open()
    if mode == "mid-write":
        real = journal_segments._write_all
        calls = 0

        def half_then_die(fd, data):
            global calls
            calls += 1
            if calls == 5:
                real(fd, data[: len(data) // 2])
                os._exit(0)  # the process dies inside the 5th write
            real(fd, data)

        journal_segments._write_all = half_then_die
        for n in range(10):
            journal.append(entry(n))
        journal.flush()
    else:
        n = 0
        while True:
            journal.append(entry(n))
            n += 1
            if n % 10 == 0:
                journal.flush()
                print(n, flush=True)
    """
)


def _child(directory: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory), mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_process_dying_mid_write_loses_only_that_entry(tmp_path: Path) -> None:
    child = _child(tmp_path / "q", "mid-write")
    assert child.wait(timeout=60) == 0
    journal = Journal(tmp_path / "q")
    report = journal.open()
    journal.close()
    full = len(encode_entry(entry(4).to_metadata(), BATCH))
    assert (report.entries, report.truncated_bytes) == (4, full // 2)
    assert [e.id for e in JournalReader(tmp_path / "q").entries()] == [
        f"{n:032x}" for n in range(4)
    ]


def test_kill_9_keeps_every_flushed_entry(tmp_path: Path) -> None:
    child = _child(tmp_path / "q", "loop")
    assert child.stdout is not None
    flushed = 0
    for line in child.stdout:
        flushed = int(line)
        if flushed >= 300:
            break
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    journal = Journal(tmp_path / "q")
    report = journal.open()
    journal.close()
    ids = [e.id for e in JournalReader(tmp_path / "q").entries()]
    assert report.entries == len(ids) >= flushed
    assert ids == [f"{n:032x}" for n in range(len(ids))]  # in order, none missing, intact
    assert list(JournalReader(tmp_path / "q").entries()) == [entry(n) for n in range(len(ids))]


# -- write errors ------------------------------------------------------------------------------


def test_write_errors_degrade_and_recover(
    journal_factory: Callable[..., Journal],
    errors: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    journal = journal_factory()
    journal.open()
    journal.append(entry(0))
    assert journal.flush(timeout=10)
    real = journal_segments._write_all

    def disk_full(fd: int, data: bytes) -> None:
        real(fd, data[:10])  # a partial write first, as a filling disk does
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(journal_segments, "_write_all", disk_full)
    started = time.monotonic()
    for n in range(1, 6):
        journal.append(entry(n))  # never raises, never waits for the disk
    assert time.monotonic() - started < 0.5
    assert not journal.flush(timeout=10)
    assert journal.degraded == "No space left on device"
    assert journal.failed_writes == 5
    assert errors == ["quarantine journal write failed: No space left on device"]  # once
    monkeypatch.setattr(journal_segments, "_write_all", real)
    journal.append(entry(6))
    assert journal.flush(timeout=10)
    assert journal.degraded is None
    assert journal.written == 2
    # The partial writes were cut back: the entry after them is readable.
    assert [e.id for e in read(journal).entries()] == [f"{n:032x}" for n in (0, 6)]
    assert read(journal).problems == []


def test_unwritable_directory_degrades_without_raising(
    journal_factory: Callable[..., Journal], errors: list[str], tmp_path: Path
) -> None:
    journal = journal_factory()
    journal.open()
    # The directory disappears and a file takes its place: creating a segment fails.
    shutil.rmtree(journal.directory)
    journal.directory.write_bytes(b"")
    journal.append(entry(0))
    assert not journal.flush(timeout=10)
    assert journal.degraded is not None and journal.failed_writes == 1
    assert len(errors) == 1
    journal.directory.unlink()
    journal.append(entry(1))
    assert journal.flush(timeout=10)
    assert journal.degraded is None
    assert [e.partition for e in read(journal).entries()] == [1]


def test_real_file_size_limit(tmp_path: Path) -> None:
    """A real failing write (RLIMIT_FSIZE, EFBIG) in a child process, then recovery."""
    script = textwrap.dedent(
        """
        import resource, signal, sys
        from pathlib import Path
        from kvproxy.journal import Journal
        from tests.harness.journal_entries import entry

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        messages = []
        journal = Journal(Path(sys.argv[1]), on_error=messages.append)
        journal.open()
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))
        for n in range(5):
            journal.append(entry(n))
        ok = journal.flush()
        print(ok, journal.written, journal.failed_writes, journal.degraded, len(messages))
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
        journal.append(entry(5))
        print(journal.flush(), journal.written, journal.degraded)
        journal.close()
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "q")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    failing, recovered = result.stdout.splitlines()
    written = int(failing.split()[1])
    assert failing.startswith("False") and "File too large" in failing
    assert failing.split()[2] == str(5 - written) and failing.endswith(" 1")
    assert recovered == f"True {written + 1} None"
    entries = list(JournalReader(tmp_path / "q").entries())
    assert [e.partition for e in entries] == [n % 3 for n in [*range(written), 5]]


def test_full_queue_drops_without_blocking(
    journal_factory: Callable[..., Journal],
    errors: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()
    real = journal_segments._write_all

    def slow(fd: int, data: bytes) -> None:
        release.wait(10)
        real(fd, data)

    monkeypatch.setattr(journal_segments, "_write_all", slow)
    journal = journal_factory(queue_entries=3)
    journal.open()
    started = time.monotonic()
    for n in range(20):
        journal.append(entry(n))
    assert time.monotonic() - started < 0.5
    assert journal.dropped >= 16  # the writer holds one, the queue three
    assert errors == [  # once per interval: the first drop, with the counts since the last line
        f"quarantine journal cannot keep up: 1 entries ({len(BATCH) + 1024} bytes) not kept "
        f"since the last report: its queue is full (3 entries or {64 * 1024 * 1024} bytes, "
        "quarantine.queue_bytes)"
    ]
    release.set()
    assert journal.flush(timeout=10)
    assert journal.written + journal.dropped == 20


def test_append_before_open_or_after_close_is_dropped(
    journal_factory: Callable[..., Journal], errors: list[str]
) -> None:
    journal = journal_factory()
    journal.append(entry(0))
    journal.open()
    journal.append(entry(1))
    journal.close()
    journal.close()  # idempotent
    journal.append(entry(2))
    assert (journal.written, journal.dropped) == (1, 2)
    assert len(errors) == 1  # once per interval: the second drop waits for the next line
    assert journal.dropped_by_reason == {"not_open": [2, 2 * (len(BATCH) + 1024)]}
    assert [e.partition for e in read(journal).entries()] == [1]


def test_flushes_on_the_interval_without_being_asked(
    journal_factory: Callable[..., Journal], monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = threading.Event()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        real_fsync(fd)
        synced.set()

    monkeypatch.setattr(journal_segments.os, "fsync", fsync)
    journal = journal_factory(flush_interval_ms=50)
    journal.open()
    journal.append(entry(0))
    assert synced.wait(5)


def test_unreadable_older_segment_is_aged_by_its_mtime_not_deleted(
    journal_factory: Callable[..., Journal],
) -> None:
    size = len(encode_entry(entry(0).to_metadata(), BATCH))
    journal = _fill(journal_factory, 4, segment_bytes=2 * size)
    first = read(journal).segments()[0]
    first.write_bytes(b"\x00" + first.read_bytes()[1:])  # its first entry is corrupt
    reopened = journal_factory(segment_bytes=2 * size)
    report = reopened.open()
    assert report.corrupt_segments == (first.name,)
    assert first.exists()  # evidence kept until it ages out like any other segment
    assert [e.partition for e in read(reopened).entries()] == [2 % 3, 3 % 3]


def test_one_writer_per_directory(journal_factory: Callable[..., Journal], tmp_path: Path) -> None:
    first = journal_factory()
    first.open()
    script = (
        "import sys\nfrom kvproxy.journal import Journal\n"
        "try:\n    Journal(sys.argv[1]).open()\nexcept BlockingIOError as exc:\n"
        "    print(exc.strerror)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(first.directory)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "in use by another process" in result.stdout
    first.close()
    second = journal_factory()
    second.open()  # the lock went with close()
