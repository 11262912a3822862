"""A deterministic mutation fuzzer for kvproxy's client side: inputs, and what a correct proxy does.

Every input is a function of `(seed, index)` alone (`make_input`), so a failure is reproduced from
those two numbers: `python -m tests.harness.fuzz SEED INDEX` prints the input's bytes.

Seeds are the Produce requests captured from real clients (`tests/golden`) and requests built
here: ApiVersions v0-v4, Metadata v0-v12, Produce v0-v11 carrying magic 0/1/2 batches with every
codec the version allows. Mutators work on a request's payload (the frame without its size
prefix) or on the wire bytes (size prefixes, pipelining, byte-by-byte delivery):

* bytes: flip bits, set bytes to boundary values, insert, delete, truncate, extend, splice the
  head of one request onto the tail of another;
* header: api key, api version, correlation id;
* lengths: int32 and int16 fields that look like array or string lengths set to -1, negative,
  huge or off by one; varints made overlong or huge;
* batches: length, magic, CRC, record count, attributes (codec bits, control, transactional),
  base offset, last offset delta, producer id/epoch/sequence, each with the CRC recomputed most
  of the time so that the checks behind the CRC are reached;
* compression payloads: replaced with garbage, or with a bounded decompression bomb of each codec;
* the wire: a wrong size prefix (off by one, zero, negative, above the proxy's maximum), several
  frames pipelined in one write, a trailing incomplete frame, delivery one byte per write.

`expected_answers` says which correlation ids a correct proxy answers for a given wire, in order:
the runner (tests/integration/test_fuzz_proxy.py) checks the answers it gets against it, and
`check_forwarded` is what it asks of every frame the upstream received.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib
import random
import re
import struct
import sys
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import cramjam
import crc32c

from kvproxy.protocol.compression import Codec, compress
from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.messages import (
    API_VERSIONS,
    CODEC_KEYS,
    METADATA,
    PRODUCE,
    decode_request,
    encode_request,
    make_request,
    supported_versions,
)
from kvproxy.protocol.records import build_batch, iter_batches

GOLDEN: Final = Path(__file__).resolve().parents[1] / "golden"
TIMESTAMP_MS: Final = 1_790_000_000_000
"""Every generated record's timestamp (2026-09-21): fixed, so an input's bytes depend only on
(seed, index); in range for the default `timestamps` policy (no lower bound)."""
TOPIC: Final = "stub-topic"
CLIENT_ID: Final = "kvproxy-fuzz"
BOMB_BYTES: Final = 16 * 1024 * 1024
"""What a fuzzer's decompression bomb expands to: enough to show a missing bound in a memory
figure, small enough that thousands of them fit in a bounded run."""
API_VERSIONS_MAX: Final = max(supported_versions(API_VERSIONS))

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")

# ---- seeds -------------------------------------------------------------------------------------


def golden_requests() -> list[bytes]:
    """The captured Produce request payloads (no size prefix), in file name order."""
    return [path.read_bytes() for path in sorted(GOLDEN.glob("*-produce-v*.bin"))]


def _records(count: int, size: int, keyed: bool = True) -> list[Any]:
    return [
        (
            f"key-{i}".encode() if keyed else None,
            (f"value-{i}-" * (size // 8 + 1)).encode()[:size],
            None,
            TIMESTAMP_MS + i,
        )
        for i in range(count)
    ]


def produce_request(
    version: int,
    correlation_id: int,
    parts: Sequence[tuple[Any, int, bytes | None]],
    *,
    acks: int = -1,
    transactional_id: str | None = None,
    client_id: str = CLIENT_ID,
) -> bytes:
    """A Produce request payload of `version` carrying `parts` = [(topic, partition, records)];
    from v13 a topic is its id (a `uuid.UUID`)."""
    from kio.static.primitive import i16, i32, i32Timedelta

    if version <= 2:
        schema: Any = importlib.import_module("kvproxy.protocol.legacy_messages")
        request_type = getattr(schema, f"ProduceRequestV{version}")
    else:
        schema = importlib.import_module(f"kio.schema.produce.v{version}.request")
        request_type = schema.ProduceRequest
    topics: dict[Any, list[Any]] = {}
    for topic, partition, records in parts:
        topics.setdefault(topic, []).append(
            schema.PartitionProduceData(index=i32(partition), records=records)
        )
    fields: dict[str, Any] = {
        "acks": i16(acks),
        "timeout": i32Timedelta.parse(datetime.timedelta(seconds=10)),
        "topic_data": tuple(
            schema.TopicProduceData(topic_id=name, partition_data=tuple(data))
            if version >= 13
            else schema.TopicProduceData(name=name, partition_data=tuple(data))
            for name, data in topics.items()
        ),
    }
    if version >= 3:
        fields["transactional_id"] = transactional_id
    body = request_type(**fields)
    return encode_request(make_request(PRODUCE, version, correlation_id, client_id, body))


def _request(api_key: int, version: int, correlation_id: int, **values: Any) -> bytes:
    module = {API_VERSIONS: "api_versions", METADATA: "metadata"}[api_key]
    schema = importlib.import_module(f"kio.schema.{module}.v{version}.request")
    cls = next(
        getattr(schema, name)
        for name in dir(schema)
        if name.endswith("Request") and dataclasses.is_dataclass(getattr(schema, name))
    )
    names = {f.name for f in dataclasses.fields(cls)}
    body = cls(**{k: v for k, v in values.items() if k in names})
    return encode_request(make_request(api_key, version, correlation_id, CLIENT_ID, body))


def api_versions_request(version: int, correlation_id: int) -> bytes:
    return _request(
        API_VERSIONS,
        version,
        correlation_id,
        client_software_name="kvproxy-fuzz",
        client_software_version="1.0",
    )


def metadata_request(version: int, correlation_id: int, topics: Sequence[str] | None) -> bytes:
    schema = importlib.import_module(f"kio.schema.metadata.v{version}.request")
    entry = schema.MetadataRequestTopic
    names = {f.name for f in dataclasses.fields(entry)}
    made = None
    if topics is not None:
        made = tuple(
            entry(**{k: v for k, v in {"name": t, "topic_id": None}.items() if k in names})
            for t in topics
        )
    if version == 0 and made is None:
        made = ()
    return _request(
        METADATA,
        version,
        correlation_id,
        topics=made,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


def _codecs_for(version: int, magic: int) -> tuple[Codec, ...]:
    """The codecs a client may use: zstd needs magic 2 and Produce v7+."""
    if magic < 2 or version < 7:
        return (Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4)
    return tuple(Codec)


@functools.cache
def generated_requests() -> tuple[bytes, ...]:
    """Well-formed requests built here, to complement the golden Produce requests."""
    out: list[bytes] = []
    cid = 1000
    for version in range(5):
        out.append(api_versions_request(version, cid := cid + 1))
    for version in range(13):
        out.append(metadata_request(version, cid := cid + 1, [TOPIC]))
        if version >= 1:
            out.append(metadata_request(version, cid := cid + 1, None))
    for version in range(12):
        magics = (0, 1) if version < 2 else (1,) if version == 2 else (2,)
        for magic in magics:
            for codec in _codecs_for(version, magic):
                batch = build_batch(_records(3, 40), magic=magic, codec=codec)
                for acks in (-1, 1, 0):
                    out.append(
                        produce_request(version, cid := cid + 1, [(TOPIC, 0, batch)], acks=acks)
                    )
        if version >= 3:
            parts = [
                (TOPIC, p, build_batch(_records(2, 20, keyed=p != 1), codec=Codec.GZIP))
                for p in range(3)
            ]
            out.append(produce_request(version, cid := cid + 1, parts))
            idempotent = build_batch(
                _records(2, 10), producer_id=7, producer_epoch=0, base_sequence=0
            )
            out.append(produce_request(version, cid := cid + 1, [(TOPIC, 0, idempotent)]))
    return tuple(out)


@functools.cache
def corpus() -> tuple[bytes, ...]:
    """Golden requests first, then the generated ones: what every mutation starts from."""
    return (*golden_requests(), *generated_requests())


# ---- bombs -------------------------------------------------------------------------------------


def encode_uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_varint(value: int) -> bytes:
    return encode_uvarint((value << 1) ^ (value >> 63))


def bomb_batch(codec: Codec, expanded: int) -> bytes:
    """A valid magic-2 batch of one record whose value is `expanded` zero bytes, compressed with
    `codec`: a few KiB on the wire (zstd, gzip) that expand to `expanded` bytes once decoded.

    The zero bytes are fed to a streaming compressor in pieces, so building a bomb never holds
    its expansion in memory (zstd and gzip; lz4 and snappy are built whole, and are larger).
    """
    key = b"bomb"
    header = b"\x00" + encode_varint(0) + encode_varint(0)  # attributes and two deltas
    body = header + encode_varint(len(key)) + key + encode_varint(expanded)
    tail = encode_varint(0)  # no headers
    length = len(body) + expanded + len(tail)
    head = encode_varint(length) + body
    if codec in (Codec.ZSTD, Codec.GZIP):
        compressor = (cramjam.zstd if codec is Codec.ZSTD else cramjam.gzip).Compressor()
        compressor.compress(head)
        piece = bytes(1 << 20)
        left = expanded
        while left:
            step = min(left, len(piece))
            compressor.compress(piece[:step])
            left -= step
        compressor.compress(tail)
        payload = bytes(compressor.finish())
    else:
        payload = compress(codec, head + bytes(expanded) + tail)
    attributes = int(codec)
    after_crc = (
        _I16.pack(attributes)
        + _I32.pack(0)  # last offset delta
        + _I64.pack(TIMESTAMP_MS)
        + _I64.pack(TIMESTAMP_MS)
        + _I64.pack(-1)  # producer id
        + _I16.pack(-1)
        + _I32.pack(-1)
        + _I32.pack(1)  # record count
        + payload
    )
    crc = crc32c.crc32c(after_crc)
    batch_length = 4 + 1 + 4 + len(after_crc)  # leader epoch, magic, crc, the rest
    return (
        _I64.pack(0) + _I32.pack(batch_length) + _I32.pack(0) + b"\x02" + _U32.pack(crc) + after_crc
    )


@functools.cache
def _bomb(codec: Codec) -> bytes:
    return bomb_batch(codec, BOMB_BYTES)


@functools.cache
def _legacy_bomb(codec: Codec) -> bytes:
    return build_batch([(b"bomb", bytes(BOMB_BYTES), None, TIMESTAMP_MS)], magic=1, codec=codec)


# ---- request structure -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class BatchSpan:
    """Where one batch (magic 2) or one message (magic 0/1) of a Produce payload lies."""

    topic: int
    partition: int
    start: int
    end: int
    magic: int


def batch_spans(payload: bytes) -> list[BatchSpan]:
    """The batches of a Produce request payload that decodes; [] for anything else."""
    try:
        request = decode_request(payload)
    except ProtocolError:
        return []
    if request.header.api_key != PRODUCE:
        return []
    spans = []
    search_from = 0
    for t, topic in enumerate(request.body.topic_data):
        for p, part in enumerate(topic.partition_data):
            if not part.records:
                continue
            records = bytes(part.records)
            base = payload.find(records, search_from)
            if base < 0:
                continue
            search_from = base + len(records)
            pos = 0
            while pos + 17 <= len(records):
                (length,) = _I32.unpack_from(records, pos + 8)
                end = pos + 12 + length
                if length <= 0 or end > len(records):
                    break
                spans.append(BatchSpan(t, p, base + pos, base + end, records[pos + 16]))
                pos = end
    return spans


def fix_crc(data: bytearray, span: BatchSpan) -> None:
    """Recompute the CRC of the batch (CRC32C) or message (CRC32) at `span`, in place."""
    start, end = span.start, span.end
    if end > len(data) or end - start < 22:
        return
    if span.magic == 2:
        _U32.pack_into(data, start + 17, crc32c.crc32c(bytes(data[start + 21 : end])))
    else:
        _U32.pack_into(data, start + 12, zlib.crc32(bytes(data[start + 16 : end])))


def replace_records(payload: bytes, topic: int, partition: int, records: bytes) -> bytes:
    """The Produce payload with one partition's records replaced (lengths re-encoded)."""
    request = decode_request(payload)
    topics = list(request.body.topic_data)
    parts = list(topics[topic].partition_data)
    parts[partition] = dataclasses.replace(parts[partition], records=records)
    topics[topic] = dataclasses.replace(topics[topic], partition_data=tuple(parts))
    body = dataclasses.replace(request.body, topic_data=tuple(topics))
    return encode_request(dataclasses.replace(request, body=body))


