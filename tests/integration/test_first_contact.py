"""The first minutes with kvproxy: the documented files start, signals never kill, and what
goes wrong is said in words (which timeout, which protocol the upstream speaks instead)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from kvproxy.cli import main
from kvproxy.protocol.messages import (
    METADATA,
    PRODUCE,
    decode_response,
    encode_request,
    make_request,
)
from kvproxy.protocol.records import build_batch
from kvproxy.proxy.config.proxy_config import ProxyConfig
from kvproxy.proxy.errors import ProxyError
from tests.harness import Broker, RawKafkaClient, create_topic, unique_topic_name
from tests.harness.clients import consume_through, produce_through, sasl_plain_producer
from tests.harness.fuzz import produce_request
from tests.harness.metrics import get
from tests.harness.processes import kvproxy_serve
from tests.harness.proxy import free_port_range, proxy_config, run_proxy
from tests.harness.stub_upstream import run_stub_cluster
from tests.harness.tansu import free_port

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]
KVPROXY = [sys.executable, "-m", "kvproxy.cli"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def wait_for(condition: object, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not callable(condition) or not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.5):
        return True
    return False


def serving(config: Path, log: Path) -> contextlib.AbstractContextManager[Any]:
    """`kvproxy serve -c CONFIG` as the installed command runs it, from the file's folder."""
    return kvproxy_serve(config, log, module="kvproxy.cli", cwd=config.parent)


# ---- the documented development file ----


