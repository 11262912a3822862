"""The quarantine journal on disk: append-only segments written by a thread, and a reader.

`Journal` is what the proxy holds: `append()` only puts the entry on a bounded queue (it never
blocks the event loop and never raises); a writer thread encodes entries with
`kvproxy.protocol.journal`, appends them to the active segment, rolls and expires segments, and
fsyncs every `flush_interval_ms` and on close. Write errors (disk full, permissions) are recorded in
`degraded` and the counters, reported once per failure streak through `on_error`, and never reach
the caller.

`JournalReader` reads a journal directory without a writer thread
and without repairing anything, so `kvproxy quarantine list|show` can run while a proxy writes.
The format and the guarantees are in docs/quarantine.md.
"""

from kvproxy.journal.entry import QuarantineEntry
from kvproxy.journal.reader import (
    SEGMENT_SUFFIX,
    WORKER_DIR_PREFIX,
    JournalReader,
    segment_name,
)
from kvproxy.journal.segments import RecoveryReport
from kvproxy.journal.writer import Journal

__all__ = [
    "SEGMENT_SUFFIX",
    "WORKER_DIR_PREFIX",
    "Journal",
    "JournalReader",
    "QuarantineEntry",
    "RecoveryReport",
    "segment_name",
]
