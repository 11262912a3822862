"""A recording TCP relay (threads + sockets, loopback only) for capturing real client traffic.

The relay forwards bytes both ways unchanged and records every complete frame it sees, split on
the 4-byte size prefix: requests (client -> broker) and responses (broker -> client).

Tansu advertises its own address in Metadata, so a client would bypass the relay after
bootstrapping. Nothing is rewritten: the relay binds its socket first, then Tansu is started
advertising the relay's port, and the relay forwards to Tansu's real listener port::

    with recording_tansu() as (relay, server):
        producer = Producer({"bootstrap.servers": relay.bootstrap})
        ...
        for frame in relay.requests(api_key=0):   # Produce requests, payload without prefix
            ...

A request is recorded as soon as it has been read from the client, before it is forwarded, so
requests the broker refuses (Tansu drops connections carrying magic 0/1 message sets) are still
recorded.

The relay can also stand for a slow broker: after ``relay.hold_answers(api_key)`` the answers to
requests of that API sent from then on wait in the relay until ``relay.release_answers()``, so a
test can change something between a request reaching the broker and its answer leaving it.
Answers are forwarded frame by frame.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from tests.harness.tansu import HOST, TansuServer, run_tansu

__all__ = [
    "ProduceSummary",
    "RecordedFrame",
    "RecordingRelay",
    "read_produce_request",
    "recording_tansu",
]


@dataclass(frozen=True)
class RecordedFrame:
    """One complete frame (payload without its size prefix) seen on connection ``conn``."""

    conn: int
    direction: str  # "request" (client -> broker) or "response" (broker -> client)
    payload: bytes

    @property
    def api_key(self) -> int:
        """Request api key (only meaningful for requests)."""
        return int(struct.unpack_from(">h", self.payload, 0)[0])

    @property
    def api_version(self) -> int:
        return int(struct.unpack_from(">h", self.payload, 2)[0])

    @property
    def correlation_id(self) -> int:
        offset = 4 if self.direction == "request" else 0
        return int(struct.unpack_from(">i", self.payload, offset)[0])


class _FrameSplitter:
    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        while len(self._buf) >= 4:
            (size,) = struct.unpack_from(">i", self._buf, 0)
            if size < 0 or len(self._buf) < 4 + size:
                break
            out.append(bytes(self._buf[4 : 4 + size]))
            del self._buf[: 4 + size]
        return out


class RecordingRelay:
    """Listens on 127.0.0.1 (port bound at construction), forwards to an upstream once started."""

    def __init__(self, host: str = HOST, port: int = 0) -> None:
        self.host = host
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(64)
        self.port: int = int(self._listener.getsockname()[1])
        self._upstream: tuple[str, int] | None = None
        self._lock = threading.Lock()
        self._frames: list[RecordedFrame] = []
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._conn_count = 0
        self._closed = threading.Event()
        self._hold_api_key: int | None = None
        self._held: set[tuple[int, int]] = set()
        """(connection, correlation id) of the requests whose answers wait for the release."""
        self._released = threading.Event()
        self._released.set()

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    # -- control ---------------------------------------------------------------------------
    def start(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        t = threading.Thread(target=self._accept_loop, name="relay-accept", daemon=True)
        t.start()
        self._threads.append(t)

    def hold_answers(self, api_key: int) -> None:
        """Keep the answers to `api_key` requests sent from now on until `release_answers`."""
        with self._lock:
            self._hold_api_key = api_key
            self._released.clear()

    def release_answers(self) -> None:
        with self._lock:
            self._hold_api_key = None
            self._held.clear()
        self._released.set()

    def close(self) -> None:
        self._closed.set()
        self._released.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            socks = list(self._sockets)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
        for t in self._threads:
            t.join(timeout=2)

    def __enter__(self) -> RecordingRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- recorded data ---------------------------------------------------------------------
    @property
    def frames(self) -> list[RecordedFrame]:
        with self._lock:
            return list(self._frames)

    def requests(self, api_key: int | None = None) -> list[RecordedFrame]:
        return [
            f
            for f in self.frames
            if f.direction == "request" and (api_key is None or f.api_key == api_key)
        ]

    def responses(self) -> list[RecordedFrame]:
        return [f for f in self.frames if f.direction == "response"]

    def clear(self) -> None:
        with self._lock:
            self._frames.clear()

    # -- internals -------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        assert self._upstream is not None
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._upstream, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                conn = self._conn_count
                self._conn_count += 1
                self._sockets += [client, upstream]
            for src, dst, direction in (
                (client, upstream, "request"),
                (upstream, client, "response"),
            ):
                t = threading.Thread(
                    target=self._pump,
                    args=(conn, src, dst, direction),
                    name=f"relay-{conn}-{direction}",
                    daemon=True,
                )
                t.start()
                self._threads.append(t)

    def _pump(self, conn: int, src: socket.socket, dst: socket.socket, direction: str) -> None:
        splitter = _FrameSplitter()
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                frames = [RecordedFrame(conn, direction, f) for f in splitter.feed(data)]
                if frames:
                    with self._lock:
                        self._frames.extend(frames)
                        if direction == "request" and self._hold_api_key is not None:
                            self._held.update(
                                (conn, f.correlation_id)
                                for f in frames
                                if f.api_key == self._hold_api_key
                            )
                if direction == "request":
                    dst.sendall(data)
                    continue
                for recorded in frames:  # answers go on whole, each once it may
                    with self._lock:
                        held = (conn, recorded.correlation_id) in self._held
                    if held:
                        self._released.wait()
                    dst.sendall(struct.pack(">i", len(recorded.payload)) + recorded.payload)
        except OSError:
            pass
        finally:
            # propagate the close to the other side (half-close first, then full close)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            with contextlib.suppress(OSError):
                src.shutdown(socket.SHUT_RD)


@contextlib.contextmanager
def recording_tansu() -> Iterator[tuple[RecordingRelay, TansuServer]]:
    """A relay in front of a fresh Tansu that advertises the relay's address."""
    relay = RecordingRelay()
    try:
        with run_tansu(advertised_port=relay.port) as server:
            relay.start(server.host, server.port)
            yield relay, server
    finally:
        relay.close()


