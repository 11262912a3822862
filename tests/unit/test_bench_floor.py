"""The floor of the network benchmarks: HAProxy in TCP mode in front of Apache Kafka.

HAProxy's generated configuration must be one HAProxy accepts, and the wiring must send every
request through it: a broker started with a second listener whose advertised port is HAProxy's
answers Metadata through HAProxy with HAProxy's port, while its first listener still names itself.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.harness.bench_modules import bench_module
from tests.harness.kafka_broker import KAFKA_4, Listener, api_versions_ok, run_kafka

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def common() -> Iterator[ModuleType]:
    with bench_module("_common") as module:
        yield module


def test_haproxy_accepts_the_generated_configuration(common: ModuleType, tmp_path: Path) -> None:
    config = tmp_path / "haproxy.cfg"
    config.write_text(common.haproxy_config(common.free_port(), "127.0.0.1:9092"))
    checked = subprocess.run(
        [common.haproxy_binary(), "-c", "-f", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "mode tcp" in config.read_text()
    assert "bind 127.0.0.1:" in config.read_text()


def test_metadata_through_haproxy_names_haproxy(common: ModuleType) -> None:
    floor_port = common.free_port()
    listeners = (Listener("PLAINTEXT"), Listener("FLOOR", advertised_port=floor_port))
    with run_kafka(KAFKA_4, listeners=listeners) as kafka:
        node = kafka.brokers[0]
        backend = f"127.0.0.1:{node.ports['FLOOR']}"
        with common.start_haproxy(floor_port, backend) as relay:
            assert api_versions_ok("127.0.0.1", floor_port)
            assert common.metadata_brokers(floor_port) == [(1, "127.0.0.1", floor_port)]
            assert common.metadata_brokers(node.port) == [(1, "127.0.0.1", node.port)]
            assert relay.bootstrap == f"127.0.0.1:{floor_port}"
            assert len(relay.processes()) == 1  # HAProxy: one process, its threads counted in it


def test_the_floor_rows_compare_medians_and_each_round(common: ModuleType) -> None:
    cpu = common.against_floor("cpu", [1.0, 0.8, 0.9], [2.0, 2.4, 1.8], at_most=1.5)
    assert (cpu.haproxy, cpu.kvproxy, cpu.comparison) == (0.9, 2.0, "ratio")
    assert cpu.value == pytest.approx(2.0 / 0.9)
    assert cpu.per_round == pytest.approx((2.0, 3.0, 2.0))
    assert (cpu.goal, cpu.met) == ("<= 1.5", False)
    rate = common.against_floor("rate", [10.0], [9.6], at_least=0.95)
    assert (rate.goal, rate.met) == (">= 0.95", True)
    late = common.floor_difference("p99", 2.0, 2.25, [0.25, 0.5], at_most=0.5)
    assert (late.value, late.per_round, late.goal, late.met) == (0.25, (0.25, 0.5), "<= +0.5", True)
    assert common.against_floor("plain", [1.0], [1.0]).met is None


def test_run_all_gathers_the_floor_rows_of_the_benchmarks_that_ran(
    common: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = {
        "throughput": [
            common.against_floor("throughput: CPU", [1.0, 0.5], [2.0, 2.0], at_most=1.5)
        ],
        "request_rate": [],  # as with --upstream tansu: no floor
        "latency": [common.floor_difference("latency: p50 ms", 1.0, 1.05, [0.05], at_most=0.1)],
    }
    for name, found in rows.items():
        (tmp_path / f"{name}.json").write_text(
            json.dumps({"against_floor": [dataclasses.asdict(row) for row in found]})
        )
    with bench_module("run_all") as loaded:
        run_all = loaded
    monkeypatch.setattr(run_all, "RESULTS", tmp_path)
    table = run_all._against_floor(["throughput", "request_rate", "latency", "engine"])
    assert len(table) == 3
    assert " ".join(table[1].split()) == "throughput: CPU 0.75 2 2.67x <= 1.5 NO 2.00 4.00"
    assert " ".join(table[2].split()) == "latency: p50 ms 1 1.05 +0.050 <= +0.1 yes +0.050"
    assert run_all._against_floor(["request_rate", "engine"]) == []
