"""Planning an audit without Spark: finding segments, cutting ranges, checking one unit."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from kvproxy.pipeline.check import bucket_size_ms, check_unit, key_preview
from kvproxy.pipeline.cli import parse_now
from kvproxy.pipeline.files import InputError
from kvproxy.pipeline.segments import (
    CorruptRegion,
    JournalSegment,
    SegmentFile,
    SegmentRange,
    discover,
    plan_segment,
)
from kvproxy.pipeline.task_data import AuditSettings
from kvproxy.policies.api import parse_records
from kvproxy.policies.builtin.broker import BatchIntegrityPolicy, OffsetsPolicy
from kvproxy.protocol.journal import encode_entry
from kvproxy.protocol.records import build_batch
from tests.harness.segments import TESTDATA_LOGS, assign_offsets, placements, write_segment

NOW = int(time.time() * 1000)


def batches(n: int, size: int = 100) -> list[bytes]:
    return assign_offsets(
        [build_batch([(b"k", bytes([i % 256]) * size, None, NOW)]) for i in range(n)]
    )


def tile(ranges: list[SegmentRange | CorruptRegion]) -> list[tuple[int, int]]:
    return [(r.start, r.end) for r in ranges]


@pytest.mark.parametrize("range_bytes", [1, 150, 1000, 10_000, 1 << 30])
def test_ranges_tile_the_file_at_batch_boundaries(tmp_path: Path, range_bytes: int) -> None:
    parts = batches(40)
    path = write_segment(tmp_path, "t", 3, parts)
    ranges = plan_segment(SegmentFile(str(path), "t", 3), range_bytes)
    boundaries = {p.position for p in placements(parts)} | {path.stat().st_size}
    assert all(isinstance(r, SegmentRange) for r in ranges)
    spans = tile(ranges)
    assert spans[0][0] == 0
    assert spans[-1][1] == path.stat().st_size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    assert all(start in boundaries and end in boundaries for start, end in spans)
    # every range reaches its target size, except the last
    assert all(end - start >= min(range_bytes, path.stat().st_size) for start, end in spans[:-1])


def test_a_broken_frame_is_one_region_and_planning_resumes(tmp_path: Path) -> None:
    parts = batches(6)
    broken = bytearray(parts[2])
    broken[8:12] = b"\x7f\xff\xff\xff"  # a length far past the end of the file
    parts[2] = bytes(broken)
    path = write_segment(tmp_path, "t", 0, parts)
    placed = placements(parts)
    planned = plan_segment(SegmentFile(str(path), "t", 0), 1 << 30)
    assert [type(p).__name__ for p in planned] == ["SegmentRange", "CorruptRegion", "SegmentRange"]
    region = planned[1]
    assert isinstance(region, CorruptRegion)
    assert (region.start, region.end) == (placed[2].position, placed[3].position)
    assert region.offset is None  # its length was garbage: the offset beside it is no offset
    assert "truncated batch at byte" in region.reason
    assert tile(planned) == [
        (0, placed[2].position),
        (placed[2].position, placed[3].position),
        (placed[3].position, path.stat().st_size),
    ]


def test_unknown_magic_and_short_tail(tmp_path: Path) -> None:
    parts = batches(2)
    bad_magic = bytearray(parts[1])
    bad_magic[16] = 7
    path = write_segment(tmp_path, "t", 0, [parts[0], bytes(bad_magic), b"\x00" * 5])
    planned = plan_segment(SegmentFile(str(path), "t", 0))
    assert isinstance(planned[-1], CorruptRegion)
    assert "unknown magic 7" in planned[-1].reason
    assert planned[-1].end == path.stat().st_size  # nothing verifiable after it


def test_discover_every_kind_of_input(tmp_path: Path) -> None:
    found = discover(str(TESTDATA_LOGS))
    assert sorted((s.topic, s.partition) for s in found if isinstance(s, SegmentFile)) == [
        ("__consumer_offsets", 0),
        ("__consumer_offsets", 14),
        ("air_quality_data", 1),
        ("cities", 0),
    ]
    folder = discover(str(TESTDATA_LOGS / "air_quality_data-1"))
    assert [(s.topic, s.partition) for s in folder] == [("air_quality_data", 1)]  # type: ignore[union-attr]
    one = discover(str(TESTDATA_LOGS / "cities-0" / "00000000000000000000.log"))
    assert one == [
        SegmentFile(str(TESTDATA_LOGS / "cities-0" / "00000000000000000000.log"), "cities", 0)
    ]
    # topic names may contain dashes; Kafka's deleted and future folders are not partitions
    (tmp_path / "my-topic-12").mkdir()
    (tmp_path / "my-topic-12" / "00000000000000000000.log").write_bytes(b"".join(batches(1)))
    (tmp_path / "my-topic-12.abc123-delete").mkdir()
    (tmp_path / "my-topic-12.abc123-delete" / "00000000000000000000.log").write_bytes(b"x")
    assert [(s.topic, s.partition) for s in discover(str(tmp_path))] == [("my-topic", 12)]  # type: ignore[union-attr]
    journal = tmp_path / "quarantine"
    journal.mkdir()
    (journal / "00000000000000000001.kvq").write_bytes(b"")
    assert discover(str(journal)) == [JournalSegment(str(journal / "00000000000000000001.kvq"))]


def test_inputs_that_cannot_be_audited_say_why(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file or directory"):
        discover(str(tmp_path / "missing"))
    with pytest.raises(InputError, match="no Kafka log segments"):
        discover(str(tmp_path))
    stray = tmp_path / "00000000000000000000.log"
    stray.write_bytes(b"")
    with pytest.raises(InputError, match=r"<topic>-<partition> folder"):
        discover(str(stray))
    with pytest.raises(InputError, match=r"needs fsspec|cannot read"):
        discover("nosuchscheme://bucket/kafka-logs")


def test_check_unit_reads_only_its_range(tmp_path: Path) -> None:
    parts = assign_offsets(
        [build_batch([(None if i in (3, 7) else b"k", b"v", None, NOW)]) for i in range(10)]
    )
    path = write_segment(tmp_path, "t", 0, parts)
    settings = AuditSettings(
        defaults=None,
        topics=[{"match": "t", "compacted": True}],
        base_dir=str(tmp_path),
        now_ms=NOW,
    )
    units = plan_segment(SegmentFile(str(path), "t", 0), sum(len(p) for p in parts[:5]))
    assert len(units) == 2
    results = [check_unit(unit, settings) for unit in units]
    assert [[row[2] for row in rows] for rows, _ in results] == [[3], [7]]
    assert [stats[0].records for _, stats in results] == [5, 5]


def test_check_unit_checks_journal_entries_as_produce_requests(tmp_path: Path) -> None:
    records = build_batch([(b"k", b"a", None, NOW), (None, b"bb", None, NOW)])
    segment = tmp_path / "00000000000000000000.kvq"
    metadata = {"v": 1, "id": "x", "time_ms": NOW, "kind": "warned", "topic": "t",
                "partition": 2, "produce_version": 9}  # fmt: skip
    mark = {**metadata, "kind": "replayed", "id": "y"}
    segment.write_bytes(encode_entry(metadata, records) + encode_entry(mark, b""))
    settings = AuditSettings(
        defaults=None,
        topics=[{"match": "t", "compacted": True}],
        base_dir=str(tmp_path),
        now_ms=NOW,
    )
    rows, stats = check_unit(JournalSegment(str(segment)), settings)
    assert [(r[0], r[1], r[2], r[5], r[6], r[7], r[12]) for r in rows] == [
        ("t", 2, -1, 2, "compacted_key", 87, 0)
    ]
    assert (stats[0].records, stats[0].batches) == (2, 1)


def test_kip_profile_renumbers_record_rejections(tmp_path: Path) -> None:
    parts = assign_offsets([build_batch([(None, b"v", None, NOW)])])
    path = write_segment(tmp_path, "t", 0, parts)
    settings = AuditSettings(
        defaults=None,
        topics=[{"match": "t", "compacted": True}],
        base_dir=str(tmp_path),
        profile="kip",
        now_ms=NOW,
    )
    (unit,) = plan_segment(SegmentFile(str(path), "t", 0))
    rows, _ = check_unit(unit, settings)
    assert [(r[7], r[8]) for r in rows] == [(45, "INVALID_RECORD_KEY")]


def _stored(data: bytes) -> object:
    return parse_records(
        "t", 0, data, produce_version=12, acks=-1, transactional_id=None, compacted=True,
        now_ms=NOW, stored=True,
    )  # fmt: skip


def _cleaned_batch() -> bytes:
    """A batch as the log cleaner leaves it: offsets 40-44, the records at 41 and 43 removed."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    for delta in (0, 2, 4):
        builder.append(delta, NOW, b"k", bytes([delta]), [])
    data = bytearray(builder.build())
    data[0:8] = (40).to_bytes(8, "big")
    return bytes(data)


