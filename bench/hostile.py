"""Hostile input: what one request can make `kvproxy serve` hold and how long it holds the loop.

Each scenario gets a fresh Tansu broker and a fresh `kvproxy serve` (default checks; the topic
`hostile-compacted` is declared `compacted: true`), so every peak belongs to one scenario. While
the hostile client sends its request, a second client ("the other client", its own connection
from 127.0.0.2) sends one small Produce at a time (one 100-byte record, acks=1) and times each
answer. The figures:

- proxy peak RSS: VmHWM of the serve process (`/proc/PID/status`), and how far above its idle
  RSS (read just before the hostile request) that is. VmRSS is also sampled every 10 ms: when it
  passes the memory guard (`--memory-guard-gib`, default 8) the proxy is killed with SIGKILL and
  the row says so.
- event loop blocked: the other client's longest wait during the hostile request (while the
  loop is held it answers nobody, so this is how long it was held, plus the broker's time), and
  `kvproxy_event_loop_lag_max_seconds` / `kvproxy_event_loop_lag_seconds` from /metrics when
  the proxy has them ("n/a" when it has not).
- the other client's p50 / p99 / max over the requests it had in flight during the hostile
  request (from the first byte sent to the last answer read), and its p50 before it.
- what the hostile client got: the error codes of the answer's partitions, or "connection
  closed", and the answer's size; "well formed" when every answer decodes, has the request's
  correlation id and names every partition sent.

Scenarios (`--scenarios` takes their names, comma-separated; all by default):

    zstd-5, zstd-20, zstd-60  N partitions, each one zstd batch of one record of 60 MiB of zeros
                              (about 2 KB compressed)
    gzip-bomb                 one partition, one gzip batch of 60 MiB of zeros (about 60 KB)
    compacted-null-key        60 partitions of 15,000 records of 4 KiB (zstd, keys key-0..,
                              the last key null) on a compacted topic, sent 3 times: once, then
                              twice back to back unless that would pass the memory guard
    snappy-1gib               one partition, one xerial snappy batch of 1,024 records of 1 MiB
                              of zeros (1 GiB, about 50 MB compressed)
    legacy-gzip               Produce v2, one magic 1 gzip wrapper of 2,000,000 inner messages
    bad-timestamps            one zstd batch of 999,999 records dated a day ahead
    size-prefixes             1,000 connections that each send only a size prefix of 50 MiB,
                              held for 5 s
    target                    the zstd-60 request 10 times back to back on one connection

Everything is bounded: each scenario has a timeout (`--timeout` overrides it), after which the
proxy is stopped; the memory guard kills it. `--smoke` runs every scenario at tiny sizes (a
check that the bench works, not a measurement).

    .venv/bin/python bench/hostile.py [--scenarios zstd-5,target] [--json out.json]
        [--memory-guard-gib 8] [--timeout SECONDS] [--smoke]

The proxy runs from this file's checkout (`python -m kvproxy.cli serve` in its root); the output
names the file its `kvproxy.proxy.serve.server` module is read from and the commit.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import importlib
import json
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import cramjam
import crc32c
import psutil
from kio.static.primitive import Records, i16, i32, i32Timedelta

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, create_topic, machine, start_proxy, tansu, write_results
from connections import raise_fd_limit
from request_rate import AnswerCheck, BenchmarkError, metrics_url, percentile, produce_payload

from kvproxy.protocol import legacy_messages
from kvproxy.protocol.compression import Codec, compress
from kvproxy.protocol.error_codes import error_name
from kvproxy.protocol.messages import decode_response, encode_request, make_request
from kvproxy.protocol.records import build_batch

KIB, MIB, GIB = 2**10, 2**20, 2**30
PRODUCE = 0
CLIENT_ID = "kvbench-hostile"
TOPIC = "hostile"
COMPACTED_TOPIC = "hostile-compacted"
OTHER_TOPIC = "other"
OTHER_HOST = "127.0.0.2"
"""The other client's source address: the size-prefix scenario takes all 1,000 connections
`limits.max_connections_per_client` allows one address."""
_TIMEOUT = datetime.timedelta(seconds=30)
RULES = f'topics:\n  - match: "{COMPACTED_TOPIC}"\n    compacted: true\n'
LAG_MAX = "kvproxy_event_loop_lag_max_seconds"
LAG_HISTOGRAM = "kvproxy_event_loop_lag_seconds"
SAMPLE_SECONDS = 0.01
MAX_ANSWER = GIB
"""An answer frame larger than this ends the read (the client would not take it either)."""


# ---- sizes ----


@dataclass(frozen=True)
class Sizes:
    """How big each scenario is; `SMOKE` shrinks every one of them."""

    inflate: int = 60 * MIB
    partitions: tuple[int, int, int] = (5, 20, 60)
    compacted_partitions: int = 60
    compacted_records: int = 15_000
    compacted_value: int = 4 * KIB
    compacted_sends: int = 3
    snappy_records: int = 1024
    snappy_value: int = MIB
    legacy_messages: int = 2_000_000
    bad_timestamps: int = 999_999
    prefixes: int = 1000
    prefix_size: int = 50 * MIB
    prefix_hold: float = 5.0
    target_repeats: int = 10
    timeout_scale: float = 1.0


FULL = Sizes()
SMOKE = Sizes(
    inflate=MIB,
    partitions=(2, 3, 4),
    compacted_partitions=3,
    compacted_records=200,
    snappy_records=8,
    legacy_messages=20_000,
    bad_timestamps=1000,
    prefixes=20,
    prefix_hold=0.5,
    target_repeats=3,
    timeout_scale=0.2,
)


# ---- batches ----


def zero_value_batch(codec: Codec, value_bytes: int) -> bytes:
    """One magic 2 batch of one record (no key) whose value is `value_bytes` zeros."""
    return build_batch([(None, bytes(value_bytes), None, None)], codec=codec)


def compacted_batch(records: int, value_bytes: int) -> bytes:
    """A zstd batch of `records` records (keys key-0, key-1, ..., the last one null)."""
    value = bytes(value_bytes)
    rows: list[tuple[bytes | None, bytes, None, None]] = [
        (b"key-%d" % index, value, None, None) for index in range(records - 1)
    ]
    rows.append((None, value, None, None))
    return build_batch(rows, codec=Codec.ZSTD)


def bad_timestamp_batch(records: int) -> bytes:
    """A zstd batch of `records` empty records, all dated a day ahead (`timestamps` allows 1 h)."""
    ahead = int(time.time() * 1000) + 86_400_000
    return build_batch([(None, b"", None, ahead)] * records, codec=Codec.ZSTD)


def _zigzag_varint(value: int) -> bytes:
    """Kafka's signed varint (zigzag, then 7 bits a byte)."""
    encoded = (value << 1) ^ (value >> 63)
    out = bytearray()
    while encoded >= 0x80:
        out.append((encoded & 0x7F) | 0x80)
        encoded >>= 7
    out.append(encoded)
    return bytes(out)


