"""`kvproxy demo` as a user runs it: the embedded broker starts, answers, and stops."""

from __future__ import annotations

import subprocess
import sys

from proxy.embedded import api_versions_ok, run_embedded_broker


def test_demo_sends_records_through_kvproxy() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    out = result.stdout
    lines = out.splitlines()
    assert lines[0].startswith("embedded broker (Tansu) on 127.0.0.1:")
    node_port = int(lines[2].rsplit(" ", 1)[1])
    assert f"brokers the client was told about: [(111, '127.0.0.1', {node_port})]" in out
    for i in range(3):
        assert f"sent order-{i} = " in out
        assert f"offset {i}: order-{i} = " in out
    good = next(i for i, line in enumerate(lines) if "good batch" in line)
    assert "broker answered NONE (base offset 3)" in lines[good]
    assert "kvproxy decoder: CRC32C ok, 3 records" in lines[good + 1]
    assert "broker answered CORRUPT_MESSAGE (base offset -1)" in lines[good + 2]
    assert "kvproxy decoder: CORRUPT_MESSAGE: stored crc" in lines[good + 3]


def test_embedded_broker_stops_on_exit() -> None:
    with run_embedded_broker() as broker:
        assert api_versions_ok(broker.host, broker.port)
    assert not api_versions_ok(broker.host, broker.port, timeout=0.5)
