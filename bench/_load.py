"""The raw Kafka client of the network benchmarks: pipelined Produce requests on asyncio (uvloop)
over many connections in client processes, each answer checked, and the checks of what the
broker stored afterwards; the readings of the proxy's metrics and of CPU they are judged by."""

from __future__ import annotations

import asyncio
import collections
import multiprocessing
import re
import socket
import time
import urllib.request
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import psutil
import uvloop
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from bench._relays import ProxyProcess
from kvproxy.protocol.messages import decode_response
from tests.harness.requests import produce_request

PRODUCE = 0

PRODUCE_VERSION = 9
"""Flexible Produce (kafka-python sends v9, librdkafka 2.16 v10: the same layout for this use)."""

CLIENT_ID = "kvbench"


class BenchmarkError(RuntimeError):
    """A request was refused, lost or answered wrongly: the benchmark failed, no figure."""


def produce_payload(
    topic: str, value: bytes, *, key: bytes | None = b"k", correlation_id: int = 0, acks: int = -1
) -> bytes:
    """One Produce v9 request (no size prefix) of one batch of one record for partition 0."""
    return produce_request(
        PRODUCE_VERSION, correlation_id, topic, [(key, value)], acks=acks, client_id=CLIENT_ID
    )


class ProduceTemplate:
    """A framed Produce request whose correlation id is patched in per send (no encoding cost)."""

    def __init__(self, topic: str, value: bytes) -> None:
        payload = produce_payload(topic, value)
        self._head = len(payload).to_bytes(4, "big") + payload[:4]  # size, api key, version
        self._tail = payload[8:]  # after the correlation id
        self.frame_bytes = len(payload) + 4

    def frame(self, correlation_id: int) -> bytes:
        return self._head + correlation_id.to_bytes(4, "big") + self._tail


class AnswerCheck:
    """Checks a Produce v9 answer for one partition: correlation id, error code 0, same layout.

    The first answer is decoded in full; later ones must have its length (no error message, no
    record errors) and error code 0 at the same place, which costs a few bytes' comparison.
    """

    def __init__(self, topic: str) -> None:
        name = len(topic.encode())
        if name > 126:
            raise ValueError("topic name too long for the fixed-layout check")
        # correlation id, header tags, responses count, name, partitions count, index
        self._error_at = 4 + 1 + 1 + 1 + name + 1 + 4
        self._offset_at = self._error_at + 2
        self._length = -1

    def offset(self, payload: bytes, correlation_id: int) -> int:
        """The base offset of an answer that is a success, else BenchmarkError."""
        if (
            len(payload) != self._length
            or payload[self._error_at : self._offset_at] != b"\0\0"
            or int.from_bytes(payload[:4], "big") != correlation_id
        ):
            return self._slow(payload, correlation_id)
        return int.from_bytes(payload[self._offset_at : self._offset_at + 8], "big", signed=True)

    def _slow(self, payload: bytes, correlation_id: int) -> int:
        try:
            response = decode_response(payload, PRODUCE, PRODUCE_VERSION)
        except Exception as exc:
            raise BenchmarkError(f"undecodable Produce answer: {exc!r}") from exc
        got = response.header.correlation_id
        if got != correlation_id:
            raise BenchmarkError(f"answer for correlation id {got}, expected {correlation_id}")
        parts = [p for topic in response.body.responses for p in topic.partition_responses]
        if len(parts) != 1 or parts[0].error_code != 0 or parts[0].record_errors:
            raise BenchmarkError(f"Produce refused: {response.body}")
        base = int(parts[0].base_offset)
        if self._length < 0:
            stored = int.from_bytes(payload[self._offset_at : self._offset_at + 8], "big")
            if stored != base:
                raise BenchmarkError("unexpected Produce answer layout")
            self._length = len(payload)
            return base
        raise BenchmarkError(f"Produce answer of an unexpected shape: {response.body}")