# ---- payload mutators --------------------------------------------------------------------------

Mutator = Callable[[random.Random, bytes], bytes]
INTERESTING_I32: Final = (-1, -2, 0, 1, 0x7FFFFFFF, -0x80000000, 0x40000000, 0x10000, 255, 256)
INTERESTING_BYTES: Final = (0x00, 0x01, 0x7F, 0x80, 0xFF)


def flip_bits(rng: random.Random, payload: bytes) -> bytes:
    data = bytearray(payload)
    for _ in range(rng.randint(1, 8)):
        if data:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return bytes(data)


def set_bytes(rng: random.Random, payload: bytes) -> bytes:
    data = bytearray(payload)
    for _ in range(rng.randint(1, 4)):
        if data:
            data[rng.randrange(len(data))] = rng.choice(INTERESTING_BYTES)
    return bytes(data)


def insert_bytes(rng: random.Random, payload: bytes) -> bytes:
    at = rng.randint(0, len(payload))
    return payload[:at] + rng.randbytes(rng.randint(1, 16)) + payload[at:]


def delete_bytes(rng: random.Random, payload: bytes) -> bytes:
    if not payload:
        return payload
    at = rng.randrange(len(payload))
    return payload[:at] + payload[at + rng.randint(1, 16) :]


def truncate(rng: random.Random, payload: bytes) -> bytes:
    return payload[: rng.randint(0, len(payload))]


