"""A stub multi-broker Kafka "cluster" on loopback, for tests of the proxy's address handling.

It exists only because Tansu cannot return several brokers in one Metadata answer: Tansu is a
single node (node id 111), so a test that needs a Metadata, FindCoordinator or DescribeCluster
answer naming several brokers, or that must check which broker a request reached, uses this stub.
It is not a broker: it stores nothing and validates nothing.

Usage::

    with run_stub_cluster(node_ids=(1, 2, 3)) as cluster:
        cluster.nodes               # {1: ("127.0.0.1", p1), 2: ("127.0.0.1", p2), 3: (...)}
        cluster.bootstrap           # "127.0.0.1:p1" (the first node)
        ...                         # point a client / the proxy at it
        cluster.requests(2)         # [(api_key, api_version, correlation_id), ...] seen by node 2
        cluster.produced(2)         # records produced to node 2 so far

Every node listens on its own free 127.0.0.1 port and speaks just enough Kafka:

* ApiVersions v0-4 (answered in the request's version; a higher version gets a v0 answer with
  UNSUPPORTED_VERSION, as a broker does). It lists :data:`ADVERTISED_API_VERSIONS`: the APIs
  below plus Fetch 4-12 (advertised, not served: librdkafka needs it to send magic-2 batches).
* Metadata v0-12: every node with its real host/port, controller = the first node, cluster id
  ``cluster_id`` (v2+), one topic ``topic`` with one partition per node, partition ``i`` led by the
  ``i``-th node (replicas/ISR = that node). Other requested topic names get
  UNKNOWN_TOPIC_OR_PARTITION.
* FindCoordinator v0-6: the coordinator is the first node (one entry per key from v4 on).
* DescribeCluster v0-1: every node.
* Produce v3-v11: error 0 for every partition, ``base_offset`` = records produced on that node
  before this partition's batch (so offsets count up per node). acks=0 gets no answer.

With ``sasl_plain={"user": "password"}`` every node requires SASL/PLAIN first (what a broker's
SASL_PLAINTEXT listener does): SaslHandshake v0-1 (only v1 is served; v0 closes) and
SaslAuthenticate v0-2; before a successful authentication anything but ApiVersions closes the
connection; a wrong user or password is answered SASL_AUTHENTICATION_FAILED (58) and then the
connection is closed. ``cluster.frames(node_id)`` keeps the raw request/answer payloads.

Every request a node handles is recorded (before its answer is sent) as ``(api_key, api_version,
correlation_id)``. A request with an api key or version outside the table, or one that does not
decode, makes the node close the connection (and is not recorded).

Implementation: one accept thread per node, one thread per connection, blocking sockets; the
project's codec (``kvproxy.protocol.messages``, kio schemas) builds the answers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import socket
import struct
import sys
import threading
from collections.abc import Iterator
from types import MappingProxyType
from typing import Any, Final

from kvproxy.protocol.framing import FrameDecoder, frame
from kvproxy.protocol.messages import (
    API_VERSIONS,
    DESCRIBE_CLUSTER,
    FETCH,
    FIND_COORDINATOR,
    METADATA,
    PRODUCE,
    encode_response,
    make_response,
    read_request,
)

__all__ = ["ADVERTISED_API_VERSIONS", "STUB_API_VERSIONS", "StubCluster", "run_stub_cluster"]

HOST: Final = "127.0.0.1"

STUB_API_VERSIONS: Final = MappingProxyType(
    {
        PRODUCE: (3, 11),
        METADATA: (0, 12),
        FIND_COORDINATOR: (0, 6),
        API_VERSIONS: (0, 4),
        DESCRIBE_CLUSTER: (0, 1),
    }
)
"""``{api_key: (min_version, max_version)}``: what every stub node answers."""

SASL_HANDSHAKE: Final = 17
SASL_AUTHENTICATE: Final = 36
SASL_API_VERSIONS: Final = MappingProxyType({SASL_HANDSHAKE: (1, 1), SASL_AUTHENTICATE: (0, 2)})
"""Added to the served and advertised APIs when the cluster requires SASL/PLAIN."""
_SASL_AUTHENTICATION_FAILED: Final = 58
_ILLEGAL_SASL_STATE: Final = 34
_UNSUPPORTED_SASL_MECHANISM: Final = 33

ADVERTISED_API_VERSIONS: Final = MappingProxyType({**STUB_API_VERSIONS, FETCH: (4, 12)})
"""What the ApiVersions answer lists: the served APIs plus Fetch 4-12, which is advertised only
because librdkafka picks the record format from it (without Fetch v4+ it sends magic 0 message
sets even on Produce v10). A Fetch request closes the connection like any API not served."""

_UNSUPPORTED_VERSION: Final = 35
_UNKNOWN_TOPIC_OR_PARTITION: Final = 3


def _build(cls: type, **values: Any) -> Any:
    """Instantiate a kio dataclass from the keyword arguments it has fields for."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def _nested(cls: type, name: str) -> type:
    """A sibling schema class (same kio module) of ``cls``, e.g. the broker entry class."""
    return getattr(sys.modules[cls.__module__], name)  # type: ignore[no-any-return]


