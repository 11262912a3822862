"""The compiled record skim (kvproxy/protocol/records/_skim.c) is installed, is the one used, and
gives
exactly the pure-Python skim's answers: on Kafka's own batches, on generated ones (null keys,
headers with valid and invalid UTF-8 keys, log-append time, negative and extreme timestamp
deltas) and on every kind of damage (truncation, flipped bytes, wrong counts, trailing bytes,
over-long varints). Without it the pure-Python skim runs and the proxy decides the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvproxy.policies.config import build_routing
from kvproxy.protocol import messages
from kvproxy.protocol.compression import Codec, decompress
from kvproxy.protocol.records import batch_v2, build_batch, skim
from kvproxy.protocol.records.layout import V2_HEADER_SIZE
from kvproxy.protocol.records.readers import iter_batches, read_batch
from kvproxy.protocol.records.record import RecordScan
from kvproxy.protocol.records.skim import python_skim_v2
from kvproxy.proxy.produce.decision import ProduceSettings
from kvproxy.proxy.produce.engine import ProduceEngine
from tests.harness.fuzz import produce_request
from tests.harness.records_testdata import SEGMENTS, segment_bytes

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"


def compiled_skim() -> Callable[..., Any]:
    from kvproxy.protocol.records import _skim

    return _skim.skim_v2


def compiled_values() -> Callable[..., Any]:
    from kvproxy.protocol.records import _skim

    return _skim.values_v2


# ---- the build ----


@pytest.mark.compiled
def test_the_installed_package_has_the_compiled_skim_and_uses_it() -> None:
    """Fails when the install fell back to pure Python (this machine has a C compiler)."""
    from kvproxy.protocol.records import _skim

    assert skim.COMPILED
    assert skim.skim_v2 is _skim.skim_v2
    assert batch_v2.skim_v2 is _skim.skim_v2
    assert batch_v2.values_v2 is _skim.values_v2
    assert batch_v2.SKIM_FROM_BYTES_PER_RECORD == 0  # every batch is skimmed
    source = ROOT / "kvproxy" / "protocol" / "records" / "_skim.c"
    assert Path(_skim.__file__).stat().st_mtime >= source.stat().st_mtime, (
        "_skim.c changed after the module was built: reinstall (make setup)"
    )


# ---- raw records, every field under the test's control ----


def varint(value: int, width: int = 0) -> bytes:
    """`value` zigzag-encoded as a varint, padded with continuation bytes to `width` bytes."""
    raw = value << 1 if value >= 0 else ((-value) << 1) - 1
    out = bytearray()
    while True:
        out.append(raw & 0x7F)
        raw >>= 7
        if not raw:
            break
        out[-1] |= 0x80
    while len(out) < width:
        out[-1] |= 0x80
        out.append(0)
    return bytes(out)


def field(data: bytes | None) -> bytes:
    return varint(-1) if data is None else varint(len(data)) + data


def raw_record(
    *,
    delta: int = 0,
    key: bytes | None = b"k",
    value: bytes | None = b"v",
    headers: tuple[tuple[bytes, bytes | None], ...] = (),
    attributes: int = 0,
    delta_width: int = 0,
    length_width: int = 0,
    length_change: int = 0,
) -> bytes:
    body = (
        bytes([attributes])
        + varint(delta, delta_width)
        + varint(0)
        + field(key)
        + field(value)
        + varint(len(headers))
        + b"".join(field(k) + field(v) for k, v in headers)
    )
    return varint(len(body) + length_change, length_width) + body


def plain(*records: bytes) -> bytes:
    """An uncompressed batch as the skim reads it: the header (not read), then the records."""
    return bytes(V2_HEADER_SIZE) + b"".join(records)


def agree(buffer: Any, count: int, first: int, max_ts: int, log_append: bool) -> Any:
    """Both skims on the same input; their common answer. The compiled value reader declines
    exactly the batches the skims decline, and what they accept aiokafka's C reader reads to the
    same values, count, timestamps and null keys."""
    expected = python_skim_v2(buffer, count, first, max_ts, log_append)
    shown = (bytes(buffer)[V2_HEADER_SIZE : V2_HEADER_SIZE + 80], count, first, max_ts, log_append)
    assert compiled_skim()(buffer, count, first, max_ts, log_append) == expected, shown
    values = compiled_values()(buffer, count, first, max_ts, log_append)
    if expected is None:
        assert values is None, shown
    else:
        records = reader_records(bytes(buffer), count, first, max_ts, log_append)
        assert values == [record.value for record in records], shown
        if records:
            stamps = [record.timestamp for record in records]
            nulls = sum(record.key is None for record in records)
            assert expected == (len(records), min(stamps), max(stamps), nulls), shown
    return expected


def reader_records(
    batch: bytes, count: int, first: int = 0, max_ts: int = 0, log_append: bool = False
) -> list[Any]:
    """The records aiokafka's C reader reads from an uncompressed batch, with the count, first
    and max timestamps and timestamp type put in its header (which `plain` leaves zero)."""
    header = bytearray(batch[:V2_HEADER_SIZE])
    header[21:23] = (0x08 if log_append else 0).to_bytes(2, "big")
    header[27:35] = first.to_bytes(8, "big", signed=True)
    header[35:43] = max_ts.to_bytes(8, "big", signed=True)
    header[V2_HEADER_SIZE - 4 :] = max(count, 0).to_bytes(4, "big")  # a negative one reads none
    return list(DefaultRecordBatch(bytes(header) + batch[V2_HEADER_SIZE:]))


def test_a_plain_batch_gives_a_record_scan() -> None:
    batch = plain(raw_record(delta=5), raw_record(delta=-3, key=None), raw_record(delta=2))
    scan = agree(batch, 3, 1000, 2000, False)
    assert scan == (3, 997, 1005, 1)
    assert type(scan) is RecordScan
    assert scan.null_keys == 1
    assert agree(batch, 3, 1000, 2000, True) == (3, 2000, 2000, 1)
    assert agree(plain(), 0, 5, 6, False) == (0, 0, 0, 0)


@pytest.mark.parametrize(
    "wrap",
    [
        bytes,
        bytearray,
        memoryview,
        lambda b: memoryview(bytearray(b)).toreadonly(),
        lambda b: memoryview(b"xyz" + b + b"xyz")[3:-3],
    ],
    ids=["bytes", "bytearray", "memoryview", "readonly-view-of-bytearray", "view-slice"],
)
@pytest.mark.parametrize("records", [3, 400], ids=["small", "over-64-KiB"])
def test_any_buffer_is_read(wrap: Callable[[bytes], Any], records: int) -> None:
    value = bytes(200)
    batch = plain(*(raw_record(delta=i, value=value) for i in range(records)))
    assert agree(wrap(batch), records, 10, 20, False) == (records, 10, 10 + records - 1, 0)
    assert agree(wrap(batch + b"\0"), records, 10, 20, False) is None


def kafka_timestamp(first: int, delta: int) -> int:
    """What Kafka makes of a record's timestamp whose delta `varint` encodes: the varlong read
    into a long (`ByteUtils.readVarlong` keeps the low 64 bits of the raw value), added to the
    first timestamp as Java adds two longs."""
    raw = (delta << 1 if delta >= 0 else ((-delta) << 1) - 1) & (2**64 - 1)
    value = (raw >> 1) ^ -(raw & 1)
    return (first + value + 2**63) % 2**64 - 2**63


def test_timestamps_at_the_ends_of_int64_wrap_as_kafkas() -> None:
    """A sum beyond int64 wraps, as Java's; no timestamp delta of 10 bytes is declined."""
    cases = [
        (INT64_MAX, 0),
        (INT64_MAX - 5, 5),
        (INT64_MAX - 5, 6),
        (INT64_MIN, 0),
        (INT64_MIN + 5, -5),
        (INT64_MIN + 5, -6),
        (INT64_MIN, INT64_MAX),
        (INT64_MIN, 2**64 - 1),
        (INT64_MIN, 2**64),
        (INT64_MAX, -(2**64) + 1),
        (INT64_MAX, -(2**64)),
        (INT64_MAX, -(2**64) - 1),
        (0, 2**69 - 1),
        (0, -(2**69)),
        (-1, 2**63),
        (0, 2**63),
    ]
    for first, delta in cases:
        batch = plain(raw_record(delta=delta))
        stamp = kafka_timestamp(first, delta)
        assert agree(batch, 1, first, INT64_MAX, False) == (1, stamp, stamp, 0), (first, delta)
        assert agree(batch, 1, first, INT64_MIN, True) == (1, INT64_MIN, INT64_MIN, 0)