def extend(rng: random.Random, payload: bytes) -> bytes:
    return payload + rng.choice((b"\x00", rng.randbytes(rng.randint(1, 64)), payload))


def splice(rng: random.Random, payload: bytes) -> bytes:
    other = rng.choice(corpus())
    return payload[: rng.randint(0, len(payload))] + other[rng.randint(0, len(other)) :]


def api_key(rng: random.Random, payload: bytes) -> bytes:
    key = rng.choice((0, 1, 3, 10, 17, 18, 32, 36, 60, 67, -1, rng.randint(-32768, 32767)))
    return _I16.pack(key) + payload[2:] if len(payload) >= 2 else payload


def api_version(rng: random.Random, payload: bytes) -> bytes:
    version = rng.choice((*range(-1, 16), 0x7FFF, -32768, rng.randint(-32768, 32767)))
    return payload[:2] + _I16.pack(version) + payload[4:] if len(payload) >= 4 else payload


def correlation_id(rng: random.Random, payload: bytes) -> bytes:
    cid = rng.choice((0, -1, 0x7FFFFFFF, -0x80000000, rng.randint(-(2**31), 2**31 - 1)))
    return payload[:4] + _I32.pack(cid) + payload[8:] if len(payload) >= 8 else payload


_SMALL_I32 = re.compile(rb"(?=\x00\x00\x00[\x00-\x40]|\xff\xff\xff\xff)", re.DOTALL)
_SMALL_I16 = re.compile(rb"(?=\x00[\x00-\x40]|\xff\xff)", re.DOTALL)


