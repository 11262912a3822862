"""`Journal`: the proxy's writer of the quarantine journal, a thread appending to segments."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvproxy.journal.drops import Drops
from kvproxy.journal.entry import QuarantineEntry
from kvproxy.journal.segments import RecoveryReport, SegmentFiles, describe
from kvproxy.protocol.errors import EncodeError
from kvproxy.protocol.journal import encode_entry

MiB = 1024 * 1024
GiB = 1024 * MiB
DAY_MS = 24 * 60 * 60 * 1000


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
        self._files = SegmentFiles(
            self.directory,
            segment_bytes=segment_bytes,
            retention_bytes=retention_bytes,
            retention_ms=retention_ms,
            clock=clock,
            on_sync_error=lambda message: self._failed(message, count=False),
            report=self._report,
        )

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
        report = self._files.open()
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=f"kvproxy-journal:{self.directory}", daemon=True
        )
        self._thread.start()
        return report

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
        self._files.unlock()

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
        files = self._files
        while True:
            wait = max(interval - (time.monotonic() - files.last_sync), 0.0)
            try:
                item = self._queue.get(timeout=wait if files.dirty else None)
            except queue.Empty:
                files.sync()
                continue
            if item is _STOP:
                files.sync()
                files.close_file()
                return
            if isinstance(item, _FlushRequest):
                item.ok = files.sync() and self._degraded is None
                item.done.set()
                continue
            assert isinstance(item, _Queued)
            try:
                self._write(item.entry, item.extra)
            finally:
                self._dequeued(item.size)
            if files.dirty and time.monotonic() - files.last_sync >= interval:
                files.sync()

    def _write(self, entry: QuarantineEntry, extra: dict[str, object] | None = None) -> None:
        metadata = entry.to_metadata()
        if extra:
            metadata.update(extra)
        try:
            data = encode_entry(metadata, entry.records)
        except EncodeError as exc:
            self._failed(f"entry {entry.id} cannot be encoded: {exc}")
            return
        try:
            self._files.append(data, entry.time_ms)
        except OSError as exc:
            self._failed(describe(exc))
            return
        except Exception as exc:  # never let the writer thread die
            self._failed(f"{type(exc).__name__}: {exc}")
            return
        self.written += 1
        self._healthy()

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
