"""`SegmentFiles`: the journal directory's segment files, as the writer thread keeps them.

It holds the directory's lock, recovers the segments at open (cutting a torn tail), appends to
the active segment (rolling to a new one at `segment_bytes`), fsyncs, and deletes whole oldest
segments past the retention bounds. `Journal` feeds it from its queue and owns the counters.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvproxy.journal.reader import list_segments, segment_name
from kvproxy.protocol.errors import DecodeError
from kvproxy.protocol.journal import iter_entries

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


def describe(exc: OSError) -> str:
    """An OSError as the journal reports it ("No space left on device", ...)."""
    return exc.strerror or str(exc) or type(exc).__name__


@dataclass
class _Segment:
    sequence: int
    path: Path
    size: int
    newest_ms: int | None
    damaged: bool = False


class SegmentFiles:
    """The segments of one journal directory, for one thread at a time (the writer thread).

    A failed fsync goes to `on_sync_error` and a segment that cannot be deleted to `report`;
    `append` raises what the write raised, after cutting what it left.
    """

    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int,
        retention_bytes: int,
        retention_ms: int,
        clock: Callable[[], float],
        on_sync_error: Callable[[str], None],
        report: Callable[[str], None],
    ) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.retention_bytes = retention_bytes
        self.retention_ms = retention_ms
        self.clock = clock
        self.on_sync_error = on_sync_error
        self.report = report
        self.dirty = False
        """Bytes were written since the last fsync."""
        self.last_sync = time.monotonic()
        self._segments: list[_Segment] = []
        self._fd: int | None = None
        self._lock_fd: int | None = None

    # -- open and close -----------------------------------------------------------------------

    def open(self) -> RecoveryReport:
        """Create the directory, take its lock and recover the segments (see `Journal.open`)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock()
        try:
            report = self._recover()
        except BaseException:
            self.unlock()
            raise
        self.last_sync = time.monotonic()
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

    def unlock(self) -> None:
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

    def close_file(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    # -- writing ------------------------------------------------------------------------------

    def append(self, data: bytes, time_ms: int) -> None:
        """Append one encoded entry written at `time_ms`; on an error, cut what it left (so
        later entries stay readable) and raise it."""
        segment: _Segment | None = None
        before = 0
        try:
            segment = self._active_for(len(data))
            before = segment.size
            assert self._fd is not None
            _write_all(self._fd, data)
        except Exception:
            self._undo_partial(segment, before)
            raise
        segment.size += len(data)
        if segment.newest_ms is None or time_ms > segment.newest_ms:
            segment.newest_ms = time_ms
        self.dirty = True

    def _active_for(self, size: int) -> _Segment:
        """The segment to append `size` bytes to: a new one when they would take the active
        segment past `segment_bytes` (a single larger entry gets a segment of its own)."""
        active = self._segments[-1] if self._segments else None
        if active is None or active.damaged:
            return self._open_new()
        if active.size > 0 and active.size + size > self.segment_bytes:
            self.sync()
            self.close_file()
            return self._open_new()
        if self._fd is None:
            self._fd = os.open(active.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            if os.fstat(self._fd).st_size != active.size:
                # Changed behind our back: never append after bytes we did not check.
                active.damaged = True
                self.close_file()
                return self._open_new()
        return active

    def _open_new(self) -> _Segment:
        self.close_file()
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

    def _undo_partial(self, segment: _Segment | None, size: int) -> None:
        """After a failed write, cut what it left so later entries stay readable; if that fails
        too, leave the segment (readers stop at its torn entry) and start a new one next time."""
        if self._fd is None or segment is None:
            return
        try:
            if os.fstat(self._fd).st_size != size:
                os.ftruncate(self._fd, size)
        except OSError:
            self.close_file()
            segment.damaged = True  # never append to it again

    def sync(self) -> bool:
        """fsync what was written since the last one; False (told to `on_sync_error`) when it
        fails."""
        if self._fd is None or not self.dirty:
            return True
        try:
            os.fsync(self._fd)
        except OSError as exc:
            self.on_sync_error(describe(exc))
            return False
        self.dirty = False
        self.last_sync = time.monotonic()
        return True

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
                self.report(f"quarantine journal cannot delete {oldest.path}: {describe(exc)}")
                break
            self._segments.pop(0)