# -- a minimal, independent Produce request reader (for the capture script's own checks) -----


class _Reader:
    def __init__(self, buf: bytes, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def _unpack(self, fmt: str) -> int:
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return int(v)

    def int16(self) -> int:
        return self._unpack(">h")

    def int32(self) -> int:
        return self._unpack(">i")

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            b = self.buf[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7

    def take(self, n: int) -> bytes:
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def string(self, compact: bool) -> str | None:
        n = self.uvarint() - 1 if compact else self.int16()
        return None if n < 0 else self.take(n).decode()

    def bytes_(self, compact: bool) -> bytes | None:
        n = self.uvarint() - 1 if compact else self.int32()
        return None if n < 0 else self.take(n)

    def array_len(self, compact: bool) -> int:
        return self.uvarint() - 1 if compact else self.int32()

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())


@dataclass(frozen=True)
class ProduceSummary:
    api_version: int
    correlation_id: int
    client_id: str | None
    transactional_id: str | None
    acks: int
    timeout_ms: int
    partitions: list[tuple[str, int, bytes | None]]  # (topic, partition, records) in order


def read_produce_request(payload: bytes) -> ProduceSummary:
    """Parse a Produce request (v0-v11, payload without size prefix). Topic names only (< v13)."""
    r = _Reader(payload)
    api_key, version, correlation_id = r.int16(), r.int16(), r.int32()
    if api_key != 0:
        raise ValueError(f"not a Produce request (api_key {api_key})")
    flexible = version >= 9
    client_id = r.string(compact=False)
    if flexible:
        r.skip_tags()
    transactional_id = r.string(compact=flexible) if version >= 3 else None
    acks, timeout_ms = r.int16(), r.int32()
    partitions: list[tuple[str, int, bytes | None]] = []
    for _ in range(r.array_len(flexible)):
        topic = r.string(flexible)
        assert topic is not None
        for _ in range(r.array_len(flexible)):
            index = r.int32()
            partitions.append((topic, index, r.bytes_(flexible)))
            if flexible:
                r.skip_tags()
        if flexible:
            r.skip_tags()
    if flexible:
        r.skip_tags()
    if r.pos != len(payload):
        raise ValueError(f"{len(payload) - r.pos} trailing bytes after the Produce request")
    return ProduceSummary(
        version, correlation_id, client_id, transactional_id, acks, timeout_ms, partitions
    )