class XerialWriter:
    """Xerial snappy framing written as it comes, so 1 GiB of zeros is never held: blocks of
    32 KiB of input, each compressed alone (as `kvproxy.protocol.compression.compress` frames
    them), an
    all-zero block compressed once."""

    BLOCK = 32 * KIB
    HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)

    def __init__(self) -> None:
        self.parts: list[bytes] = [self.HEADER]
        self.plain_bytes = 0
        self._pending = bytearray()
        zero = bytes(cramjam.snappy.compress_raw(bytes(self.BLOCK)))
        self._zero_block = struct.pack(">i", len(zero)) + zero

    def write(self, data: bytes) -> None:
        self.plain_bytes += len(data)
        self._pending += data
        while len(self._pending) >= self.BLOCK:
            self._emit(bytes(self._pending[: self.BLOCK]))
            del self._pending[: self.BLOCK]

    def zeros(self, count: int) -> None:
        if self._pending:
            head = min(count, self.BLOCK - len(self._pending))
            self.write(bytes(head))
            count -= head
        whole, rest = divmod(count, self.BLOCK)
        self.parts.extend([self._zero_block] * whole)
        self.plain_bytes += whole * self.BLOCK
        self.write(bytes(rest))

    def finish(self) -> bytes:
        if self._pending or len(self.parts) == 1:
            self._emit(bytes(self._pending))
            self._pending.clear()
        return b"".join(self.parts)

    def _emit(self, block: bytes) -> None:
        compressed = bytes(cramjam.snappy.compress_raw(block))
        self.parts.append(struct.pack(">i", len(compressed)) + compressed)


def snappy_zero_batch(records: int, value_bytes: int) -> bytes:
    """A magic 2 xerial snappy batch of `records` records of `value_bytes` zeros, built by hand
    so that its plain bytes (`records` x `value_bytes`) are never held at once."""
    writer = XerialWriter()
    for index in range(records):
        head = b"\0" + _zigzag_varint(0) + _zigzag_varint(index) + _zigzag_varint(-1)
        head += _zigzag_varint(value_bytes)
        length = len(head) + value_bytes + 1  # + the header count after the value
        writer.write(_zigzag_varint(length) + head)
        writer.zeros(value_bytes)
        writer.write(_zigzag_varint(0))
    body = writer.finish()
    now = int(time.time() * 1000)
    header = struct.pack(
        ">qiibIhiqqqhii",
        0,  # base offset
        49 + len(body),  # batch length: the 61-byte header less offset and length
        -1,  # partition leader epoch
        2,  # magic
        0,  # crc, below
        int(Codec.SNAPPY),  # attributes
        records - 1,  # last offset delta
        now,
        now,
        -1,  # producer id
        -1,  # producer epoch
        -1,  # base sequence
        records,
    )
    crc = crc32c.crc32c(header[21:] + body)
    return header[:17] + struct.pack(">I", crc) + header[21:] + body


