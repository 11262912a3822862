"""The quarantine journal on disk: append-only segments written by a thread, and a reader.

`Journal` is what the proxy holds: `append()` only puts the entry on a bounded queue (it never
blocks the event loop and never raises); a writer thread encodes entries with
`protocol.journal`, appends them to the active segment, rolls and expires segments, and fsyncs
every `flush_interval_ms` and on close. Write errors (disk full, permissions) are recorded in
`degraded` and the counters, reported once per failure streak through `on_error`, and never
reach the caller.

`JournalReader` (`open_journal_for_reading`) reads a journal directory without a writer thread
and without repairing anything, so `kvproxy quarantine list|show` can run while a proxy writes.
The format and the guarantees are in docs/quarantine.md.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protocol.errors import BufferUnderflow, DecodeError, EncodeError
from protocol.journal import encode_entry, iter_entries
from proxy.bounds import (
    MAX_CLIENT_ID_CHARS,
    MAX_MESSAGE_CHARS,
    MAX_RECORD_INDEXES,
    MAX_TOPIC_CHARS,
    clip,
)

__all__ = [
    "KINDS",
    "SEGMENT_SUFFIX",
    "Journal",
    "JournalReader",
    "QuarantineEntry",
    "RecoveryReport",
    "new_entry_id",
    "open_journal_for_reading",
    "read_entries",
    "segment_name",
]

MiB = 1024 * 1024
GiB = 1024 * MiB
DAY_MS = 24 * 60 * 60 * 1000

SEGMENT_SUFFIX = ".kvq"
WORKER_DIR_PREFIX = "worker-"
"""With `kvproxy serve --workers N`, worker i journals into `<dir>/worker-<i>`; readers of `<dir>`
read those too."""
LOCK_FILE = ".lock"
"""Held (flock, exclusive) by the one Journal writing a directory; readers do not take it."""
KINDS = ("rejected", "warned", "replayed")
METADATA_VERSION = 1
"""The `v` key of every entry's metadata; readers ignore keys they do not know."""


def new_entry_id() -> str:
    """A fresh entry id: uuid4 as 32 hex digits."""
    return uuid.uuid4().hex


def segment_name(sequence: int) -> str:
    """`00000000000000000042.kvq`: the sequence number, zero-padded to 20 digits."""
    return f"{sequence:020d}{SEGMENT_SUFFIX}"


def _segment_sequence(path: Path) -> int | None:
    if path.suffix != SEGMENT_SUFFIX or len(path.stem) != 20 or not path.stem.isdigit():
        return None
    return int(path.stem)


def _list_segments(directory: Path) -> list[tuple[int, Path]]:
    found = []
    for path in directory.iterdir():
        sequence = _segment_sequence(path)
        if sequence is not None and path.is_file():
            found.append((sequence, path))
    return sorted(found)