def _length_positions(payload: bytes, width: int) -> list[int]:
    """Offsets where a big-endian int of `width` bytes holds a small count (0..64) or -1:
    array, string and bytes lengths, most likely."""
    pattern = _SMALL_I32 if width == 4 else _SMALL_I16
    return [m.start() for m in pattern.finditer(payload) if m.start() + width <= len(payload)]


def int32_length(rng: random.Random, payload: bytes) -> bytes:
    positions = _length_positions(payload, 4)
    if not positions:
        return flip_bits(rng, payload)
    at = rng.choice(positions)
    (old,) = _I32.unpack_from(payload, at)
    new = rng.choice((*INTERESTING_I32, old + 1, old - 1, rng.randint(-(2**31), 2**31 - 1)))
    return payload[:at] + _I32.pack(new) + payload[at + 4 :]


def int16_length(rng: random.Random, payload: bytes) -> bytes:
    positions = _length_positions(payload, 2)
    if not positions:
        return flip_bits(rng, payload)
    at = rng.choice(positions)
    (old,) = _I16.unpack_from(payload, at)
    new = rng.choice((-1, -2, 0x7FFF, -32768, old + 1, old - 1, rng.randint(-32768, 32767)))
    return payload[:at] + _I16.pack(new) + payload[at + 2 :]


