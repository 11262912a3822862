"""kvproxy under upstream and client faults, beyond `test_proxy_faults.py`.

* The broker restarts during a produce stream: no record the producer was told succeeded is lost
  or read back twice (a real Tansu restart, and an outage of the network path to a broker that
  keeps its data).
* An upstream that accepts but never answers: the client gets its own request timeout, and once
  it goes away the proxy holds nothing.
* An upstream that answers garbage: that client's connection is closed, every other client keeps
  working.
* A client that vanishes in the middle of a request, a real producer killed mid-stream, and
  half-open connections: the proxy frees everything as soon as the operating system reports the
  peer gone.

Stub servers stand in only where Tansu cannot misbehave on purpose (never answering, answering
garbage) or cannot keep its data over a restart (its storage here is memory); each says so.

Idempotence: librdkafka's idempotent producer works through the proxy against Tansu 0.6 (Tansu
answers InitProducerId v4, librdkafka gets a PID). After a real restart with memory storage Tansu
has forgotten the PID and answers UNKNOWN_PRODUCER_ID; librdkafka then raises a fatal error rather
than risk duplicates, so each phase of the real-restart test uses a fresh topic and a fresh
producer. The outage test keeps the broker's data and producer state, so one idempotent producer
runs across every outage there.
"""

from __future__ import annotations

import abc
import contextlib
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import pytest

from kvproxy.protocol.messages import METADATA, encode_request, make_request
from tests.harness import Broker, create_topic, run_tansu, unique_topic_name
from tests.harness.clients import produce_and_consume
from tests.harness.proxy import RunningProxy, proxy_config, run_proxy
from tests.harness.proxy_checks import assert_idle, assert_serves
from tests.harness.raw_client import (
    RawClientError,
    RawKafkaClient,
    api_versions_v0_request,
    parse_api_versions_v0_response,
)
from tests.harness.requests import fetch_request, produce_request, topic_id_of
from tests.harness.tansu import free_port

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


# ---- small servers for what Tansu cannot do ----


