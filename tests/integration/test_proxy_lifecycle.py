"""`kvproxy serve` and `kvproxy check` as a user runs them: a process, a YAML file, signals."""

from __future__ import annotations

import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvproxy.cli import main
from kvproxy.protocol.messages import API_VERSIONS, FETCH, decode_response
from tests.harness import Broker, create_topic, unique_topic_name
from tests.harness.clients import consume_through, produce_through
from tests.harness.processes import HOST, REPO, kvproxy_serve, wait_for_answer
from tests.harness.proxy import RunningProxy, free_port_range
from tests.harness.raw_client import RawKafkaClient
from tests.harness.requests import correlation_id_of, fetch_request, topic_id_of
from tests.harness.tansu import free_port


def write_config(path: Path, upstream: dict[str, Any], drain_timeout_ms: int = 5000) -> int:
    """A config for `kvproxy serve` on free ports; returns the bootstrap port."""
    port = free_port()
    config = {
        "listen": {
            "host": HOST,
            "port": port,
            "broker_port_base": free_port_range(20),
            "lowest_node_id": 100,  # Tansu is node 111
            "max_brokers": 20,
        },
        "upstream": upstream,
        "shutdown": {"drain_timeout_ms": drain_timeout_ms},
    }
    path.write_text(yaml.safe_dump(config))
    return port


def port_is_closed(port: int) -> bool:
    try:
        socket.create_connection((HOST, port), timeout=1).close()
    except OSError:
        return True
    return False


# ---- serve ----


def test_serve_relays_and_sigterm_drains_the_in_flight_request(
    tansu: Broker, tmp_path: Path
) -> None:
    config = tmp_path / "kvproxy.yaml"
    port = write_config(config, {"bootstrap_servers": [tansu.bootstrap]}, drain_timeout_ms=5000)
    topic = create_topic(tansu.bootstrap, unique_topic_name("serve"))
    empty = create_topic(tansu.bootstrap, unique_topic_name("empty"))
    log = tmp_path / "kvproxy.log"
    with kvproxy_serve(config, log) as proc:
        wait_for_answer(port, proc)
        bootstrap = f"{HOST}:{port}"
        produce_through(bootstrap, topic)
        assert consume_through(bootstrap, topic, 5) == [f"v{n}".encode() for n in range(5)]

        client = RawKafkaClient(HOST, port)
        try:
            topic_id = topic_id_of(client, empty)
            # a long poll on an empty partition: the broker holds it for max_wait_ms
            client.send_frame(
                fetch_request(16, 4242, topic_id, max_wait_ms=2000, min_bytes=1 << 30)
            )
            time.sleep(0.2)
            sent_at = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            answer = client.recv_frame(timeout=10)  # drained, not cut off
            assert time.monotonic() - sent_at > 1.0  # it really was held by the broker
            assert correlation_id_of(answer) == 4242
            assert decode_response(answer, FETCH, 16).body.error_code == 0
            assert client.is_closed_by_peer(timeout=10)
        finally:
            client.close()
        assert proc.wait(10) == 0, log.read_text()
        assert time.monotonic() - sent_at < 5.0 + 1.0  # within the drain timeout (5 s)
    # The process has exited, so its listeners are gone; probing the port now could hit another
    # test's server that took the freed port.
    text = log.read_text()
    assert "kvproxy ready" in text and "draining in-flight requests" in text


def test_serve_refuses_new_connections_while_draining(tansu: Broker, tmp_path: Path) -> None:
    config = tmp_path / "kvproxy.yaml"
    port = write_config(config, {"bootstrap_servers": [tansu.bootstrap]}, drain_timeout_ms=5000)
    empty = create_topic(tansu.bootstrap, unique_topic_name("empty"))
    with kvproxy_serve(config, tmp_path / "kvproxy.log") as proc:
        wait_for_answer(port, proc)
        with RawKafkaClient(HOST, port) as client:
            topic_id = topic_id_of(client, empty)
            client.send_frame(fetch_request(16, 7, topic_id, max_wait_ms=2000, min_bytes=1 << 30))
            time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            assert port_is_closed(port)  # listeners close first
            assert correlation_id_of(client.recv_frame(timeout=10)) == 7
        assert proc.wait(10) == 0