def varint(rng: random.Random, payload: bytes) -> bytes:
    """Overwrite or insert a varint: overlong (continuation bits past 5 or 10 bytes), huge, or
    the zig-zag of a negative length, at a random offset or inside a batch's records."""
    spans = [s for s in batch_spans(payload) if s.magic == 2 and s.end - s.start > 61]
    choice = rng.randrange(4)
    encoded = (
        b"\x80" * rng.randint(5, 12) + b"\x01",
        b"\xff" * rng.randint(4, 10) + b"\x7f",
        encode_varint(rng.choice((-1, -2, 2**31 - 1, -(2**31), 2**62))),
        encode_uvarint(rng.choice((0, 1, 2**32 - 1, 2**35, 0x7FFFFFFF))),
    )[choice]
    if spans and rng.random() < 0.7:
        span = rng.choice(spans)
        at = rng.randint(span.start + 61, span.end - 1)
        data = bytearray(payload[:at] + encoded + payload[at + len(encoded) :])
        data = data[: len(payload)] if len(data) > len(payload) else data
        fix_crc(data, span)
        return bytes(data)
    at = rng.randint(0, len(payload))
    if rng.random() < 0.5:
        return payload[:at] + encoded + payload[at:]
    return payload[:at] + encoded + payload[at + len(encoded) :]


_BATCH_FIELDS: Final = {
    # name: (offset in a magic-2 batch, width)
    "base_offset": (0, 8),
    "length": (8, 4),
    "leader_epoch": (12, 4),
    "magic": (16, 1),
    "crc": (17, 4),
    "attributes": (21, 2),
    "last_offset_delta": (23, 4),
    "first_timestamp": (27, 8),
    "max_timestamp": (35, 8),
    "producer_id": (43, 8),
    "producer_epoch": (51, 2),
    "base_sequence": (53, 4),
    "record_count": (57, 4),
}
_LEGACY_FIELDS: Final = {
    "offset": (0, 8),
    "length": (8, 4),
    "crc": (12, 4),
    "magic": (16, 1),
    "attributes": (17, 1),
}


def _field_value(rng: random.Random, name: str, width: int, old: int) -> int:
    if name == "magic":
        return rng.choice((0, 1, 2, 3, 0xFF, old ^ 1))
    if name == "attributes":
        return rng.choice(
            (old & ~7 | rng.randrange(8), old | 0x10, old | 0x20, old | 0x08, old ^ 0x30, 0xFFFF)
        ) & ((1 << (8 * width)) - 1)
    bits = 8 * width
    top = 1 << (bits - 1)
    value = rng.choice((0, 1, -1, old + 1, old - 1, top - 1, -top, rng.randint(-top, top - 1)))
    return max(-top, min(top - 1, value))