NOW = 1_796_000_000_000  # 2026-11-30, in ms
TEN_MINUTES, THIRTY_DAYS = 600_000, 30 * 86_400_000


@pytest.mark.parametrize(
    ("first", "delta", "stored"),
    [
        # 2**64 raw: read in 70 bits, now + 10 minutes; Kafka keeps none of it (delta 0)
        (NOW + TEN_MINUTES - 2**63, 2**63, NOW + TEN_MINUTES - 2**63),
        # 2**64 + 1 raw: read in 70 bits, 2**63 ms before the first; Kafka reads -1
        (NOW + THIRTY_DAYS + 1, -(2**63) - 1, NOW + THIRTY_DAYS),
    ],
    ids=["hides-a-timestamp-2**63-in-the-past", "hides-a-timestamp-30-days-ahead"],
)
def test_a_delta_beyond_64_bits_gives_the_timestamp_kafka_stores(
    first: int, delta: int, stored: int
) -> None:
    """The check sees the timestamp Kafka 4.4 stores (-9223370240691356141 for the first case,
    on the day it was found), not the one 70 bits of the varint would give."""
    batch = plain(raw_record(delta=delta))
    assert len(varint(delta)) == 10
    assert kafka_timestamp(first, delta) == stored
    assert agree(batch, 1, first, first, False) == (1, stored, stored, 0)
    [record] = reader_records(batch, 1, first, first)
    assert record.timestamp == stored