def _legacy_message(offset: int, attributes: int, timestamp: int, value: bytes | None) -> bytes:
    """One magic 1 message: offset, size, CRC32, magic, attributes, timestamp, null key, value."""
    body = struct.pack(">bbqi", 1, attributes, timestamp, -1)
    body += struct.pack(">i", -1) if value is None else struct.pack(">i", len(value)) + value
    return struct.pack(">qiI", offset, 4 + len(body), zlib.crc32(body)) + body


def legacy_gzip_wrapper(messages: int) -> bytes:
    """A magic 1 gzip wrapper holding `messages` inner messages with empty values (34 bytes
    each; inner offsets relative, the wrapper's the last one, as the Java producer writes)."""
    now = int(time.time() * 1000)
    tail = _legacy_message(0, 0, now, b"")[8:]  # everything but the offset is the same
    plain = b"".join([struct.pack(">q", index) + tail for index in range(messages)])
    return _legacy_message(messages - 1, int(Codec.GZIP), now, compress(Codec.GZIP, plain))


# ---- requests and answers ----


def produce_request(topic: str, batches: Sequence[bytes], *, version: int = 9) -> bytes:
    """A Produce request (acks=1, no size prefix, correlation id 0): partition i holds
    batches[i]."""
    if version <= 2:
        legacy = legacy_messages
        topic_data: Any = legacy.TopicProduceData(
            name=topic,  # type: ignore[arg-type]
            partition_data=tuple(
                legacy.PartitionProduceData(index=i32(i), records=cast(Records, b))
                for i, b in enumerate(batches)
            ),
        )
        body: Any = legacy.ProduceRequestV2(
            acks=i16(1), timeout=i32Timedelta.parse(_TIMEOUT), topic_data=(topic_data,)
        )
    else:
        schema = importlib.import_module(f"kio.schema.produce.v{version}.request")
        topic_data = schema.TopicProduceData(
            name=topic,
            partition_data=tuple(
                schema.PartitionProduceData(index=i32(i), records=b) for i, b in enumerate(batches)
            ),
        )
        body = schema.ProduceRequest(
            transactional_id=None,
            acks=i16(1),
            timeout=i32Timedelta.parse(_TIMEOUT),
            topic_data=(topic_data,),
        )
    return encode_request(make_request(PRODUCE, version, 0, CLIENT_ID, body))


def framed(payload: bytes, correlation_id: int) -> bytes:
    """`payload` with its size prefix and `correlation_id` patched in."""
    return (
        len(payload).to_bytes(4, "big")
        + payload[:4]
        + struct.pack(">i", correlation_id)
        + (payload[8:])
    )


@dataclass(frozen=True)
class Answer:
    """What one Produce answer said, per partition, and whether it was what the request asked."""

    size: int
    codes: dict[int, int]
    record_errors: int
    well_formed: bool
    problem: str = ""
    message: str = ""

    def said(self) -> str:
        if not self.well_formed:
            return f"malformed answer ({self.problem})"
        parts = [f"{n} x {error_name(code)} ({code})" for code, n in sorted(self.codes.items())]
        text = ", ".join(parts)
        if self.record_errors:
            text += f", {self.record_errors:,} record errors"
        return text


def read_answer(
    payload: bytes, version: int, correlation_id: int, topic: str, count: int
) -> Answer:
    """Decode a Produce answer and check it answers partitions 0..count-1 of `topic`."""
    try:
        response = decode_response(payload, PRODUCE, version)
    except Exception as exc:  # a malformed answer is a finding, not a crash
        return Answer(len(payload), {}, 0, False, f"does not decode: {exc!r}"[:200])
    codes: collections.Counter[int] = collections.Counter()
    record_errors = 0
    message = ""
    seen: list[tuple[str, int]] = []
    for topic_answer in response.body.responses:
        for part in topic_answer.partition_responses:
            seen.append((str(topic_answer.name), int(part.index)))
            codes[int(part.error_code)] += 1
            errors = getattr(part, "record_errors", ())
            record_errors += len(errors)
            if not message:
                message = str(getattr(part, "error_message", None) or "")
    problem = ""
    if response.header.correlation_id != correlation_id:
        problem = f"correlation id {response.header.correlation_id}, sent {correlation_id}"
    elif sorted(seen) != [(topic, i) for i in range(count)]:
        problem = f"answers {len(seen)} partitions, {count} were sent"
    return Answer(len(payload), dict(codes), record_errors, not problem, problem, message[:160])


