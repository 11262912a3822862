"""Read a live topic's raw record batches for the audit job, over plain blocking sockets.

Spark runs the planning on the driver and the reading in executor tasks, neither of which has an
event loop, so this module reads through the blocking driver of kvproxy's client,
`kvproxy.client.blocking`. The driver calls `plan_live_ranges` once (Metadata for partitions and
leaders, ListOffsets for the window) and hands each task one picklable `LiveRange`; the task calls
`fetch_batches`, which yields every complete batch of its chunk exactly once, as the broker stored
it, so the same policies the proxy runs can check it.
"""

from __future__ import annotations

import datetime
import re
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from kvproxy.client import blocking
from kvproxy.client.blocking import (
    MAX_FRAME,
    Broker,
    FetchAnswer,
    LiveSourceError,
    bootstrap_servers,
    connect_any,
    list_offsets,
    partitions_of,
)
from kvproxy.protocol import admin, error_codes
from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.records import RecordBatch, iter_batches
from kvproxy.protocol.records.layout import LOG_OVERHEAD

__all__ = [
    "LiveRange",
    "LiveSourceError",
    "OffsetSpec",
    "Timestamp",
    "fetch_batches",
    "parse_offset_spec",
    "plan_live_ranges",
]

# Planning Fetches (watermarks, one batch) want an answer at once; Tansu answers max_wait 0 with
# no partitions at all, so 1 ms.
_PROBE_WAIT_MS: Final = 1
_MAX_STALLS: Final = 3
_LEADER_ATTEMPTS: Final = 3

# Partition errors after which the leader is looked up again: the partition moved.
# LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER, REPLICA_NOT_AVAILABLE, FENCED_LEADER_EPOCH,
# UNKNOWN_LEADER_EPOCH.
_LEADER_MOVED: Final = frozenset({5, 6, 9, 74, 75})

_INT32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class Timestamp:
    """An offset spec given as a time: the first offset whose record time is at or after `ms`."""

    ms: int

    def __post_init__(self) -> None:
        # Negative ListOffsets timestamps are special requests (-1 latest, -2 earliest, ...).
        if self.ms < 0:
            raise ValueError(f"timestamp {self.ms} ms is before 1970-01-01T00:00:00Z")


OffsetSpec = int | Timestamp | None
"""An offset, a time, or None: the log start for a start spec, the high watermark for an end."""

_OFFSET = re.compile(r"[+-]?\d+")
_HINT = (
    "expected an offset (1234), an ISO 8601 date or time (2026-11-01, 2026-11-01T10:00:00Z; "
    "no zone means UTC), 'earliest' or 'latest'"
)


def parse_offset_spec(text: str | None) -> OffsetSpec:
    """Read a command-line offset spec: digits are an offset, a date or time a Timestamp.

    'earliest', 'latest' and None all mean "the open end" (None): where the window starts or
    ends is decided by which side the spec is given for.
    """
    if text is None:
        return None
    value = text.strip()
    if value.lower() in ("earliest", "latest"):
        return None
    if _OFFSET.fullmatch(value):
        offset = int(value)
        if offset < 0:
            raise ValueError(f"offset spec {text!r}: an offset cannot be negative")
        return offset
    try:
        when = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"cannot read offset spec {text!r}: {_HINT}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    ms = (when - epoch) // datetime.timedelta(milliseconds=1)
    if ms < 0:
        raise ValueError(f"offset spec {text!r} is before 1970-01-01T00:00:00Z")
    return Timestamp(ms)


@dataclass(frozen=True, slots=True)
class LiveRange:
    """One Spark task's share of one partition: plain fields, so it pickles to the executors.

    [low, high) is the partition's whole scan window (records in it count); [start, end) is this
    task's chunk of it. A batch belongs to the chunk holding max(its base offset, low), so a
    batch straddling a chunk boundary is read by exactly one task.
    """

    bootstrap: tuple[str, ...]
    topic: str
    partition: int
    leader: str
    start: int
    end: int
    low: int
    high: int