def test_serve_with_embedded_broker(tmp_path: Path) -> None:
    config = tmp_path / "kvproxy.yaml"
    port = write_config(config, {"embedded": True})
    log = tmp_path / "kvproxy.log"
    with kvproxy_serve(config, log) as proc:
        wait_for_answer(port, proc)
        bootstrap = f"{HOST}:{port}"
        topic = create_topic(bootstrap, unique_topic_name("embedded"))
        produce_through(bootstrap, topic, 3)
        assert consume_through(bootstrap, topic, 3) == [b"v0", b"v1", b"v2"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, log.read_text()
    assert "embedded broker listening on" in log.read_text()


def test_serve_with_a_bad_config_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("upstream: {bootstrap_servers: [nohost]}\n")
    done = subprocess.run(
        [sys.executable, "-m", "kvproxy.cli", "serve", "-c", str(config)],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert (
        "upstream.bootstrap_servers" in done.stderr and "'nohost' is not HOST:PORT" in done.stderr
    )


# ---- check ----


def test_check_prints_ok_and_the_resolved_listeners(tmp_path: Path) -> None:
    config = tmp_path / "good.yaml"
    config.write_text(
        "listen: {host: 0.0.0.0, port: 9300, advertised_host: proxy.example,"
        " broker_port_base: 9400, lowest_node_id: 1, max_brokers: 5}\n"
        "upstream: {bootstrap_servers: 'kafka-1:9092,kafka-2:9092'}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "kvproxy.cli", "check", "-c", str(config)],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"{config}: OK"
    assert "bootstrap listener: 0.0.0.0:9300, advertised as proxy.example" in done.stdout
    assert "node N -> port 9400 + (N - 1), ports 9400-9404" in done.stdout
    assert "upstream: kafka-1:9092, kafka-2:9092" in done.stdout


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("upstream: {bootstrap_servers: [k:1]}\nlisten: {prot: 1}\n", "listen.prot: unknown key"),
        (
            "upstream: {bootstrap_servers: [k:1]}\nquarantine: {path: q}\n",
            "quarantine.path: unknown key",
        ),
        ("upstream: {bootstrap_servers: ['kafka:port']}\n", "'kafka:port' is not HOST:PORT"),
        (
            "upstream: {bootstrap_servers: [k:1], embedded: true}\n",
            "upstream: set either bootstrap_servers or embedded: true, not both",
        ),
        ("upstream: {bootstrap_servers: [k:1]\n", "not valid YAML"),
    ],
    ids=["unknown-key", "later-section", "bad-host-port", "both-sources", "invalid-yaml"],
)
def test_check_reports_the_bad_key_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    assert main(["check", "-c", str(config)]) == 2
    out, err = capsys.readouterr()
    assert "OK" not in out
    assert err.startswith(f"kvproxy: {config}")
    assert expected in err


def test_check_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.yaml"
    assert main(["check", "-c", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvproxy: {missing}: cannot read")


def test_serve_refuses_a_cluster_outside_the_broker_port_range(
    tansu: Broker, tmp_path: Path
) -> None:
    config = tmp_path / "narrow.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": {
                    "host": HOST,
                    "port": free_port(),
                    "broker_port_base": free_port_range(10),
                    "lowest_node_id": 0,
                    "max_brokers": 10,  # Tansu's node 111 has no port
                },
                "upstream": {"bootstrap_servers": [tansu.bootstrap]},
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "kvproxy.cli", "serve", "-c", str(config)],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert f"kvproxy: {config}: node id 111 is outside the proxy's broker port range" in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_on_a_port_in_use_exits_1(tansu: Broker, tmp_path: Path) -> None:
    config = tmp_path / "kvproxy.yaml"
    port = write_config(config, {"bootstrap_servers": [tansu.bootstrap]})
    with socket.socket() as taken:
        taken.bind((HOST, port))
        taken.listen()
        done = subprocess.run(
            [sys.executable, "-m", "kvproxy.cli", "serve", "-c", str(config)],
            check=False,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert done.returncode == 1
    assert "kvproxy: cannot serve:" in done.stderr and "Traceback" not in done.stderr


def test_a_closed_connection_pair_is_freed_without_the_cycle_collector(
    proxy: RunningProxy,
) -> None:
    """A closed client connection and its upstream are freed at once (no reference cycle), so
    the frame buffers their last answers held go back to the pool instead of waiting for gc."""
    import gc

    from kvproxy.proxy.relay.client_connection import ClientConnection
    from kvproxy.proxy.relay.upstream_connection import UpstreamConnection

    def alive() -> int:
        return sum(
            1 for o in gc.get_objects() if isinstance(o, ClientConnection | UpstreamConnection)
        )

    request = struct.pack(">hhih", API_VERSIONS, 0, 7, 1) + b"x"
    gc.collect()
    gc.disable()
    try:
        before = alive()
        for _ in range(20):
            with socket.create_connection((proxy.host, proxy.port), timeout=5) as sock:
                sock.sendall(struct.pack(">i", len(request)) + request)
                assert len(sock.recv(8)) > 0
        deadline = time.monotonic() + 10
        while proxy.stats().client_connections or proxy.stats().upstream_connections:
            assert time.monotonic() < deadline, proxy.stats()
            time.sleep(0.05)
        time.sleep(0.2)
        assert alive() <= before
    finally:
        gc.enable()