# ---- what is measured ----


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of `pid` in bytes (empty once it is gone)."""
    found: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                name, value = line.split(":", 1)
                found[name] = int(value.split()[0]) * KIB
    return found


class RssSampler(threading.Thread):
    """Samples VmRSS every 10 ms; SIGKILLs the process when it passes `guard` bytes."""

    def __init__(self, pid: int, guard: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.guard = guard
        self.peak = 0
        self.tripped = 0
        self.hwm = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            status = proc_status(self.pid)
            rss = status.get("VmRSS", 0)
            self.hwm = max(self.hwm, status.get("VmHWM", 0))
            self.peak = max(self.peak, rss)
            if rss > self.guard and not self.tripped:
                self.tripped = rss
                with contextlib.suppress(OSError):
                    os.kill(self.pid, signal.SIGKILL)
            self._halt.wait(SAMPLE_SECONDS)

    def rss(self) -> int:
        return proc_status(self.pid).get("VmRSS", 0)

    def stop(self) -> int:
        """Stop sampling; the peak: VmHWM while the process lives, else the sampled peak."""
        self._halt.set()
        self.join(5)
        self.hwm = max(self.hwm, proc_status(self.pid).get("VmHWM", 0))
        return max(self.hwm, self.peak)


class OtherClient(threading.Thread):
    """One small Produce (acks=1) at a time on its own connection; (sent, answered) per request."""

    def __init__(self, port: int, timeout: float) -> None:
        super().__init__(daemon=True)
        payload = produce_payload(OTHER_TOPIC, b"o" * 100, acks=1)
        self._payload = payload
        self._check = AnswerCheck(OTHER_TOPIC)
        self.sock = socket.socket()
        self.sock.bind((OTHER_HOST, 0))
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.times: list[tuple[float, float]] = []
        self.error = ""
        self.in_flight_since = 0.0
        self._halt = threading.Event()

    def run(self) -> None:
        correlation_id = 0
        try:
            while not self._halt.is_set():
                correlation_id += 1
                frame = framed(self._payload, correlation_id)
                self.in_flight_since = sent = time.perf_counter()
                self.sock.sendall(frame)
                head = self._read(4)
                answer = self._read(int.from_bytes(head, "big"))
                self.times.append((sent, time.perf_counter()))
                self.in_flight_since = 0.0
                self._check.offset(answer, correlation_id)
        except (OSError, BenchmarkError) as exc:
            if not self._halt.is_set():
                self.error = str(exc) or type(exc).__name__

    def _read(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise BenchmarkError("connection closed by the proxy")
            data += chunk
        return bytes(data)

    def stop(self) -> None:
        self._halt.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.join(10)
        self.sock.close()

    def latencies(self, start: float, end: float) -> list[float]:
        """Seconds of each request in flight at some time in [start, end], in order sent."""
        out = [done - sent for sent, done in self.times if done >= start and sent <= end]
        if self.in_flight_since and self.in_flight_since <= end:  # never answered
            out.append(time.perf_counter() - self.in_flight_since)
        return out


def fetch_metrics(url: str, timeout: float) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return str(answer.read().decode())
    except (OSError, ValueError):
        return None


def lag_figures(text: str | None) -> tuple[float | None, str | None]:
    """(the lag max gauge, the histogram's bound on the longest lag) when the proxy has them."""
    if text is None:
        return None, None
    gauge: float | None = None
    buckets: list[tuple[float, float]] = []
    count = 0.0
    for line in text.splitlines():
        if line.startswith(LAG_MAX + " "):
            gauge = float(line.split()[1])
        elif line.startswith(LAG_HISTOGRAM + "_bucket{"):
            bound_text = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(bound_text), float(line.split()[-1])))
        elif line.startswith(LAG_HISTOGRAM + "_count"):
            count = float(line.split()[-1])
    if not buckets or not count:
        return gauge, None
    buckets.sort()
    finite = [le for le, _ in buckets if le != float("inf")]
    for le, cumulative in buckets:
        if cumulative >= count:
            below = max((b for b in finite if b < le), default=0.0)
            bound = f"> {finite[-1]:g} s" if le == float("inf") else f"{below:g}-{le:g} s"
            return gauge, bound
    return gauge, None