def _leader_of(servers: Sequence[str], topic: str, partition: int, timeout_s: float) -> str:
    with connect_any(servers, timeout_s) as broker:
        for p in partitions_of(broker, topic):
            if p.index == partition:
                return p.leader
    raise LiveSourceError(f"partition {topic}-{partition} no longer exists")


class _PartitionReader:
    """Fetches one partition from its leader, looking the leader up again when it moves."""

    def __init__(self, live: LiveRange, timeout_s: float) -> None:
        self._live = live
        self._timeout_s = timeout_s
        self._leader = live.leader
        self._broker: Broker | None = None

    @property
    def leader(self) -> str:
        return self._leader

    def close(self) -> None:
        if self._broker is not None:
            self._broker.close()
            self._broker = None

    def fetch(self, offset: int, max_bytes: int) -> FetchAnswer:
        live = self._live
        problem = ""
        for attempt in range(_LEADER_ATTEMPTS):
            if attempt:
                time.sleep(0.2 * attempt)
                self.close()
                self._leader = _leader_of(
                    live.bootstrap, live.topic, live.partition, self._timeout_s
                )
            try:
                if self._broker is None:
                    self._broker = Broker(self._leader, self._timeout_s)
                answers = blocking.fetch(
                    self._broker, live.topic, {live.partition: offset}, max_bytes=max_bytes
                )
                answer = answers[live.partition]
            except LiveSourceError as exc:
                self.close()
                problem = str(exc)
                continue
            if isinstance(answer, FetchAnswer):
                return answer
            name = error_codes.error_name(answer)
            problem = f"Fetch of {live.topic}-{live.partition} at offset {offset} failed: {name}"
            if answer not in _LEADER_MOVED:
                raise LiveSourceError(problem)
        raise LiveSourceError(f"{problem} (after {_LEADER_ATTEMPTS} attempts)")


def fetch_batches(
    live: LiveRange, *, max_bytes: int = 4 * 1024 * 1024, timeout_s: float = 30.0
) -> Iterator[bytes]:
    """Every complete batch of `live`'s chunk, in offset order, exactly once, as the broker sent it.

    A batch is yielded when max(base offset, low) is in [start, end) and it holds an offset at or
    above low; its bytes include the 12-byte offset and length prefix. A batch cut off at the end
    of a Fetch answer is fetched again from its own offset. Reading stops at `end` or at the high
    watermark, whichever comes first.
    """
    if max_bytes <= 0:
        raise ValueError("max_bytes must be positive")
    position = live.start
    if position >= live.end:
        return
    reader = _PartitionReader(live, timeout_s)
    limit = max_bytes
    stalls = 0
    try:
        while position < live.end:
            answer = reader.fetch(position, limit)
            records = answer.records
            consumed = 0
            progressed = False
            try:
                for batch in iter_batches(records, allow_partial_tail=True):
                    consumed += batch.size
                    last = batch.last_offset
                    if last < position:
                        continue  # before the fetch offset: the batch holding it may start earlier
                    key = max(batch.base_offset, live.low)
                    if last >= live.low and live.start <= key < live.end:
                        yield bytes(batch.buffer)
                    position = last + 1
                    progressed = True
                    if position >= live.end:
                        return
            except ProtocolError as exc:
                raise LiveSourceError(
                    f"{live.topic}-{live.partition} near offset {position} holds a batch that "
                    f"does not parse: {exc}"
                ) from None
            if position >= answer.high_watermark:
                return  # exhausted: the partition ends before the chunk does
            if progressed:
                limit, stalls = max_bytes, 0
                continue
            if position < answer.log_start:
                raise LiveSourceError(
                    f"{live.topic}-{live.partition}: offset {position} is no longer in the log "
                    f"(it now starts at {answer.log_start})"
                )
            # No whole batch came back. A broker that does not return an oversized first batch
            # (KIP-74) tells us its size in the partial one's header: ask for that much.
            partial = len(records) - consumed
            if partial >= LOG_OVERHEAD:
                needed = _INT32.unpack_from(records, consumed + 8)[0] + LOG_OVERHEAD
                if limit < needed <= MAX_FRAME - 65536:
                    limit = needed
                    continue
            stalls += 1
            if stalls >= _MAX_STALLS:
                raise LiveSourceError(
                    f"no progress reading {live.topic}-{live.partition} at offset {position} "
                    f"from {reader.leader}: {stalls} Fetch answers without a whole batch "
                    f"(high watermark {answer.high_watermark}, max_bytes {limit})"
                )
    finally:
        reader.close()