def _zero_throttle() -> Any:
    from kio.static.primitive import i32Timedelta

    return i32Timedelta.parse(datetime.timedelta(0))


def _count_records(records: bytes | None) -> int:
    """Number of records in a magic-2 record batch sequence (raises on any other magic)."""
    if not records:
        return 0
    data = bytes(records)
    pos = 0
    total = 0
    while pos + 61 <= len(data):
        (batch_length,) = struct.unpack_from(">i", data, pos + 8)
        magic = data[pos + 16]
        if magic != 2:
            raise ValueError(f"stub upstream only counts magic 2 batches, got magic {magic}")
        (count,) = struct.unpack_from(">i", data, pos + 57)
        total += count
        pos += 12 + batch_length
    return total


@dataclasses.dataclass
class _Node:
    node_id: int
    sock: socket.socket
    host: str
    port: int
    requests: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    produced: int = 0
    connections: int = 0
    frames: list[tuple[bytes, bytes | None]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Conn:
    """Per-connection SASL state."""

    mechanism: str | None = None
    authenticated: bool = False


class StubCluster:
    """A running stub cluster. Use :func:`run_stub_cluster` to get one."""

    def __init__(
        self,
        node_ids: tuple[int, ...] = (1, 2, 3),
        *,
        topic: str = "stub-topic",
        cluster_id: str = "stub-cluster",
        sasl_plain: dict[str, str] | None = None,
    ) -> None:
        if not node_ids or len(set(node_ids)) != len(node_ids):
            raise ValueError(f"node ids must be distinct and non-empty: {node_ids}")
        self.topic = topic
        self.cluster_id = cluster_id
        self.sasl_plain = dict(sasl_plain) if sasl_plain is not None else None
        self._served = dict(STUB_API_VERSIONS)
        self._advertised = dict(ADVERTISED_API_VERSIONS)
        if self.sasl_plain is not None:
            self._served.update(SASL_API_VERSIONS)
            self._advertised.update(SASL_API_VERSIONS)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: set[socket.socket] = set()
        self._nodes: dict[int, _Node] = {}
        for node_id in node_ids:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((HOST, 0))
            sock.listen(64)
            self._nodes[node_id] = _Node(node_id, sock, HOST, int(sock.getsockname()[1]))
        for node in self._nodes.values():
            t = threading.Thread(
                target=self._accept_loop, args=(node,), name=f"stub-node-{node.node_id}"
            )
            t.daemon = True
            t.start()
            self._threads.append(t)

    # -- public ----------------------------------------------------------------------------
    @property
    def nodes(self) -> dict[int, tuple[str, int]]:
        """``{node_id: (host, port)}`` in node order."""
        return {n.node_id: (n.host, n.port) for n in self._nodes.values()}

    @property
    def node_ids(self) -> tuple[int, ...]:
        return tuple(self._nodes)

    @property
    def controller_id(self) -> int:
        """The first node: also the coordinator for every key."""
        return next(iter(self._nodes))

    @property
    def bootstrap(self) -> str:
        """``host:port`` of the first node."""
        host, port = self.nodes[self.controller_id]
        return f"{host}:{port}"

    def address(self, node_id: int) -> str:
        host, port = self.nodes[node_id]
        return f"{host}:{port}"

    def requests(self, node_id: int, api_key: int | None = None) -> list[tuple[int, int, int]]:
        """``(api_key, api_version, correlation_id)`` of every request ``node_id`` handled."""
        with self._lock:
            seen = list(self._nodes[node_id].requests)
        return [r for r in seen if api_key is None or r[0] == api_key]

    def produced(self, node_id: int) -> int:
        """Records produced to ``node_id`` so far (the next base_offset it will answer)."""
        with self._lock:
            return self._nodes[node_id].produced

    def frames(self, node_id: int) -> list[tuple[bytes, bytes | None]]:
        """Raw ``(request, answer)`` payloads (no size prefix) in arrival order; answer None when
        the node sent nothing (acks=0) or closed the connection instead."""
        with self._lock:
            return list(self._nodes[node_id].frames)

    def connection_count(self, node_id: int) -> int:
        """Connections ``node_id`` has accepted so far."""
        with self._lock:
            return self._nodes[node_id].connections

    def clear(self) -> None:
        """Forget the recorded requests (produced counts are kept)."""
        with self._lock:
            for node in self._nodes.values():
                node.requests.clear()
                node.frames.clear()

    def close(self) -> None:
        """Stop listening, drop every open connection, join the threads."""
        self._stopping.set()
        for node in self._nodes.values():
            with contextlib.suppress(OSError):
                node.sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                node.sock.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for t in self._threads:
            t.join(timeout=2)

    def __enter__(self) -> StubCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- serving ---------------------------------------------------------------------------
    def _accept_loop(self, node: _Node) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = node.sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                node.connections += 1
                self._conns.add(conn)
            t = threading.Thread(
                target=self._serve, args=(node, conn), name=f"stub-conn-{node.node_id}"
            )
            t.daemon = True
            t.start()
            with self._lock:
                self._threads.append(t)

    def _serve(self, node: _Node, conn: socket.socket) -> None:
        decoder = FrameDecoder()
        state = _Conn(authenticated=self.sasl_plain is None)
        try:
            while not self._stopping.is_set():
                data = conn.recv(65536)
                if not data:
                    return
                decoder.receive_data(data)
                while (payload := decoder.next_frame()) is not None:
                    answer = self._handle(node, state, payload)
                    sent = answer if isinstance(answer, bytes) else None
                    with self._lock:
                        node.frames.append((payload, sent))
                    if sent is not None:
                        conn.sendall(frame(sent))
                    if answer is _CLOSE or isinstance(answer, _AnswerThenClose):
                        if isinstance(answer, _AnswerThenClose):
                            with self._lock:
                                node.frames[-1] = (payload, answer.payload)
                            conn.sendall(frame(answer.payload))
                        return
        except OSError:
            return
        finally:
            with self._lock:
                self._conns.discard(conn)
            with contextlib.suppress(OSError):
                conn.close()

    def _handle(self, node: _Node, state: _Conn, payload: bytes) -> bytes | object | None:
        """The encoded answer, None for no answer (acks=0), ``_CLOSE`` or ``_AnswerThenClose``."""
        if len(payload) < 8:
            return _CLOSE
        api_key, api_version = struct.unpack_from(">hh", payload, 0)
        if api_key in (SASL_HANDSHAKE, SASL_AUTHENTICATE) and self.sasl_plain is not None:
            return self._sasl(node, state, payload, api_key, api_version)
        if not state.authenticated and api_key != API_VERSIONS:
            return _CLOSE
        if api_key == API_VERSIONS and api_version > STUB_API_VERSIONS[API_VERSIONS][1]:
            # a broker answers an ApiVersions it does not know in v0, with UNSUPPORTED_VERSION
            (correlation_id,) = struct.unpack_from(">i", payload, 4)
            self._record(node, api_key, api_version, correlation_id)
            return self._api_versions(0, correlation_id, _UNSUPPORTED_VERSION)
        span = self._served.get(api_key)
        if span is None or not span[0] <= api_version <= span[1]:
            return _CLOSE
        try:
            # read_request, not decode_request: trailing bytes are ignored, as Kafka does
            # (librdkafka 2.16 sends 3 extra bytes after some Metadata v12 requests)
            request, _ = read_request(payload, 0)
        except Exception:
            return _CLOSE
        cid = request.header.correlation_id
        body = request.body
        try:
            if api_key == PRODUCE:
                return self._produce(node, api_version, cid, body)
            self._record(node, api_key, api_version, cid)
            if api_key == API_VERSIONS:
                return self._api_versions(api_version, cid, 0)
            if api_key == METADATA:
                return self._metadata(api_version, cid, body)
            if api_key == FIND_COORDINATOR:
                return self._find_coordinator(api_version, cid, body)
            return self._describe_cluster(api_version, cid)
        except Exception:
            return _CLOSE

    def _record(self, node: _Node, api_key: int, api_version: int, cid: int) -> None:
        with self._lock:
            node.requests.append((api_key, api_version, cid))

    # -- SASL (hand-written: the project codec does not cover these APIs) -------------------
    def _sasl(
        self, node: _Node, state: _Conn, payload: bytes, api_key: int, api_version: int
    ) -> bytes | object:
        lo, hi = SASL_API_VERSIONS[api_key]
        if not lo <= api_version <= hi:
            return _CLOSE
        flexible = api_key == SASL_AUTHENTICATE and api_version >= 2
        try:
            cid, pos = _skip_request_header(payload, flexible)
        except (struct.error, IndexError):
            return _CLOSE
        self._record(node, api_key, api_version, cid)
        if api_key == SASL_HANDSHAKE:
            (n,) = struct.unpack_from(">h", payload, pos)
            mechanism = payload[pos + 2 : pos + 2 + n].decode()
            ok = mechanism == "PLAIN" and state.mechanism is None and not state.authenticated
            if ok:
                state.mechanism = mechanism
            error = 0 if ok else _UNSUPPORTED_SASL_MECHANISM
            if mechanism == "PLAIN" and not ok:
                error = _ILLEGAL_SASL_STATE
            body = struct.pack(">ihi", cid, error, 1) + _str16("PLAIN")
            return body if ok else _AnswerThenClose(body)
        # SaslAuthenticate
        if flexible:
            n, pos = _read_uvarint(payload, pos)
            token = payload[pos : pos + n - 1]
        else:
            (n,) = struct.unpack_from(">i", payload, pos)
            token = payload[pos + 4 : pos + 4 + n]
        if state.mechanism != "PLAIN" or state.authenticated:
            error, message = _ILLEGAL_SASL_STATE, "Unexpected SaslAuthenticate request"
        else:
            parts = token.split(b"\x00")
            assert self.sasl_plain is not None
            user, password = (parts[1].decode(), parts[2].decode()) if len(parts) == 3 else ("", "")
            if len(parts) == 3 and self.sasl_plain.get(user) == password:
                error, message = 0, None
            else:
                error, message = (
                    _SASL_AUTHENTICATION_FAILED,
                    "Authentication failed: Invalid username or password",
                )
        state.authenticated = error == 0
        if flexible:
            out = struct.pack(">i", cid) + b"\x00" + struct.pack(">h", error)
            out += _compact_nullable_str(message) + b"\x01" + struct.pack(">q", 0) + b"\x00"
        else:
            out = struct.pack(">ih", cid, error) + _nullable_str16(message)
            out += struct.pack(">i", 0)
            if api_version >= 1:
                out += struct.pack(">q", 0)
        return out if error == 0 else _AnswerThenClose(out)

    # -- answers ---------------------------------------------------------------------------
    @staticmethod
    def _response_type(api_key: int, api_version: int) -> type:
        from kvproxy.protocol.messages import codec_for

        return codec_for(api_key, api_version).response_type

    def _encode(self, api_key: int, api_version: int, cid: int, body: Any) -> bytes:
        return encode_response(api_key, api_version, make_response(api_key, api_version, cid, body))

    def _api_versions(self, api_version: int, cid: int, error_code: int) -> bytes:
        from kio.schema.errors import ErrorCode

        cls = self._response_type(API_VERSIONS, api_version)
        entry = _nested(cls, "ApiVersion")
        keys = tuple(
            _build(entry, api_key=k, min_version=lo, max_version=hi)
            for k, (lo, hi) in sorted(self._advertised.items())
        )
        body = _build(
            cls, error_code=ErrorCode(error_code), api_keys=keys, throttle_time=_zero_throttle()
        )
        return self._encode(API_VERSIONS, api_version, cid, body)

    def _metadata(self, api_version: int, cid: int, request: Any) -> bytes:
        import uuid

        from kio.schema.errors import ErrorCode

        cls = self._response_type(METADATA, api_version)
        broker_cls = _nested(cls, "MetadataResponseBroker")
        topic_cls = _nested(cls, "MetadataResponseTopic")
        partition_cls = _nested(cls, "MetadataResponsePartition")
        brokers = tuple(
            _build(broker_cls, node_id=n.node_id, host=n.host, port=n.port, rack=None)
            for n in self._nodes.values()
        )
        requested = request.topics
        if api_version == 0 and not requested:
            requested = None  # v0: an empty list means every topic
        names: list[str | None]
        names = [self.topic] if requested is None else [t.name for t in requested]
        topics = []
        for name in names:
            if name == self.topic:
                partitions = tuple(
                    _build(
                        partition_cls,
                        error_code=ErrorCode(0),
                        partition_index=i,
                        leader_id=node_id,
                        leader_epoch=0,
                        replica_nodes=(node_id,),
                        isr_nodes=(node_id,),
                        offline_replicas=(),
                    )
                    for i, node_id in enumerate(self._nodes)
                )
                error, topic_id = 0, uuid.UUID(int=0x5702)
            else:
                partitions, error, topic_id = (), _UNKNOWN_TOPIC_OR_PARTITION, uuid.UUID(int=0)
            topics.append(
                _build(
                    topic_cls,
                    error_code=ErrorCode(error),
                    name=name,
                    topic_id=topic_id,
                    is_internal=False,
                    partitions=partitions,
                )
            )
        body = _build(
            cls,
            throttle_time=_zero_throttle(),
            brokers=brokers,
            cluster_id=self.cluster_id,
            controller_id=self.controller_id,
            topics=tuple(topics),
        )
        return self._encode(METADATA, api_version, cid, body)

    def _find_coordinator(self, api_version: int, cid: int, request: Any) -> bytes:
        from kio.schema.errors import ErrorCode

        cls = self._response_type(FIND_COORDINATOR, api_version)
        node = self._nodes[self.controller_id]
        if api_version >= 4:
            coord_cls = _nested(cls, "Coordinator")
            coordinators = tuple(
                _build(
                    coord_cls,
                    key=key,
                    node_id=node.node_id,
                    host=node.host,
                    port=node.port,
                    error_code=ErrorCode(0),
                    error_message=None,
                )
                for key in request.coordinator_keys
            )
            body = _build(cls, throttle_time=_zero_throttle(), coordinators=coordinators)
        else:
            body = _build(
                cls,
                throttle_time=_zero_throttle(),
                error_code=ErrorCode(0),
                error_message=None,
                node_id=node.node_id,
                host=node.host,
                port=node.port,
            )
        return self._encode(FIND_COORDINATOR, api_version, cid, body)

    def _describe_cluster(self, api_version: int, cid: int) -> bytes:
        from kio.schema.errors import ErrorCode

        cls = self._response_type(DESCRIBE_CLUSTER, api_version)
        broker_cls = _nested(cls, "DescribeClusterBroker")
        brokers = tuple(
            _build(broker_cls, broker_id=n.node_id, host=n.host, port=n.port, rack=None)
            for n in self._nodes.values()
        )
        body = _build(
            cls,
            throttle_time=_zero_throttle(),
            error_code=ErrorCode(0),
            error_message=None,
            endpoint_type=1,
            cluster_id=self.cluster_id,
            controller_id=self.controller_id,
            brokers=brokers,
        )
        return self._encode(DESCRIBE_CLUSTER, api_version, cid, body)

    def _produce(self, node: _Node, api_version: int, cid: int, request: Any) -> bytes | None:
        from kio.schema.errors import ErrorCode

        cls = self._response_type(PRODUCE, api_version)
        topic_cls = _nested(cls, "TopicProduceResponse")
        partition_cls = _nested(cls, "PartitionProduceResponse")
        counts = [
            [(p.index, _count_records(p.records)) for p in t.partition_data]
            for t in request.topic_data
        ]
        with self._lock:
            node.requests.append((PRODUCE, api_version, cid))
            topics = []
            for t, parts in zip(request.topic_data, counts, strict=True):
                answers = []
                for index, n in parts:
                    answers.append(
                        _build(
                            partition_cls,
                            index=index,
                            error_code=ErrorCode(0),
                            base_offset=node.produced,
                            log_append_time=None,
                            log_start_offset=0,
                            record_errors=(),
                            error_message=None,
                        )
                    )
                    node.produced += n
                topics.append(_build(topic_cls, name=t.name, partition_responses=tuple(answers)))
        if request.acks == 0:
            return None
        body = _build(cls, responses=tuple(topics), throttle_time=_zero_throttle())
        return self._encode(PRODUCE, api_version, cid, body)


_CLOSE: Final = object()


@dataclasses.dataclass(frozen=True)
class _AnswerThenClose:
    payload: bytes


def _str16(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def _nullable_str16(text: str | None) -> bytes:
    return struct.pack(">h", -1) if text is None else _str16(text)


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _compact_nullable_str(text: str | None) -> bytes:
    if text is None:
        return b"\x00"
    raw = text.encode()
    return _uvarint(len(raw) + 1) + raw


def _skip_request_header(payload: bytes, flexible: bool) -> tuple[int, int]:
    """``(correlation_id, offset of the body)`` of a request header v1 (v2 when flexible)."""
    (cid, n) = struct.unpack_from(">ih", payload, 4)
    pos = 10 + max(n, 0)
    if flexible:  # tagged fields: count, then (tag, size, bytes) each
        count, pos = _read_uvarint(payload, pos)
        for _ in range(count):
            _, pos = _read_uvarint(payload, pos)
            size, pos = _read_uvarint(payload, pos)
            pos += size
    return int(cid), pos


@contextlib.contextmanager
def run_stub_cluster(
    node_ids: tuple[int, ...] = (1, 2, 3),
    *,
    topic: str = "stub-topic",
    cluster_id: str = "stub-cluster",
    sasl_plain: dict[str, str] | None = None,
) -> Iterator[StubCluster]:
    """Start a stub cluster (one free 127.0.0.1 port per node), yield it, stop it.

    ``sasl_plain={"user": "password"}`` makes every node require SASL/PLAIN.
    """
    cluster = StubCluster(node_ids, topic=topic, cluster_id=cluster_id, sasl_plain=sasl_plain)
    try:
        yield cluster
    finally:
        cluster.close()