def leader_address(bootstrap: str, topic: str) -> tuple[str, int]:
    """Where partition 0's leader is reached from `bootstrap` (through the proxy: its node port)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(topic, timeout=10)
    leader = metadata.topics[topic].partitions[0].leader
    broker = metadata.brokers[leader]
    return str(broker.host), int(broker.port)


def check_stored(bootstrap: str, topic: str, expected: int) -> str:
    """Fail unless partition 0 of `topic` holds offsets 0 .. expected - 1 (asked of the broker).

    The high watermark says so in one request. Tansu 0.6 sometimes answers ListOffsets with fewer
    than the records it holds and acknowledged (seen: 1 to 10 short; they can all be read back):
    then the records from its watermark on are read, and they must be exactly the missing ones.
    Returns how it was checked.
    """
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "kvbench-check", "enable.auto.commit": False}
    )
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        if high == expected:
            return "high watermark"
        if high > expected or high < 0 or expected == 0:
            raise BenchmarkError(f"{topic}: {expected} records acknowledged, high watermark {high}")
        consumer.assign([TopicPartition(topic, 0, high)])
        found: list[int] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                if found and found[-1] >= expected - 1:
                    break
                continue
            if message.error():
                raise BenchmarkError(f"{topic}: reading back records: {message.error()}")
            found.append(int(message.offset() or 0))
        if found != list(range(high, expected)):
            raise BenchmarkError(
                f"{topic}: {expected} records acknowledged, high watermark {high}, read back "
                f"{len(found)} records from it ({found[:3]} .. {found[-3:]})"
            )
        return f"high watermark {expected - high} short, the rest read back"
    finally:
        consumer.close()


def check_offsets(offsets: array[int], expected: int) -> None:
    """The acknowledged base offsets are `expected` distinct, consecutive offsets from 0."""
    if len(offsets) != expected or sorted(offsets) != list(range(expected)):
        raise BenchmarkError(
            f"{expected} requests answered, but their offsets are not 0 .. {expected - 1} "
            f"({len(set(offsets))} distinct, from {min(offsets, default=-1)} to "
            f"{max(offsets, default=-1)})"
        )


def metrics_url(proxy: ProxyProcess) -> str:
    """The proxy's /metrics address, from its log (`start_proxy` asks for port 0)."""
    log = proxy.config_path.parent / "kvproxy.log"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = re.search(r"metrics, /healthz and /readyz on (http://\S+)", log.read_text())
        if found:
            return found.group(1) + "/metrics"
        time.sleep(0.1)
    raise BenchmarkError("the proxy log does not say where its metrics are")