@pytest.mark.parametrize(("fifth", "accepted"), [(0x0F, True), (0x10, False), (0x7F, False)])
def test_a_five_byte_varint_is_kafkas_int(fifth: int, accepted: bool) -> None:
    """Kafka's `readVarint` drops a fifth byte's bits beyond the 32nd, aiokafka's reader keeps
    them: such a varint (here an offset delta, which the skims do not use) is left to the
    reader, whose answer is the one given."""
    body = bytes([0]) + varint(0) + bytes([0x80, 0x80, 0x80, 0x80, fifth])
    body += field(b"k") + field(b"v") + varint(0)
    batch = plain(varint(len(body)) + body)
    assert (agree(batch, 1, 0, 0, False) is not None) is accepted


@pytest.mark.parametrize(("width", "accepted"), [(5, True), (6, False)])
def test_lengths_are_varints_of_five_bytes_at_most(width: int, accepted: bool) -> None:
    batch = plain(raw_record(length_width=width))
    assert (agree(batch, 1, 0, 0, False) is not None) is accepted


@pytest.mark.parametrize(("width", "accepted"), [(10, True), (11, False)])
def test_the_timestamp_delta_is_a_varint_of_ten_bytes_at_most(width: int, accepted: bool) -> None:
    for log_append in (False, True):
        batch = plain(raw_record(delta=-7, delta_width=width))
        assert (agree(batch, 1, 100, 100, log_append) is not None) is accepted


def test_attributes_are_one_byte_read_as_a_varint() -> None:
    assert agree(plain(raw_record(attributes=0x7F)), 1, 0, 0, False) is not None
    assert agree(plain(raw_record(attributes=0x80)), 1, 0, 0, False) is None


def test_header_keys_are_utf8_as_pythons_strict_decoder_reads_it() -> None:
    """Every 1- and 2-byte key, and 3- and 4-byte keys around every boundary of UTF-8 (the
    pure-Python skim decodes the key with that decoder: the compiled one is compared with it)."""
    edges = [0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xFF]
    keys = [bytes([a]) for a in range(256)]
    keys += [bytes([a, b]) for a in range(256) for b in range(256)]
    keys += [bytes([a, b, c]) for a in range(0xE0, 0x100) for b in range(256) for c in edges]
    keys += [
        bytes([a, b, c, d]) for a in range(0xF0, 0xF8) for b in edges for c in edges for d in edges
    ]
    keys += [b"ok" + k for k in (b"\xe2\x82", b"\xf0\x9f\x98", b"\xc3")]  # cut short at the end
    keys += [k + b"ok" for k in keys[-3:]]
    skim_compiled = compiled_skim()
    valid = 0
    for key in keys:
        batch = plain(raw_record(headers=((b"first", None), (key, b"v"))))
        try:
            key.decode("utf-8")
        except UnicodeDecodeError:
            expected = False
        else:
            expected = True
        assert (skim_compiled(batch, 1, 0, 0, False) is not None) is expected, key
        valid += expected
    assert valid > 10_000
    for key in keys[::97]:  # and the pure-Python skim, on a sample
        agree(plain(raw_record(headers=((key, None),))), 1, 0, 0, False)


