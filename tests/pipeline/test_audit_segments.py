"""`kvproxy audit` over log segments on Spark: the brokers' own segments and generated ones."""

from __future__ import annotations

import io
import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from kvproxy.protocol.compression import Codec
from kvproxy.protocol.records import build_batch
from tests.harness.audit import audit, write_config
from tests.harness.segments import (
    TESTDATA_LOGS,
    assign_offsets,
    independent_offsets,
    placements,
    write_segment,
)

# folder -> (batches, records), from tests/data/README.md
README_COUNTS = {
    "cities-0": (11, 11),
    "__consumer_offsets-0": (2, 2),
    "air_quality_data-1": (281, 281),
    "__consumer_offsets-14": (89, 89),
}
HOUR_MS = 3_600_000


def test_testdata_with_compaction_forced(spark: Any, tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        "topics:\n"
        "  - {match: air_quality_data, compacted: true}\n"
        "  - {match: cities, compacted: true}\n",
    )
    summary, rows = audit(spark, tmp_path, inputs=(str(TESTDATA_LOGS),), config=config)

    air = [r for r in rows if r["topic"] == "air_quality_data"]
    keyless = [
        offset
        for offset, key in independent_offsets(
            (TESTDATA_LOGS / "air_quality_data-1" / "00000000000000000000.log").read_bytes()
        )
        if key is None
    ]
    assert len(keyless) == 1
    assert [(r["offset"], r["partition"], r["policy"]) for r in air] == [
        (keyless[0], 1, "compacted_key")
    ]
    assert air[0]["error_code"] == 87
    assert air[0]["error_name"] == "INVALID_RECORD"
    assert air[0]["message"] == (
        "Compacted topic cannot accept message without key in topic partition air_quality_data-1"
    )
    assert air[0]["key_preview"] is None
    assert air[0]["source"].endswith("air_quality_data-1/00000000000000000000.log")

    cities = sorted(r["offset"] for r in rows if r["topic"] == "cities")
    assert cities == list(range(11))
    assert not [r for r in rows if r["topic"] == "__consumer_offsets"]

    assert summary["violations"] == 12
    assert summary["violations_by_topic"] == {"cities": 11, "air_quality_data": 1}
    assert summary["violations_by_policy"] == {"compacted_key": 12}
    assert summary["violations_by_code"] == {"INVALID_RECORD": {"code": 87, "count": 12}}
    for folder, (batches, records) in README_COUNTS.items():
        partition = summary["partitions"][folder]
        assert (partition["batches"], partition["records"]) == (batches, records), folder
    assert summary["records_scanned"] == sum(r for _, r in README_COUNTS.values())
    assert summary["batches_scanned"] == sum(b for b, _ in README_COUNTS.values())
    assert summary["partitions"]["cities-0"]["compacted"] is True
    assert summary["partitions"]["__consumer_offsets-0"]["compacted"] is None
    assert summary["errors"] == []
    assert summary["time_range"]["first_ms"] <= summary["time_range"]["last_ms"]
    assert sum(sum(b["counts"].values()) for b in summary["timeline"]["buckets"]) == 12
    report = (tmp_path / "out" / "report.html").read_text()
    assert "air_quality_data" in report and "compacted_key" in report


def test_testdata_without_compaction_is_clean(spark: Any, tmp_path: Path) -> None:
    summary, rows = audit(spark, tmp_path, inputs=(str(TESTDATA_LOGS / "cities-0"),))
    assert rows == []
    assert summary["violations"] == 0
    assert summary["records_scanned"] == 11