class LagWatcher(threading.Thread):
    """Reads the loop-lag gauge every 2 s (it keeps only the last minute's longest)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.longest: float | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(2.0):
            self.note(fetch_metrics(self.url, 60))

    def note(self, text: str | None) -> str | None:
        gauge, _ = lag_figures(text)
        if gauge is not None:
            self.longest = max(self.longest or 0.0, gauge)
        return text

    def stop(self) -> None:
        self._halt.set()
        self.join(65)


# ---- scenarios ----


@dataclass(frozen=True)
class Plan:
    """What a scenario sends: `frames` on one connection, or `prefixes` bare size prefixes."""

    request: str
    partitions: int = 1
    topic: str = TOPIC
    version: int = 9
    frames: tuple[bytes, ...] = ()
    first_alone: bool = False
    prefixes: int = 0
    prefix_size: int = 0
    hold: float = 0.0


def _repeated(payload: bytes, times: int) -> tuple[bytes, ...]:
    return tuple(framed(payload, correlation_id) for correlation_id in range(1, times + 1))


def _size(n: float) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def plan_zstd(partitions: int) -> Callable[[Sizes], Plan]:
    def plan(sizes: Sizes) -> Plan:
        count = sizes.partitions[partitions]
        batch = zero_value_batch(Codec.ZSTD, sizes.inflate)
        payload = produce_request(TOPIC, [batch] * count)
        return Plan(
            f"{_size(len(payload))}, {count} partitions, each a zstd batch inflating to "
            f"{_size(sizes.inflate)}",
            partitions=count,
            frames=_repeated(payload, 1),
        )

    return plan


def plan_gzip(sizes: Sizes) -> Plan:
    payload = produce_request(TOPIC, [zero_value_batch(Codec.GZIP, sizes.inflate)])
    return Plan(
        f"{_size(len(payload))}: one gzip batch inflating to {_size(sizes.inflate)}",
        frames=_repeated(payload, 1),
    )


def plan_compacted(sizes: Sizes) -> Plan:
    batch = compacted_batch(sizes.compacted_records, sizes.compacted_value)
    count = sizes.compacted_partitions
    payload = produce_request(COMPACTED_TOPIC, [batch] * count)
    return Plan(
        f"{_size(len(payload))}, {count} partitions of {sizes.compacted_records:,} "
        f"{_size(sizes.compacted_value)} records (zstd, the last key null, compacted topic), "
        f"sent {sizes.compacted_sends} times",
        partitions=count,
        topic=COMPACTED_TOPIC,
        frames=_repeated(payload, sizes.compacted_sends),
        first_alone=True,
    )


def plan_snappy(sizes: Sizes) -> Plan:
    payload = produce_request(TOPIC, [snappy_zero_batch(sizes.snappy_records, sizes.snappy_value)])
    plain = sizes.snappy_records * sizes.snappy_value
    return Plan(
        f"{_size(len(payload))}: one xerial snappy batch of {_size(plain)} "
        f"({sizes.snappy_records:,} records)",
        frames=_repeated(payload, 1),
    )


def plan_legacy(sizes: Sizes) -> Plan:
    payload = produce_request(TOPIC, [legacy_gzip_wrapper(sizes.legacy_messages)], version=2)
    return Plan(
        f"{_size(len(payload))}, Produce v2: a magic 1 gzip wrapper of "
        f"{sizes.legacy_messages:,} inner messages ({_size(34 * sizes.legacy_messages)})",
        version=2,
        frames=_repeated(payload, 1),
    )


def plan_timestamps(sizes: Sizes) -> Plan:
    payload = produce_request(TOPIC, [bad_timestamp_batch(sizes.bad_timestamps)])
    return Plan(
        f"{_size(len(payload))}: one zstd batch of {sizes.bad_timestamps:,} records dated a day "
        "ahead",
        frames=_repeated(payload, 1),
    )


def plan_prefixes(sizes: Sizes) -> Plan:
    return Plan(
        f"{sizes.prefixes:,} connections, each sending only a size prefix of "
        f"{_size(sizes.prefix_size)}, held {sizes.prefix_hold:g} s",
        prefixes=sizes.prefixes,
        prefix_size=sizes.prefix_size,
        hold=sizes.prefix_hold,
    )


def plan_target(sizes: Sizes) -> Plan:
    count = sizes.partitions[2]
    payload = produce_request(TOPIC, [zero_value_batch(Codec.ZSTD, sizes.inflate)] * count)
    return Plan(
        f"{_size(len(payload))}, {count} partitions of zstd inflating to {_size(sizes.inflate)} "
        f"each, {sizes.target_repeats} times back to back",
        partitions=count,
        frames=_repeated(payload, sizes.target_repeats),
    )


@dataclass(frozen=True)
class Scenario:
    name: str
    plan: Callable[[Sizes], Plan]
    timeout: float


SCENARIOS = (
    Scenario("zstd-5", plan_zstd(0), 180),
    Scenario("zstd-20", plan_zstd(1), 300),
    Scenario("zstd-60", plan_zstd(2), 600),
    Scenario("gzip-bomb", plan_gzip, 180),
    Scenario("compacted-null-key", plan_compacted, 900),
    Scenario("snappy-1gib", plan_snappy, 600),
    Scenario("legacy-gzip", plan_legacy, 300),
    Scenario("bad-timestamps", plan_timestamps, 300),
    Scenario("size-prefixes", plan_prefixes, 180),
    Scenario("target", plan_target, 1200),
)


# ---- running one ----


@dataclass
class Outcome:
    """What the hostile client saw."""

    payloads: list[bytes] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    sent: int = 0
    expected: int = 0
    closed: bool = False
    timed_out: bool = False
    summary: str = ""
    notes: list[str] = field(default_factory=list)

    def got(self) -> str:
        if not self.expected:
            return self.summary
        said = collections.Counter(answer.said() for answer in self.answers)
        text = "; ".join((f"{n} answers: " if n > 1 else "") + what for what, n in said.items())
        if self.closed:
            text = (text + "; then " if text else "") + "connection closed"
        if self.timed_out:
            text = (text + "; then " if text else "") + "no answer before the timeout"
        if len(self.answers) < self.expected:
            text += f" ({len(self.answers)} of {self.expected} answered)"
        return text


class Hostile:
    """The hostile client's connection: frames out, answers in, each bounded by `deadline`."""

    def __init__(self, port: int, deadline: float) -> None:
        self.deadline = deadline
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = bytearray()

    def _time_left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("scenario timeout")
        return left

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            self.sock.settimeout(self._time_left())
            sent = self.sock.send(view[: 4 * MIB])
            view = view[sent:]

    def read_frame(self) -> bytes | None:
        """The next answer frame's payload, or None when the proxy closed the connection."""
        size = self._fill(4)
        if size is None:
            return None
        length = int.from_bytes(self._buffer[:4], "big", signed=True)
        if length < 0 or length > MAX_ANSWER:
            raise BenchmarkError(f"answer size prefix {length}")
        if self._fill(4 + length) is None:
            return None
        payload = bytes(self._buffer[4 : 4 + length])
        del self._buffer[: 4 + length]
        return payload

    def _fill(self, size: int) -> int | None:
        while len(self._buffer) < size:
            self.sock.settimeout(self._time_left())
            try:
                chunk = self.sock.recv(max(65536, min(size - len(self._buffer), 16 * MIB)))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            self._buffer += chunk
        return size

    def close(self) -> None:
        self.sock.close()


