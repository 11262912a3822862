"""`kvproxy demo` as a user runs it: the embedded broker starts, answers, and stops."""

from __future__ import annotations

import subprocess
import sys

from proxy.embedded import api_versions_ok, run_embedded_broker


def test_demo_shows_the_broker_accepting_what_the_decoder_refuses() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("embedded broker (Tansu) listening on 127.0.0.1:")
    assert any(line.split() == ["Produce", "v0-v11"] for line in lines)
    good = lines.index(next(line for line in lines if "good batch" in line))
    assert "broker answered NONE (base offset 0)" in lines[good]
    assert "kvproxy decoder: CRC32C ok, 3 records" in lines[good + 1]
    corrupt = lines.index(next(line for line in lines if "corrupted batch" in line))
    assert "broker answered NONE (base offset 3)" in lines[corrupt]
    assert "kvproxy decoder: CORRUPT_MESSAGE: stored crc" in lines[corrupt + 1]


def test_embedded_broker_stops_on_exit() -> None:
    with run_embedded_broker() as broker:
        assert api_versions_ok(broker.host, broker.port)
    assert not api_versions_ok(broker.host, broker.port, timeout=0.5)