def batch_field(rng: random.Random, payload: bytes) -> bytes:
    """Change one header field of one batch (or legacy message); recompute the CRC 3 times out of
    4 (never when the CRC itself is the field) so the checks behind the CRC see the change."""
    spans = batch_spans(payload)
    if not spans:
        return flip_bits(rng, payload)
    span = rng.choice(spans)
    fields = _BATCH_FIELDS if span.magic == 2 else _LEGACY_FIELDS
    name = rng.choice(sorted(fields))
    offset, width = fields[name]
    at = span.start + offset
    if at + width > span.end:
        return flip_bits(rng, payload)
    data = bytearray(payload)
    old = int.from_bytes(data[at : at + width], "big", signed=width > 1)
    new = _field_value(rng, name, width, old)
    data[at : at + width] = new.to_bytes(width, "big", signed=width > 1 and new < 0)
    if name != "crc" and rng.random() < 0.75:
        fix_crc(data, span)
    return bytes(data)


def compression_payload(rng: random.Random, payload: bytes) -> bytes:
    """Replace one batch's compressed payload with garbage (under the batch's codec or another)
    or with a decompression bomb; the batch length, CRC and request lengths are made right."""
    spans = batch_spans(payload)
    if not spans:
        return flip_bits(rng, payload)
    span = rng.choice(spans)
    if span.end - span.start < (61 if span.magic == 2 else 22):
        return flip_bits(rng, payload)  # a header cut short by an earlier mutation
    codec = rng.choice(tuple(Codec))
    if rng.random() < 0.15:
        if span.magic == 2:
            new_records = _bomb(rng.choice((Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD)))
        else:
            new_records = _legacy_bomb(rng.choice((Codec.GZIP, Codec.SNAPPY, Codec.LZ4)))
        return replace_records(payload, span.topic, span.partition, new_records)
    if span.magic != 2:
        data = bytearray(payload[span.start : span.end])
        data[17] = (data[17] & ~7) | int(codec)
        data[18:] = rng.randbytes(rng.randint(0, 64))
        _I32.pack_into(data, 8, len(data) - 12)
        legacy = BatchSpan(0, 0, 0, len(data), span.magic)
        fix_crc(data, legacy)
        new_records = bytes(data)
    else:
        data = bytearray(payload[span.start : span.start + 61])
        garbage = rng.choice(
            (
                rng.randbytes(rng.randint(0, 128)),
                compress(codec, rng.randbytes(rng.randint(0, 64))),
                b"\x28\xb5\x2f\xfd" + rng.randbytes(16),  # zstd magic, then noise
                b"\x1f\x8b\x08\x00" + rng.randbytes(16),  # gzip header, then noise
                b"\x04\x22\x4d\x18" + rng.randbytes(16),  # lz4 frame magic
                b"\x82SNAPPY\x00" + rng.randbytes(24),  # xerial header
            )
        )
        _I16.pack_into(data, 21, (_I16.unpack_from(data, 21)[0] & ~7) | int(codec))
        data += garbage
        _I32.pack_into(data, 8, len(data) - 12)
        fix_crc(data, BatchSpan(0, 0, 0, len(data), 2))
        new_records = bytes(data)
    try:
        return replace_records(payload, span.topic, span.partition, new_records)
    except ProtocolError:
        return payload
    except Exception:  # a request kio cannot re-encode (an unusual mutation before this one)
        return payload


