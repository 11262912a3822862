"""Read a live topic's raw record batches for the audit job, over plain blocking sockets.

Spark runs the planning on the driver and the reading in executor tasks, neither of which has an
event loop, so this module speaks the Kafka protocol with blocking sockets on top of the sans-IO
codec in `protocol`. The driver calls `plan_live_ranges` once (Metadata for partitions and
leaders, ListOffsets for the window) and hands each task one picklable `LiveRange`; the task calls
`fetch_batches`, which yields every complete batch of its chunk exactly once, as the broker stored
it, so the same policies the proxy runs can check it.

Only the bootstrap servers given and the brokers Metadata advertises are ever contacted. Each
API's version is the highest the broker and the codec share, capped where Kafka started naming
topics by id (Fetch v13), since the audit routes by topic name.
"""

from __future__ import annotations

import datetime
import re
import socket
import struct
import time
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cache
from typing import Any, Final

from protocol import error_codes
from protocol.errors import ProtocolError
from protocol.framing import DEFAULT_MAX_FRAME_SIZE, frame
from protocol.messages import (
    API_NAMES,
    API_VERSIONS,
    DESCRIBE_CONFIGS,
    FETCH,
    LIST_OFFSETS,
    METADATA,
    codec_for,
    decode_response,
    encode_request,
    make_request,
    supported_versions,
)
from protocol.records import RecordBatch, iter_batches
from protocol.records.layout import LOG_OVERHEAD

__all__ = [
    "LiveRange",
    "LiveSourceError",
    "OffsetSpec",
    "Timestamp",
    "describe_compaction",
    "fetch_batches",
    "parse_offset_spec",
    "plan_live_ranges",
]

CLIENT_ID: Final = "kvproxy-audit"

# (lowest version we can use, highest we will use) per API. Fetch v13 and Metadata v13 name
# topics by id (or add nothing we read); Metadata v4 is the first that can say "do not create".
# ListOffsets v1 is the first with one offset per partition (kio has no v0); Fetch v4 the first
# kio generates (and the first with read_uncommitted / high watermark semantics we rely on).
_FETCH_VERSIONS: Final = (4, 12)
_METADATA_VERSIONS: Final = (4, 12)
_LIST_OFFSETS_VERSIONS: Final = (1, 11)
# DescribeConfigs v0 is gone from Kafka 4, and Tansu's v0 config entries lack is_default (one
# byte short: they do not decode), so v1 is the floor.
_DESCRIBE_CONFIGS_VERSIONS: Final = (1, 4)

_EARLIEST: Final = -2
_LATEST: Final = -1
_READ_UNCOMMITTED: Final = 0
_TOPIC_RESOURCE: Final = 2
_CLEANUP_POLICY: Final = "cleanup.policy"
_FETCH_MAX_WAIT_MS: Final = 500
# Planning Fetches (watermarks, one batch) want an answer at once; Tansu answers max_wait 0 with
# no partitions at all, so 1 ms.
_PROBE_WAIT_MS: Final = 1
_MAX_STALLS: Final = 3
_LEADER_ATTEMPTS: Final = 3
_MAX_FRAME: Final = DEFAULT_MAX_FRAME_SIZE

# Partition errors after which the leader is looked up again: the partition moved.
# LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER, REPLICA_NOT_AVAILABLE, FENCED_LEADER_EPOCH,
# UNKNOWN_LEADER_EPOCH.
_LEADER_MOVED: Final = frozenset({5, 6, 9, 74, 75})

_REPLICA_NOT_AVAILABLE: Final = 9  # a follower is down; the leader still serves
_INT32 = struct.Struct(">i")


class LiveSourceError(Exception):
    """The live topic cannot be read: the message says what to fix (address, topic, error)."""


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


# -- a small blocking client -------------------------------------------------------------------


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LiveSourceError(f"broker address {address!r} is not host:port")
    return host, int(port)