# -- entries -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QuarantineEntry:
    """One quarantined partition (or a mark saying an earlier entry was replayed)."""

    id: str
    time_ms: int
    kind: str  # "rejected" | "warned" | "replayed"
    topic: str
    partition: int
    client_id: str | None = None
    client_address: str | None = None
    produce_version: int = -1
    policy: str | None = None
    code: int = 0
    message: str | None = None
    record_indexes: tuple[int, ...] = ()
    records: bytes = b""  # the original records bytes (empty for "replayed" marks)
    replayed_id: str | None = None  # kind "replayed": the id of the entry replayed
    record_indexes_omitted: int = 0
    """Record indexes left out of the stored metadata (beyond `MAX_RECORD_INDEXES`)."""

    @classmethod
    def create(
        cls,
        kind: str,
        topic: str,
        partition: int,
        *,
        clock: Callable[[], float] = time.time,
        **fields: Any,
    ) -> QuarantineEntry:
        """A new entry with a fresh id and the current time."""
        return cls(
            id=new_entry_id(),
            time_ms=int(clock() * 1000),
            kind=kind,
            topic=topic,
            partition=partition,
            **fields,
        )

    @classmethod
    def replay_mark(
        cls, replayed: QuarantineEntry, *, clock: Callable[[], float] = time.time
    ) -> QuarantineEntry:
        """The "replayed" mark of `replayed` (same topic and partition, no records)."""
        return cls.create(
            "replayed", replayed.topic, replayed.partition, clock=clock, replayed_id=replayed.id
        )

    def to_metadata(self) -> dict[str, Any]:
        """The JSON object stored in the entry (everything but the records).

        Its size is bounded whatever the client sent: topic, client id and message are clipped
        (`proxy.bounds`) and at most `MAX_RECORD_INDEXES` record indexes are kept, the number of
        the others in `record_indexes_omitted`."""
        omitted = self.record_indexes_omitted + max(
            0, len(self.record_indexes) - MAX_RECORD_INDEXES
        )
        metadata = {
            "v": METADATA_VERSION,
            "id": self.id,
            "time_ms": self.time_ms,
            "kind": self.kind,
            "topic": clip(self.topic, MAX_TOPIC_CHARS),
            "partition": self.partition,
            "client_id": clip(self.client_id, MAX_CLIENT_ID_CHARS),
            "client_address": self.client_address,
            "produce_version": self.produce_version,
            "policy": self.policy,
            "code": self.code,
            "message": clip(self.message, MAX_MESSAGE_CHARS),
            "record_indexes": list(self.record_indexes[:MAX_RECORD_INDEXES]),
            "replayed_id": self.replayed_id,
        }
        if omitted:
            metadata["record_indexes_omitted"] = omitted
        return metadata

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], records: bytes = b"") -> QuarantineEntry:
        """The entry back from its metadata; ValueError when a field is missing or mistyped.

        Unknown keys are ignored (later versions may add some); optional keys may be absent.
        """
        return cls(
            id=_field(metadata, "id", str),
            time_ms=_field(metadata, "time_ms", int),
            kind=_field(metadata, "kind", str),
            topic=_field(metadata, "topic", str),
            partition=_field(metadata, "partition", int),
            client_id=_optional(metadata, "client_id", str),
            client_address=_optional(metadata, "client_address", str),
            produce_version=_optional(metadata, "produce_version", int, -1),
            policy=_optional(metadata, "policy", str),
            code=_optional(metadata, "code", int, 0),
            message=_optional(metadata, "message", str),
            record_indexes=tuple(_int_list(metadata.get("record_indexes"))),
            records=bytes(records),
            replayed_id=_optional(metadata, "replayed_id", str),
            record_indexes_omitted=_optional(metadata, "record_indexes_omitted", int, 0),
        )


def _field(metadata: Mapping[str, Any], key: str, kind: type[Any]) -> Any:
    value = metadata.get(key)
    if not _is(value, kind):
        raise ValueError(f"journal metadata: {key!r} must be {kind.__name__}, got {value!r}")
    return value


def _optional(metadata: Mapping[str, Any], key: str, kind: type[Any], default: Any = None) -> Any:
    value = metadata.get(key)
    if value is None:
        return default
    return _field(metadata, key, kind)