def test_stored_batches_may_carry_cleaner_gaps_and_offsets() -> None:
    data = _cleaned_batch()
    produced = _stored(data)
    assert BatchIntegrityPolicy().validate("t", 0, produced).ok  # type: ignore[arg-type]
    assert OffsetsPolicy().validate("t", 0, produced).ok  # type: ignore[arg-type]
    as_produced = parse_records(
        "t", 0, data, produce_version=12, acks=-1, transactional_id=None, compacted=True,
        now_ms=NOW,
    )  # fmt: skip
    verdict = BatchIntegrityPolicy().validate("t", 0, as_produced)  # type: ignore[arg-type]
    assert "baseOffset of the record batch" in (verdict.message or "")


def test_stored_batches_still_need_increasing_offsets() -> None:
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    for delta in (0, 2, 1):
        builder.append(delta, NOW, b"k", b"v", [])
    verdict = OffsetsPolicy().validate("t", 0, _stored(bytes(builder.build())))  # type: ignore[arg-type]
    assert verdict.code == 87
    assert [e.index for e in verdict.record_errors] == [2]


def test_parse_now_and_key_preview_and_buckets() -> None:
    assert parse_now("1700000000000") == 1_700_000_000_000
    assert parse_now("2023-11-14T22:13:20Z") == 1_700_000_000_000
    assert parse_now("2023-11-14T22:13:20") == 1_700_000_000_000
    with pytest.raises(ValueError, match="not a time"):
        parse_now("yesterday")
    assert key_preview(None) is None
    assert key_preview(b"order-17") == "order-17"
    assert key_preview(b"\x00\x01") == "0x0001"
    assert key_preview(b"k" * 40) == "k" * 32 + "…"
    assert bucket_size_ms(0, 30 * 60_000) == 30_000
    assert bucket_size_ms(0, 3_600_000) == 60_000  # an hour of violations: 60 bars, not one
    assert bucket_size_ms(5_000, 15_000) == 1_000
    assert bucket_size_ms(0, 10 * 86_400_000) == 6 * 3_600_000