def _join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _servers(bootstrap: Sequence[str]) -> tuple[str, ...]:
    """The bootstrap list, also accepting one comma-separated string (as Kafka clients do)."""
    items = [bootstrap] if isinstance(bootstrap, str) else list(bootstrap)
    servers = tuple(part.strip() for item in items for part in item.split(",") if part.strip())
    if not servers:
        raise LiveSourceError("no bootstrap servers given")
    for server in servers:
        _split_address(server)
    return servers


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


class _Broker:
    """One blocking connection to one broker, knowing which API versions the broker serves."""

    def __init__(self, address: str, timeout_s: float) -> None:
        self.address = address
        self._timeout_s = timeout_s
        self._correlation_id = 0
        try:
            self._sock = socket.create_connection(_split_address(address), timeout=timeout_s)
        except OSError as exc:
            raise LiveSourceError(f"cannot connect to {address}: {_reason(exc)}") from None
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # v0: every broker answers it, and it is all we need (key, min, max).
            answer = self.call(API_VERSIONS, 0, codec_for(API_VERSIONS, 0).request_type())
            if int(answer.error_code) != 0:
                raise LiveSourceError(
                    f"{address} refused ApiVersions: {error_codes.error_name(answer.error_code)}"
                )
        except BaseException:
            self.close()
            raise
        self._versions = {
            int(api.api_key): (int(api.min_version), int(api.max_version))
            for api in answer.api_keys
        }

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    def __enter__(self) -> _Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def version(self, api_key: int, wanted: tuple[int, int]) -> int:
        """The highest version of `api_key` that the broker, the codec and this reader share."""
        name = API_NAMES[api_key]
        served = self._versions.get(api_key)
        if served is None:
            raise LiveSourceError(f"{self.address} does not serve {name}")
        usable = [
            v
            for v in supported_versions(api_key)
            if wanted[0] <= v <= wanted[1] and served[0] <= v <= served[1]
        ]
        if not usable:
            raise LiveSourceError(
                f"{self.address} serves {name} v{served[0]}-v{served[1]}; "
                f"reading a live topic needs one of v{wanted[0]}-v{wanted[1]}"
            )
        return max(usable)

    def call(self, api_key: int, version: int, body: Any) -> Any:
        """Send one request and return the decoded answer's body."""
        name = f"{API_NAMES[api_key]} v{version}"
        self._correlation_id += 1
        request = make_request(api_key, version, self._correlation_id, CLIENT_ID, body)
        try:
            self._sock.sendall(frame(encode_request(request)))
            payload = self._read_frame()
        except OSError as exc:
            raise LiveSourceError(f"{self.address} did not answer {name}: {_reason(exc)}") from None
        try:
            response = decode_response(payload, api_key, version)
        except ProtocolError as exc:
            raise LiveSourceError(
                f"{self.address} sent a {name} answer that does not decode: {exc}"
            ) from None
        if response.header.correlation_id != self._correlation_id:
            raise LiveSourceError(
                f"{self.address} answered {name} with correlation id "
                f"{response.header.correlation_id}, expected {self._correlation_id}"
            )
        return response.body

    def _read_frame(self) -> bytes:
        (size,) = _INT32.unpack(self._read_exactly(_INT32.size))
        if not 0 <= size <= _MAX_FRAME:
            raise LiveSourceError(f"{self.address} sent a frame of {size} bytes")
        return bytes(self._read_exactly(size))  # kio's readers take read-only buffers only

    def _read_exactly(self, size: int) -> bytearray:
        buffer = bytearray(size)
        view = memoryview(buffer)
        got = 0
        while got < size:
            n = self._sock.recv_into(view[got:])
            if n == 0:
                raise ConnectionError("connection closed by the broker")
            got += n
        return buffer


def _connect_any(servers: Sequence[str], timeout_s: float) -> _Broker:
    failures = []
    for server in servers:
        try:
            return _Broker(server, timeout_s)
        except LiveSourceError as exc:
            failures.append(str(exc))
    raise LiveSourceError("cannot reach any bootstrap server: " + "; ".join(failures))


