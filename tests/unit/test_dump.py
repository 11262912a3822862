"""`kvproxy dump`: counts on real segments, and damaged copies reported at the right byte."""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from kvproxy.commands import dump
from kvproxy.protocol.compression import Codec
from kvproxy.protocol.records import build_batch, iter_batches
from tests.harness.records_testdata import KAFKA_LOGS, SEGMENTS, segment_paths

REPO = Path(__file__).resolve().parents[2]


def run_dump(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="kvproxy")
    dump.add_parser(parser.add_subparsers())
    args = parser.parse_args(["dump", *map(str, argv)])
    code = args.func(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def summary(
    capsys: pytest.CaptureFixture[str], *argv: str | Path
) -> tuple[int, dict[str, object], str]:
    code, out, err = run_dump(capsys, "--json", *argv)
    return code, json.loads(out), err


@pytest.mark.parametrize("folder", sorted(SEGMENTS))
def test_json_counts_match_readme(capsys: pytest.CaptureFixture[str], folder: str) -> None:
    code, result, err = summary(capsys, KAFKA_LOGS / folder)
    batches, records, null_keys = SEGMENTS[folder]
    assert code == 0 and err == ""
    assert result == {
        "files": 1,
        "batches": batches,
        "records": records,
        "null_keys": null_keys,
        "crc_errors": 0,
        "offset_errors": 0,
        "skipped_bytes": 0,
        "magics": [2],
        "codecs": ["none"],
        "control_batches": 0,
        "bad_regions": [],
        "errors": [],
    }


def test_json_totals_over_all_folders(capsys: pytest.CaptureFixture[str]) -> None:
    code, result, _ = summary(capsys, *(KAFKA_LOGS / folder for folder in sorted(SEGMENTS)))
    assert code == 0
    assert result["files"] == 4
    assert result["batches"] == sum(b for b, _, _ in SEGMENTS.values())
    assert result["records"] == sum(r for _, r, _ in SEGMENTS.values())
    assert result["null_keys"] == sum(n for _, _, n in SEGMENTS.values())


def test_text_output_one_line_per_batch_and_record(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_dump(capsys, KAFKA_LOGS / "cities-0")
    lines = out.splitlines()
    assert code == 0
    assert lines[0].startswith("Dumping ")
    assert len([line for line in lines if line.startswith("position: ")]) == 11
    assert "crc: " in lines[1] and "(ok)" in lines[1] and "isControl: false" in lines[1]
    code, out, _ = run_dump(capsys, "--records", KAFKA_LOGS / "cities-0")
    record_lines = [line for line in out.splitlines() if line.startswith("| offset: ")]
    assert len(record_lines) == 11
    assert "key: null" in record_lines[0]
    assert record_lines[0].startswith("| offset: 0 ")


def copy_segment(folder: str, destination: Path) -> Path:
    destination.mkdir(parents=True)
    source = segment_paths(folder)[0]
    target = destination / source.name
    shutil.copyfile(source, target)
    target.chmod(0o644)
    return target


def batch_positions(data: bytes) -> list[int]:
    positions, position = [], 0
    for batch in iter_batches(data):
        positions.append(position)
        position += batch.size
    return positions


def test_truncated_file_reported_and_scan_continues(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    broken = copy_segment("cities-0", tmp_path / "cities-0")
    data = broken.read_bytes()
    fifth = batch_positions(data)[4]
    broken.write_bytes(data[: fifth + 30])
    good = tmp_path / "__consumer_offsets-0"
    copy_segment("__consumer_offsets-0", good)
    code, result, err = summary(capsys, broken, good)
    assert code == 1
    assert result["files"] == 2
    assert result["batches"] == 4 + 2  # the intact part of the first file, then the second
    assert result["errors"] == [
        {"file": str(broken), "position": fifth, "error": result["errors"][0]["error"]}  # type: ignore[index]
    ]
    assert "BufferUnderflow" in result["errors"][0]["error"]
    assert str(broken) in err and f"byte {fifth}" in err


def test_byte_flipped_files_reported(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # A flipped magic byte breaks the framing: the scan resyncs at the next batch.
    unframed = copy_segment("cities-0", tmp_path / "a" / "cities-0")
    data = bytearray(unframed.read_bytes())
    third = batch_positions(bytes(data))[2]
    data[third + 16] ^= 0x80
    unframed.write_bytes(bytes(data))
    # A flipped value byte leaves the framing intact: the CRC catches it, later batches still count.
    bad_crc = copy_segment("cities-0", tmp_path / "b" / "cities-0")
    data = bytearray(bad_crc.read_bytes())
    seventh = batch_positions(bytes(data))[6]
    data[seventh + 70] ^= 0x01
    bad_crc.write_bytes(bytes(data))
    code, result, err = summary(capsys, unframed, bad_crc, KAFKA_LOGS / "__consumer_offsets-0")
    assert code == 1
    assert result["files"] == 3
    assert result["batches"] == 10 + 11 + 2
    assert result["crc_errors"] == 1
    assert [(e["file"], e["position"]) for e in result["errors"]] == [  # type: ignore[attr-defined]
        (str(unframed), third),
        (str(bad_crc), seventh),
    ]
    assert f"{unframed}: bad batch at byte {third}" in err
    assert f"{bad_crc}: bad batch at byte {seventh}" in err
    code, out, _ = run_dump(capsys, bad_crc)
    assert code == 1
    assert "(BAD)" in out.splitlines()[7]


def test_generated_legacy_compressed_and_control(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    segment = tmp_path / "mixed-0" / "00000000000000000000.log"
    segment.parent.mkdir()
    segment.write_bytes(
        build_batch([(b"a", b"1", None, 1), (None, b"2", None, 2)], magic=1, codec=Codec.GZIP)
        + build_batch([(b"b", b"3", None, 3)], magic=0, base_offset=2)
        + build_batch([(b"c", b"\x00\xff", [("h", b"v")], 4)], codec=Codec.ZSTD, base_offset=3)
        + build_batch([(b"\x00\x00\x00\x00", b"", None, 5)], base_offset=4, is_control=True)
    )
    later = tmp_path / "mixed-0" / "00000000000000000005.log"
    later.write_bytes(build_batch([(b"d", b"4", None, 6)], codec=Codec.SNAPPY, base_offset=5))
    code, result, _ = summary(capsys, segment.parent)
    assert code == 0
    assert result == {
        "files": 2,
        "batches": 4,
        "records": 5,
        "null_keys": 1,
        "crc_errors": 0,
        "offset_errors": 0,
        "skipped_bytes": 0,
        "magics": [0, 1, 2],
        "codecs": ["gzip", "none", "snappy", "zstd"],
        "control_batches": 1,
        "bad_regions": [],
        "errors": [],
    }
    code, out, _ = run_dump(capsys, "--records", segment.parent)
    offsets = [int(line.split()[2]) for line in out.splitlines() if line.startswith("| offset:")]
    assert offsets == [0, 1, 2, 3, 4, 5]
    assert "value: 0x00ff" in out and "headers: [h='v']" in out


def test_segment_files_in_base_offset_order(tmp_path: Path) -> None:
    for name in ("00000000000000000100.log", "00000000000000000007.log", "x.index"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in dump.segment_files([tmp_path])] == [
        "00000000000000000007.log",
        "00000000000000000100.log",
    ]


def test_missing_path_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Exit 2, like a bad argument; the other paths are still dumped."""
    missing = tmp_path / "nope.log"
    code, result, err = summary(capsys, missing, KAFKA_LOGS / "cities-0")
    assert code == 2 and result["batches"] == 11
    assert err == f"kvproxy dump: {missing}: no such file or directory\n"
    done = subprocess.run(
        [sys.executable, "-m", "kvproxy.cli", "dump", str(missing)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, ""), done
    assert done.stderr == f"kvproxy dump: {missing}: no such file or directory\n", done


def test_folder_without_segments_is_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "00000000000000000000.index").write_bytes(b"")
    code, out, err = run_dump(capsys, tmp_path)
    assert (code, out) == (1, "")
    assert err == f"kvproxy dump: no Kafka log segments (*.log) in {tmp_path}\n"
    code, result, err = summary(capsys, tmp_path, KAFKA_LOGS / "cities-0")
    assert code == 1 and result["batches"] == 11 and str(tmp_path) in err


def test_preview() -> None:
    assert dump.preview(None) == "null"
    assert dump.preview(b"hello") == "'hello'"
    assert dump.preview(b"x" * 100) == repr("x" * 40 + "...")
    assert dump.preview(b"\x00\x01") == "0x0001"


def test_cli_dump_json() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvproxy.cli",
            "dump",
            "--json",
            str(KAFKA_LOGS / "air_quality_data-1"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    summary_json = json.loads(result.stdout)
    assert (
        summary_json["batches"],
        summary_json["records"],
        summary_json["null_keys"],
    ) == SEGMENTS["air_quality_data-1"]


def test_shrunk_length_is_a_crc_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The CRC is checked before the records: a batch cut short by its length field is a CRC
    error, and the bytes it no longer covers are a bad region up to the next batch."""
    broken = copy_segment("cities-0", tmp_path / "cities-0")
    data = bytearray(broken.read_bytes())
    positions = batch_positions(bytes(data))
    third, fourth = positions[2], positions[3]
    length = int.from_bytes(data[third + 8 : third + 12], "big")
    data[third + 8 : third + 12] = (length - 10).to_bytes(4, "big")
    broken.write_bytes(bytes(data))
    code, result, err = summary(capsys, broken)
    assert code == 1
    assert (result["crc_errors"], result["batches"], result["records"]) == (1, 11, 10)
    errors = result["errors"]
    assert isinstance(errors, list)
    assert errors[0]["position"] == third and errors[0]["error"].startswith("CRC mismatch")
    assert result["skipped_bytes"] == 10
    assert [(r["start"], r["end"]) for r in result["bad_regions"]] == [(fourth - 10, fourth)]  # type: ignore[attr-defined]
    assert "does not decode" not in err


def test_resync_after_broken_frames(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A broken frame is skipped to the next batch that verifies, as the audit does; each bad
    region is reported with its position and the JSON summary counts the rest of the file."""
    broken = copy_segment("cities-0", tmp_path / "cities-0")
    original = broken.read_bytes()
    positions = batch_positions(original)
    third, fourth, sixth = positions[2], positions[3], positions[5]
    data = bytearray(original[:sixth] + b"\x02" * 100 + original[sixth:])
    data[third + 16] ^= 0x80  # unknown magic
    broken.write_bytes(bytes(data))
    code, result, err = summary(capsys, broken, KAFKA_LOGS / "__consumer_offsets-0")
    assert code == 1
    assert result["files"] == 2
    assert (result["batches"], result["records"], result["null_keys"]) == (10 + 2, 10 + 2, 10)
    assert result["bad_regions"] == [
        {
            "file": str(broken),
            "start": third,
            "end": fourth,
            "bytes": fourth - third,
            "error": f"CorruptRecords: batch at byte {third} has unknown magic 130",
        },
        {
            "file": str(broken),
            "start": sixth,
            "end": sixth + 100,
            "bytes": 100,
            "error": result["bad_regions"][1]["error"],  # type: ignore[index]
        },
    ]
    assert result["skipped_bytes"] == fourth - third + 100
    assert f"bad batch at byte {third}" in err and f"skipped 100 bytes to byte {sixth + 100}" in err
    code, out, _ = run_dump(capsys, broken)
    batch_lines = [line for line in out.splitlines() if line.startswith("position: ")]
    assert len(batch_lines) == 10
    assert batch_lines[-1].startswith(f"position: {len(data) - (len(original) - positions[10])} ")


def test_broker_log_directory_read_as_the_audit_lists_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    logs = tmp_path / "kafka-logs"
    copy_segment("cities-0", logs / "cities-0")
    copy_segment("__consumer_offsets-0", logs / "__consumer_offsets-0")
    # What a broker leaves beside live segments: none of it is read.
    for leftover in ("cities-0.0123abcd-delete", "cities-1.0123abcd-future", "x-0.0123-stray"):
        copy_segment("cities-0", logs / leftover)
    for name in ("00000000000000000011.log.deleted", "00000000000000000011.log.swap"):
        (logs / "cities-0" / name).write_bytes(b"\x00" * 100)
    (logs / "meta.properties").write_text("version=0\n")
    code, result, err = summary(capsys, logs)
    assert (code, err) == (0, "")
    assert (result["files"], result["batches"], result["records"]) == (2, 13, 13)
    assert [str(p.relative_to(logs)) for p in dump.segment_files([logs])] == [
        "__consumer_offsets-0/00000000000000000000.log",
        "cities-0/00000000000000000000.log",
    ]


def test_control_batches_counted_apart(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """As the audit counts them: `batches` are data batches, markers are `control_batches`."""
    segment = tmp_path / "tx-0" / "00000000000000000000.log"
    segment.parent.mkdir()
    segment.write_bytes(
        build_batch([(b"k", b"1", None, 1), (b"k", b"2", None, 1)], is_transactional=True)
        + build_batch(
            [(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", None, 2)],
            base_offset=2,
            is_transactional=True,
            is_control=True,
        )
        + build_batch([(None, b"3", None, 3)], base_offset=3)
    )
    code, result, _ = summary(capsys, segment)
    assert code == 0
    assert (result["batches"], result["control_batches"]) == (2, 1)
    assert (result["records"], result["null_keys"]) == (3, 1)


def test_offsets_must_go_up(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The offset field is outside the CRC: a changed one is caught by the order of offsets."""
    raised = copy_segment("cities-0", tmp_path / "a" / "cities-0")
    data = bytearray(raised.read_bytes())
    positions = batch_positions(bytes(data))
    fifth, sixth = positions[4], positions[5]
    data[fifth + 7] ^= 0x40  # offset 4 becomes 68
    raised.write_bytes(bytes(data))
    code, result, err = summary(capsys, raised)
    assert code == 1
    assert (result["offset_errors"], result["crc_errors"], result["batches"]) == (1, 0, 11)
    assert result["errors"] == [
        {
            "file": str(raised),
            "position": sixth,
            "error": f"offset out of order: baseOffset 5 does not follow lastOffset 68 of the "
            f"batch at byte {fifth}",
        }
    ]
    assert f"bad batch at byte {sixth}" in err
    # A segment's name is its base offset: no batch below it.
    renamed = copy_segment("cities-0", tmp_path / "b" / "cities-0")
    renamed = renamed.rename(renamed.with_name("00000000000000000005.log"))
    code, result, _ = summary(capsys, renamed)
    assert code == 1 and result["offset_errors"] == 1
    assert result["errors"] == [
        {
            "file": str(renamed),
            "position": 0,
            "error": "offset out of order: baseOffset 0 is below 5, the base offset the file's "
            "name gives",
        }
    ]


def test_headers_only_counts_from_headers(capsys: pytest.CaptureFixture[str]) -> None:
    folder = "air_quality_data-1"
    code, result, _ = summary(capsys, "--headers-only", KAFKA_LOGS / folder)
    batches, records, _ = SEGMENTS[folder]
    assert code == 0
    assert (result["batches"], result["records"], result["null_keys"]) == (batches, records, None)


def test_preview_shows_utf8_text_with_line_breaks() -> None:
    value = '{"note": "première\r\nligne"}'.encode()
    assert dump.preview(value) == repr('{"note": "première\r\nligne"}')
    assert dump.preview(b"a\tb\nc") == repr("a\tb\nc")
    assert dump.preview(b"\x00\x01") == "0x0001"


def test_legacy_inner_crc_is_a_crc_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A compressed magic 1 wrapper whose own CRC holds but one of whose inner messages was
    changed: a CRC error, its records left uncounted."""
    inner = bytearray(build_batch([(b"a", b"hello", None, 1), (b"b", b"world", None, 2)], magic=1))
    inner[-1] ^= 0x01  # the last byte of the second inner message's value
    value = gzip.compress(bytes(inner))
    body = struct.pack(">bbqi", 1, int(Codec.GZIP), 2, -1) + struct.pack(">i", len(value)) + value
    wrapper = struct.pack(">qiI", 1, 4 + len(body), zlib.crc32(body)) + body
    segment = tmp_path / "legacy-0" / "00000000000000000000.log"
    segment.parent.mkdir()
    segment.write_bytes(wrapper + build_batch([(b"c", b"!", None, 3)], base_offset=2))
    code, result, _ = summary(capsys, segment)
    assert code == 1
    assert (result["crc_errors"], result["batches"], result["records"]) == (1, 2, 1)
    assert result["errors"][0]["position"] == 0  # type: ignore[index]
    assert "inner message" in result["errors"][0]["error"]  # type: ignore[index]
    code, out, _ = run_dump(capsys, segment)
    assert "(BAD)" in out.splitlines()[1] and "(ok)" in out.splitlines()[2]