# ---- generated batches and their damage ----

record_fields = st.fixed_dictionaries(
    {
        "delta": st.one_of(
            st.integers(-1000, 1000),
            st.integers(-(2**70), 2**70),
            st.sampled_from([INT64_MAX, INT64_MIN, 2**64 - 1, -(2**64)]),
        ),
        "key": st.one_of(st.none(), st.binary(max_size=12)),
        "value": st.one_of(st.none(), st.binary(max_size=40)),
        "headers": st.lists(
            st.tuples(
                st.one_of(st.text(max_size=6).map(str.encode), st.binary(max_size=6)),
                st.one_of(st.none(), st.binary(max_size=6)),
            ),
            max_size=3,
        ).map(tuple),
    }
)
timestamps = st.one_of(
    st.integers(-(10**13), 10**13),
    st.integers(INT64_MIN, INT64_MAX),
    st.sampled_from([INT64_MIN, INT64_MAX, -1, 0]),
)


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    rows=st.lists(record_fields, max_size=6),
    stamps=st.tuples(timestamps, timestamps, st.booleans()),
    count_change=st.sampled_from([0, 0, 0, -1, 1, -(2**40), 2**40, 2**63, 2**63 + 5, -(2**63)]),
    damage=st.data(),
)
def test_the_skims_agree_on_generated_and_damaged_batches(
    rows: list[dict[str, Any]],
    stamps: tuple[int, int, bool],
    count_change: int,
    damage: st.DataObject,
) -> None:
    """(first timestamp, max timestamp, log-append time) in `stamps`."""
    batch = bytearray(plain(*(raw_record(**row) for row in rows)))
    count = len(rows) + count_change
    variants = [bytes(batch)]
    if len(batch) > V2_HEADER_SIZE:
        at = damage.draw(st.integers(V2_HEADER_SIZE, len(batch) - 1))
        flipped = bytearray(batch)
        flipped[at] ^= damage.draw(st.integers(1, 255))
        variants += [bytes(flipped), bytes(batch[:at])]
    variants.append(bytes(batch) + damage.draw(st.binary(min_size=1, max_size=4)))
    variants.append(bytes(batch) + raw_record(delta_width=damage.draw(st.integers(1, 12))))
    for variant in variants:
        agree(variant, count, *stamps)
        agree(variant, count + 1, *stamps)


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.GZIP, Codec.ZSTD])
def test_the_skims_agree_on_built_batches_of_every_size(codec: Codec) -> None:
    for rows in range(0, 300, 37):
        records = [
            (
                None if i % 3 == 0 else b"key-%d" % i,
                bytes(i * 13 % 1500),
                [("h\u00e9", b"x"), ("trace", None)] if i % 4 == 0 else None,
                1_700_000_000_000 + (i * 7919) % 5000 - 2500,
            )
            for i in range(rows)
        ]
        for timestamp_type in (0, 1):
            batch = build_batch(records, codec=codec, timestamp_type=timestamp_type)
            for rb, scan in scans_of(batch):
                assert scan is not None
                assert scan == reader_scan(rb) == rb.scan()


# ---- Kafka's own batches ----


def reader_scan(rb: Any) -> RecordScan:
    """What aiokafka's C reader finds, record by record."""
    records = list(read_batch(rb.buffer)[0].records())
    stamps = [r.timestamp for r in records] or [0]
    return RecordScan(len(records), min(stamps), max(stamps), sum(r.key is None for r in records))


