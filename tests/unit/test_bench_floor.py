"""The floor of the network benchmarks: HAProxy in TCP mode in front of Apache Kafka, and the
uvloop relay (bench/uvloop_relay.py) beside it.

HAProxy's generated configuration must be one HAProxy accepts, and the wiring must send every
request through it: a broker started with a second listener whose advertised port is HAProxy's
answers Metadata through HAProxy with HAProxy's port, while its first listener still names itself.
The uvloop relay the same on a third listener. The rows comparing kvproxy with the relay and the
relay with HAProxy come out of the benchmarks' own row builders.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import struct
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from bench import latency, request_rate, run_all
from bench._brokers import free_port
from bench._floor import against_floor, floor_difference, floor_table
from bench._relays import (
    haproxy_binary,
    haproxy_config,
    metadata_brokers,
    read_frame,
    start_haproxy,
    start_uvloop_relay,
)
from tests.harness.kafka_broker import KAFKA_4, Listener, api_versions_ok, run_kafka

ROOT = Path(__file__).resolve().parents[2]


def test_haproxy_accepts_the_generated_configuration(tmp_path: Path) -> None:
    config = tmp_path / "haproxy.cfg"
    config.write_text(haproxy_config(free_port(), "127.0.0.1:9092"))
    checked = subprocess.run(
        [haproxy_binary(), "-c", "-f", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "mode tcp" in config.read_text()
    assert "bind 127.0.0.1:" in config.read_text()


def test_metadata_through_haproxy_and_the_uvloop_relay_names_each_relay() -> None:
    floor_port, uvloop_port = free_port(), free_port()
    listeners = (
        Listener("PLAINTEXT"),
        Listener("FLOOR", advertised_port=floor_port),
        Listener("UVLOOP", advertised_port=uvloop_port),
    )
    with run_kafka(KAFKA_4, listeners=listeners) as kafka:
        node = kafka.brokers[0]
        with (
            start_haproxy(floor_port, f"127.0.0.1:{node.ports['FLOOR']}") as haproxy,
            start_uvloop_relay(uvloop_port, f"127.0.0.1:{node.ports['UVLOOP']}") as relay,
        ):
            for port in (floor_port, uvloop_port):
                assert api_versions_ok("127.0.0.1", port)
                assert metadata_brokers(port) == [(1, "127.0.0.1", port)]
            assert metadata_brokers(node.port) == [(1, "127.0.0.1", node.port)]
            assert haproxy.bootstrap == f"127.0.0.1:{floor_port}"
            assert len(haproxy.processes()) == 1  # HAProxy: one process, its threads counted
            assert relay.bootstrap == f"127.0.0.1:{uvloop_port}"
            assert relay.cpu_seconds() > 0
            relay_process = relay.process
        assert relay_process.returncode == 0  # SIGTERM ends it cleanly


def test_the_uvloop_relay_relays_many_requests_on_one_connection_and_closes_both_sides() -> None:
    """Forty pipelined ApiVersions requests through the relay are each answered in order; when
    the client closes, the relay closes its upstream connection (the broker's count of
    connections on that listener goes back down, seen by the relay accepting new ones)."""
    uvloop_port = free_port()
    listeners = (Listener("PLAINTEXT"), Listener("UVLOOP", advertised_port=uvloop_port))
    with run_kafka(KAFKA_4, listeners=listeners) as kafka:
        upstream_port = kafka.brokers[0].ports["UVLOOP"]
        with start_uvloop_relay(uvloop_port, f"127.0.0.1:{upstream_port}") as relay:
            with socket.create_connection(("127.0.0.1", uvloop_port), timeout=10) as sock:
                requests = [struct.pack(">hhih", 18, 0, n, 2) + b"rl" for n in range(40)]
                sock.sendall(b"".join(struct.pack(">i", len(r)) + r for r in requests))
                answered = [struct.unpack_from(">ih", read_frame(sock)) for _ in range(40)]
                assert answered == [(n, 0) for n in range(40)]
                upstream = _peer_of(relay.process.pid, upstream_port)
                assert upstream is not None  # the relay's own connection to the broker
            deadline = time.monotonic() + 10
            while _peer_of(relay.process.pid, upstream_port) is not None:
                assert time.monotonic() < deadline, "the relay kept its upstream connection"
                time.sleep(0.05)


def _peer_of(pid: int, port: int) -> tuple[str, int] | None:
    """The process's established TCP connection to 127.0.0.1:`port`, if it has one."""
    for conn in psutil.Process(pid).net_connections(kind="tcp"):
        if conn.raddr and conn.raddr.port == port and conn.status == psutil.CONN_ESTABLISHED:
            return conn.raddr.ip, conn.raddr.port
    return None


