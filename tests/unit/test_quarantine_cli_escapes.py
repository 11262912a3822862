"""`kvproxy quarantine list|show` print what clients named (topic, client id, message) with its
control characters escaped, as the log does: a client cannot drive the operator's terminal or
forge a line of the output."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvproxy import cli
from kvproxy.journal import QuarantineEntry, segment_name
from kvproxy.protocol.journal import encode_entry
from kvproxy.protocol.records import build_batch

HOSTILE_CLIENT = "app\x1b[31m\nFORGED 1 entries"
HOSTILE_TOPIC = "orders\x1b]0;title\x07\rX"


def journal(directory: Path) -> Path:
    entry = QuarantineEntry(
        id=f"{1:032x}",
        time_ms=1_900_000_000_000,
        kind="rejected",
        topic=HOSTILE_TOPIC,
        partition=0,
        client_id=HOSTILE_CLIENT,
        client_address="127.0.0.1:5000",
        produce_version=7,
        policy="json",
        code=87,
        message="bad\n\x1b[2Jvalue",
        records=build_batch([(b"k", b"v", None, 1000)]),
    )
    directory.mkdir()
    (directory / segment_name(0)).write_bytes(encode_entry(entry.to_metadata(), entry.records))
    return directory


@pytest.mark.parametrize("command", ["list", "show"])
def test_names_are_printed_escaped(
    command: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    directory = journal(tmp_path / "journal")
    assert cli.main(["quarantine", command, "--dir", str(directory)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\x07" not in out
    assert not any(line.startswith("FORGED") for line in out.splitlines())
    assert "orders\\x1b]0;title\\x07\\rX" in out
    if command == "show":
        assert "client app\\x1b[31m\\nFORGED 1 entries at 127.0.0.1:5000" in out
        assert "bad\\n\\x1b[2Jvalue" in out
