"""Running out of file descriptors: said in those words, not counted as an upstream failure, not
reported by /readyz as a broker that is down; and `serve` raises its soft limit at start.

`kvproxy serve` runs as a subprocess whose limit on open files (soft and hard, so that it cannot
raise it) is a few dozen above what it opens at start; clients then open more connections than
that leaves room for. Each client connection holds two descriptors (its own and its upstream
one), so the proxy runs out while connecting upstream, and, under uvloop, libuv closes the
connections it cannot accept.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml

from kvproxy.protocol.messages import API_VERSIONS, decode_response
from tests.harness import Broker
from tests.harness.fuzz import api_versions_request
from tests.harness.processes import REPO, SET_LIMIT, wait_for_answer
from tests.harness.proxy import free_port_range, run_proxy
from tests.harness.raw_client import RawClientError, RawKafkaClient
from tests.harness.tansu import free_port

HOST = "127.0.0.1"
FD_LIMIT = 64
CLIENTS = 60
"""More connections than FD_LIMIT leaves room for once the proxy has started (about 25 open)."""


def fixed_limit(limit: int) -> tuple[int, int]:
    """Soft and hard limit both `limit`: the proxy cannot raise it."""
    return limit, limit


def soft_limit(limit: int) -> tuple[int, int]:
    """Soft limit `limit` under the test's own hard limit."""
    return limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]


class Serve:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path, port: int, metrics: int):
        self.proc = proc
        self.log = log
        self.port = port
        self.metrics = metrics

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    def wait_for_line(self, predicate: Callable[[str], bool], timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.lines()
            for line in self.lines():
                if predicate(line):
                    return line
            time.sleep(0.05)
        raise AssertionError(f"no such line in {self.lines()}")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.metrics}{path}", timeout=5) as got:
                return got.status, got.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


@contextlib.contextmanager
def kvproxy_serve(tmp_path: Path, tansu: Broker, limit: tuple[int, int]) -> Iterator[Serve]:
    port, metrics = free_port(), free_port()
    config = tmp_path / "kvproxy.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": {
                    "host": HOST,
                    "port": port,
                    "broker_port_base": free_port_range(20),
                    "lowest_node_id": 100,  # Tansu is node 111
                    "max_brokers": 20,
                },
                "upstream": {"bootstrap_servers": [tansu.bootstrap]},
                # set: unset, it would be what the limit has room for, refusing by count first
                "limits": {"max_connections_per_listener": 10_000},
                "shutdown": {"drain_timeout_ms": 2000},
                "metrics": {"host": HOST, "port": metrics},
            }
        )
    )
    log = tmp_path / "kvproxy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *SET_LIMIT,
                *map(str, limit),
                sys.executable,
                "-m",
                "kvproxy.cli",
                "serve",
                "-c",
                str(config),
            ],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        wait_for_answer(port, proc)
        yield Serve(proc, log, port, metrics)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def samples(text: str, name: str) -> dict[str, float]:
    """label text -> value of every sample of `name` in a /metrics text."""
    found = {}
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(\{{.*\}})? (\S+)", line)
        if match:
            found[match.group(1) or ""] = float(match.group(2))
    return found


def answers(port: int) -> bool:
    with (
        contextlib.suppress(OSError, RawClientError),
        RawKafkaClient(HOST, port, connect_timeout=2) as client,
    ):
        answer = client.request(api_versions_request(0, 7), timeout=5)
        return bool(decode_response(answer, API_VERSIONS, 0).body.error_code == 0)
    return False


def test_out_of_file_descriptors_is_said_not_counted_as_upstream_failure_and_passes(
    tansu: Broker, tmp_path: Path
) -> None:
    with kvproxy_serve(tmp_path, tansu, fixed_limit(FD_LIMIT)) as proxy:
        clients = []
        try:
            for _ in range(CLIENTS):
                clients.append(socket.create_connection((HOST, proxy.port), timeout=5))
            line = proxy.wait_for_line(lambda line: "out of file descriptors (" in line)
        finally:
            for client in clients:
                client.close()
        assert "ERROR" in line
        assert re.search(
            rf"out of file descriptors \({FD_LIMIT} open, limit {FD_LIMIT}\): raise the limit "
            r"\(ulimit -n; LimitNOFILE= under systemd, ulimits under Docker\) or lower "
            r"limits.max_connections_per_listener; every client connection holds two "
            r"descriptors: ",
            line,
        ), line
        assert not any("unreachable" in line for line in proxy.lines())
        refused = [line for line in proxy.lines() if "out of file descriptors (" in line]
        assert 1 <= len(refused) <= 3, refused  # a line per 10 s, not one per connection

        deadline = time.monotonic() + 30
        while not answers(proxy.port):  # the connections closed: it serves again
            assert time.monotonic() < deadline, proxy.lines()
            time.sleep(0.2)
        status, text = proxy.get("/metrics")
        assert status == 200
        assert samples(text, "kvproxy_upstream_connect_failures_total") == {}
        closed = samples(text, "kvproxy_connections_closed_total")
        assert closed.get('{reason="out_of_file_descriptors"}', 0) >= 1, closed
        assert '{reason="no_upstream"}' not in closed, closed
        deadline = time.monotonic() + 30
        while (ready := proxy.get("/readyz"))[0] != 200:
            assert time.monotonic() < deadline, ready
            time.sleep(0.5)
        assert ready[1].startswith("ready: upstream")


def test_serve_raises_its_soft_limit_on_open_files_to_the_hard_limit(
    tansu: Broker, tmp_path: Path
) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert hard > 256, "the test needs a hard limit above 256"
    with kvproxy_serve(tmp_path, tansu, soft_limit(256)) as proxy:
        line = proxy.wait_for_line(lambda line: "open file limit" in line)
        assert f"INFO kvproxy: open file limit raised from 256 to {hard} (the hard limit)" in line
        limits = Path(f"/proc/{proxy.proc.pid}/limits").read_text()
        [row] = [row for row in limits.splitlines() if row.startswith("Max open files")]
        assert row.split()[3:5] == [str(hard), str(hard)], row


def test_readyz_says_the_proxy_is_out_of_file_descriptors_not_that_the_broker_is_down(
    tansu: Broker,
) -> None:
    """In process: the soft limit lowered to the lowest free descriptor, on the proxy's loop,
    around one readiness check, so that the check's socket is the one refused."""
    with run_proxy(tansu.bootstrap) as proxy:

        async def check_at_the_limit() -> tuple[bool, str]:
            await asyncio.sleep(1.1)  # past the cached answer of the last check
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            lowest_free = os.dup(0)
            os.close(lowest_free)
            resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
            try:
                return await proxy.server.listeners.readiness.check()
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

        ready, why = proxy.call(check_at_the_limit())
        assert not ready
        assert why.startswith("not ready: out of file descriptors (")
        assert "raise the limit (ulimit -n" in why
        assert "upstream" not in why.split(":")[0]
        [failures] = proxy.server.metrics.connect_failures.collect()
        assert failures.samples == []