def _is(value: Any, kind: type[Any]) -> bool:
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _int_list(value: Any) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(_is(item, int) for item in value):
        raise ValueError(f"journal metadata: 'record_indexes' must be a list of int: {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What `Journal.open` found.

    `truncated_bytes` were cut from the end of the last segment (`truncated_segment`, a file name)
    because they held a torn or corrupt entry. `corrupt_segments` names older segments with a
    corrupt entry: they are left as they are and read up to that entry.
    """

    segments: int
    entries: int
    truncated_bytes: int
    truncated_segment: str | None
    corrupt_segments: tuple[str, ...] = ()


# -- reading -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SegmentProblem:
    """A segment a reader could not read to its end."""

    segment: str
    position: int
    error: str
    torn_tail: bool  # the file ends inside an entry (normal for the segment being written)


@dataclass
class _Scan:
    entries: int = 0
    good_end: int = 0
    newest_ms: int | None = None
    error: DecodeError | None = None


def _scan(data: bytes) -> _Scan:
    scan = _Scan()
    try:
        for _, end, metadata, _records in iter_entries(data):
            scan.entries += 1
            scan.good_end = end
            stamp = metadata.get("time_ms")
            if isinstance(stamp, int) and (scan.newest_ms is None or stamp > scan.newest_ms):
                scan.newest_ms = stamp
    except DecodeError as exc:
        scan.error = exc
    return scan


class JournalReader:
    """Reads a journal directory: no writer thread, nothing truncated or deleted.

    Safe while a proxy writes to the same directory: a torn tail of a segment (an entry being
    written) ends that segment; a corrupt entry ends it too and is recorded in `problems`; a
    segment deleted by retention meanwhile is skipped.
    """

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.problems: list[SegmentProblem] = []

    def segments(self) -> list[Path]:
        """Segment files in write order (an absent directory has none): the directory's own, then
        each worker's (`worker-<i>/`, see WORKER_DIR_PREFIX) in worker order."""
        found: list[Path] = []
        for directory in journal_directories(self.directory):
            try:
                found.extend(path for _, path in _list_segments(directory))
            except FileNotFoundError:
                continue
        return found

    def entries(
        self,
        *,
        topic: str | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        kinds: Iterable[str] | None = ("rejected", "warned"),
    ) -> Iterator[QuarantineEntry]:
        """Entries in write order, filtered: `since_ms <= time_ms < until_ms`; `kinds=None` is
        every kind. Entries whose metadata does not make a QuarantineEntry are skipped (and
        recorded in `problems`)."""
        wanted = None if kinds is None else frozenset(kinds)
        self.problems = []
        for path in self.segments():
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            good_end = 0
            try:
                for position, end, metadata, records in iter_entries(data):
                    good_end = end
                    try:
                        entry = QuarantineEntry.from_metadata(metadata, records)
                    except ValueError as exc:
                        self.problems.append(SegmentProblem(path.name, position, str(exc), False))
                        continue
                    if (
                        (wanted is None or entry.kind in wanted)
                        and (topic is None or entry.topic == topic)
                        and (since_ms is None or entry.time_ms >= since_ms)
                        and (until_ms is None or entry.time_ms < until_ms)
                    ):
                        yield entry
            except DecodeError as exc:
                torn = isinstance(exc, BufferUnderflow)
                self.problems.append(SegmentProblem(path.name, good_end, str(exc), torn))

    def replayed_ids(self) -> set[str]:
        """Ids named by "replayed" marks."""
        return {
            entry.replayed_id
            for entry in self.entries(kinds=("replayed",))
            if entry.replayed_id is not None
        }


def journal_directories(directory: Path) -> list[Path]:
    """`directory` and the journals of its workers (`worker-<i>`, in the order of i)."""
    workers: list[tuple[int, Path]] = []
    with contextlib.suppress(OSError):
        for child in directory.iterdir():
            suffix = child.name.removeprefix(WORKER_DIR_PREFIX)
            if child.name.startswith(WORKER_DIR_PREFIX) and suffix.isdigit() and child.is_dir():
                workers.append((int(suffix), child))
    return [directory, *(path for _, path in sorted(workers))]


def open_journal_for_reading(directory: Path | str) -> JournalReader:
    """A reader over `directory` (see JournalReader)."""
    return JournalReader(directory)


def read_entries(
    directory: Path | str,
    *,
    topic: str | None = None,
    since_ms: int | None = None,
    until_ms: int | None = None,
    kinds: Iterable[str] | None = ("rejected", "warned"),
) -> Iterator[QuarantineEntry]:
    """`JournalReader(directory).entries(...)`."""
    return JournalReader(directory).entries(
        topic=topic, since_ms=since_ms, until_ms=until_ms, kinds=kinds
    )


# -- writing -------------------------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written (the one place the writer writes; tests patch it)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:  # pragma: no cover - os.write raises rather than returning 0
            raise OSError(errno.EIO, "write wrote nothing")
        view = view[written:]


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class _Segment:
    sequence: int
    path: Path
    size: int
    newest_ms: int | None
    damaged: bool = False


@dataclass
class _FlushRequest:
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = True


_STOP = object()


class Journal:
    """The proxy's quarantine journal: `open()`, `append()` from any thread, `close()`.

    Counters (read them from any thread): `written` entries written to a segment,
    `failed_writes` entries lost to a write error, `dropped` entries refused because the queue
    was full or the journal not open. `degraded` is the last write error while writes fail, else
    None.
    """

    def __init__(
        self,
        directory: Path | str,
        *,
        segment_bytes: int = 64 * MiB,
        retention_bytes: int = 1 * GiB,
        retention_ms: int = 7 * DAY_MS,
        flush_interval_ms: int = 1000,
        queue_entries: int = 10_000,
        clock: Callable[[], float] = time.time,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.retention_bytes = retention_bytes
        self.retention_ms = retention_ms
        self.flush_interval_ms = flush_interval_ms
        self.clock = clock
        self.on_error = on_error
        self.written = 0
        self.failed_writes = 0
        self.dropped = 0
        self._degraded: str | None = None
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_entries)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._queue_full = False
        self._segments: list[_Segment] = []
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._dirty = False
        self._last_sync = time.monotonic()

    # -- lifecycle ----------------------------------------------------------------------------

    def open(self) -> RecoveryReport:
        """Create the directory, recover the segments, start the writer thread.

        A torn or corrupt tail of the last segment is truncated to the end of its last good
        entry. An older segment with a corrupt entry is left alone (readers stop there) and
        named in the report. Raises OSError when the directory cannot be created, listed or
        repaired, and BlockingIOError when another Journal (another process) holds it; write
        errors after this never raise.
        """
        if self._thread is not None:
            raise RuntimeError("journal already open")
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock()
        try:
            report = self._recover()
        except BaseException:
            self._unlock()
            raise
        self._closed = False
        self._last_sync = time.monotonic()
        self._thread = threading.Thread(
            target=self._run, name=f"kvproxy-journal:{self.directory}", daemon=True
        )
        self._thread.start()
        return report

    def _lock(self) -> None:
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise BlockingIOError(
                exc.errno, f"quarantine journal {self.directory} is in use by another process"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def _recover(self) -> RecoveryReport:
        found = _list_segments(self.directory)
        entries = 0
        truncated_bytes = 0
        truncated_segment: str | None = None
        corrupt: list[str] = []
        self._segments = []
        for index, (sequence, path) in enumerate(found):
            data = path.read_bytes()
            scan = _scan(data)
            entries += scan.entries
            size = len(data)
            if scan.error is not None:
                if index == len(found) - 1:
                    with open(path, "r+b") as file:
                        file.truncate(scan.good_end)
                        file.flush()
                        os.fsync(file.fileno())
                    truncated_bytes = size - scan.good_end
                    truncated_segment = path.name
                    size = scan.good_end
                else:
                    corrupt.append(path.name)
            newest_ms = scan.newest_ms
            if newest_ms is None and size > 0:  # nothing readable: age it by the file's mtime
                newest_ms = int(path.stat().st_mtime * 1000)
            self._segments.append(_Segment(sequence, path, size, newest_ms))
        self._apply_retention()
        return RecoveryReport(
            segments=len(found),
            entries=entries,
            truncated_bytes=truncated_bytes,
            truncated_segment=truncated_segment,
            corrupt_segments=tuple(corrupt),
        )

    def append(self, entry: QuarantineEntry) -> None:
        """Queue `entry` for the writer thread. Never blocks, never raises."""
        if self._thread is None or self._closed:
            self.dropped += 1
            self._report("quarantine journal is not open: entry dropped")
            return
        try:
            self._queue.put_nowait(entry)
        except queue.Full:
            self.dropped += 1
            if not self._queue_full:
                self._queue_full = True
                self._report(
                    f"quarantine journal queue full ({self._queue.maxsize} entries): "
                    "entries dropped"
                )
            return
        self._queue_full = False

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued before this call is written and fsynced.

        True when done within `timeout` and nothing failed (no write or fsync error since the
        journal last was healthy); False otherwise. True at once when no writer runs.
        """
        if self._thread is None or not self._thread.is_alive():
            return self._degraded is None
        request = _FlushRequest()
        try:
            self._queue.put(request, timeout=timeout)
        except queue.Full:
            return False
        return request.done.wait(timeout) and request.ok

    def close(self) -> None:
        """Write and fsync what is queued, stop the thread, close the file. Idempotent."""
        thread = self._thread
        if thread is None:
            return
        self._closed = True
        self._queue.put(_STOP)
        thread.join()
        self._thread = None
        self._unlock()

    def __enter__(self) -> Journal:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state --------------------------------------------------------------------------------

    @property
    def degraded(self) -> str | None:
        """The last write error while writes fail ("No space left on device", ...), else None."""
        return self._degraded

    @property
    def pending(self) -> int:
        """Entries queued and not yet written."""
        return self._queue.qsize()

    def segment_paths(self) -> list[Path]:
        """The segment files on disk, in write order."""
        return JournalReader(self.directory).segments()

    def entries(
        self,
        *,
        topic: str | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        kinds: Iterable[str] | None = ("rejected", "warned"),
    ) -> Iterator[QuarantineEntry]:
        """Entries on disk in write order (call `flush()` first to see everything appended)."""
        return read_entries(
            self.directory, topic=topic, since_ms=since_ms, until_ms=until_ms, kinds=kinds
        )

    def replayed_ids(self) -> set[str]:
        """Ids named by "replayed" marks on disk."""
        return JournalReader(self.directory).replayed_ids()

    # -- writer thread ------------------------------------------------------------------------

    def _run(self) -> None:
        interval = max(self.flush_interval_ms, 0) / 1000
        while True:
            wait = max(interval - (time.monotonic() - self._last_sync), 0.0)
            try:
                item = self._queue.get(timeout=wait if self._dirty else None)
            except queue.Empty:
                self._sync()
                continue
            if item is _STOP:
                self._sync()
                self._close_file()
                return
            if isinstance(item, _FlushRequest):
                item.ok = self._sync() and self._degraded is None
                item.done.set()
                continue
            assert isinstance(item, QuarantineEntry)
            self._write(item)
            if self._dirty and time.monotonic() - self._last_sync >= interval:
                self._sync()

    def _write(self, entry: QuarantineEntry) -> None:
        try:
            data = encode_entry(entry.to_metadata(), entry.records)
        except EncodeError as exc:
            self._failed(f"entry {entry.id} cannot be encoded: {exc}")
            return
        segment: _Segment | None = None
        before = 0
        try:
            segment = self._active_for(len(data))
            before = segment.size
            assert self._fd is not None
            _write_all(self._fd, data)
        except OSError as exc:
            self._undo_partial(segment, before)
            self._failed(_describe(exc))
            return
        except Exception as exc:  # never let the writer thread die
            self._undo_partial(segment, before)
            self._failed(f"{type(exc).__name__}: {exc}")
            return
        segment.size += len(data)
        if segment.newest_ms is None or entry.time_ms > segment.newest_ms:
            segment.newest_ms = entry.time_ms
        self._dirty = True
        self.written += 1
        self._healthy()

    def _active_for(self, size: int) -> _Segment:
        """The segment to append `size` bytes to: a new one when they would take the active
        segment past `segment_bytes` (a single larger entry gets a segment of its own)."""
        active = self._segments[-1] if self._segments else None
        if active is None or active.damaged:
            return self._open_new()
        if active.size > 0 and active.size + size > self.segment_bytes:
            self._roll()
            return self._open_new()
        if self._fd is None:
            self._fd = os.open(active.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            if os.fstat(self._fd).st_size != active.size:
                # Changed behind our back: never append after bytes we did not check.
                active.damaged = True
                self._close_file()
                return self._open_new()
        return active

    def _open_new(self) -> _Segment:
        self._close_file()
        sequence = self._segments[-1].sequence + 1 if self._segments else 0
        path = self.directory / segment_name(sequence)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
        segment = _Segment(sequence, path, 0, None)
        self._segments.append(segment)
        with contextlib.suppress(OSError):
            _fsync_directory(self.directory)
        self._apply_retention()
        return segment

    def _roll(self) -> None:
        self._sync()
        self._close_file()

    def _undo_partial(self, segment: _Segment | None, size: int) -> None:
        """After a failed write, cut what it left so later entries stay readable; if that fails
        too, leave the segment (readers stop at its torn entry) and start a new one next time."""
        if self._fd is None or segment is None:
            return
        try:
            if os.fstat(self._fd).st_size != size:
                os.ftruncate(self._fd, size)
        except OSError:
            self._close_file()
            segment.damaged = True  # never append to it again

    def _sync(self) -> bool:
        if self._fd is None or not self._dirty:
            return True
        try:
            os.fsync(self._fd)
        except OSError as exc:
            self._failed(_describe(exc), count=False)
            return False
        self._dirty = False
        self._last_sync = time.monotonic()
        return True

    def _close_file(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _apply_retention(self) -> None:
        """Delete whole oldest segments (never the active one) while the total exceeds
        `retention_bytes` or the oldest's newest entry is older than `retention_ms`."""
        now_ms = int(self.clock() * 1000)
        while len(self._segments) > 1:
            oldest = self._segments[0]
            total = sum(segment.size for segment in self._segments)
            # No timestamp: an empty segment, which goes first.
            expired = oldest.newest_ms is None or oldest.newest_ms < now_ms - self.retention_ms
            if total <= self.retention_bytes and not expired:
                break
            try:
                oldest.path.unlink(missing_ok=True)
            except OSError as exc:
                self._report(f"quarantine journal cannot delete {oldest.path}: {_describe(exc)}")
                break
            self._segments.pop(0)

    # -- errors -------------------------------------------------------------------------------

    def _failed(self, message: str, *, count: bool = True) -> None:
        if count:
            self.failed_writes += 1
        first = self._degraded is None
        self._degraded = message
        if first:
            self._report(f"quarantine journal write failed: {message}")

    def _healthy(self) -> None:
        self._degraded = None

    def _report(self, message: str) -> None:
        if self.on_error is None:
            return
        with contextlib.suppress(Exception):
            self.on_error(message)


def _describe(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__
