"""The blocking driver of kvproxy's client, for the audit: sockets around `kvproxy.client.core`,
with the sans-IO requests of `kvproxy.protocol.admin`.

Spark runs the planning on the driver and the reading in executor tasks, neither of which has an
event loop, so the audit speaks the Kafka protocol with blocking sockets. Each API's version is
the highest the broker and the codec share, capped where Kafka started naming topics by id
(Fetch v13), since the audit routes by topic name. Only the bootstrap servers given and the
brokers Metadata advertises are ever contacted.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from kvproxy.client.core import (
    API_VERSIONS_VERSION,
    Conversation,
    CorrelationMismatch,
    api_versions_request,
    served_versions,
    shared_version,
)
from kvproxy.policies.topic_settings import ClusterSetting, from_cluster
from kvproxy.protocol import admin, error_codes
from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.framing import DEFAULT_MAX_FRAME_SIZE
from kvproxy.protocol.messages import (
    API_NAMES,
    API_VERSIONS,
    DESCRIBE_CONFIGS,
    FETCH,
    LIST_OFFSETS,
    METADATA,
)
from kvproxy.settings.addresses import join_host_port, parse_host_port

__all__ = [
    "CLIENT_ID",
    "MAX_FRAME",
    "Broker",
    "FetchAnswer",
    "LiveSourceError",
    "Partition",
    "bootstrap_servers",
    "connect_any",
    "describe_compaction",
    "fetch",
    "list_offsets",
    "partitions_of",
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

_FETCH_MAX_WAIT_MS: Final = 500
MAX_FRAME: Final = DEFAULT_MAX_FRAME_SIZE
_REPLICA_NOT_AVAILABLE: Final = 9  # a follower is down; the leader still serves
_INT32 = struct.Struct(">i")


class LiveSourceError(Exception):
    """The live topic cannot be read: the message says what to fix (address, topic, error)."""


def _split_address(address: str) -> tuple[str, int]:
    try:
        return parse_host_port(address.strip())
    except ValueError:
        raise LiveSourceError(f"broker address {address!r} is not host:port") from None


def bootstrap_servers(bootstrap: Sequence[str]) -> tuple[str, ...]:
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


class Broker:
    """One blocking connection to one broker, knowing which API versions the broker serves."""

    def __init__(self, address: str, timeout_s: float) -> None:
        self.address = address
        self._timeout_s = timeout_s
        self._conversation = Conversation(CLIENT_ID)
        try:
            self._sock = socket.create_connection(_split_address(address), timeout=timeout_s)
        except OSError as exc:
            raise LiveSourceError(f"cannot connect to {address}: {_reason(exc)}") from None
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            answer = self.call(API_VERSIONS, API_VERSIONS_VERSION, api_versions_request())
            if int(answer.error_code) != 0:
                raise LiveSourceError(
                    f"{address} refused ApiVersions: {error_codes.error_name(answer.error_code)}"
                )
        except BaseException:
            self.close()
            raise
        self._versions = served_versions(answer)

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def version(self, api_key: int, wanted: tuple[int, int]) -> int:
        """The highest version of `api_key` that the broker, the codec and this reader share."""
        version = shared_version(self._versions, api_key, wanted)
        if version is not None:
            return version
        name = API_NAMES[api_key]
        served = self._versions.get(api_key)
        if served is None:
            raise LiveSourceError(f"{self.address} does not serve {name}")
        raise LiveSourceError(
            f"{self.address} serves {name} v{served[0]}-v{served[1]}; "
            f"reading a live topic needs one of v{wanted[0]}-v{wanted[1]}"
        )

    def call(self, api_key: int, version: int, body: Any) -> Any:
        """Send one request and return the decoded answer's body."""
        name = f"{API_NAMES[api_key]} v{version}"
        request = self._conversation.request(api_key, version, body)
        try:
            self._sock.sendall(request)
            payload = self._read_frame()
        except OSError as exc:
            raise LiveSourceError(f"{self.address} did not answer {name}: {_reason(exc)}") from None
        try:
            return self._conversation.answer(payload)
        except CorrelationMismatch as exc:
            raise LiveSourceError(
                f"{self.address} answered {name} with correlation id {exc.got}, "
                f"expected {exc.expected}"
            ) from None
        except ProtocolError as exc:
            raise LiveSourceError(
                f"{self.address} sent a {name} answer that does not decode: {exc}"
            ) from None

    def _read_frame(self) -> bytes:
        (size,) = _INT32.unpack(self._read_exactly(_INT32.size))
        if not 0 <= size <= MAX_FRAME:
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