def test_the_floor_rows_compare_medians_and_each_round() -> None:
    cpu = against_floor("cpu", [1.0, 0.8, 0.9], [2.0, 2.4, 1.8], at_most=1.5)
    assert (cpu.floor_reading, cpu.measured_reading, cpu.comparison) == (0.9, 2.0, "ratio")
    assert (cpu.measured, cpu.floor) == ("kvproxy", "HAProxy")
    assert cpu.value == pytest.approx(2.0 / 0.9)
    assert cpu.per_round == pytest.approx((2.0, 3.0, 2.0))
    assert (cpu.goal, cpu.met) == ("<= 1.5", False)
    rate = against_floor("rate", [10.0], [9.6], at_least=0.95)
    assert (rate.goal, rate.met) == (">= 0.95", True)
    late = floor_difference("p99", 2.0, 2.25, [0.25, 0.5], at_most=0.5)
    assert (late.value, late.per_round, late.goal, late.met) == (0.25, (0.25, 0.5), "<= +0.5", True)
    assert against_floor("plain", [1.0], [1.0]).met is None


def test_run_all_gathers_the_floor_rows_of_the_benchmarks_that_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = {
        "throughput": [against_floor("throughput: CPU", [1.0, 0.5], [2.0, 2.0], at_most=1.5)],
        "request_rate": [],  # as with --upstream tansu: no floor
        "latency": [floor_difference("latency: p50 ms", 1.0, 1.05, [0.05], at_most=0.1)],
    }
    for name, found in rows.items():
        (tmp_path / f"{name}.json").write_text(
            json.dumps({"against_floor": [dataclasses.asdict(row) for row in found]})
        )
    monkeypatch.setattr(run_all, "RESULTS", tmp_path)
    table = run_all._against_floor(["throughput", "request_rate", "latency", "engine"])
    assert len(table) == 3
    assert " ".join(table[1].split()) == (
        "throughput: CPU kvproxy / HAProxy 0.75 2 2.67x <= 1.5 NO 2.00 4.00"
    )
    assert " ".join(table[2].split()) == (
        "latency: p50 ms kvproxy - HAProxy 1 1.05 +0.050 <= +0.1 yes +0.050"
    )
    assert run_all._against_floor(["request_rate", "engine"]) == []


