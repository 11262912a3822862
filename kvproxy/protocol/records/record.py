"""What a batch holds as a policy sees it: `Record`, its headers, and `RecordScan`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

Header = tuple[str, bytes | None]
RecordInput = tuple[bytes | None, bytes | None, Sequence[Header] | None, int | None]
"""What `build_batch` takes per record: (key, value, headers, timestamp in ms or None for now)."""


class Record(NamedTuple):
    """One record as a policy sees it.

    A NamedTuple rather than a frozen dataclass: it is built once per record on the hot path, and
    a frozen dataclass's `__init__` (one `object.__setattr__` per field) costs about five times
    as much as `tuple.__new__` and would cap iteration well below a million records/s. It is just
    as immutable.
    """

    index: int  # type: ignore[assignment]  # shadows tuple.index on purpose: Kafka's name
    """0-based position in its batch (Kafka's `batch_index` in record_errors)."""
    offset_delta: int
    """Magic 2: the offset delta; magic 0/1 inner message: its stored offset; plain magic 0/1: 0."""
    timestamp: int
    """Milliseconds; LogAppendTime batches give the batch's time; -1 when absent (magic 0)."""
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    magic: int
    attributes: int
    """Magic 0/1: the message's own attributes (compression bits included). Magic 2: 0 — Kafka
    defines no record-level attribute bits and the C reader does not surface the byte."""

    @property
    def has_key(self) -> bool:
        return self.key is not None

    @property
    def has_value(self) -> bool:
        return self.value is not None


class RecordScan(NamedTuple):
    """What one pass over a batch's records tells without building a `Record` per record.

    The checks that pass on almost every batch (timestamps in range, keys present on a compacted
    topic) read this first and decode `Record`s only to word a rejection.
    """

    record_count: int
    min_timestamp: int
    """Smallest record timestamp (-1 counts like any other value); 0 when there are no records."""
    max_timestamp: int
    null_keys: int
    """Records without a key."""