def _generated_parts(now_ms: int) -> tuple[list[bytes], dict[str, Any]]:
    """Good batches of every codec and magic, plus one of each kind of bad batch."""
    ts = now_ms - 60_000

    def records(n: int, key: bytes | None = b"k") -> list[Any]:
        return [(key, b"v" * (10 + i), None, ts) for i in range(n)]

    good = [build_batch(records(3), codec=codec) for codec in Codec]
    good.append(build_batch(records(2), magic=1, codec=Codec.GZIP))
    good.append(build_batch(records(1), magic=0))
    flipped = bytearray(build_batch(records(2)))
    flipped[-1] ^= 0xFF  # a record byte: the CRC no longer matches
    control = build_batch(
        [(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", None, ts)],
        producer_id=7,
        producer_epoch=0,
        base_sequence=-1,
        is_transactional=True,
        is_control=True,
    )
    future = build_batch(
        [(b"k", b"early", None, ts), (b"k", b"late", None, now_ms + 2 * HOUR_MS)],
        codec=Codec.LZ4,
    )
    keyless = build_batch([(b"k", b"a", None, ts), (None, b"bb", None, ts)], codec=Codec.ZSTD)
    parts = assign_offsets([*good, bytes(flipped), control, future, keyless])
    labels = {"flipped": len(good), "control": len(good) + 1, "future": len(good) + 2}
    labels["keyless"] = len(good) + 3
    return parts, labels


def test_generated_segment_yields_exactly_the_expected_violations(
    spark: Any, tmp_path: Path
) -> None:
    now_ms = int(time.time() * 1000)
    parts, at = _generated_parts(now_ms)
    # Bytes that frame no batch, then good batches again (the scan must go on after them),
    # then a batch cut short at the end of the file.
    garbage = b"\x00\x00\x00\x00\x00\x00\x00\x63" + b"\xff" * 37
    tail = assign_offsets(
        [build_batch([(None, b"after", None, now_ms), (b"k", b"x", None, now_ms)])], 99
    )
    truncated = assign_offsets([build_batch([(b"k", b"cut", None, now_ms)])], 101)[0][:30]
    parts = [*parts, garbage, *tail, truncated]
    placed = placements(parts)
    write_segment(tmp_path / "logs", "gen", 0, parts)
    config = write_config(tmp_path, "topics:\n  - {match: gen, compacted: true}\n")

    summary, rows = audit(
        spark, tmp_path, inputs=(str(tmp_path / "logs"),), config=config, now_ms=now_ms
    )

    flipped, future, keyless = placed[at["flipped"]], placed[at["future"]], placed[at["keyless"]]
    after = placed[len(placed) - 2]
    found = {(r["policy"], r["error_code"], r["offset"], r["position"]) for r in rows}
    assert found == {
        ("crc", 2, flipped.base_offset, flipped.position),
        ("timestamps", 32, future.base_offset + 1, future.position),
        ("compacted_key", 87, keyless.base_offset + 1, keyless.position),
        ("batch_integrity", 2, None, placed[-3].position),  # garbage: no offset; resynced
        ("compacted_key", 87, 99, after.position),
        ("batch_integrity", 2, 101, placed[-1].position),  # the truncated tail
    }
    assert len(rows) == len(found)
    by_policy = {r["policy"]: r for r in rows}
    assert by_policy["timestamps"]["error_name"] == "INVALID_TIMESTAMP"
    assert by_policy["timestamps"]["message"].startswith(
        f"Timestamp {now_ms + 2 * HOUR_MS} of message with offset {future.base_offset + 1} "
        "is out of range."
    )
    assert by_policy["crc"]["message"].startswith("Record is corrupt (stored crc = ")
    corrupt = sorted(
        (r for r in rows if r["policy"] == "batch_integrity"), key=lambda r: r["position"]
    )
    assert "45 bytes up to byte" in corrupt[0]["message"]
    assert "truncated batch at byte" in corrupt[1]["message"]
    partition = summary["partitions"]["gen-0"]
    assert partition["control_batches"] == 1
    good_records = 3 * len(Codec) + 2 + 1
    assert partition["records"] == good_records + 2 + 2 + 2 + 2  # flipped, future, keyless, tail
    assert summary["violations"] == 6


def test_ranges_do_not_split_or_repeat_batches(spark: Any, tmp_path: Path) -> None:
    now_ms = int(time.time() * 1000)
    parts, _ = _generated_parts(now_ms)
    many = assign_offsets(
        [build_batch([(None if i % 5 == 0 else b"k", b"v" * 200, None, now_ms)]) for i in range(60)]
    )
    write_segment(tmp_path / "logs", "split", 0, assign_offsets([*parts, *many]))
    config = write_config(tmp_path, "topics:\n  - {match: split, compacted: true}\n")

    def run(range_bytes: int, name: str) -> tuple[dict[str, Any], list[Any]]:
        summary, rows = audit(
            spark,
            tmp_path / name,
            inputs=(str(tmp_path / "logs"),),
            config=config,
            now_ms=now_ms,
            range_bytes=range_bytes,
        )
        return summary, sorted(tuple(sorted(r.items())) for r in rows)

    whole_summary, whole = run(1 << 30, "whole")
    cut_summary, cut = run(1000, "cut")
    assert cut == whole
    assert len(whole) == 1 + 1 + 1 + 12  # crc, timestamps, keyless, every fifth of 60
    for key in ("records_scanned", "batches_scanned", "bytes_scanned", "control_batches"):
        assert cut_summary[key] == whole_summary[key], key


def test_sample_checks_only_about_n_records(spark: Any, tmp_path: Path) -> None:
    summary, _ = audit(spark, tmp_path, inputs=(str(TESTDATA_LOGS),), sample=40)
    assert summary["sample"] == 40
    # one unit per segment here: each checks whole batches until it has had its share (10);
    # __consumer_offsets-0 holds only 2
    assert summary["records_scanned"] == 10 + 2 + 10 + 10


@pytest.mark.parametrize("codec", [c for c in Codec if c is not Codec.NONE])
def test_generated_compressed_batches_are_read_by_an_independent_reader(codec: Codec) -> None:
    """The generated inputs are real Kafka bytes: kafka-python reads them the same way."""
    data = b"".join(
        assign_offsets([build_batch([(b"a", b"1", None, 5), (None, b"2", None, 6)], codec=codec)])
    )
    assert independent_offsets(data) == [(0, b"a"), (1, None)]


def test_the_sample_report_in_examples_matches_a_fresh_audit(spark: Any, tmp_path: Path) -> None:
    """examples/audit/ is what its command (in its kvproxy.yaml) produces today."""
    from kvproxy.pipeline.cli import parse_now

    example = Path(__file__).resolve().parents[2] / "examples" / "audit"
    summary, _ = audit(
        spark,
        tmp_path,
        inputs=(str(TESTDATA_LOGS),),
        config=str(example / "kvproxy.yaml"),
        now_ms=parse_now("2026-11-22T00:00:00Z"),
    )
    kept = json.loads((example / "summary.json").read_text())
    for key in ("records_scanned", "batches_scanned", "violations", "violations_by_policy",
                "violations_by_topic", "violations_by_code", "timeline", "now_ms"):  # fmt: skip
        assert summary[key] == kept[key], key
    assert "<svg" in (example / "report.html").read_text()


def test_ship_packages_puts_the_project_on_the_executors(spark: Any) -> None:
    import zipfile

    from kvproxy.pipeline.spark import ship_packages

    archive = ship_packages(spark)
    names = set(zipfile.ZipFile(archive).namelist())
    assert {
        "kvproxy/__init__.py",
        "kvproxy/protocol/records/batch.py",
        "kvproxy/policies/chain.py",
        "kvproxy/settings/errors.py",
        "kvproxy/client/blocking.py",
        "kvproxy/pipeline/check.py",
    } <= names  # as executors import them: kvproxy.protocol, ...
    assert all(name.startswith("kvproxy/") for name in names)
    assert not any(
        name.startswith(("kvproxy/proxy/", "kvproxy/producer/", "kvproxy/cli.py")) for name in names
    )
    paths = (
        spark.sparkContext.parallelize([0], 1)
        .map(lambda _: [p for p in __import__("sys").path if p.endswith("kvproxy_packages.zip")])
        .collect()
    )
    assert paths[0], "the zip is on the executors' sys.path"


def test_offsets_out_of_order_are_reported_with_the_batch_that_broke_it(
    spark: Any, tmp_path: Path
) -> None:
    """The offset field is outside the CRC: a flipped bit there passes every batch check."""
    data = bytearray((TESTDATA_LOGS / "cities-0" / "00000000000000000000.log").read_bytes())
    heads = batch_heads(bytes(data))
    assert [offset for _, offset in heads] == list(range(11))
    up, down = heads[5][0], heads[8][0]
    data[up + 7] ^= 0x38  # offset 5 becomes 61: 4, 61, 6
    data[down + 7] ^= 0x08  # offset 8 becomes 0: 7, 0, 9
    logs = tmp_path / "logs"
    (logs / "cities-0").mkdir(parents=True)
    (logs / "cities-0" / "00000000000000000000.log").write_bytes(bytes(data))
    # an intact segment under a name it does not match: it says its first offset is 3
    (logs / "cities-1").mkdir()
    (logs / "cities-1" / "00000000000000000003.log").write_bytes(
        (TESTDATA_LOGS / "cities-0" / "00000000000000000000.log").read_bytes()
    )
    out = io.StringIO()
    summary, rows = audit(spark, tmp_path, inputs=(str(logs),), out=out)

    found = sorted((r["partition"], r["position"], r["offset"], r["policy"]) for r in rows)
    assert found == [
        (0, up, 61, "offset_order"),
        (0, down, 0, "offset_order"),
        (1, 0, 0, "offset_order"),
    ]
    by_position = {(r["partition"], r["position"]): r for r in rows}
    assert by_position[(0, up)]["message"] == (
        "Offsets out of order in topic partition cities-0: batch at byte 371 has offset 61, "
        "out of order between offsets 4 (byte 297) and 6 (byte 444)"
    )
    assert by_position[(0, down)]["message"].endswith(
        "batch at byte 594 has offset 0, not above the last offset 7 of the batch before it "
        "(byte 517)"
    )
    assert by_position[(1, 0)]["message"].endswith(
        "first batch at byte 0 has base offset 0, below the segment's base offset 3 (its file name)"
    )
    assert {r["error_name"] for r in rows} == {"CORRUPT_MESSAGE"}
    assert summary["violations_by_policy"] == {"offset_order": 3}
    assert summary["partitions"]["cities-0"]["violations"] == 2
    assert summary["partitions"]["cities-0"]["records"] == 11  # the batches are still checked
    assert "2 batches out of offset order" not in out.getvalue()
    assert "3 batches out of offset order" in out.getvalue()


def batch_heads(data: bytes) -> list[tuple[int, int]]:
    """(position, offset field) of every batch of an intact segment."""
    heads = []
    position = 0
    while position < len(data):
        offset, length = struct.unpack_from(">qi", data, position)
        heads.append((position, offset))
        position += 12 + length
    return heads


def test_control_batches_are_counted_apart_and_said_so(spark: Any, tmp_path: Path) -> None:
    now_ms = int(time.time() * 1000)
    parts, _ = _generated_parts(now_ms)
    write_segment(tmp_path / "logs", "gen", 0, parts)
    out = io.StringIO()
    summary, _ = audit(spark, tmp_path, inputs=(str(tmp_path / "logs"),), now_ms=now_ms, out=out)
    data_batches = len(parts) - 1
    assert (summary["data_batches"], summary["control_batches"]) == (data_batches, 1)
    assert summary["batches_scanned"] == data_batches  # kept for readers of older summaries
    partition = summary["partitions"]["gen-0"]
    assert (partition["data_batches"], partition["control_batches"]) == (data_batches, 1)
    assert f"in {data_batches} data batches + 1 control batch (not checked)" in out.getvalue()
    report = (tmp_path / "out" / "report.html").read_text()
    assert f'{data_batches:,}</div><div class="sub">+ 1 control batch, not checked' in report