def exchange(
    plan: Plan, port: int, deadline: float, outcome: Outcome, *, sampler: RssSampler, idle: int
) -> None:
    """Send the plan's frames and read an answer for each (acks=1 answers every one)."""
    outcome.expected = len(plan.frames)
    hostile = Hostile(port, deadline)
    try:
        batches = [plan.frames[:1], plan.frames[1:]] if plan.first_alone else [plan.frames]
        for index, frames in enumerate(batches):
            if not frames:
                continue
            if index and plan.first_alone:
                status = proc_status(sampler.pid)
                grown = status.get("VmHWM", 0) - idle
                would = status.get("VmRSS", 0) + grown * len(frames)
                if would > sampler.guard:
                    outcome.notes.append(
                        f"sent once only: the first took the proxy {_size(grown)} above idle "
                        f"and left it at {_size(status.get('VmRSS', 0))}; {len(frames)} more "
                        f"could reach {_size(would)}, past the {_size(sampler.guard)} memory "
                        "guard"
                    )
                    outcome.expected = 1
                    break
            for frame in frames:
                hostile.send(frame)
                outcome.sent += len(frame)
            for _ in frames:
                payload = hostile.read_frame()
                if payload is None:
                    outcome.closed = True
                    return
                outcome.payloads.append(payload)  # decoded once the window is over
    except TimeoutError:
        outcome.timed_out = True
    except (BrokenPipeError, ConnectionResetError):
        outcome.closed = True
    except BenchmarkError as exc:  # an answer no client could read
        outcome.closed = True
        outcome.notes.append(f"unreadable answer: {exc}")
    finally:
        hostile.close()


def size_prefixes(plan: Plan, port: int, deadline: float, outcome: Outcome) -> None:
    """Open the connections, send each a bare size prefix, hold them, count those closed."""
    sockets: list[socket.socket] = []
    prefix = struct.pack(">i", plan.prefix_size)
    try:
        for _ in range(plan.prefixes):
            if time.monotonic() > deadline:
                outcome.timed_out = True
                break
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sockets.append(sock)
            sock.sendall(prefix)
            outcome.sent += len(prefix)
        time.sleep(max(0.0, min(plan.hold, deadline - time.monotonic())))
        closed = 0
        for sock in sockets:
            sock.setblocking(False)
            try:
                closed += sock.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        outcome.summary = (
            f"{len(sockets) - closed:,} of {len(sockets):,} connections open after "
            f"{plan.hold:g} s, none answered"
        )
    except OSError as exc:
        outcome.summary = f"{len(sockets):,} connections opened, then {exc}"
    finally:
        for sock in sockets:
            sock.close()