def test_inputs_on_another_filesystem_are_planned_and_checked(tmp_path: Path) -> None:
    """Any fsspec URI works like a local path (here fsspec's in-memory filesystem)."""
    import fsspec

    fs = fsspec.filesystem("memory")
    parts = assign_offsets([build_batch([(None, b"v", None, NOW)]) for _ in range(3)])
    fs.pipe("/logs/t-4/00000000000000000000.log", b"".join(parts))
    fs.pipe("/logs/t-4/00000000000000000000.index", b"ignored")
    try:
        (segment,) = discover("memory://logs")
        assert isinstance(segment, SegmentFile)
        assert (segment.uri, segment.topic, segment.partition) == (
            "memory://logs/t-4/00000000000000000000.log",
            "t",
            4,
        )
        units = plan_segment(segment, 1)
        assert len(units) == 3
        settings = AuditSettings(
            defaults=None,
            topics=[{"match": "t", "compacted": True}],
            base_dir=str(tmp_path),
            now_ms=NOW,
        )
        assert [[row[2] for row in check_unit(u, settings)[0]] for u in units] == [[0], [1], [2]]
    finally:
        fs.rm("/logs", recursive=True)


def test_a_framed_batch_with_an_unknown_codec_is_reported_and_the_range_goes_on(
    tmp_path: Path,
) -> None:
    parts = assign_offsets([build_batch([(None, b"v", None, NOW)]) for _ in range(3)])
    unknown = bytearray(parts[1])
    unknown[22] = (unknown[22] & ~0x07) | 6  # compression id 6: no such codec
    parts[1] = bytes(unknown)
    path = write_segment(tmp_path, "t", 0, parts)
    settings = AuditSettings(
        defaults=None,
        topics=[{"match": "t", "compacted": True}],
        base_dir=str(tmp_path),
        now_ms=NOW,
    )
    (unit,) = plan_segment(SegmentFile(str(path), "t", 0))
    rows, _ = check_unit(unit, settings)
    assert [(r[2], r[6], r[7], r[12]) for r in rows] == [
        (0, "compacted_key", 87, 0),
        (1, "batch_integrity", 2, len(parts[0])),
        (2, "compacted_key", 87, len(parts[0]) + len(parts[1])),
    ]
    assert "Record batch in topic partition t-0 is corrupt:" in rows[1][9]


