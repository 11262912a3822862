"""The inputs of the differential test (tests/integration/test_kafka_differential.py): every
Produce that the Kafka test port sends (`tests/unit/test_kafka_parity.py`, captured while it
runs), the fuzz corpus's Produce requests, and corrupt batches made here.

A case is one partition's records and the settings of the topic they go to, in Kafka's names.
The port's inputs are captured by running the port under pytest with this module as a plugin
(`-p tests.harness.differential_cases`, the capture file named by `CAPTURE_ENV`): each call of
`kafka_parity.produce` is written down with the settings of the engine it went to, so a new test
in the port is a new differential case without anything to add here.
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c
import pytest

from kvproxy.protocol.compression import Codec, compress, decompress
from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.messages import PRODUCE, decode_request
from kvproxy.protocol.records import build_batch
from tests.harness import fuzz
from tests.harness.fuzz import encode_varint as _varint
from tests.harness.kafka_parity import (
    ATTRIBUTES,
    BASE_SEQUENCE,
    LAST_OFFSET_DELTA,
    PRODUCER_ID,
    RECORDS_COUNT,
    end_transaction_marker,
    log_append_time,
    patch,
    v2_batch,
)

CAPTURE_ENV = "KVPROXY_DIFFERENTIAL_CAPTURE"
REPOSITORY = Path(__file__).resolve().parents[2]
NOW_PLACEHOLDER = 1_700_000_000_000
"""The clock the corrupt cases are written for (shifted to the broker's clock when sent)."""
HOUR_MS = 3_600_000

Settings = tuple[tuple[str, str], ...]
"""A topic's settings in Kafka's names, sorted: the key its real topic is made for."""


@dataclass(frozen=True)
class Case:
    """One partition's records sent on every Produce version both sides accept."""

    name: str
    records: bytes | None
    settings: Settings = ()
    clock_ms: int | None = None
    """The clock the records' timestamps were written for: they are moved by (now - clock_ms)
    when sent, so that Kafka's wall clock sees them as the case meant (None: sent as written)."""
    transactional_id: str | None = None
    acks: int = -1
    group: str = ""
    """Cases of one group share producer state (in order); another group's producer ids are
    other producers on the broker."""
    answer_timeout_s: float = 15.0
    """How long an answer is waited for (a broker that never answers is an outcome too)."""


def settings_of(**configs: object) -> Settings:
    return tuple(sorted((name.replace("_", "."), str(value)) for name, value in configs.items()))


# ---- what is sent: timestamps on the broker's clock, producer ids of their own -----------


def adjust(records: bytes, shift_ms: int, renumber: Any) -> bytes:
    """`records` with timestamps moved by `shift_ms` (magic 2 batches, magic 1 messages and the
    messages inside a magic 1 wrapper) and producer ids renumbered; a CRC that was valid is
    made valid again, a stale one stays stale. Bytes that do not parse are left as they are."""
    out = []
    start = 0
    while start + 17 <= len(records):
        (length,) = struct.unpack_from(">i", records, start + 8)
        end = start + 12 + length
        magic = records[start + 16]
        if end > len(records) or length < 14 or magic > 2 or (magic == 2 and length < 49):
            break
        piece = records[start:end]
        if magic == 2:
            piece = _batch(piece, shift_ms, renumber)
        elif magic == 1 and shift_ms:
            piece = _legacy(piece, shift_ms)
        out.append(piece)
        start = end
    return b"".join(out) + records[start:]


def _batch(batch: bytes, shift_ms: int, renumber: Any) -> bytes:
    buf = bytearray(batch)
    crc_valid = struct.unpack_from(">I", buf, 17)[0] == crc32c.crc32c(bytes(buf[21:]))
    for position in (27, 35):
        (stamp,) = struct.unpack_from(">q", buf, position)
        if stamp >= 0 and shift_ms:
            struct.pack_into(">q", buf, position, stamp + shift_ms)
    (producer_id,) = struct.unpack_from(">q", buf, 43)
    if producer_id >= 0:
        struct.pack_into(">q", buf, 43, renumber(producer_id))
    if crc_valid:
        struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


def _legacy(message: bytes, shift_ms: int) -> bytes:
    """A magic 1 message (log header included) with its timestamp moved, and a wrapper's inner
    messages with theirs (decompressed, moved, compressed again)."""
    try:
        offset, _, crc = struct.unpack_from(">qiI", message)
        body = bytearray(message[16:])  # magic, attributes, timestamp, key, value
        crc_valid = zlib.crc32(body) == crc
        (stamp,) = struct.unpack_from(">q", body, 2)
        if stamp >= 0:
            struct.pack_into(">q", body, 2, stamp + shift_ms)
        codec = body[1] & 0x07
        if codec:
            (key_length,) = struct.unpack_from(">i", body, 10)
            position = 14 + max(key_length, 0)
            (value_length,) = struct.unpack_from(">i", body, position)
            value = bytes(body[position + 4 : position + 4 + value_length])
            inner = adjust(bytes(decompress(codec, value)), shift_ms, lambda pid: pid)
            value = compress(codec, inner)
            body = body[:position] + struct.pack(">i", len(value)) + value
        if crc_valid:
            crc = zlib.crc32(body)
        return struct.pack(">qiI", offset, len(body) + 4, crc) + bytes(body)
    except (ProtocolError, struct.error):
        return message


# ---- the port, captured -------------------------------------------------------------------------


def _port_settings(
    policies: list[Any] | None, compacted: bool, topics: list[dict[str, Any]] | None
) -> dict[str, str]:
    out: dict[str, str] = {}
    for spec in policies or ():
        if isinstance(spec, dict) and "timestamps" in spec:
            options = spec["timestamps"]
            out["message.timestamp.type"] = options.get("type", "CreateTime")
            for option in ("before_max_ms", "after_max_ms"):
                if option in options:
                    out[f"message.timestamp.{option.replace('_', '.')}"] = str(options[option])
    if compacted:
        out["cleanup.policy"] = "compact"
    for topic in topics or ():
        out.update({name: str(value) for name, value in topic.get("config", {}).items()})
    if out.get("message.timestamp.type") == "CreateTime":
        del out["message.timestamp.type"]  # the default
    return out


def pytest_configure(config: pytest.Config) -> None:
    """As a plugin: write down every Produce the port sends (nothing unless `CAPTURE_ENV`)."""
    path = os.environ.get(CAPTURE_ENV)
    if not path:
        return
    from tests.harness import kafka_parity

    engines: dict[int, tuple[Any, str]] = {}
    make_engine, send = kafka_parity.kafka_engine, kafka_parity.produce

    def kafka_engine(policies: Any, *, compacted: bool = False, topics: Any = None) -> Any:
        engine = make_engine(policies, compacted=compacted, topics=topics)
        settings = _port_settings(policies, compacted, topics)
        engines[id(engine)] = (engine, json.dumps(settings, sort_keys=True))
        return engine

    def produce(engine: Any, records: bytes | None, **options: Any) -> Any:
        _, settings = engines[id(engine)]
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0].split("::")[-1]
        entry = {
            "test": test,
            "engine": f"{test}/{list(engines).index(id(engine))}",
            "settings": json.loads(settings),
            "records": None if records is None else records.hex(),
            "version": options.get("version", 9),
            "now_ms": options.get("now_ms", kafka_parity.NOW),
            "transactional_id": options.get("transactional_id"),
        }
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")
        return send(engine, records, **options)

    kafka_parity.kafka_engine = kafka_engine  # type: ignore[assignment]
    kafka_parity.produce = produce  # type: ignore[assignment]