def code_location() -> dict[str, str]:
    """Where the proxy's code comes from (the serve command runs in ROOT) and its commit."""
    found = subprocess.run(
        [sys.executable, "-c", "import proxy.server; print(proxy.server.__file__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    changed = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--", "protocol", "policies", "proxy"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {"proxy_module": found, "commit": commit + (" + uncommitted changes" if changed else "")}


def proxy_log_lines(path: Path, start: int) -> list[str]:
    """The proxy's log lines from byte `start` on that say why it closed a connection or what
    went wrong (rejections are left out: the answer's codes say those), shortened."""
    with contextlib.suppress(OSError), path.open("rb") as log:
        log.seek(start)
        text = log.read().decode(errors="replace")
        keep = [
            line.split(" ", 2)[-1]
            for line in text.splitlines()
            if "closing connection" in line or " ERROR " in line or " CRITICAL " in line
        ]
        return [line if len(line) <= 240 else line[:237] + "..." for line in keep]
    return []


@contextlib.contextmanager
def watching(pid: int, guard: int) -> Iterator[RssSampler]:
    sampler = RssSampler(pid, guard)
    sampler.start()
    try:
        yield sampler
    finally:
        sampler.stop()


def run_scenario(
    scenario: Scenario, sizes: Sizes, guard: int, timeout: float | None
) -> dict[str, Any]:
    """One scenario on a fresh broker and proxy; its figures."""
    limit = timeout if timeout is not None else scenario.timeout * sizes.timeout_scale
    plan = scenario.plan(sizes)
    print(f"\n== {scenario.name}: {plan.request} (timeout {limit:g} s)", flush=True)
    outcome = Outcome()
    row: dict[str, Any] = {"scenario": scenario.name, "request": plan.request}
    with tansu() as server, start_proxy(server.broker.bootstrap, rules=RULES) as proxy:
        broker = server.broker.bootstrap
        create_topic(broker, OTHER_TOPIC, 1)
        create_topic(broker, plan.topic, plan.partitions)
        assert server.proc is not None
        tansu_process = psutil.Process(server.proc.pid)
        url = metrics_url(proxy)
        log_path = proxy.config_path.parent / "kvproxy.log"
        pid = proxy.process.pid
        other = OtherClient(proxy.port, limit + 60)
        lag = LagWatcher(url)
        with watching(pid, guard) as sampler:
            other.start()
            time.sleep(1.0)  # warm-up: connections made, the other client's first answers
            started_at = time.perf_counter()
            before = other.latencies(0.0, started_at)[5:]
            has_lag = lag_figures(lag.note(fetch_metrics(url, 10))) != (None, None)
            if has_lag:
                lag.start()
            idle = sampler.rss()
            log_start = log_path.stat().st_size
            tansu_cpu = sum(tansu_process.cpu_times()[:2])
            deadline = time.monotonic() + limit
            began = time.perf_counter()
            if plan.prefixes:
                size_prefixes(plan, proxy.port, deadline, outcome)
            else:
                exchange(plan, proxy.port, deadline, outcome, sampler=sampler, idle=idle)
            ended = time.perf_counter()
            tansu_cpu = sum(tansu_process.cpu_times()[:2]) - tansu_cpu
            during = other.latencies(began, ended)
            alive = proxy.process.poll() is None
            final = fetch_metrics(url, 60) if alive and not outcome.timed_out else None
            if has_lag:
                lag.stop()
                lag.note(final)
            other.stop()
            outcome.answers = [
                read_answer(payload, plan.version, number, plan.topic, plan.partitions)
                for number, payload in enumerate(outcome.payloads, 1)
            ]
            outcome.payloads.clear()
            if outcome.timed_out:  # still busy: do not wait for it to drain
                proxy.process.kill()
        peak = sampler.hwm if sampler.hwm else sampler.peak
        logged = proxy_log_lines(log_path, log_start)
        outcome.notes += [f"proxy log: {line}" for line in logged[:3]]
        if sampler.tripped:
            outcome.notes.append(
                f"the memory guard killed the proxy at {_size(sampler.tripped)} RSS"
            )
        elif not alive:
            outcome.notes.append(f"the proxy exited (code {proxy.process.returncode})")
        if other.error:
            outcome.notes.append(f"other client: {other.error}")
        _, bound = lag_figures(final)
        ordered = sorted(during)
        row.update(
            {
                "request_bytes": outcome.sent,
                "idle_rss": idle,
                "peak_rss": peak,
                "peak_above_idle": peak - idle,
                "memory_guard_tripped_at": sampler.tripped or None,
                "seconds": ended - began,
                "other_client": {
                    "requests": len(during),
                    "p50_ms": percentile(ordered, 0.5) * 1e3,
                    "p99_ms": percentile(ordered, 0.99) * 1e3,
                    "max_ms": (ordered[-1] if ordered else float("nan")) * 1e3,
                    "p50_before_ms": percentile(sorted(before), 0.5) * 1e3,
                    "error": other.error or None,
                },
                "loop_lag_max_s": lag.longest,
                "loop_lag_histogram": bound,
                "tansu_cpu_seconds": tansu_cpu,
                "got": outcome.got(),
                "answers": [asdict(answer) for answer in outcome.answers],
                "answered": len(outcome.answers),
                "expected_answers": outcome.expected,
                "well_formed": bool(outcome.answers)
                and len(outcome.answers) == outcome.expected
                and all(answer.well_formed for answer in outcome.answers),
                "notes": outcome.notes,
            }
        )
    print_row(row)
    return row


# ---- report ----


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}"


def blocked(row: dict[str, Any]) -> str:
    other = row["other_client"]
    text = "-" if math.isnan(other["max_ms"]) else f"{other['max_ms'] / 1e3:,.2f} s"
    if row["loop_lag_max_s"] is not None:
        text += f" (lag metric {row['loop_lag_max_s']:.2f} s)"
    elif row["loop_lag_histogram"] is not None:
        text += f" (lag metric {row['loop_lag_histogram']})"
    return text


def answer_sizes(row: dict[str, Any]) -> str:
    sizes = collections.Counter(_size(a["size"]) for a in row["answers"])
    if not sizes:
        return "-"
    return ", ".join(f"{n} x {size}" if n > 1 else size for size, n in sizes.items())


def print_row(row: dict[str, Any]) -> None:
    other = row["other_client"]
    print(
        f"   peak RSS {_size(row['peak_rss'])} (+{_size(row['peak_above_idle'])} above idle "
        f"{_size(row['idle_rss'])}); other client p50/p99/max {_ms(other['p50_ms'])}/"
        f"{_ms(other['p99_ms'])}/{_ms(other['max_ms'])} ms over {other['requests']} requests "
        f"(p50 {other['p50_before_ms']:.1f} ms before); loop blocked {blocked(row)}; Tansu "
        f"CPU {row['tansu_cpu_seconds']:.1f} s",
        flush=True,
    )
    print(f"   got: {row['got']}; answer {answer_sizes(row)}; took {row['seconds']:.1f} s")
    for note in row["notes"]:
        print(f"   note: {note}")


def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| scenario | request | proxy peak RSS (above idle) | event loop blocked | other "
        "client's p50 / p99 / max (ms) | what the hostile client got | answer size |",
        "|---|---|---|---|---|---|---|",
    ]
    notes: list[str] = []
    for row in rows:
        other = row["other_client"]
        got = row["got"] + (" (well formed)" if row["well_formed"] else "")
        lines.append(
            f"| {row['scenario']} | {row['request']} | {_size(row['peak_rss'])} "
            f"(+{_size(row['peak_above_idle'])}) | {blocked(row)} | {_ms(other['p50_ms'])} / "
            f"{_ms(other['p99_ms'])} / {_ms(other['max_ms'])} | {got} | {answer_sizes(row)} |"
        )
        notes += [f"- {row['scenario']}: {note}" for note in row["notes"]]
    return "\n".join(lines + (["", *notes] if notes else []))


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = [s.name for s in SCENARIOS]
    parser.add_argument("--scenarios", default=",".join(names), help="comma-separated names")
    parser.add_argument("--json", type=Path, help="write every figure here too")
    parser.add_argument("--memory-guard-gib", type=float, default=8.0)
    parser.add_argument("--timeout", type=float, help="seconds per scenario (default: its own)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the bench runs")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.scenarios.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        parser.error(f"unknown scenarios {unknown}; known: {', '.join(names)}")
    sizes = SMOKE if args.smoke else FULL
    guard = int(args.memory_guard_gib * GIB)
    raise_fd_limit()
    where = code_location()
    host = machine()
    print(
        f"hostile input against {where['proxy_module']} (commit {where['commit']}); "
        f"memory guard {_size(guard)}; load average {host['load_average']}"
        + ("; --smoke" if args.smoke else ""),
        flush=True,
    )
    began = time.monotonic()
    rows: list[dict[str, Any]] = []
    failed: list[str] = []
    for scenario in SCENARIOS:
        if scenario.name in chosen:
            try:
                rows.append(run_scenario(scenario, sizes, guard, args.timeout))
            except Exception as exc:  # the other scenarios still run and report
                traceback.print_exc()
                failed.append(f"- {scenario.name}: the bench failed: {exc!r}")
    report = "\n".join([table(rows), *failed])
    print("\n" + report)
    print(f"\ntook {time.monotonic() - began:.0f} s")
    figures = {
        "code": where,
        "memory_guard_bytes": guard,
        "smoke": args.smoke,
        "sizes": asdict(sizes),
        "rows": rows,
        "table": report,
    }
    write_results("hostile", figures)
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": host, **figures}, indent=2))
    if failed:
        raise SystemExit(1)
    return rows


if __name__ == "__main__":
    main()