class ThreadedServer(abc.ABC):
    """A loopback TCP server: one accept thread, one thread per connection (`handle`)."""

    def __init__(self, port: int = 0) -> None:
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self.port = port
        self._listener: socket.socket | None = None
        self.listen()

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop_listening(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()

    def reset_all(self) -> None:
        """Drop every open connection with a reset (what a crashed broker's peers see)."""
        with self._lock:
            conns = list(self._conns)
            self._conns.clear()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def close(self) -> None:
        self._closed = True
        self.stop_listening()
        self.reset_all()
        for thread in self._threads:
            thread.join(5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def track(self, conn: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._conns.add(conn)
            return True

    def untrack(self, conn: socket.socket) -> None:
        with self._lock:
            self._conns.discard(conn)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            if not self.track(conn):
                conn.close()
                return
            thread = threading.Thread(target=self._run, args=(conn,), daemon=True)
            thread.start()
            with self._lock:
                self._threads = [t for t in self._threads if t.is_alive()]
                self._threads.append(thread)

    def _run(self, conn: socket.socket) -> None:
        try:
            self.handle(conn)
        except OSError:
            pass
        finally:
            self.untrack(conn)
            with contextlib.suppress(OSError):
                conn.close()

    @abc.abstractmethod
    def handle(self, conn: socket.socket) -> None:
        """What the server does with one connection: each test server below says."""


def read_frame(conn: socket.socket) -> bytes | None:
    """One size-prefixed frame, or None at EOF."""
    head = read_exactly(conn, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    return read_exactly(conn, size)


def read_exactly(conn: socket.socket, n: int) -> bytes | None:
    data = bytearray()
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


class SilentUpstream(ThreadedServer):
    """Accepts and reads everything, never writes a byte.

    Tansu always answers; this stands for a broker that hangs (stuck disk, deadlock).
    `talking` counts the connections that sent something and are still open, apart from the
    proxy's own: its Metadata requests (client id "kvproxy"), which it repeats every second
    while the cluster has never answered, and its readiness probe (a connect, nothing sent)."""

    def __init__(self) -> None:
        self.talking = 0
        self.received = 0
        super().__init__()

    def handle(self, conn: socket.socket) -> None:
        counted = False
        try:
            while chunk := conn.recv(65536):
                with self._lock:
                    self.received += len(chunk)
                    if not counted and not _the_proxys_own_metadata_request(chunk):
                        counted = True
                        self.talking += 1
        finally:
            if counted:
                with self._lock:
                    self.talking -= 1


def _the_proxys_own_metadata_request(chunk: bytes) -> bool:
    """Size, api key 3 (Metadata), version, correlation id, then client id "kvproxy"."""
    return chunk[4:6] == b"\x00\x03" and chunk[12:21] == b"\x00\x07kvproxy"


def api_versions_v0_answer(correlation_id: int) -> bytes:
    """ApiVersions v0: no error, ApiVersions 0-3 only."""
    return struct.pack(">ihi", correlation_id, 0, 1) + struct.pack(">hhh", 18, 0, 3)


GARBAGE: dict[str, Callable[[int], bytes]] = {
    "wrong-correlation-id": lambda cid: frame(api_versions_v0_answer(cid + 1)),
    "random-frame": lambda cid: frame(
        struct.pack(">i", cid ^ 0x5A5A5A5A) + random.Random(cid).randbytes(508)
    ),
    "random-bytes-then-close": lambda cid: random.Random(cid).randbytes(64),
    "oversized-size-prefix": lambda cid: struct.pack(">i", 2**31 - 1) + b"\x00" * 64,
    "negative-size-prefix": lambda cid: struct.pack(">i", -5) + b"\x00" * 64,
    "extra-answer": lambda cid: (
        frame(api_versions_v0_answer(cid)) + frame(api_versions_v0_answer(cid + 7))
    ),
    "undecodable-metadata": lambda cid: frame(struct.pack(">i", cid) + b"\xff" * 12),
}
"""What the garbage upstream sends a victim, by variant, given the request's correlation id."""


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


class GarbageUpstream(ThreadedServer):
    """Answers ApiVersions v0 properly, except to a client whose client id is `victim`: that one
    gets the garbage of `variant` (and no further answer; `random-bytes-then-close` also closes).
    Requests other than ApiVersions from anyone else close the connection.

    Tansu only sends well-formed answers; this stands for a broken broker or a wrong service
    listening on the broker's port."""

    def __init__(self, variant: str) -> None:
        self.variant = variant
        super().__init__()

    def handle(self, conn: socket.socket) -> None:
        while (payload := read_frame(conn)) is not None:
            api_key, _version, cid, id_length = struct.unpack_from(">hhih", payload)
            client_id = payload[10 : 10 + max(id_length, 0)]
            if client_id == b"victim":
                conn.sendall(GARBAGE[self.variant](cid))
                if self.variant == "random-bytes-then-close":
                    return
                while conn.recv(65536):  # no more answers, connection kept open
                    pass
                return
            if api_key != 18:
                return
            conn.sendall(frame(api_versions_v0_answer(cid)))


class Relay(ThreadedServer):
    """A byte-for-byte TCP relay to `target` that can fail like a broker host: `outage()` resets
    every connection and refuses new ones for a while, then accepts again on the same port.

    Tansu's storage here is memory: a real restart loses what it stored, so this is how a test
    checks that acknowledged records survive an outage of the path to the broker."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self.target = target
        super().__init__(port)

    def handle(self, conn: socket.socket) -> None:
        upstream = socket.create_connection(self.target, timeout=5)
        upstream.settimeout(None)
        if not self.track(upstream):
            upstream.close()
            return
        back = threading.Thread(target=self._pump, args=(upstream, conn), daemon=True)
        back.start()
        try:
            self._pump(conn, upstream)
        finally:
            back.join(5)
            self.untrack(upstream)
            upstream.close()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_RDWR)

    def outage(self, seconds: float) -> None:
        self.stop_listening()
        self.reset_all()
        time.sleep(seconds)
        self.listen()


# ---- producers that remember what they were told ----


@dataclass
class Outcomes:
    """Delivery reports of one producer: value -> (report time, error code or None, offset)."""

    reports: dict[bytes, tuple[float, int | None, int]] = field(default_factory=dict)
    fatal: list[Any] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_delivery(self, err: Any, message: Any) -> None:
        with self.lock:
            code = None if err is None else int(err.code())
            self.reports[message.value()] = (time.monotonic(), code, message.offset())

    def acked(self, before: float | None = None, after: float | None = None) -> set[bytes]:
        with self.lock:
            return {
                value
                for value, (at, code, _) in self.reports.items()
                if code is None
                and (before is None or at < before)
                and (after is None or at > after)
            }

    def offset(self, value: bytes) -> int:
        with self.lock:
            return self.reports[value][2]

    def errors(self) -> Counter[int]:
        with self.lock:
            return Counter(code for _, code, _ in self.reports.values() if code is not None)


class Stream:
    """Produce numbered records to partition 0 of `topic` every `interval` s until stopped; a
    poll thread serves delivery reports as they arrive."""

    def __init__(self, producer: Any, topic: str, outcomes: Outcomes, interval: float) -> None:
        self.producer = producer
        self.topic = topic
        self.outcomes = outcomes
        self.interval = interval
        self.sent = 0
        self.refused: list[str] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._produce, daemon=True),
            threading.Thread(target=self._poll, daemon=True),
        ]

    def __enter__(self) -> Self:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def release(self) -> None:
        """Drop the producer, so destroying it closes its connections."""
        self.stop()
        self.producer = None

    def _produce(self) -> None:
        from confluent_kafka import KafkaException

        while not self._stop.wait(self.interval):
            value = f"r{self.sent:06d}".encode()
            try:
                self.producer.produce(
                    self.topic, value, partition=0, on_delivery=self.outcomes.on_delivery
                )
            except KafkaException as exc:  # fatal: the producer takes no more records
                self.refused.append(str(exc))
                return
            except BufferError:
                continue
            self.sent += 1

    def _poll(self) -> None:
        from confluent_kafka import KafkaException

        while not self._stop.is_set():
            try:
                self.producer.poll(0.02)
            except KafkaException as exc:
                self.outcomes.fatal.append(exc.args[0])


def acked_at_least(outcomes: Outcomes, count: int) -> Callable[[], bool]:
    return lambda: len(outcomes.acked()) >= count


def stream_producer(
    bootstrap: str, outcomes: Outcomes, timeout_ms: int, *, idempotent: bool = True
) -> Any:
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": idempotent,
            "acks": "all",
            "linger.ms": 2,
            "message.timeout.ms": timeout_ms,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
            "error_cb": outcomes.fatal.append,
        }
    )


def read_values(bootstrap: str, topic: str, want: set[bytes], timeout: float) -> Counter[bytes]:
    """Values of partition 0 from offset 0 (assign) up to the end the partition had when the
    read started, and on until every value of `want` was seen (bounded by `timeout`); each value
    with how often it was read."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    got: Counter[bytes] = Counter()
    try:
        end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout)[1]
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout
        position = 0
        while time.monotonic() < deadline and (position < end or not want <= set(got)):
            message = consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            value = message.value()
            assert value is not None
            got[value] += 1
            position = (message.offset() or 0) + 1
    finally:
        consumer.close()
    return got


# ---- the broker restarts during a produce stream ----


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "acks-all"])
def test_real_broker_restart_mid_stream_loses_no_acknowledged_record(idempotent: bool) -> None:
    """Two phases, each with a fresh topic and a fresh producer streaming numbered records
    through the proxy; in each, the broker (Tansu, memory storage) is restarted while the stream
    runs, and the topic is created again on the new, empty broker.

    * Just before the restart, every record acknowledged so far is read back exactly once (the
      restart empties the broker, so this is the last moment to look).
    * Every record gets a delivery report: no hang.
    * Every record acknowledged after the restart is read back exactly once from the new broker.
      The idempotent producer acknowledges none: the new broker does not know its producer id
      (UNKNOWN_PRODUCER_ID) and librdkafka stops rather than risk duplicates. The acks=all
      producer (not idempotent) goes on into the new broker.
    * The proxy holds nothing once the producer is gone, and serves the next phase."""
    with run_tansu() as broker, run_proxy(broker.broker.bootstrap) as proxy:
        for phase in range(2):
            topic = create_topic(broker.broker.bootstrap, unique_topic_name(f"phase{phase}"))
            outcomes = Outcomes()
            producer = stream_producer(proxy.bootstrap, outcomes, 8000, idempotent=idempotent)
            with Stream(producer, topic, outcomes, interval=0.002) as stream:
                wait_for(acked_at_least(outcomes, 300), 20, "300 acknowledged")
                acked = outcomes.acked()
                read = read_values(proxy.bootstrap, topic, acked, timeout=20)
                assert acked <= set(read), f"{len(acked - set(read))} acknowledged, not stored"
                assert max(read.values()) == 1, "a record was stored twice"
                killed_at = time.monotonic()
                broker.restart()
                ready_at = time.monotonic()
                with contextlib.suppress(Exception):  # the producer's Metadata may create it
                    create_topic(broker.broker.bootstrap, topic)
                time.sleep(1.5)  # the stream goes on against the new broker
                stream.stop()
                assert producer.flush(20) == 0, "records left without a delivery report"
            unchecked = outcomes.acked(before=ready_at) - acked
            after = outcomes.acked(after=ready_at)
            # a report that ran late (a loaded machine) for a record the old broker acknowledged:
            # the old broker's offsets are the records' numbers (read back once above), the new
            # broker's topic starts again at offset 0, below any number sent after the restart
            late = {value for value in after if outcomes.offset(value) == int(value[1:])}
            unchecked |= late
            after -= late
            if after:
                again = read_values(proxy.bootstrap, topic, after, timeout=20)
                assert after <= set(again), f"{len(after - set(again))} acknowledged, not stored"
                assert max(again[v] for v in after) == 1, "an acknowledged record was read twice"
            assert len(outcomes.reports) == stream.sent
            print(
                f"\nrestart, {'idempotent' if idempotent else 'acks=all'} phase {phase}: "
                f"{stream.sent} sent; {len(acked)} acknowledged and read back once before the "
                f"restart check, {len(unchecked)} acknowledged between that check and the restart "
                f"(lost with the broker's memory, which took {ready_at - killed_at:.2f} s); "
                f"{len(after)} acknowledged after it and read back once; "
                f"errors {dict(outcomes.errors())}"
            )
            stream.release()
            del producer
            assert_idle(proxy)


def test_acknowledged_records_survive_upstream_outages_exactly_once() -> None:
    """One idempotent producer streams numbered records through the proxy while the network path
    to the broker fails three times (every connection reset, new ones refused for a second, as
    when a broker host restarts; the broker keeps its data). Every record the producer was told
    succeeded is read back exactly once, and with message.timeout.ms above the outages every
    record succeeds."""
    relay_port = free_port()
    with (
        run_tansu(advertised_port=relay_port) as broker,
        Relay(relay_port, (broker.host, broker.port)) as relay,
        run_proxy(relay.bootstrap) as proxy,
    ):
        topic = create_topic(broker.broker.bootstrap, unique_topic_name("outage"))
        outcomes = Outcomes()
        producer = stream_producer(proxy.bootstrap, outcomes, 60_000)
        with Stream(producer, topic, outcomes, interval=0.002) as stream:
            for n in range(3):
                wait_for(acked_at_least(outcomes, 300 * (n + 1)), 30, "acknowledged records")
                relay.outage(1.0)
            time.sleep(1.0)
            stream.stop()
            assert producer.flush(60) == 0, "records left without a delivery report"
        acked = outcomes.acked()
        read = read_values(proxy.bootstrap, topic, acked, timeout=30)
        print(
            f"\noutages: {stream.sent} sent, {len(acked)} acknowledged, "
            f"{len(set(read))} read back, {sum(read.values()) - len(read)} duplicates, "
            f"errors {dict(outcomes.errors())}, client errors {len(outcomes.fatal)}"
        )
        assert acked <= set(read), f"{len(acked - set(read))} acknowledged, not stored"
        assert max(read[v] for v in acked) == 1, "an acknowledged record was read twice"
        assert len(acked) == stream.sent == len(outcomes.reports)
        stream.release()
        del producer
        assert_idle(proxy)


# ---- an upstream that accepts but never answers ----


def test_never_answering_upstream_client_times_out_and_nothing_leaks() -> None:
    """A raw client's request waits for an answer that never comes: it hits its own timeout,
    the connection pair stays open while the client does, and once it closes, the proxy and the
    upstream side are both closed. A librdkafka producer gets its own delivery timeout, and after
    it is destroyed the proxy holds nothing."""
    from confluent_kafka import KafkaError, Producer

    with SilentUpstream() as upstream:
        config = proxy_config(upstream.bootstrap, upstream={"connect_timeout_ms": 1000})
        with run_proxy(config=config) as proxy:
            client = RawKafkaClient(proxy.host, proxy.port)
            try:
                client.send_frame(api_versions_v0_request(1))
                with pytest.raises(RawClientError, match="timed out"):
                    client.recv_frame(timeout=2)
                stats = proxy.stats()
                assert (stats.client_connections, stats.upstream_connections) == (1, 1)
                assert upstream.talking == 1
            finally:
                client.close()
            assert_idle(proxy)
            wait_for(lambda: upstream.talking == 0, 10, "the upstream side to be closed")

            results: list[Any] = []
            producer = Producer(
                {
                    "bootstrap.servers": proxy.bootstrap,
                    "message.timeout.ms": 3000,
                    "socket.timeout.ms": 1000,
                    "api.version.request.timeout.ms": 1000,
                    "error_cb": lambda err: None,
                }
            )
            producer.produce("never", b"v", partition=0, on_delivery=lambda e, m: results.append(e))
            assert producer.flush(15) == 0
            assert [e.code() for e in results] == [KafkaError._MSG_TIMED_OUT]
            del producer
            assert_idle(proxy)
            wait_for(lambda: upstream.talking == 0, 10, "the upstream side to be closed")


# ---- an upstream that answers garbage ----


@pytest.mark.parametrize("variant", sorted(GARBAGE))
def test_garbage_from_upstream_closes_only_that_client(variant: str) -> None:
    """The victim's connection is closed; a client connected before keeps getting answers on its
    own connection pair, a new client is served, and nothing is left behind."""
    with GarbageUpstream(variant) as upstream:
        config = proxy_config(upstream.bootstrap, upstream={"connect_timeout_ms": 1000})
        with run_proxy(config=config) as proxy:
            healthy = RawKafkaClient(proxy.host, proxy.port)
            try:
                answer = healthy.request(api_versions_v0_request(1, "healthy"))
                assert parse_api_versions_v0_response(answer)[:2] == (1, 0)
                with RawKafkaClient(proxy.host, proxy.port) as victim:
                    if variant == "undecodable-metadata":
                        body = make_request(METADATA, 1, 5, "victim", metadata_v1_all())
                        victim.send_frame(encode_request(body))
                    else:
                        victim.send_frame(api_versions_v0_request(5, "victim"))
                    assert victim.is_closed_by_peer(timeout=5), "victim not disconnected"
                answer = healthy.request(api_versions_v0_request(2, "healthy"))
                assert parse_api_versions_v0_response(answer)[:2] == (2, 0)
            finally:
                healthy.close()
            with RawKafkaClient(proxy.host, proxy.port) as fresh:
                answer = fresh.request(api_versions_v0_request(3, "fresh"))
                assert parse_api_versions_v0_response(answer)[:2] == (3, 0)
            assert_idle(proxy)


def metadata_v1_all() -> Any:
    from kio.schema.metadata.v1.request import MetadataRequest

    return MetadataRequest(topics=None)


# ---- clients that vanish mid-request ----


@pytest.mark.parametrize("ending", ["close", "reset"])
def test_client_vanishing_inside_a_frame_leaves_nothing_behind(
    proxy: RunningProxy, topic: str, ending: str
) -> None:
    """A client sends a whole request and then part of a 256 KiB Produce request and goes
    away (FIN or RST): the proxy frees the pair, and the partial record is never written."""
    request = produce_request(9, 2, topic, [(b"k", b"partial" * 36_000)])
    whole = produce_request(9, 1, topic, [(b"k", b"whole")])
    for _ in range(10):
        sock = socket.create_connection((proxy.host, proxy.port))
        sock.sendall(frame(whole) + frame(request)[: len(request) // 2])
        time.sleep(0.05)
        if ending == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    assert_idle(proxy)
    read = read_values(proxy.bootstrap, topic, set(), timeout=5)
    assert b"partial" * 36_000 not in read


PRODUCER_SCRIPT = """
import sys, time
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1], "acks": "all", "linger.ms": 1})
n = 0
print("started", flush=True)
while True:
    p.produce(sys.argv[2], f"k{n}".encode(), partition=0)
    p.poll(0)
    n += 1
    time.sleep(0.001)
"""


def test_producer_process_killed_mid_stream_leaves_nothing_behind(
    proxy: RunningProxy, tansu: Broker
) -> None:
    """A librdkafka producer process is SIGKILLed while it streams through the proxy (the OS
    closes its sockets): the proxy frees its connections, and the next producer is served."""
    topic = create_topic(tansu.bootstrap, unique_topic_name("killed"))
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", PRODUCER_SCRIPT, proxy.bootstrap, topic],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == b"started\n"
            wait_for(lambda: proxy.stats().client_connections >= 1, 10, "the producer's link")
            time.sleep(0.5)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
        assert_idle(proxy)
    fresh = create_topic(tansu.bootstrap, unique_topic_name("after"))
    assert produce_and_consume(proxy.bootstrap, fresh) == [f"v{n}".encode() for n in range(5)]


# ---- half-open connections ----


@contextlib.contextmanager
def silent_client(proxy: RunningProxy, payload: bytes, rcvbuf: int | None = None) -> Iterator[Any]:
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((proxy.host, proxy.port))
    try:
        sock.sendall(payload)
        yield sock
    finally:
        sock.close()


@pytest.mark.parametrize("ending", ["close", "reset", "shutdown-write"])
def test_half_open_client_is_held_until_the_os_reports_it(
    proxy: RunningProxy, topic: str, ending: str
) -> None:
    """A client sends requests, then neither reads nor closes. The proxy cannot tell it from a
    slow client, so it keeps the pair (with its answers queued) for as long as the socket lives.
    When the peer's end is reported (FIN or RST), the proxy frees everything and keeps serving.
    After a half-close of the client's sending side, the client can still read: the proxy ends
    the connection (as a broker does on end of input) and frees everything.

    What loopback cannot show: a peer that disappears without any FIN or RST (power loss, a
    dropped route). The kernel always sends one when a loopback socket or its process goes, so
    that case is left to the proxy's idle timeout and TCP keepalive, which this test does not
    exercise."""
    with RawKafkaClient(proxy.host, proxy.port) as setup:
        setup.request(produce_request(9, 1, topic, [(b"k", b"x" * 50_000)] * 4))
        topic_id = topic_id_of(setup, topic)
    requests = b"".join(
        frame(fetch_request(16, 100 + n, topic_id, max_wait_ms=100)) for n in range(50)
    )
    assert_idle(proxy)
    with silent_client(proxy, requests, rcvbuf=16 * 1024) as sock:
        time.sleep(1.0)
        stats = proxy.stats()
        assert (stats.client_connections, stats.upstream_connections) == (1, 1)
        if ending == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        elif ending == "close":
            sock.close()
        else:  # a half-close: the client still reads what is owed, then sees the end
            sock.shutdown(socket.SHUT_WR)
            reader = RawKafkaClient.__new__(RawKafkaClient)
            reader.__dict__.update(host=proxy.host, port=proxy.port, _sock=sock, _buf=bytearray())
            reader._closed = False
            answers = 0
            with contextlib.suppress(RawClientError):
                while answers < 50:
                    reader.recv_frame(timeout=10)
                    answers += 1
            assert reader.is_closed_by_peer(timeout=10)
            print(f"\nhalf-close: {answers} of 50 answers delivered before the proxy closed")
        assert_idle(proxy)
    assert_serves(proxy)
    assert_idle(proxy)


def test_many_half_open_clients_then_reset_leave_nothing(proxy: RunningProxy, topic: str) -> None:
    """Forty clients each leave a Produce and a Metadata request unread and stay connected, then
    all vanish with a reset at once: every pair is freed."""
    from tests.harness.requests import metadata_request

    payload = frame(produce_request(9, 1, topic, [(b"k", b"v")])) + frame(metadata_request(12, 2))
    socks = []
    try:
        for _ in range(40):
            sock = socket.create_connection((proxy.host, proxy.port))
            sock.sendall(payload)
            socks.append(sock)
        wait_for(lambda: proxy.stats().client_connections == 40, 10, "40 connections")
        time.sleep(0.3)
        assert proxy.stats().upstream_connections == 40
    finally:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
    assert_idle(proxy)
    assert_serves(proxy)
