"""`kvproxy demo` as a user runs it: the embedded broker starts, answers, and stops."""

from __future__ import annotations

import subprocess
import sys

from kvproxy.proxy.serve.embedded import api_versions_ok, run_embedded_broker


def test_demo_sends_records_through_kvproxy() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kvproxy.cli", "demo"],
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
    assert "a good batch\n    -> NONE: stored at offset 3" in out
    assert "one bit flipped\n    -> CORRUPT_MESSAGE (2): Record is corrupt (stored crc = " in out
    assert "-> INVALID_RECORD (87): One or more records have been rejected due to 1 record" in out
    assert (
        "record 1: Compacted topic cannot accept message without key in topic partition "
        "customers-0\n" in out
    )
    assert "-> POLICY_VIOLATION (44): currency GBP is not allowed; allowed: EUR, USD" in out
    assert "own decoder on the flipped batch: CORRUPT_MESSAGE: stored crc" in out
    assert (
        'kvproxy_policy_rejections_total{code="87",policy="compacted_key",topic="customers"} 1.0'
        in out
    )
    assert (
        'kvproxy_policy_rejections_total{code="44",policy="currency",topic="payments"} 1.0' in out
    )
    # The schema policy, against the stand-in registry the demo serves, said to be one.
    assert "a stand-in the demo serves (not a real schema registry)" in out
    assert (
        "three invoices to 'invoices' (schema policy): schema id 1, no schema id, schema id 99 "
        "(unknown)\n    -> INVALID_RECORD (87): One or more records have been rejected due to 2 "
        "record errors" in out
    )
    assert "record 1: no schema id: magic byte 0x7b, expected 0x00\n" in out
    assert "record 2: unknown schema id 99\n" in out
    assert 'kvproxy_policy_rejections_total{code="87",policy="schema",topic="invoices"} 1.0' in out


def test_embedded_broker_stops_on_exit() -> None:
    with run_embedded_broker() as broker:
        assert api_versions_ok(broker.host, broker.port)
    assert not api_versions_ok(broker.host, broker.port, timeout=0.5)