# -- planning ---------------------------------------------------------------------------------


def _high_watermarks(broker: Broker, topic: str, partitions: Sequence[int]) -> dict[int, int]:
    """partition -> high watermark, as a Fetch answer states it.

    ListOffsets(latest) is only the starting point: Fetch's high watermark is where
    `fetch_batches` will stop, and Tansu's ListOffsets answers are not all reliable. Fetching at
    the listed offset with min_bytes 0 returns at once and carries (next to) no records.
    """
    listed = list_offsets(broker, topic, partitions, admin.LATEST)
    answers = blocking.fetch(
        broker,
        topic,
        {p: max(o, 0) for p, o in listed.items()},
        max_bytes=1,
        min_bytes=0,
        max_wait_ms=_PROBE_WAIT_MS,
    )
    marks = {}
    for p in partitions:
        answer = answers[p]
        stated = answer.high_watermark if isinstance(answer, FetchAnswer) else -1
        marks[p] = stated if stated >= 0 else listed[p]
    return marks


def _batch_at(broker: Broker, topic: str, partition: int, offset: int) -> RecordBatch | None:
    """The batch holding `offset` (or the first one after it); None past the end of the log.

    min_bytes 1: the callers ask below the high watermark, so the answer comes as soon as the
    broker has read the batch (Tansu may answer a shorter wait with no records yet).
    """
    for _ in range(_MAX_STALLS):
        answer = blocking.fetch(broker, topic, {partition: offset}, max_bytes=1)[partition]
        if not isinstance(answer, FetchAnswer):
            raise LiveSourceError(
                f"Fetch of {topic}-{partition} at offset {offset} from {broker.address} failed: "
                f"{error_codes.error_name(answer)}"
            )
        try:
            for batch in iter_batches(answer.records, allow_partial_tail=True):
                if batch.last_offset >= offset:
                    return batch
        except ProtocolError as exc:
            raise LiveSourceError(
                f"{topic}-{partition} near offset {offset} holds a batch that does not parse: {exc}"
            ) from None
        if offset >= answer.high_watermark:
            return None
    raise LiveSourceError(
        f"{broker.address} returned no whole batch of {topic}-{partition} at offset {offset}"
    )


def _record_times(batch: RecordBatch) -> list[tuple[int, int]]:
    """(offset, timestamp) of each record of a magic 2 batch."""
    return [(batch.base_offset + r.offset_delta, r.timestamp) for r in batch.records()]


def _holds_time_answer(batch: RecordBatch, offset: int, ms: int) -> bool:
    """Whether `offset` is what Kafka answers for `ms`: the batch's first record at or after it.

    A broker with a time index never fails this; Tansu answers 0 for every time.
    """
    if batch.magic < 2:
        return True  # no per-record offsets to check against; trust the broker
    for at, timestamp in _record_times(batch):
        if timestamp >= ms:
            return at == offset
    return False