def port_cases(work: Path) -> list[Case]:
    """Every Produce of the port, in the order it sends them (it must pass while captured)."""
    capture = work / "port-capture.jsonl"
    capture.unlink(missing_ok=True)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p"]
    command += [__name__, "tests/unit/test_kafka_parity.py"]
    env = {**os.environ, CAPTURE_ENV: str(capture)}
    done = subprocess.run(
        command, check=False, cwd=REPOSITORY, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    cases: list[Case] = []
    seen: dict[str, int] = {}
    for line in capture.read_text().splitlines():
        entry = json.loads(line)
        number = seen[entry["test"]] = seen.get(entry["test"], 0) + 1
        records = None if entry["records"] is None else bytes.fromhex(entry["records"])
        cases.append(
            Case(
                name=f"port/{entry['test']}#{number}",
                records=records,
                settings=tuple(sorted(entry["settings"].items())),
                clock_ms=entry["now_ms"],
                transactional_id=entry["transactional_id"],
                group=entry["engine"],
            )
        )
    return cases


# ---- the fuzz corpus ----------------------------------------------------------------------------


def corpus_cases() -> list[Case]:
    """Each partition of each Produce request in `fuzz.corpus()`, once per distinct records."""
    cases: list[Case] = []
    seen: set[tuple[bytes | None, int, str | None]] = set()
    for index, payload in enumerate(fuzz.corpus()):
        request = decode_request(payload)
        if request.header.api_key != PRODUCE:
            continue
        body = request.body
        acks = int(body.acks)
        transactional_id = getattr(body, "transactional_id", None)
        for topic in body.topic_data:
            for part in topic.partition_data:
                records = None if part.records is None else bytes(part.records)
                key = (records, acks, transactional_id)
                if key in seen:
                    continue
                seen.add(key)
                cases.append(
                    Case(
                        name=f"corpus/{index}-{int(part.index)}",
                        records=records,
                        transactional_id=transactional_id,
                        acks=acks,
                        group=f"corpus/{index}-{int(part.index)}",
                    )
                )
    return cases


MUTATIONS = 80
"""Corpus batches with one header field changed by the fuzzer (`fuzz.batch_field`)."""


def mutated_cases(count: int = MUTATIONS, seed: int = 27) -> list[Case]:
    """Produce requests of the corpus with one batch header field changed (magic, attributes,
    base offset, lengths, counts, producer fields; the CRC mostly recomputed), acks=-1."""
    rng = random.Random(seed)
    seeds = [p for p in fuzz.corpus() if decode_request(p).header.api_key == PRODUCE]
    cases: list[Case] = []
    while len(cases) < count:
        payload = fuzz.batch_field(rng, rng.choice(seeds))
        try:
            request = decode_request(payload)
        except ProtocolError:
            continue
        for topic in request.body.topic_data:
            for part in topic.partition_data:
                name = f"mutated/{len(cases)}"
                records = None if part.records is None else bytes(part.records)
                cases.append(Case(name=name, records=records, group=name))
    return cases[:count]


# ---- corrupt batches made here ------------------------------------------------------------------

T = NOW_PLACEHOLDER


def _three(codec: Codec = Codec.NONE, *, key: bytes | None = b"k", **options: Any) -> bytes:
    return build_batch([(key, b"v%d" % i, None, T + i) for i in range(3)], codec=codec, **options)


def _flip(raw: bytes, position: int) -> bytes:
    buf = bytearray(raw)
    buf[position] ^= 0xFF
    return bytes(buf)


def _made() -> Iterator[tuple[str, bytes | None, Mapping[str, object], dict[str, Any]]]:
    """(name, records, topic settings, Case options)."""
    plain: Mapping[str, object] = {}
    for codec in Codec:
        name = codec.name.lower()
        yield f"valid-{name}", _three(codec), plain, {}
        yield f"bad-crc-{name}", _flip(_three(codec), len(_three(codec)) - 2), plain, {}
        yield f"count-over-{name}", patch(_three(codec), ">i", RECORDS_COUNT, 5), plain, {}
        yield f"count-under-{name}", patch(_three(codec), ">i", RECORDS_COUNT, 2), plain, {}
        yield (
            f"null-key-compacted-{name}",
            _three(codec, key=None),
            {"cleanup.policy": "compact"},
            {},
        )
        garbage = v2_batch([(0, T, b"k", b"v")], codec=codec)
        if codec is not Codec.NONE:
            buf = bytearray(garbage)
            buf[61:] = b"\x13" * (len(buf) - 61)
            garbage = patch(bytes(buf), ">h", ATTRIBUTES, int(codec))
            yield f"garbage-payload-{name}", garbage, plain, {}
    raw = _three()
    yield "magic-3", patch(raw, ">b", 16, 3, fix_crc=False), plain, {}
    yield "magic-1-set", build_batch([(b"k", b"v", None, T)], magic=1), plain, {}
    yield "magic-0-set", build_batch([(b"k", b"v", None, None)], magic=0), plain, {}
    yield "last-offset-delta-5", patch(raw, ">i", LAST_OFFSET_DELTA, 5), plain, {}
    yield "last-offset-delta-negative", patch(raw, ">i", LAST_OFFSET_DELTA, -1), plain, {}
    yield "count-negative", patch(raw, ">i", RECORDS_COUNT, -1), plain, {}
    yield "base-offset-7", patch(raw, ">q", 0, 7, fix_crc=False), plain, {}
    yield "length-short", patch(raw, ">i", 8, len(raw) - 14, fix_crc=False), plain, {}
    yield "length-long", patch(raw, ">i", 8, len(raw) + 100, fix_crc=False), plain, {}
    yield "length-13", patch(raw, ">i", 8, 13, fix_crc=False), plain, {}
    yield "length-20", patch(raw, ">i", 8, 20, fix_crc=False), plain, {}
    yield "truncated", raw[:-5], plain, {}
    yield "header-only", raw[:11], plain, {}
    yield "trailing-header", raw + raw[:20], plain, {}
    yield "magic-3-truncated", patch(raw, ">b", 16, 3, fix_crc=False)[:30], plain, {}
    yield "magic-negative", patch(raw, ">b", 16, -2, fix_crc=False), plain, {}
    yield "trailing-bytes", raw + b"\x00\x01\x02", plain, {}
    yield "two-batches", raw + _three(base_offset=3), plain, {}
    yield "empty-records", b"", plain, {}
    yield "null-records", None, plain, {"answer_timeout_s": 2.0}
    yield "garbage", b"\x00\x01garbage-bytes-that-are-no-batch", plain, {}
    yield "empty-batch", v2_batch([], count=0, base_timestamp=T, max_timestamp=T), plain, {}
    yield "control-no-txn", end_transaction_marker(4000, 0, T), plain, {}
    yield "control-txn", end_transaction_marker(4001, 0, T), plain, {"transactional_id": "txn"}
    yield (
        "transactional-no-id",
        _three(producer_id=4002, producer_epoch=0, base_sequence=0, is_transactional=True),
        plain,
        {},
    )
    yield "idempotent", _three(producer_id=4003, producer_epoch=0, base_sequence=0), plain, {}
    yield "idempotent-seq-5", _three(producer_id=4004, producer_epoch=0, base_sequence=5), plain, {}
    idem = _three(producer_id=4005, producer_epoch=0, base_sequence=0)
    yield "idempotent-seq-negative", patch(idem, ">i", BASE_SEQUENCE, -1), plain, {}
    yield (
        "idempotent-epoch-negative",
        _three(producer_id=4006, producer_epoch=-1, base_sequence=0),
        plain,
        {},
    )
    yield "sequence-without-producer", patch(raw, ">i", BASE_SEQUENCE, 3), plain, {}
    yield "producer-without-sequence", patch(raw, ">q", PRODUCER_ID, 4007), plain, {}
    yield "log-append-time-from-client", log_append_time(raw), plain, {}
    for name, record in _odd_records():
        for codec in (Codec.NONE, Codec.GZIP):
            yield f"{name}-{codec.name.lower()}", _one_record_batch(record, codec), plain, {}
    for type_ in ("CreateTime", "LogAppendTime"):
        topic = {
            "message.timestamp.before.max.ms": 60_000,
            "message.timestamp.after.max.ms": 60_000,
        }
        if type_ == "LogAppendTime":
            topic["message.timestamp.type"] = type_
        for label, offset in (("past", -HOUR_MS), ("future", HOUR_MS), ("now", 0)):
            records = build_batch(
                [(b"k", b"v", None, T + offset), (b"k", b"w", None, T)], codec=Codec.GZIP
            )
            yield f"{type_}-{label}-hour", records, topic, {}
        no_stamp = build_batch([(b"k", b"v", None, -1)])
        yield f"{type_}-no-timestamp", no_stamp, topic, {}
    big = build_batch([(b"k", b"x" * 2000, None, T)])
    yield "over-max-message-bytes", big, {"max.message.bytes": 1000}, {}
    yield "at-max-message-bytes", big, {"max.message.bytes": len(big)}, {}
    huge = build_batch([(b"k", bytes(1_100_000), None, T)])
    yield (
        "over-segment-bytes",
        huge,
        {"segment.bytes": 1_048_576, "max.message.bytes": 2_000_000},
        {},
    )
    yield "acks-0-valid", raw, plain, {"acks": 0}
    yield "acks-0-bad-crc", _flip(raw, len(raw) - 2), plain, {"acks": 0}
    yield "acks-0-null-key-compacted", _three(key=None), {"cleanup.policy": "compact"}, {"acks": 0}
    yield "acks-1-bad-crc", _flip(raw, len(raw) - 2), plain, {"acks": 1}


def _odd_records() -> Iterator[tuple[str, bytes]]:
    """The inside of one record (attributes .. headers) that Kafka's record reader refuses."""
    start = bytes([0]) + _varint(0) + _varint(0)
    yield "key-length-minus-2", start + _varint(-2) + _varint(1) + b"v" + _varint(0)
    yield "value-length-minus-2", start + _varint(1) + b"k" + _varint(-2) + _varint(0)
    yield (
        "header-key-null",
        start
        + _varint(1)
        + b"k"
        + _varint(1)
        + b"v"
        + _varint(1)
        + (_varint(-1) + _varint(1) + b"h"),
    )
    yield "header-count-negative", start + _varint(1) + b"k" + _varint(1) + b"v" + _varint(-2)
    yield "header-count-over", start + _varint(1) + b"k" + _varint(1) + b"v" + _varint(3)
    yield "varint-overlong", start + b"\xff" * 10 + b"\x01" + _varint(0)


def _one_record_batch(record: bytes, codec: Codec) -> bytes:
    """A valid batch of one record whose inside is `record` (CRC valid)."""
    body = _varint(len(record)) + record
    if codec is not Codec.NONE:
        body = compress(codec, body)
    tail = struct.pack(">hiqqqhii", int(codec), 0, T, T, -1, -1, -1, 1) + body
    head = struct.pack(">qiib", 0, 4 + 1 + 4 + len(tail), -1, 2)
    return head + struct.pack(">I", crc32c.crc32c(tail)) + tail


def made_cases() -> list[Case]:
    return [
        Case(
            name=f"made/{name}",
            records=records,
            settings=tuple(sorted((k, str(v)) for k, v in settings.items())),
            clock_ms=NOW_PLACEHOLDER,
            group=f"made/{name}",
            **options,
        )
        for name, records, settings, options in _made()
    ]


def _stateless(case: Case) -> bool:
    """No producer id and no transaction: sending it twice is the same test."""
    if case.transactional_id is not None:
        return False
    records = case.records or b""
    return len(records) < 51 or struct.unpack_from(">q", records, 43)[0] < 0


def varlong_cases() -> list[Case]:
    """A timestamp delta of 10 bytes whose raw value passes 64 bits: Kafka keeps the low 64 (and
    so must the proxy's checks). Written for the moment they are made (the broker's and the
    proxy's clock then), not moved: their first timestamps are far from any clock."""
    now = int(time.time() * 1000)
    # raw 2**64: in 70 bits now + 10 minutes; Kafka reads delta 0, a timestamp 2**63 ms ago
    ago = now + 600_000 - 2**63
    hidden_past = v2_batch([(0, ago + 2**63, b"k", b"v")], base_timestamp=ago, max_timestamp=ago)
    # raw 2**64 + 1: in 70 bits 2**63 ms before the first; Kafka reads -1, 30 days ahead
    ahead = now + 30 * 24 * HOUR_MS
    hidden_future = v2_batch(
        [(0, ahead + 1 - 2**63 - 1, b"k", b"v")], base_timestamp=ahead + 1, max_timestamp=ahead
    )
    week = settings_of(message_timestamp_before_max_ms=7 * 24 * HOUR_MS)
    return [
        Case("varlong/delta-2**64-past-a-week", hidden_past, week, group="varlong/past"),
        Case("varlong/delta-2**64+1-a-month-ahead", hidden_future, (), group="varlong/ahead"),
    ]


def all_cases(work: Path) -> list[Case]:
    """Every case, the port's repeated inputs once (several of its tests send the same
    records to topics with the same settings: the proxy's checks are the default ones here)."""
    cases: list[Case] = []
    seen: set[tuple[object, ...]] = set()
    every = (*port_cases(work), *corpus_cases(), *made_cases(), *varlong_cases(), *mutated_cases())
    for case in every:
        key = (case.records, case.settings, case.clock_ms, case.acks)
        if _stateless(case) and case.name.startswith("port/"):
            if key in seen:
                continue
            seen.add(key)
        cases.append(case)
    return cases