def connect_any(servers: Sequence[str], timeout_s: float) -> Broker:
    failures = []
    for server in servers:
        try:
            return Broker(server, timeout_s)
        except LiveSourceError as exc:
            failures.append(str(exc))
    raise LiveSourceError("cannot reach any bootstrap server: " + "; ".join(failures))


@dataclass(frozen=True, slots=True)
class Partition:
    index: int
    leader: str


def partitions_of(broker: Broker, topic: str) -> list[Partition]:
    """The topic's partitions and their leaders' addresses, without creating the topic."""
    version = broker.version(METADATA, _METADATA_VERSIONS)
    answer = broker.call(METADATA, version, admin.metadata_request(version, [topic]))
    brokers = {node: join_host_port(*address) for node, address in admin.brokers_of(answer).items()}
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
        partitions.append(Partition(index, brokers[leader_id]))
    return partitions


def list_offsets(
    broker: Broker, topic: str, partitions: Sequence[int], timestamp: int
) -> dict[int, int]:
    """partition -> offset for one ListOffsets timestamp (-2 earliest, -1 latest, or a time).

    -1 in the answer means no record is at or after the time.
    """
    version = broker.version(LIST_OFFSETS, _LIST_OFFSETS_VERSIONS)
    body = admin.list_offsets_request(
        version, topic, dict.fromkeys(partitions, timestamp), timeout_s=broker.timeout_s
    )
    answer = broker.call(LIST_OFFSETS, version, body)
    offsets: dict[int, int] = {}
    for index, (code, offset) in admin.listed_offsets(answer, topic).items():
        if code != 0:
            raise LiveSourceError(
                f"ListOffsets for {topic}-{index} at {broker.address} failed: "
                f"{error_codes.error_name(code)}"
            )
        offsets[index] = offset
    missing = sorted(set(partitions) - offsets.keys())
    if missing:
        raise LiveSourceError(
            f"ListOffsets from {broker.address} left out partitions {missing} of {topic!r}"
        )
    return offsets


# -- Fetch ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FetchAnswer:
    records: bytes
    high_watermark: int
    log_start: int


def fetch(
    broker: Broker,
    topic: str,
    offsets: Mapping[int, int],
    *,
    max_bytes: int,
    min_bytes: int = 1,
    max_wait_ms: int = _FETCH_MAX_WAIT_MS,
) -> dict[int, FetchAnswer | int]:
    """One Fetch of some partitions: partition -> its records and watermarks, or its error code.

    `max_bytes` is asked for per partition and in all. No fetch session: every request is a
    full, stateless fetch (session id 0, epoch -1).
    """
    version = broker.version(FETCH, _FETCH_VERSIONS)
    body = admin.fetch_request(
        version, topic, offsets, max_bytes=max_bytes, min_bytes=min_bytes, max_wait_ms=max_wait_ms
    )
    answer = broker.call(FETCH, version, body)
    top_error = int(getattr(answer, "error_code", 0))
    if top_error != 0:
        raise LiveSourceError(
            f"Fetch of {topic!r} from {broker.address} failed: {error_codes.error_name(top_error)}"
        )
    results: dict[int, FetchAnswer | int] = {}
    for index, p in admin.fetched_partitions(answer, topic).items():
        if index not in offsets:
            continue
        if p.error_code != 0:
            results[index] = p.error_code
        else:
            results[index] = FetchAnswer(p.records, p.high_watermark, p.log_start)
    missing = sorted(offsets.keys() - results.keys())
    if missing:
        raise LiveSourceError(
            f"{broker.address} answered a Fetch of {topic!r} without partitions {missing}"
        )
    return results


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
    with connect_any(bootstrap_servers(bootstrap), timeout_s) as broker:
        try:
            version = broker.version(DESCRIBE_CONFIGS, _DESCRIBE_CONFIGS_VERSIONS)
        except LiveSourceError:
            return result  # the cluster cannot be asked
        answer = broker.call(
            DESCRIBE_CONFIGS, version, admin.describe_configs_request(version, wanted)
        )
    for topic, configs in admin.described_configs(answer, wanted).items():
        if configs is not None:  # no cleanup.policy: Kafka's default, delete
            settings = (ClusterSetting(c.name, c.value, c.source) for c in configs)
            result[topic] = from_cluster(settings).config.compacted
    return result
