"""What the hostile benchmarks (bench/hostile.py and the bench/hostile_*.py beside it) send and
read: how big each scenario is, the hand-built batches (decompression bombs, a legacy gzip
wrapper of many messages, huge compacted and timestamp batches), Produce requests framed, and the
proxy's answers read and checked."""

from __future__ import annotations

import collections
import datetime
import importlib
import struct
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import cramjam
import crc32c
from kio.static.primitive import Records, i16, i32, i32Timedelta

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

_TIMEOUT = datetime.timedelta(seconds=30)

RULES = f'topics:\n  - match: "{COMPACTED_TOPIC}"\n    compacted: true\n'

MAX_ANSWER = GIB
"""An answer frame larger than this ends the read (the client would not take it either)."""


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