def _search_time(
    broker: Broker, topic: str, partition: int, *, ms: int, low: int, high: int
) -> int:
    """The first offset in [low, high) whose record time is at or after `ms` (high if none).

    Binary search over the batches' max timestamps, as Kafka's time index does, for a broker
    whose ListOffsets answer for a time is wrong: about log2(high - low) small Fetches.
    """
    lo, hi = low, high
    while lo < hi:
        mid = (lo + hi) // 2
        batch = _batch_at(broker, topic, partition, mid)
        if batch is None or batch.max_timestamp >= ms:
            hi = mid
        else:
            lo = max(mid, batch.last_offset) + 1  # the whole batch is before the time
    if lo >= high:
        return high
    batch = _batch_at(broker, topic, partition, lo)
    if batch is None:
        return high
    if batch.magic < 2:
        return min(max(batch.base_offset, lo), high)
    for at, timestamp in _record_times(batch):
        if at >= lo and timestamp >= ms:
            return min(at, high)
    return min(batch.last_offset + 1, high)


def _offsets_for_time(
    broker: Broker,
    topic: str,
    partitions: Sequence[int],
    *,
    ms: int,
    low: Mapping[int, int],
    high: Mapping[int, int],
) -> dict[int, int]:
    """partition -> first offset whose record time is at or after `ms` (the high watermark if
    none): ListOffsets' answer, checked against the batch it points into."""
    listed = list_offsets(broker, topic, partitions, ms)
    found = {}
    for p in partitions:
        offset = listed[p]
        if offset < 0 or offset >= high[p]:
            found[p] = high[p]  # no record at or after the time
            continue
        batch = _batch_at(broker, topic, p, offset)
        if batch is not None and _holds_time_answer(batch, offset, ms):
            found[p] = offset
        else:
            found[p] = _search_time(broker, topic, p, ms=ms, low=low[p], high=high[p])
    return found


def _resolve(spec: OffsetSpec, default: int, by_time: Mapping[int, int] | None, p: int) -> int:
    if spec is None:
        return default
    if isinstance(spec, Timestamp):
        assert by_time is not None
        return by_time[p]
    return spec


def plan_live_ranges(
    bootstrap: Sequence[str],
    topic: str,
    start: OffsetSpec = None,
    end: OffsetSpec = None,
    *,
    offsets_per_range: int = 1_000_000,
    timeout_s: float = 30.0,
) -> list[LiveRange]:
    """Split the topic's [start, end) window into chunks of `offsets_per_range` offsets.

    The window is clamped to what each partition holds ([log start, high watermark)); a time
    resolves to the first offset at or after it (the high watermark when there is none). An
    empty window gives no range.
    """
    if offsets_per_range <= 0:
        raise ValueError("offsets_per_range must be positive")
    for side, spec in (("start", start), ("end", end)):
        if isinstance(spec, int) and spec < 0:
            raise ValueError(f"{side} offset {spec} is negative")
    servers = bootstrap_servers(bootstrap)
    with connect_any(servers, timeout_s) as broker:
        partitions = partitions_of(broker, topic)
    by_leader: dict[str, list[int]] = {}
    for p in partitions:
        by_leader.setdefault(p.leader, []).append(p.index)
    windows: dict[int, tuple[int, int]] = {}
    for leader, indexes in by_leader.items():
        with Broker(leader, timeout_s) as broker:
            earliest = list_offsets(broker, topic, indexes, admin.EARLIEST)
            latest = _high_watermarks(broker, topic, indexes)
            start_times = end_times = None
            if isinstance(start, Timestamp):
                start_times = _offsets_for_time(
                    broker, topic, indexes, ms=start.ms, low=earliest, high=latest
                )
            if isinstance(end, Timestamp):
                end_times = _offsets_for_time(
                    broker, topic, indexes, ms=end.ms, low=earliest, high=latest
                )
        for i in indexes:
            window_low = max(_resolve(start, earliest[i], start_times, i), earliest[i])
            window_high = min(_resolve(end, latest[i], end_times, i), latest[i])
            windows[i] = (window_low, window_high)
    ranges = []
    for p in partitions:
        low, high = windows[p.index]
        for chunk in range(low, high, offsets_per_range):
            ranges.append(
                LiveRange(
                    bootstrap=servers,
                    topic=topic,
                    partition=p.index,
                    leader=p.leader,
                    start=chunk,
                    end=min(chunk + offsets_per_range, high),
                    low=low,
                    high=high,
                )
            )
    return ranges