def scans_of(buffer: bytes) -> Iterator[tuple[Any, Any]]:
    """Each magic 2 batch of `buffer` and its common skim (damaged copies too, the skims agreeing
    on those as well)."""
    for rb in iter_batches(buffer):
        if rb.magic != 2:
            continue
        records = bytes(rb.buffer[V2_HEADER_SIZE:])
        if rb.codec is not Codec.NONE:
            records = bytes(decompress(rb.codec, records))
        batch = plain(records)
        args = (rb.record_count, rb.first_timestamp, rb.max_timestamp, rb.timestamp_type == 1)
        scan = agree(batch, *args)
        for cut in range(V2_HEADER_SIZE, len(batch), max(1, len(records) // 7)):
            agree(batch[:cut], *args)
            flipped = bytearray(batch)
            flipped[cut] ^= 0x41
            agree(bytes(flipped), *args)
        yield read_batch(rb.buffer)[0], scan


@pytest.mark.parametrize("folder", sorted(SEGMENTS))
def test_the_skims_agree_on_kafka_log_segments(folder: str) -> None:
    scanned = 0
    for rb, scan in scans_of(segment_bytes(folder)):
        assert scan is not None, f"a batch Kafka wrote was declined: {rb.base_offset}"
        assert scan == reader_scan(rb) == rb.scan()
        assert list(rb.values()) == [r.value for r in read_batch(rb.buffer)[0].records()]
        scanned += 1
    assert scanned


def test_the_skims_agree_on_golden_produce_requests() -> None:
    scanned = 0
    for path in sorted(GOLDEN.glob("*-produce-v*.bin")):
        request = messages.decode_request(path.read_bytes())
        for topic in request.body.topic_data:
            for partition in topic.partition_data:
                if partition.records:
                    for rb, scan in scans_of(bytes(partition.records)):
                        assert scan == reader_scan(rb) == rb.scan()
                        assert list(rb.values()) == [r.value for r in rb.records()]
                        scanned += 1
    assert scanned >= 10


# ---- without the compiled skim ----


def hide_compiled_skim(monkeypatch: pytest.MonkeyPatch) -> None:
    """What skim.py chooses when `_skim` cannot be imported."""
    monkeypatch.setattr(batch_v2, "skim_v2", python_skim_v2)
    monkeypatch.setattr(
        batch_v2, "SKIM_FROM_BYTES_PER_RECORD", skim.PYTHON_SKIM_FROM_BYTES_PER_RECORD
    )
    monkeypatch.setattr(batch_v2, "values_v2", None)


def decision_batches() -> list[bytes]:
    batches = []
    for rows, value_bytes in ((1, 10), (40, 1000), (3, 20_000)):
        for codec in (Codec.NONE, Codec.LZ4):
            for with_null in (False, True):
                records = [
                    (None if with_null and i == rows - 1 else b"k%d" % i, bytes(value_bytes), None)
                    for i in range(rows)
                ]
                good = build_batch([(*r, None) for r in records], codec=codec)
                batches.append(good)
                old = build_batch([(*r, 1_000) for r in records], codec=codec)
                batches.append(old)
    damaged = []
    for batch in batches[:8]:
        for at in (V2_HEADER_SIZE, V2_HEADER_SIZE + 3, len(batch) - 2):
            broken = bytearray(batch)
            broken[at] ^= 0x03
            damaged.append(bytes(broken))
    return batches + damaged


def decisions(batches: list[bytes]) -> list[Any]:
    """The default chain's answers on a compacted topic (every record's key and timestamp read)."""
    routing = build_routing(None, None, ROOT)
    engine = ProduceEngine(routing, ProduceSettings(), lambda _topic: True)
    out = []
    for index, batch in enumerate(batches):
        frame = produce_request(9, index, [("orders", 0, batch)])
        decision = engine.decide(frame, messages.decode_request(frame))
        verdicts = [(o.rejected, repr(o.verdict)) for o in decision.outcomes]
        out.append((verdicts, decision.forward is None))
    return out


def test_the_proxy_decides_the_same_without_the_compiled_skim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batches = decision_batches()
    with_compiled = decisions(batches)
    hide_compiled_skim(monkeypatch)
    assert decisions(batches) == with_compiled
    assert any(rejected for verdicts, _ in with_compiled for rejected, _ in verdicts)


def batch_values(batches: list[bytes]) -> list[Any]:
    """Each batch's values as the checks that read only values get them, or the error raised."""
    out: list[Any] = []
    for batch in batches:
        try:
            rb = read_batch(batch)[0]
            out.append(list(rb.values()))
        except Exception as exc:
            out.append((type(exc).__name__, str(exc)))
    return out


def test_values_are_the_same_without_the_compiled_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compressed, null keys and values, damaged batches: the same values or the same error."""
    nulls = build_batch([(b"k", None, None, None), (None, b"", None, None)], codec=Codec.GZIP)
    batches = [*decision_batches(), nulls]
    with_compiled = batch_values(batches)
    hide_compiled_skim(monkeypatch)
    assert batch_values(batches) == with_compiled
    assert any(isinstance(values, tuple) for values in with_compiled)  # some errors compared
    assert [None, b""] in with_compiled


def test_without_the_module_the_pure_python_skim_is_chosen() -> None:
    """A fresh interpreter where `_skim` cannot be imported (as after an install without a C
    compiler) chooses the pure-Python skim for large records only, with the same answers."""
    batch = plain(raw_record(delta=4, key=None), raw_record(delta=-2))
    script = (
        "import json, sys\n"
        "sys.modules['kvproxy.protocol.records._skim'] = None\n"
        "from kvproxy.protocol.records import batch_v2, skim\n"
        "batch = bytes.fromhex(sys.argv[1])\n"
        "print(json.dumps([skim.COMPILED, skim.skim_v2 is skim.python_skim_v2,\n"
        "    batch_v2.SKIM_FROM_BYTES_PER_RECORD, skim.skim_v2(batch, 2, 10, 20, False)]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, batch.hex()],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    compiled, python_chosen, threshold, scan = json.loads(result.stdout)
    assert (compiled, python_chosen, threshold) == (False, True, 16 * 1024)
    assert tuple(scan) == compiled_skim()(batch, 2, 10, 20, False) == (2, 8, 14, 1)


# ---- said at start-up ----


def _said_at_start_up(
    part: Any,
    compiled: bool,
    prefix: str,
    *,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> str:
    """`kvproxy serve`'s one start-up line beginning with `prefix` (the server itself not run),
    with `part.COMPILED` set to `compiled`."""
    from kvproxy.cli import main
    from kvproxy.commands import cli
    from kvproxy.proxy.ops import fds, logs
    from kvproxy.proxy.serve import app

    served: list[object] = []
    monkeypatch.setattr(app, "run", lambda config, *args, **kw: served.append(config))
    monkeypatch.setattr(logs, "configure_logging", lambda *args, **kw: None)
    monkeypatch.setattr(cli, "queue_sighup", lambda: None)
    monkeypatch.setattr(fds, "raise_open_file_limit", lambda: (4096, 4096, None))
    monkeypatch.setattr(part, "COMPILED", compiled)
    (tmp_path / "kvproxy.yaml").write_text("upstream: {bootstrap_servers: ['127.0.0.1:9092']}\n")
    with caplog.at_level("INFO", logger="kvproxy"):
        assert main(["serve", "-c", str(tmp_path / "kvproxy.yaml")]) == 0
    assert served
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(prefix)]
    assert len(lines) == 1
    return lines[0]


@pytest.mark.parametrize(("compiled", "said"), [(True, "compiled"), (False, "pure Python")])
def test_serve_says_which_record_scan_runs(
    compiled: bool,
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    line = _said_at_start_up(
        skim, compiled, "record scan", tmp_path=tmp_path, monkeypatch=monkeypatch, caplog=caplog
    )
    assert line.startswith(f"record scan: {said}")


@pytest.mark.parametrize(("compiled", "said"), [(True, "compiled"), (False, "off (pure Python")])
def test_serve_says_whether_the_fast_accept_is_compiled(
    compiled: bool,
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from kvproxy.protocol import fast_accept

    line = _said_at_start_up(
        fast_accept,
        compiled,
        "fast accept",
        tmp_path=tmp_path,
        monkeypatch=monkeypatch,
        caplog=caplog,
    )
    assert line.startswith(f"fast accept: {said}")
