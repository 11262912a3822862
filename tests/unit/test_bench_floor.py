"""The floor of the network benchmarks: HAProxy in TCP mode in front of Apache Kafka.

HAProxy's generated configuration must be one HAProxy accepts, and the wiring must send every
request through it: a broker started with a second listener whose advertised port is HAProxy's
answers Metadata through HAProxy with HAProxy's port, while its first listener still names itself.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.harness.kafka_broker import KAFKA_4, Listener, api_versions_ok, run_kafka

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def common() -> Iterator[ModuleType]:
    """bench/_common.py as a module (bench/ is no package); sys.path is put back afterwards."""
    saved = list(sys.path)
    spec = importlib.util.spec_from_file_location("bench_common", ROOT / "bench" / "_common.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path[:] = saved
        sys.modules.pop(spec.name, None)


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