def test_request_rate_rows_set_kvproxy_against_the_uvloop_relay_and_it_against_haproxy() -> None:
    """Beside the goal row (kvproxy / HAProxy), kvproxy / the uvloop relay and the relay /
    HAProxy of the same figures, without goals; none of them when the relay was left out."""

    def runs(side: str, cpu: list[float], rate: list[float]) -> list[dict[str, float]]:
        pairs = zip(cpu, rate, strict=True)
        return [{f"{side}_cpu_s_per_100k": c, "requests_per_s": r} for c, r in pairs]

    measured = {
        "haproxy": runs("haproxy", [3.0, 2.0, 2.5], [100.0, 110.0, 90.0]),
        "uvloop": runs("uvloop", [2.0, 3.0, 2.5], [100.0, 100.0, 100.0]),
        "proxy": runs("proxy", [8.0, 9.0, 10.0], [50.0, 60.0, 40.0]),
    }
    rows = request_rate.floor_rows(measured)
    alone = request_rate.floor_rows({k: v for k, v in measured.items() if k != "uvloop"})
    shown = [(r.figure.split(": ")[1], r.measured, r.floor, round(r.value, 3)) for r in rows]
    assert shown == [
        ("CPU s per 100k requests", "kvproxy", "HAProxy", 3.6),
        ("requests/s", "kvproxy", "HAProxy", 0.5),
        ("CPU s per 100k requests", "kvproxy", "uvloop relay", 3.6),
        ("requests/s", "kvproxy", "uvloop relay", 0.5),
        ("CPU s per 100k requests", "uvloop relay", "HAProxy", 1.0),
        ("requests/s", "uvloop relay", "HAProxy", 1.0),
    ]
    assert rows[2].per_round == pytest.approx((4.0, 3.0, 4.0))
    assert rows[4].per_round == pytest.approx((2.0 / 3.0, 1.5, 1.0))
    assert [row.goal for row in rows] == ["<= 2", None, None, None, None, None]
    assert alone == rows[:2]


def test_latency_rows_set_kvproxy_against_the_uvloop_relay_and_it_against_haproxy() -> None:
    """kvproxy - HAProxy (the goals), kvproxy - the relay and the relay - HAProxy, paced (with
    each slice's difference) and one request at a time; the table names both sides."""
    overall = {
        "haproxy": {"p50": 0.5, "p99": 6.0},
        "uvloop": {"p50": 0.6, "p99": 5.0},
        "proxy": {"p50": 1.7, "p99": 12.0},
    }
    slices = {
        side: [{"p50_ms": p50, "p99_ms": p50 * 10} for p50 in values]
        for side, values in {
            "haproxy": [0.5, 0.4],
            "uvloop": [0.7, 0.6],
            "proxy": [1.5, 1.9],
        }.items()
    }
    unloaded = {"haproxy": {"p50": 0.2, "p99": 1.7}, "uvloop": {"p50": 0.25, "p99": 1.0}}
    unloaded["proxy"] = {"p50": 0.43, "p99": 1.1}
    rows = latency.floor_rows(overall, slices, unloaded)
    shown = [(r.figure, r.measured, r.floor, round(r.value, 3), r.goal) for r in rows]
    assert shown == [
        ("latency, paced: p50 ms", "kvproxy", "HAProxy", 1.2, "<= +0.1"),
        ("latency, paced: p99 ms", "kvproxy", "HAProxy", 6.0, "<= +0.5"),
        ("latency, one at a time: p50 ms", "kvproxy", "HAProxy", 0.23, None),
        ("latency, one at a time: p99 ms", "kvproxy", "HAProxy", -0.6, None),
        ("latency, paced: p50 ms", "kvproxy", "uvloop relay", 1.1, None),
        ("latency, paced: p99 ms", "kvproxy", "uvloop relay", 7.0, None),
        ("latency, one at a time: p50 ms", "kvproxy", "uvloop relay", 0.18, None),
        ("latency, one at a time: p99 ms", "kvproxy", "uvloop relay", 0.1, None),
        ("latency, paced: p50 ms", "uvloop relay", "HAProxy", 0.1, None),
        ("latency, paced: p99 ms", "uvloop relay", "HAProxy", -1.0, None),
        ("latency, one at a time: p50 ms", "uvloop relay", "HAProxy", 0.05, None),
        ("latency, one at a time: p99 ms", "uvloop relay", "HAProxy", -0.7, None),
    ]
    assert rows[4].per_round == pytest.approx((0.8, 1.3))
    assert rows[8].per_round == pytest.approx((0.2, 0.2))
    line = floor_table([dataclasses.asdict(row) for row in rows])[9]
    assert " ".join(line.split()) == (
        "latency, paced: p50 ms uvloop relay - HAProxy 0.5 0.6 +0.100 - - +0.200 +0.200"
    )