def test_a_corrupt_region_is_one_batch_integrity_violation(tmp_path: Path) -> None:
    parts = batches(3)
    path = write_segment(tmp_path, "t", 0, [*parts, parts[0][:20]])
    *_, region = plan_segment(SegmentFile(str(path), "t", 0))
    assert isinstance(region, CorruptRegion)
    settings = AuditSettings(defaults=None, topics=None, base_dir=str(tmp_path), now_ms=NOW)
    rows, stats = check_unit(region, settings)
    assert [(r[2], r[6], r[7], r[8], r[12]) for r in rows] == [
        (0, "batch_integrity", 2, "CORRUPT_MESSAGE", sum(len(p) for p in parts))
    ]
    assert rows[0][9].endswith(f"; 20 bytes up to byte {path.stat().st_size} skipped")
    assert (stats[0].violations, stats[0].bytes, stats[0].records) == (1, 20, 0)


def test_local_inputs_are_made_absolute_for_executors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An executor in another folder (any non-local master) resolves the same file."""
    from kvproxy.pipeline.files import absolute

    monkeypatch.chdir(tmp_path)
    assert absolute("logs/t-0") == str(tmp_path / "logs" / "t-0")
    assert absolute("/data/logs") == "/data/logs"
    assert absolute("file:///data/logs") == "file:///data/logs"
    assert absolute("hdfs://nn/kafka") == "hdfs://nn/kafka"


def test_a_topic_config_in_the_yaml_applies_to_the_audit(tmp_path: Path) -> None:
    """`config:` in a topics entry is what the backtest checks against, as `serve` would: here
    the topic's message.timestamp.before.max.ms, which refuses the batch two hours old."""
    hour = 3_600_000
    parts = assign_offsets(
        [build_batch([(b"k", b"v", None, ts)]) for ts in (NOW, NOW - 2 * hour, NOW)]
    )
    path = write_segment(tmp_path, "t", 0, parts)
    settings = AuditSettings(
        defaults=None,
        topics=[{"match": "t", "config": {"message.timestamp.before.max.ms": hour}}],
        base_dir=str(tmp_path),
        now_ms=NOW,
    )
    (unit,) = plan_segment(SegmentFile(str(path), "t", 0))
    rows, _ = check_unit(unit, settings)
    assert [(r[2], r[6], r[7]) for r in rows] == [(1, "timestamps", 32)]