def metric(url: str, name: str, labels: dict[str, str] | None = None) -> float:
    """Sum of one Prometheus series (every sample of `name` whose labels include `labels`)."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    total = 0.0
    for line in text.splitlines():
        found = re.match(rf"{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if found is None:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', found.group(1) or ""))
        if all(have.get(k) == v for k, v in (labels or {}).items()):
            total += float(found.group(2))
    return total


def cpu_seconds(process: psutil.Process) -> float:
    """User + system CPU seconds of one process (the broker) so far."""
    times = process.cpu_times()
    return float(times.user + times.system)


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, int(fraction * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


class Pipeline(asyncio.Protocol):
    """One connection keeping `depth` Produce requests in flight until `stop_at`."""

    def __init__(self, template: ProduceTemplate, check: AnswerCheck, depth: int) -> None:
        self.template = template
        self.check = check
        self.depth = depth
        self.latencies: array[float] | None = None
        self.sent_at: collections.deque[float] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.sent = 0
        self.answered = 0
        self.in_window = 0
        self.last_offset = -1
        self.offsets = array("q")
        self.stop_at = 0.0
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def run(self, stop_at: float, *, keep_latencies: bool = False) -> asyncio.Future[None]:
        """Send until `stop_at` (time.perf_counter), then let the last answers come in."""
        self.stop_at = stop_at
        self.in_window = 0
        self.latencies = array("d") if keep_latencies else None
        self.done = asyncio.get_running_loop().create_future()
        for _ in range(self.depth):
            self._send()
        return self.done

    def _send(self) -> None:
        self.sent += 1
        self.sent_at.append(time.perf_counter())
        assert self.transport is not None
        self.transport.write(self.template.frame(self.sent))

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        buffer = self.buffer
        buffer += data
        pos = 0
        try:
            while len(buffer) - pos >= 4:
                end = pos + 4 + int.from_bytes(buffer[pos : pos + 4], "big")
                if end > len(buffer):
                    break
                payload = bytes(buffer[pos + 4 : end])
                pos = end
                self.answered += 1
                offset = self.check.offset(payload, self.answered)
                if offset <= self.last_offset:
                    raise BenchmarkError(f"offset {offset} after {self.last_offset}")
                self.last_offset = offset
                self.offsets.append(offset)
                sent_at = self.sent_at.popleft()
                if now <= self.stop_at:
                    self.in_window += 1
                    if self.latencies is not None:
                        self.latencies.append(now - sent_at)
                    self._send()
                elif not self.sent_at and not self.done.done():
                    self.done.set_result(None)
        except Exception as exc:  # any failure ends the run, with its reason
            if not self.done.done():
                self.done.set_exception(exc)
            assert self.transport is not None
            self.transport.abort()
        del buffer[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(
                BenchmarkError(f"connection closed with {len(self.sent_at)} answers missing: {exc}")
            )


@dataclass(frozen=True)
class LoadSpec:
    """What one client process does: its share of the connections, how, for how long."""

    host: str
    port: int
    topic: str
    connections: int
    depth: int
    record_bytes: int
    seconds: float
    keep_latencies: bool


async def _load(spec: LoadSpec, control: Connection) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    template = ProduceTemplate(spec.topic, b"v" * spec.record_bytes)
    check = AnswerCheck(spec.topic)
    pipes = []
    for _ in range(spec.connections):
        _, pipe = await loop.create_connection(
            lambda: Pipeline(template, check, spec.depth), spec.host, spec.port
        )
        pipes.append(pipe)
    # warm-up: one round of requests on every connection (the first answer is decoded in full)
    await asyncio.gather(*(pipe.run(0.0) for pipe in pipes))
    control.send("ready")
    control.recv()  # go
    cpu0 = time.process_time()
    started = time.perf_counter()
    stop_at = started + spec.seconds
    await asyncio.gather(*(p.run(stop_at, keep_latencies=spec.keep_latencies) for p in pipes))
    finished = time.perf_counter()
    cpu = time.process_time() - cpu0
    for pipe in pipes:
        assert pipe.transport is not None
        pipe.transport.close()
    latencies, offsets = array("d"), array("q")
    for pipe in pipes:
        offsets.extend(pipe.offsets)
        if pipe.latencies is not None:
            latencies.extend(pipe.latencies)
    return {
        "in_window": sum(p.in_window for p in pipes),
        "answered": sum(p.answered for p in pipes),
        "window_seconds": stop_at - started,
        "drain_seconds": finished - stop_at,
        "cpu_seconds": cpu,
        "latencies": latencies.tobytes(),
        "offsets": offsets.tobytes(),
    }


def _load_process(spec: LoadSpec, control: Connection) -> None:
    """A client process: connect, say ready, run on "go", send back the figures (or the error)."""
    uvloop.install()
    try:
        result = asyncio.run(_load(spec, control))
    except BaseException as exc:  # the parent fails the run with it
        control.send({"error": f"{type(exc).__name__}: {exc}"})
        return
    control.send(result)


@dataclass
class LoadResult:
    """What every client process of one run did."""

    requests: int  # answered within the window
    answered: int  # all answered, the last in-flight ones included
    seconds: float
    client_cpu_seconds: float
    client_processes: int
    latencies: array[float] = field(default_factory=lambda: array("d"))
    offsets: array[int] = field(default_factory=lambda: array("q"))

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def run_load(
    host: str,
    port: int,
    topic: str,
    *,
    connections: int,
    depth: int,
    seconds: float,
    record_bytes: int,
    processes: int,
    keep_latencies: bool = False,
    while_running: Callable[[], None] | None = None,
) -> LoadResult:
    """`connections` pipelined connections over `processes` client processes, for `seconds`.

    `while_running` is called about every 0.2 s while the clients send (say, to sample RSS).
    """
    processes = max(1, min(processes, connections))
    context = multiprocessing.get_context("spawn")
    controls: list[Connection] = []
    workers = []
    for index in range(processes):
        share = connections // processes + (1 if index < connections % processes else 0)
        spec = LoadSpec(host, port, topic, share, depth, record_bytes, seconds, keep_latencies)
        mine, theirs = context.Pipe()
        worker = context.Process(target=_load_process, args=(spec, theirs), daemon=True)
        worker.start()
        controls.append(mine)
        workers.append(worker)
    try:
        for control in controls:
            if not control.poll(60):
                raise BenchmarkError("a client process did not get ready")
            message = control.recv()
            if message != "ready":
                raise BenchmarkError(f"client process failed: {message['error']}")
        for control in controls:
            control.send("go")
        results: list[dict[str, Any]] = []
        deadline = time.monotonic() + seconds + 60
        pending = list(controls)
        while pending:
            if time.monotonic() > deadline:
                raise BenchmarkError("client processes did not finish")
            for control in list(pending):
                if control.poll(0.2 / len(pending)):
                    results.append(control.recv())
                    pending.remove(control)
            if while_running is not None:
                while_running()
    finally:
        for worker in workers:
            worker.join(10)
            if worker.is_alive():
                worker.kill()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise BenchmarkError("; ".join(errors))
    latencies, offsets = array("d"), array("q")
    for r in results:
        latencies.frombytes(r["latencies"])
        offsets.frombytes(r["offsets"])
    return LoadResult(
        requests=sum(r["in_window"] for r in results),
        answered=sum(r["answered"] for r in results),
        seconds=max(r["window_seconds"] for r in results),
        client_cpu_seconds=sum(r["cpu_seconds"] for r in results),
        client_processes=processes,
        latencies=latencies,
        offsets=offsets,
    )