@pytest.mark.xdist_group("default-ports")
def test_the_documented_dev_file_serves_on_the_default_ports(tmp_path: Path) -> None:
    """`printf 'upstream: {embedded: true}\\n' > dev.yaml; kvproxy serve -c dev.yaml`, as the
    README says: Tansu is node 111, which the default mapping puts on 9193 + 111 mod 100."""
    config = tmp_path / "dev.yaml"
    config.write_text("upstream: {embedded: true}\n")
    done = subprocess.run(
        [*KVPROXY, "check", "-c", str(config), "--connect"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "broker listeners: node N -> port 9193 + (N mod 100), ports 9193-9292" in done.stdout
    assert "-> 127.0.0.1:9204" in done.stdout and "node 111 at 127.0.0.1:" in done.stdout

    log = tmp_path / "serve.log"
    with serving(config, log) as proc:
        wait_for(lambda: "kvproxy ready" in log.read_text() or proc.poll() is not None, "ready")
        assert proc.poll() is None, log.read_text()
        assert accepts(9204), log.read_text()
        topic = unique_topic_name("dev")
        produce_through(f"{HOST}:9192", topic, 3)
        assert consume_through(f"{HOST}:9192", topic, 3) == [b"v0", b"v1", b"v2"]
        broker = next(p for p in psutil.Process(proc.pid).children() if "tansu" in p.name())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    assert not psutil.pid_exists(broker.pid) or broker.status() == psutil.STATUS_ZOMBIE
    assert log.read_text().rstrip().endswith("kvproxy stopped")


def test_a_cluster_numbered_from_1001_is_served_without_listen_keys() -> None:
    with (
        run_stub_cluster(node_ids=(1001, 1002, 1003)) as cluster,
        run_proxy(config=_default_mapping(cluster.bootstrap)) as proxy,
    ):
        base = proxy.config.listen.broker_port_base
        assert proxy.nodes == cluster.nodes
        client = RawKafkaClient(proxy.host, proxy.port)
        try:
            body = _metadata_v1_all()
            payload = client.request(encode_request(make_request(METADATA, 1, 3, "t", body)))
        finally:
            client.close()
        brokers = decode_response(payload, METADATA, 1).body.brokers
        assert sorted((b.node_id, b.port) for b in brokers) == [
            (1001, base + 1),
            (1002, base + 2),
            (1003, base + 3),
        ]
        for port in (base + 1, base + 2, base + 3):
            assert accepts(port)


def test_nodes_sharing_a_port_stop_serve_and_check_connect_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with run_stub_cluster(node_ids=(1, 101)) as cluster:
        config = _default_mapping(cluster.bootstrap)
        with (
            pytest.raises(ProxyError, match=r"node 101 has no port: port [0-9]+ is node 1's"),
            run_proxy(config=config),
        ):
            pass
        path = tmp_path / "kvproxy.yaml"
        path.write_text(yaml.safe_dump({"upstream": {"bootstrap_servers": [cluster.bootstrap]}}))
        assert main(["check", "-c", str(path), "--connect"]) == 2
        out, err = capsys.readouterr()
        assert "node 1 at 127.0.0.1:" in out and "-> 127.0.0.1:9194" in out
        assert "kvproxy: node 101 has no port: port 9194 is node 1's (node ids 1 and 101" in err


def test_check_connect_says_why_the_cluster_did_not_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with silent_upstream() as port:
        path = tmp_path / "kvproxy.yaml"
        path.write_text(
            yaml.safe_dump(
                {"upstream": {"bootstrap_servers": [f"{HOST}:{port}"], "connect_timeout_ms": 300}}
            )
        )
        assert main(["check", "-c", str(path), "--connect"]) == 1
    out, err = capsys.readouterr()
    assert (
        f"metadata from {HOST}:{port} failed: no answer within upstream.connect_timeout_ms "
        "(300 ms)" in out
    )
    assert "the cluster did not answer" in err


def _default_mapping(bootstrap: str) -> ProxyConfig:
    config = proxy_config(bootstrap, listen={"broker_port_base": free_port_range(100)})
    listen = config.listen.model_copy(update={"lowest_node_id": None, "max_brokers": 100})
    return config.model_copy(update={"listen": listen})


def _metadata_v1_all() -> object:
    from kio.schema.metadata.v1.request import MetadataRequest

    return MetadataRequest(topics=None)


# ---- signals ----


@contextlib.contextmanager
def silent_upstream() -> Iterator[int]:
    """Accepts connections and reads, never answers: a broker that hangs."""
    server = socket.create_server((HOST, 0))
    stop = threading.Event()
    conns: list[socket.socket] = []

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                conn, _ = server.accept()
                conns.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        for conn in conns:
            conn.close()
        server.close()


def test_sighup_while_starting_is_queued_and_a_silent_cluster_is_not_ready(
    tmp_path: Path,
) -> None:
    """SIGHUP while the proxy waits for its first Metadata answer (the bootstrap listener already
    serving) used to kill it (exit 129); and it logged "ready" with an empty reason."""
    port, metrics_port = free_port(), free_port()
    config = tmp_path / "kvproxy.yaml"
    log = tmp_path / "serve.log"
    with silent_upstream() as upstream:
        config.write_text(
            yaml.safe_dump(
                {
                    "listen": {
                        "host": HOST,
                        "port": port,
                        "broker_port_base": free_port_range(1),
                        "max_brokers": 1,
                    },
                    "upstream": {
                        "bootstrap_servers": [f"{HOST}:{upstream}"],
                        "connect_timeout_ms": 4000,
                    },
                    "metrics": {"port": metrics_port},
                }
            )
        )
        with serving(config, log) as proc:
            wait_for(lambda: accepts(port) or proc.poll() is not None, "the bootstrap listener")
            for _ in range(3):  # inside the gap: listening, no Metadata answer yet
                proc.send_signal(signal.SIGHUP)
                time.sleep(0.2)
            assert proc.poll() is None, log.read_text()
            expected = (
                f"metadata from {HOST}:{upstream} failed: no answer within "
                "upstream.connect_timeout_ms (4000 ms)"
            )
            wait_for(lambda: "not ready" in log.read_text(), "the not-ready line")
            proc.send_signal(signal.SIGHUP)  # live now: a reload
            status, text = get(f"http://{HOST}:{metrics_port}/readyz")
            assert status == 503 and expected in text, text
            wait_for(lambda: "config reloaded" in log.read_text(), "the queued reload")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, log.read_text()
    text = log.read_text()
    assert "SIGHUP before the configuration is live: reloading once it is" in text
    assert f"kvproxy listening (bootstrap {HOST}:{port}" in text and expected in text
    assert "kvproxy ready" not in text
    assert text.rstrip().endswith("kvproxy stopped")


class _BadRequest(socketserver.BaseRequestHandler):
    """What an HTTP server answers to bytes that are no HTTP request (nginx, a REST proxy)."""

    def handle(self) -> None:
        self.request.recv(65536)
        self.request.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


def test_an_http_server_given_as_the_broker_is_named_as_such(
    caplog: pytest.LogCaptureFixture,
) -> None:
    http_server = socketserver.ThreadingTCPServer((HOST, 0), _BadRequest)
    thread = threading.Thread(target=http_server.serve_forever, daemon=True)
    thread.start()
    try:
        bootstrap = f"{HOST}:{http_server.server_address[1]}"
        with caplog.at_level("WARNING", logger="kvproxy"), run_proxy(bootstrap) as proxy:
            assert not proxy.server.listeners.readiness.cluster_answered
    finally:
        http_server.shutdown()
        http_server.server_close()
    assert (
        f"metadata from {bootstrap} failed: the answer is not Kafka's: frame size 1213486160 is "
        "larger than the maximum 104857600: the peer does not speak Kafka (its first bytes "
        "b'HTTP' look like HTTP (an HTTP server's answer))" in caplog.text
    )


# ---- kvproxy demo ----


class _Lines:
    """A process's stdout, line by line, read on a thread (so reads can time out)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert proc.stdout is not None
        stream = proc.stdout
        self._thread = threading.Thread(target=lambda: self.lines.extend(stream), daemon=True)
        self._thread.start()

    def wait_for(self, text: str, count: int = 1, timeout: float = 120) -> list[str]:
        found: list[str] = []

        def enough() -> bool:
            found[:] = [line for line in list(self.lines) if text in line]
            return len(found) >= count

        wait_for(enough, f"{count} line(s) with {text!r}; got {self.lines[-5:]}", timeout)
        return found


@contextlib.contextmanager
def demo_running() -> Iterator[tuple[subprocess.Popen[str], _Lines, int, psutil.Process]]:
    proc = subprocess.Popen(
        [*KVPROXY, "demo", "--keep-running"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ENV,
    )
    try:
        lines = _Lines(proc)
        (up,) = lines.wait_for("kvproxy stays up on")
        port = int(up.split(";")[0].rsplit(":", 1)[1])
        (broker,) = [p for p in psutil.Process(proc.pid).children() if "tansu" in p.name()]
        yield proc, lines, port, broker
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_demo_keep_running_prints_every_rejection_and_sigterm_stops_the_broker() -> None:
    with demo_running() as (proc, lines, port, broker):
        good = bytearray(build_batch([(b"k", b"v", (), None)]))
        good[-1] ^= 0xFF  # a CRC that no longer matches
        with RawKafkaClient(HOST, port) as client:
            for n in range(12):  # more than the log's 10 per window
                client.request(produce_request(9, n, [("kvproxy-demo", 0, bytes(good))]))
        rejected = lines.wait_for("rejected: kvproxy-demo-0 by crc: CORRUPT_MESSAGE (2)", 12)
        assert "Record is corrupt (stored crc = " in rejected[0]
        assert "[client 'kvproxy-fuzz' at 127.0.0.1:" in rejected[0]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        wait_for(lambda: _gone(broker), "the embedded broker to stop", 10)


def test_a_killed_demo_takes_its_broker_with_it() -> None:
    with demo_running() as (proc, _, _, broker):
        proc.kill()  # no handler runs: the broker must not be left running on its own
        proc.wait(10)
        wait_for(lambda: _gone(broker), "the embedded broker to die with kvproxy", 10)


def test_embedded_serve_leaves_no_broker_behind_on_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "dev.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": {
                    "host": HOST,
                    "port": 0,
                    "broker_port_base": free_port_range(1),
                    "max_brokers": 1,
                },
                "upstream": {"embedded": True},
                "metrics": {"port": 0},
            }
        )
    )
    log = tmp_path / "serve.log"
    with serving(config, log) as proc:
        wait_for(lambda: "kvproxy ready" in log.read_text() or proc.poll() is not None, "ready")
        (broker,) = [p for p in psutil.Process(proc.pid).children() if "tansu" in p.name()]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    wait_for(lambda: _gone(broker), "the embedded broker to stop", 10)


def test_the_topic_of_a_fresh_tansu_is_produced_through_the_default_mapping(
    tansu: Broker,
) -> None:
    """In front of a real broker (node 111) with no listen keys but free ports."""
    config = _default_mapping(tansu.bootstrap)
    topic = create_topic(tansu.bootstrap, unique_topic_name("first"))
    with run_proxy(config=config) as proxy:
        assert proxy.nodes == {111: (HOST, tansu.port)}
        bootstrap = f"{HOST}:{proxy.port}"
        produce_through(bootstrap, topic, 2)
        assert consume_through(bootstrap, topic, 2) == [b"v0", b"v1"]


# ---- clusters that answer the proxy only in part ----


def _produce_logged_in(bootstrap: str) -> None:
    """One record to partition 2 (led by node 3) as alice over SASL/PLAIN; it must be written."""
    errors: list[Any] = []
    producer: Any = sasl_plain_producer(bootstrap, "secret", errors)
    results: list[Any] = []
    producer.produce("stub-topic", b"v", partition=2, on_delivery=lambda e, m: results.append(e))
    assert producer.flush(10) == 0 and results == [None], errors


def test_a_cluster_that_requires_sasl_is_ready_once_it_answers_api_versions(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A SASL-only listener closes the connection on the proxy's Metadata request (it carries no
    credentials) but answers ApiVersions: the cluster has answered, /readyz says ready, and the
    brokers are learnt from the clients' own (authenticated) answers."""
    with (
        caplog.at_level("WARNING", logger="kvproxy"),
        run_stub_cluster(sasl_plain={"alice": "secret"}) as cluster,
        run_proxy(cluster.bootstrap, max_brokers=10) as proxy,
    ):
        assert proxy.server.listeners.readiness.cluster_answered
        wait_for(lambda: get(f"{proxy.metrics_url}/readyz")[0] == 200, "/readyz 200", 10)
        _produce_logged_in(proxy.bootstrap)
    assert (
        f"the cluster answered ApiVersions at {cluster.bootstrap} but closed the connection on "
        "Metadata" in caplog.text
    )


def test_a_broker_port_taken_by_another_process_fails_only_that_broker() -> None:
    """The listener of node 2 cannot open (another process holds its port): a client's Metadata
    answer still comes back, and the partitions of the other brokers are produced to. It used
    to close every connection whose answer named node 2."""
    with (
        run_stub_cluster(sasl_plain={"alice": "secret"}) as cluster,  # nodes learnt from clients
        run_proxy(cluster.bootstrap, max_brokers=10) as proxy,
        socket.create_server((HOST, proxy.broker_port(2))),  # taken
    ):
        _produce_logged_in(proxy.bootstrap)
        assert cluster.produced(3) == 1  # partition 2's leader is node 3
        assert sorted(proxy.nodes) == [1, 2, 3]


def test_a_failing_rejection_listener_is_dropped_and_changes_no_answer(
    tansu: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    topic = create_topic(tansu.bootstrap, unique_topic_name("listener"))
    defaults = {"policies": ["batch_integrity", "crc", "json"]}
    with run_proxy(tansu.bootstrap, defaults=defaults) as proxy:

        def broken(event: object) -> None:
            raise BrokenPipeError("stdout is gone")

        proxy.server.sink.rejection_listeners.append(broken)
        not_json = build_batch([(b"k", b"not json", (), None)])
        with RawKafkaClient(proxy.host, proxy.port) as client:
            for n in range(2):
                answer = client.request(produce_request(9, n, [(topic, 0, not_json)]))
                body = decode_response(answer, PRODUCE, 9).body
                assert body.responses[0].partition_responses[0].error_code == 87
        assert proxy.server.sink.rejection_listeners == []
    assert caplog.text.count("no longer told") == 1
