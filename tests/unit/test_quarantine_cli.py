"""`kvproxy quarantine list` on a journal written here: the record counts docs/quarantine.md
promises, and the doc's example printed exactly as the command prints it."""

from __future__ import annotations

import datetime
import re
import textwrap
from pathlib import Path

import pytest

from kvproxy import cli
from kvproxy.commands.quarantine import REPLAYED_FILE
from kvproxy.journal import QuarantineEntry, segment_name
from kvproxy.protocol.journal import encode_entry
from kvproxy.protocol.records import build_batch

DOC = Path(__file__).resolve().parents[2] / "docs" / "quarantine.md"
EXAMPLE_COMMAND = "$ kvproxy quarantine list --dir quarantine"


def at(text: str) -> int:
    return int(datetime.datetime.fromisoformat(text).timestamp() * 1000)


def records(*counts: int) -> bytes:
    """One batch per count, of that many records."""
    return b"".join(
        build_batch([(b"k", b"v%d" % i, None, 1000) for i in range(count)]) for count in counts
    )


def rejected(
    n: int, topic: str, policy: str, code: int, *, time: str, data: bytes
) -> QuarantineEntry:
    return QuarantineEntry(
        id=f"{n:032x}",
        time_ms=at(time),
        kind="rejected",
        topic=topic,
        partition=0,
        policy=policy,
        code=code,
        records=data,
    )


# The journal the doc's example lists: a replayed entry, two batches in one entry, a warned one.
ENTRIES = (
    rejected(1, "orders", "json", 87, time="2030-01-15T08:00:00+00:00", data=records(2)),
    rejected(
        2,
        "orders",
        "max_record_bytes",
        10,
        time="2030-01-15T08:01:30.250+00:00",
        data=records(1, 3),
    ),
    rejected(3, "orders", "json", 87, time="2030-01-15T08:05:00+00:00", data=records(1)),
    QuarantineEntry(
        id=f"{4:032x}",
        time_ms=at("2030-01-15T09:12:30.500+00:00"),
        kind="warned",
        topic="payments",
        partition=2,
        policy="timestamps",
        code=32,
        records=records(5),
    ),
)


def write_journal(directory: Path) -> None:
    directory.mkdir()
    (directory / segment_name(0)).write_bytes(
        b"".join(encode_entry(e.to_metadata(), e.records) for e in ENTRIES)
    )
    (directory / REPLAYED_FILE).write_text(ENTRIES[0].id + "\n")


def list_output(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> str:
    write_journal(tmp_path / "quarantine")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["quarantine", "list", "--dir", "quarantine"]) == 0
    return capsys.readouterr().out


def test_list_counts_records_per_row_and_in_total(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    lines = list_output(capsys, monkeypatch, tmp_path).splitlines()
    header = lines[1].split()
    assert header[:8] == [
        "topic",
        "policy",
        "code",
        "kind",
        "entries",
        "replayed",
        "records",
        "from",
    ]
    rows = {tuple(line.split()[:2]): line.split() for line in lines[2:-1]}
    assert rows[("orders", "json")][5:8] == ["2", "1", "3"]
    assert rows[("orders", "max_record_bytes")][5:8] == ["1", "0", "4"]
    assert rows[("payments", "timestamps")][5:8] == ["1", "0", "5"]
    assert lines[-1].strip() == "4 entries, 12 records"


def test_list_counts_undecodable_records_as_unknown(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    broken = rejected(
        9, "orders", "crc", 2, time="2030-01-15T08:00:00+00:00", data=b"\x00\x01garbage"
    )
    whole = rejected(8, "orders", "crc", 2, time="2030-01-15T08:00:01+00:00", data=records(2))
    directory = tmp_path / "journal"
    directory.mkdir()
    (directory / segment_name(0)).write_bytes(
        encode_entry(broken.to_metadata(), broken.records)
        + encode_entry(whole.to_metadata(), whole.records)
    )
    assert cli.main(["quarantine", "list", "--dir", str(directory)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split()[5:8] == ["2", "0", "2+?"], lines
    assert lines[-1].strip() == (
        "2 entries, 2+? records (1 entry holds bytes that do not decode: see `show`)"
    )


def test_the_documented_example_is_what_list_prints(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocks = [
        textwrap.dedent(body)
        for _, body in re.findall(
            r"^( *)```\n(.*?)^\1```$", DOC.read_text(), flags=re.DOTALL | re.MULTILINE
        )
    ]
    example = next(block for block in blocks if block.startswith(EXAMPLE_COMMAND + "\n"))
    printed = list_output(capsys, monkeypatch, tmp_path)
    assert example == f"{EXAMPLE_COMMAND}\n{printed}"


def test_replay_of_a_missing_journal_folder_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "kvproxy.yaml"
    config.write_text('upstream:\n  bootstrap_servers: ["127.0.0.1:1"]\n')
    missing = tmp_path / "nope"
    argv = ["quarantine", "replay", "-c", str(config), "--dir", str(missing), "--topic", "t"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == f"kvproxy: {missing}: no such journal folder\n"