# -- building requests for whichever version was negotiated -------------------------------------


def _build(cls: type, **values: Any) -> Any:
    """An instance of a kio schema class from the values its version has (others are dropped)."""
    names = {f.name for f in fields(cls)}
    return cls(**{name: value for name, value in values.items() if name in names})


@cache
def _element_type(cls: type, field_name: str) -> type:
    """The entity type of an array field (`tuple[X, ...]`, maybe `| None`)."""
    hint = typing.get_type_hints(cls)[field_name]
    for option in (hint, *typing.get_args(hint)):
        if typing.get_origin(option) is tuple:
            element: type = typing.get_args(option)[0]
            return element
    raise TypeError(f"{cls.__name__}.{field_name} is not an array")


@dataclass(frozen=True, slots=True)
class _Partition:
    index: int
    leader: str


def _metadata(broker: _Broker, topic: str) -> list[_Partition]:
    """The topic's partitions and their leaders' addresses, without creating the topic."""
    version = broker.version(METADATA, _METADATA_VERSIONS)
    request_type = codec_for(METADATA, version).request_type
    body = _build(
        request_type,
        topics=(_build(_element_type(request_type, "topics"), name=topic, topic_id=None),),
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    answer = broker.call(METADATA, version, body)
    brokers = {int(b.node_id): _join_address(b.host, int(b.port)) for b in answer.brokers}
    entry = next((t for t in answer.topics if t.name == topic), None)
    if entry is None or int(entry.error_code) == error_codes.UNKNOWN_TOPIC_OR_PARTITION:
        raise LiveSourceError(f"unknown topic {topic!r}: the cluster at {broker.address} has none")
    if int(entry.error_code) != 0:
        raise LiveSourceError(
            f"Metadata for topic {topic!r} failed: {error_codes.error_name(entry.error_code)}"
        )
    partitions = []
    for p in sorted(entry.partitions, key=lambda p: int(p.partition_index)):
        index, leader_id = int(p.partition_index), int(p.leader_id)
        if int(p.error_code) not in (0, _REPLICA_NOT_AVAILABLE):
            raise LiveSourceError(
                f"partition {topic}-{index} is not readable: {error_codes.error_name(p.error_code)}"
            )
        if leader_id not in brokers:
            raise LiveSourceError(
                f"partition {topic}-{index} has no leader the cluster advertises "
                f"(leader id {leader_id})"
            )
        partitions.append(_Partition(index, brokers[leader_id]))
    return partitions


def _list_offsets(
    broker: _Broker, topic: str, partitions: Sequence[int], timestamp: int
) -> dict[int, int]:
    """partition -> offset for one ListOffsets timestamp (-2 earliest, -1 latest, or a time).

    -1 in the answer means no record is at or after the time.
    """
    version = broker.version(LIST_OFFSETS, _LIST_OFFSETS_VERSIONS)
    request_type = codec_for(LIST_OFFSETS, version).request_type
    topic_type = _element_type(request_type, "topics")
    partition_type = _element_type(topic_type, "partitions")
    body = _build(
        request_type,
        replica_id=-1,
        isolation_level=_READ_UNCOMMITTED,
        timeout=datetime.timedelta(seconds=broker.timeout_s),
        topics=(
            _build(
                topic_type,
                name=topic,
                partitions=tuple(
                    _build(partition_type, partition_index=p, timestamp=timestamp)
                    for p in partitions
                ),
            ),
        ),
    )
    answer = broker.call(LIST_OFFSETS, version, body)
    offsets: dict[int, int] = {}
    for entry in answer.topics:
        if entry.name != topic:
            continue
        for p in entry.partitions:
            index, code = int(p.partition_index), int(p.error_code)
            if code != 0:
                raise LiveSourceError(
                    f"ListOffsets for {topic}-{index} at {broker.address} failed: "
                    f"{error_codes.error_name(code)}"
                )
            offsets[index] = int(p.offset)
    missing = sorted(set(partitions) - offsets.keys())
    if missing:
        raise LiveSourceError(
            f"ListOffsets from {broker.address} left out partitions {missing} of {topic!r}"
        )
    return offsets


# -- Fetch ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _FetchAnswer:
    records: bytes
    high_watermark: int
    log_start: int


def _fetch(
    broker: _Broker,
    topic: str,
    offsets: Mapping[int, int],
    *,
    max_bytes: int,
    min_bytes: int = 1,
    max_wait_ms: int = _FETCH_MAX_WAIT_MS,
) -> dict[int, _FetchAnswer | int]:
    """One Fetch of some partitions: partition -> its records and watermarks, or its error code.

    `max_bytes` is asked for per partition and in all. No fetch session: every request is a
    full, stateless fetch (session id 0, epoch -1).
    """
    version = broker.version(FETCH, _FETCH_VERSIONS)
    request_type = codec_for(FETCH, version).request_type
    topic_type = _element_type(request_type, "topics")
    partition_type = _element_type(topic_type, "partitions")
    body = _build(
        request_type,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=_READ_UNCOMMITTED,
        session_id=0,
        session_epoch=-1,
        forgotten_topics_data=(),
        rack_id="",
        topics=(
            _build(
                topic_type,
                topic=topic,
                partitions=tuple(
                    _build(
                        partition_type,
                        partition=partition,
                        fetch_offset=offset,
                        log_start_offset=-1,
                        partition_max_bytes=max_bytes,
                    )
                    for partition, offset in offsets.items()
                ),
            ),
        ),
    )
    answer = broker.call(FETCH, version, body)
    top_error = int(getattr(answer, "error_code", 0))
    if top_error != 0:
        raise LiveSourceError(
            f"Fetch of {topic!r} from {broker.address} failed: {error_codes.error_name(top_error)}"
        )
    results: dict[int, _FetchAnswer | int] = {}
    for entry in answer.responses:
        if entry.topic != topic:
            continue
        for p in entry.partitions:
            index = int(p.partition_index)
            if index not in offsets:
                continue
            if int(p.error_code) != 0:
                results[index] = int(p.error_code)
            else:
                results[index] = _FetchAnswer(
                    p.records if p.records is not None else b"",
                    int(p.high_watermark),
                    int(getattr(p, "log_start_offset", -1)),
                )
    missing = sorted(offsets.keys() - results.keys())
    if missing:
        raise LiveSourceError(
            f"{broker.address} answered a Fetch of {topic!r} without partitions {missing}"
        )
    return results


def _leader_of(servers: Sequence[str], topic: str, partition: int, timeout_s: float) -> str:
    with _connect_any(servers, timeout_s) as broker:
        for p in _metadata(broker, topic):
            if p.index == partition:
                return p.leader
    raise LiveSourceError(f"partition {topic}-{partition} no longer exists")


class _PartitionReader:
    """Fetches one partition from its leader, looking the leader up again when it moves."""

    def __init__(self, live: LiveRange, timeout_s: float) -> None:
        self._live = live
        self._timeout_s = timeout_s
        self._leader = live.leader
        self._broker: _Broker | None = None

    @property
    def leader(self) -> str:
        return self._leader

    def close(self) -> None:
        if self._broker is not None:
            self._broker.close()
            self._broker = None

    def fetch(self, offset: int, max_bytes: int) -> _FetchAnswer:
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
                    self._broker = _Broker(self._leader, self._timeout_s)
                answers = _fetch(
                    self._broker, live.topic, {live.partition: offset}, max_bytes=max_bytes
                )
                answer = answers[live.partition]
            except LiveSourceError as exc:
                self.close()
                problem = str(exc)
                continue
            if isinstance(answer, _FetchAnswer):
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
                if limit < needed <= _MAX_FRAME - 65536:
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


def _high_watermarks(broker: _Broker, topic: str, partitions: Sequence[int]) -> dict[int, int]:
    """partition -> high watermark, as a Fetch answer states it.

    ListOffsets(latest) is only the starting point: Fetch's high watermark is where
    `fetch_batches` will stop, and Tansu's ListOffsets answers are not all reliable. Fetching at
    the listed offset with min_bytes 0 returns at once and carries (next to) no records.
    """
    listed = _list_offsets(broker, topic, partitions, _LATEST)
    answers = _fetch(
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
        stated = answer.high_watermark if isinstance(answer, _FetchAnswer) else -1
        marks[p] = stated if stated >= 0 else listed[p]
    return marks


def _batch_at(broker: _Broker, topic: str, partition: int, offset: int) -> RecordBatch | None:
    """The batch holding `offset` (or the first one after it); None past the end of the log.

    min_bytes 1: the callers ask below the high watermark, so the answer comes as soon as the
    broker has read the batch (Tansu may answer a shorter wait with no records yet).
    """
    for _ in range(_MAX_STALLS):
        answer = _fetch(broker, topic, {partition: offset}, max_bytes=1)[partition]
        if not isinstance(answer, _FetchAnswer):
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
    broker: _Broker, topic: str, partition: int, *, ms: int, low: int, high: int
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
    broker: _Broker,
    topic: str,
    partitions: Sequence[int],
    *,
    ms: int,
    low: Mapping[int, int],
    high: Mapping[int, int],
) -> dict[int, int]:
    """partition -> first offset whose record time is at or after `ms` (the high watermark if
    none): ListOffsets' answer, checked against the batch it points into."""
    listed = _list_offsets(broker, topic, partitions, ms)
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
    servers = _servers(bootstrap)
    with _connect_any(servers, timeout_s) as broker:
        partitions = _metadata(broker, topic)
    by_leader: dict[str, list[int]] = {}
    for p in partitions:
        by_leader.setdefault(p.leader, []).append(p.index)
    windows: dict[int, tuple[int, int]] = {}
    for leader, indexes in by_leader.items():
        with _Broker(leader, timeout_s) as broker:
            earliest = _list_offsets(broker, topic, indexes, _EARLIEST)
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


# -- topic configuration ----------------------------------------------------------------------


def describe_compaction(
    bootstrap: Sequence[str], topics: Sequence[str], *, timeout_s: float = 30.0
) -> dict[str, bool | None]:
    """topic -> whether its cleanup.policy includes compact (None: the cluster cannot say).

    The audit needs it for the key-on-compacted-topic check. All keys are asked for: Tansu drops
    the connection when DescribeConfigs names them. A cluster that cannot be reached at all is a
    LiveSourceError, not a None: the audit would otherwise run with the wrong rules.
    """
    wanted = list(dict.fromkeys([topics] if isinstance(topics, str) else topics))
    result: dict[str, bool | None] = dict.fromkeys(wanted)
    if not wanted:
        return result
    with _connect_any(_servers(bootstrap), timeout_s) as broker:
        try:
            version = broker.version(DESCRIBE_CONFIGS, _DESCRIBE_CONFIGS_VERSIONS)
        except LiveSourceError:
            return result  # the cluster cannot be asked
        request_type = codec_for(DESCRIBE_CONFIGS, version).request_type
        resource_type = _element_type(request_type, "resources")
        body = _build(
            request_type,
            resources=tuple(
                _build(
                    resource_type,
                    resource_type=_TOPIC_RESOURCE,
                    resource_name=topic,
                    configuration_keys=None,
                )
                for topic in wanted
            ),
            include_synonyms=False,
            include_documentation=False,
        )
        answer = broker.call(DESCRIBE_CONFIGS, version, body)
    for entry in answer.results:
        if int(entry.error_code) != 0 or entry.resource_name not in result:
            continue
        policy = next((c.value for c in entry.configs if c.name == _CLEANUP_POLICY), None)
        # No entry: Kafka's default, delete.
        result[entry.resource_name] = "compact" in {
            part.strip() for part in (policy or "").split(",")
        }
    return result