PAYLOAD_MUTATORS: Final[dict[str, tuple[Mutator, int]]] = {
    # name: (mutator, weight)
    "flip_bits": (flip_bits, 10),
    "set_bytes": (set_bytes, 6),
    "insert_bytes": (insert_bytes, 3),
    "delete_bytes": (delete_bytes, 3),
    "truncate": (truncate, 4),
    "extend": (extend, 3),
    "splice": (splice, 3),
    "api_key": (api_key, 4),
    "api_version": (api_version, 6),
    "correlation_id": (correlation_id, 3),
    "int32_length": (int32_length, 8),
    "int16_length": (int16_length, 5),
    "varint": (varint, 7),
    "batch_field": (batch_field, 16),
    "compression_payload": (compression_payload, 6),
}


# ---- inputs ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class FuzzInput:
    """One input: the bytes sent on one connection and how they are delivered."""

    seed: int
    index: int
    steps: tuple[str, ...]
    """What was done, in order (seed request names, mutators, wire changes)."""
    wire: bytes
    byte_by_byte: bool

    def describe(self) -> str:
        head = self.wire[:512].hex()
        more = f"... ({len(self.wire)} bytes)" if len(self.wire) > 512 else ""
        return (
            f"seed={self.seed} index={self.index} steps={'+'.join(self.steps)} "
            f"byte_by_byte={self.byte_by_byte} wire={head}{more}"
        )


def _mutate(rng: random.Random, steps: list[str]) -> bytes:
    pool = corpus()
    payload = rng.choice(pool)
    steps.append(f"corpus[{pool.index(payload)}]")
    if rng.random() < 0.12:
        return payload  # unmutated: the proxy must answer it (or forward it) normally
    names = list(PAYLOAD_MUTATORS)
    weights = [PAYLOAD_MUTATORS[n][1] for n in names]
    for name in rng.choices(names, weights, k=rng.choice((1, 1, 1, 2, 2, 3))):
        payload = PAYLOAD_MUTATORS[name][0](rng, payload)
        steps.append(name)
    return payload


def _prefix(rng: random.Random, payload: bytes, steps: list[str]) -> bytes:
    size = len(payload)
    if rng.random() < 0.06:
        size = rng.choice((size + 1, size - 1, 0, -1, -(2**31), 2**31 - 1, 100 * 1024 * 1024 + 1))
        steps.append(f"size_prefix={size}")
    return _I32.pack(size) + payload


def make_input(seed: int, index: int) -> FuzzInput:
    """Input number `index` of the run seeded with `seed` (depends on nothing else)."""
    rng = random.Random(f"kvproxy-fuzz:{seed}:{index}")
    steps: list[str] = []
    count = 1 if rng.random() < 0.8 else rng.randint(2, 8)
    if count > 1:
        steps.append(f"pipeline={count}")
    wire = b"".join(_prefix(rng, _mutate(rng, steps), steps) for _ in range(count))
    if rng.random() < 0.03 and wire:
        wire = wire[: rng.randint(0, len(wire) - 1)]
        steps.append("wire_truncated")
    byte_by_byte = len(wire) <= 600 and rng.random() < 0.01
    return FuzzInput(seed, index, tuple(steps), wire, byte_by_byte)


# ---- what a correct proxy does -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Expectation:
    """What a correct proxy does with a wire: answer `answers` (api key, version, correlation id),
    in order, or close the connection after answering a prefix of them."""

    answers: tuple[tuple[int, int, int], ...]
    frames: tuple[bytes, ...]
    """The complete frames in the wire, as the proxy splits it (before anything ends it)."""
    ends_cleanly: bool
    """The wire is a whole number of frames the proxy accepts: after the answers, the connection
    is ready for more (False: a partial frame is pending, or the proxy must close)."""


