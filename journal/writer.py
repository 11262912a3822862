"""`Journal`: the proxy's writer of the quarantine journal, a thread appending to segments."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvproxy.journal.drops import Drops
from kvproxy.journal.entry import QuarantineEntry
from kvproxy.journal.reader import list_segments, segment_name
from kvproxy.protocol.errors import DecodeError, EncodeError
from kvproxy.protocol.journal import encode_entry, iter_entries

MiB = 1024 * 1024
GiB = 1024 * MiB
DAY_MS = 24 * 60 * 60 * 1000
LOCK_FILE = ".lock"
"""Held (flock, exclusive) by the one Journal writing a directory; readers do not take it."""


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

ENTRY_OVERHEAD_BYTES = 1024
"""What a queued entry costs beyond its records bytes (the object, its metadata), for the byte
bound."""


def queued_size(entry: QuarantineEntry) -> int:
    """The bytes `entry` holds while it waits for the writer thread."""
    return len(entry.records) + ENTRY_OVERHEAD_BYTES


@dataclass
class _Queued:
    entry: QuarantineEntry
    extra: dict[str, object] | None
    size: int


class Journal:
    """The proxy's quarantine journal: `open()`, `append()` from any thread, `close()`.

    Counters (read them from any thread): `written` entries written to a segment,
    `failed_writes` entries lost to a write error, `dropped` entries not kept because the queue
    was full (`queue_bytes`, records plus `ENTRY_OVERHEAD_BYTES` each, or `queue_entries`) or the
    journal not open: `drops` has them by reason and says so once per `report_interval_s`.
    `degraded` is the last write error while writes fail, else None.
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
        queue_bytes: int = 64 * MiB,
        report_interval_s: float = 10.0,
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
        self.drops = Drops(report_interval_s, clock, self._report)
        self.queue_bytes = queue_bytes
        self._queued_bytes = 0
        self._bytes_lock = threading.Lock()
        self._degraded: str | None = None
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_entries)
        self._thread: threading.Thread | None = None
        self._closed = False
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
        found = list_segments(self.directory)
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

    def append(self, entry: QuarantineEntry, extra: dict[str, object] | None = None) -> bool:
        """Queue `entry` for the writer thread (`extra`: metadata keys stored with it). Never
        blocks, never raises; False when it was dropped (counted, reported once per interval).
        """
        size = queued_size(entry)
        if self._thread is None or self._closed:
            self._drop("not_open", size)
            return False
        with self._bytes_lock:
            full = self._queued_bytes + size > self.queue_bytes
            self._queued_bytes += 0 if full else size
        if full:
            self._drop("queue_full", size)
            return False
        try:
            self._queue.put_nowait(_Queued(entry, extra, size))
        except queue.Full:
            self._dequeued(size)
            self._drop("queue_full", size)
            return False
        return True

    @property
    def queued_bytes(self) -> int:
        """Bytes of the entries waiting for the writer thread (at most `queue_bytes`)."""
        return self._queued_bytes

    def _dequeued(self, size: int) -> None:
        with self._bytes_lock:
            self._queued_bytes -= size

    def _drop(self, reason: str, size: int) -> None:
        full = (
            f"({self._queue.maxsize} entries or {self.queue_bytes} bytes, quarantine.queue_bytes)"
        )
        why = "it is not open" if reason == "not_open" else f"its queue is full {full}"
        self.drops.count(reason, size, why)

    @property
    def dropped(self) -> int:
        return self.drops.entries

    @property
    def dropped_by_reason(self) -> dict[str, list[int]]:
        return self.drops.by_reason

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
            assert isinstance(item, _Queued)
            try:
                self._write(item.entry, item.extra)
            finally:
                self._dequeued(item.size)
            if self._dirty and time.monotonic() - self._last_sync >= interval:
                self._sync()

    def _write(self, entry: QuarantineEntry, extra: dict[str, object] | None = None) -> None:
        metadata = entry.to_metadata()
        if extra:
            metadata.update(extra)
        try:
            data = encode_entry(metadata, entry.records)
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