def split_frames(wire: bytes, max_frame: int) -> tuple[list[bytes], bool, bool]:
    """(complete frames, a bad size prefix stops the stream, bytes left over)."""
    frames: list[bytes] = []
    pos = 0
    while len(wire) - pos >= 4:
        (size,) = _I32.unpack_from(wire, pos)
        if size < 0 or size > max_frame:
            return frames, True, True
        if len(wire) - pos - 4 < size:
            return frames, False, True
        frames.append(wire[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return frames, False, pos != len(wire)


def expected_answers(wire: bytes, max_frame: int) -> Expectation:
    """The answers a correct proxy gives to `wire`, per the data flow of docs/architecture.md.

    A frame shorter than a request prefix, a Produce request that does not decode, or a bad size
    prefix ends the connection; an acks=0 Produce request gets no answer; every other complete
    frame gets one (from the broker, or from the proxy: ApiVersions above its version, rejected
    partitions). The proxy may also close after any answer (an upstream that closes, a rejected
    acks=0 request), which the caller accepts.
    """
    frames, bad_prefix, leftover = split_frames(wire, max_frame)
    answers: list[tuple[int, int, int]] = []
    seen: list[bytes] = []
    for payload in frames:
        seen.append(payload)
        if len(payload) < 8:
            return Expectation(tuple(answers), tuple(seen), False)
        key, version, cid = struct.unpack_from(">hhi", payload)
        if key == PRODUCE:
            try:
                request = decode_request(payload)
            except ProtocolError:
                return Expectation(tuple(answers), tuple(seen), False)
            if int(request.body.acks) == 0:
                continue
        answers.append((key, version, cid))
    return Expectation(tuple(answers), tuple(seen), not (bad_prefix or leftover))


def answer_version(api_key: int, api_version: int) -> tuple[int, int] | None:
    """The (api key, version) an answer decodes as; None when the codec cannot read it."""
    if api_key == API_VERSIONS and api_version > API_VERSIONS_MAX:
        return API_VERSIONS, 0
    if (api_key, api_version) not in CODEC_KEYS:
        return None
    return api_key, api_version


def check_forwarded(
    payload: bytes, answered: bool, sent: set[int], stub_produce_versions: range
) -> str | None:
    """What is wrong with a frame the upstream received, or None.

    A Produce request must decode cleanly and hold only batches with a valid CRC (the default
    policies refuse the rest), and the upstream must not have closed on it (for the versions the
    stub serves). Anything else is relayed as opaque bytes by design: it must be byte for byte a
    frame a client sent, or one of the proxy's own requests (which decode).
    """
    if len(payload) < 8:
        return f"a frame of {len(payload)} bytes, shorter than a request header"
    key, version, _ = struct.unpack_from(">hhi", payload)
    if key != PRODUCE:
        if hash(payload) in sent:
            return None
        try:
            decode_request(payload)
        except ProtocolError as exc:
            return f"an opaque frame no client sent and that does not decode: {exc}"
        return None
    try:
        request = decode_request(payload)
    except ProtocolError as exc:
        return f"a Produce request that does not decode: {exc}"
    for topic in request.body.topic_data:
        for part in topic.partition_data:
            if part.records is None:
                continue
            try:
                for batch in iter_batches(part.records):
                    if not batch.crc_valid():
                        return f"a batch with a bad CRC in {topic.name}/{part.index}"
                    if version >= 3 and batch.magic != 2:
                        return f"a magic {batch.magic} batch in Produce v{version}"
            except ProtocolError as exc:
                return f"records that do not parse in {topic.name}/{part.index}: {exc}"
    if not answered and int(request.body.acks) != 0 and version in stub_produce_versions:
        return "a Produce request the upstream closed the connection on"
    return None


def frame_of(payload: bytes) -> bytes:
    """`payload` with its size prefix."""
    return _I32.pack(len(payload)) + payload


def main(argv: Sequence[str]) -> int:
    """`python -m tests.harness.fuzz SEED INDEX...`: print those inputs."""
    if len(argv) < 2:
        print("usage: python -m tests.harness.fuzz SEED INDEX...", file=sys.stderr)
        return 2
    seed = int(argv[0])
    for index in argv[1:]:
        item = make_input(seed, int(index))
        print(item.describe().replace(item.wire[:512].hex(), item.wire.hex()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
