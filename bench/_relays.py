"""The processes a benchmark puts in front of the broker: `kvproxy serve`, HAProxy in TCP mode
(the floor) and the uvloop relay (bench/uvloop_relay.py), each ready once an ApiVersions request
passes through it, with its CPU and memory readings; and the raw Kafka frames that check them.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench._results import ROOT
from tests.harness.proxy import free_port_range
from tests.harness.socket_frames import read_frame
from tests.harness.tansu import free_port

HOST = "127.0.0.1"

RECORD_LEVEL_RULE = """\
topics:
  - match: "{pattern}"
    compacted: true
    default_policies: drop
    policies:
      - compacted_key
      - {{max_record_bytes: {{limit: 1048576}}}}
      - json
"""
"""A topic rule with the record-level policies of benchmark 1 (keys needed, values JSON)."""


@dataclass
class RelayProcess:
    """A process in front of the broker (kvproxy, HAProxy, the uvloop relay), where clients reach
    it, and its CPU and memory over it and its child processes (psutil counts every thread of a
    process)."""

    process: subprocess.Popen[bytes]
    port: int
    _ps: psutil.Process = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._ps = psutil.Process(self.process.pid)

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def processes(self) -> list[psutil.Process]:
        """The process and its children (kvproxy's workers with `--workers N`)."""
        try:
            return [self._ps, *self._ps.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def cpu_seconds(self) -> float:
        """User + system CPU seconds so far, over the proxy and its workers."""
        total = 0.0
        for proc in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                times = proc.cpu_times()
                total += times.user + times.system
        return total

    def rss_bytes(self) -> int:
        """Resident memory over the proxy and its workers."""
        total = 0
        for proc in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                total += proc.memory_info().rss
        return total


@dataclass
class ProxyProcess(RelayProcess):
    """A running `kvproxy serve` and where clients reach it (its log beside its config)."""

    config_path: Path


@dataclass
class HAProxyProcess(RelayProcess):
    """A running HAProxy in TCP mode (the floor) and where clients reach it."""

    config_path: Path


@dataclass
class UvloopRelayProcess(RelayProcess):
    """A running bench/uvloop_relay.py (the floor of a Python proxy) and where clients reach it."""


def _answers_api_versions(port: int) -> bool:
    """True when a relay (kvproxy, HAProxy, the uvloop relay) passes an ApiVersions v0 request
    on and answers it."""
    request = struct.pack(">hhih", 18, 0, 1, 5) + b"bench"
    try:
        with socket.create_connection((HOST, port), timeout=2) as sock:
            sock.sendall(struct.pack(">i", len(request)) + request)
            sock.settimeout(2)
            head = sock.recv(8)
            return len(head) == 8 and struct.unpack(">ii", head)[1] == 1
    except OSError:
        return False


@contextlib.contextmanager
def start_proxy(
    upstream: str,
    *,
    rules: str = "",
    workers: int = 1,
    extra_yaml: str = "",
    listen_yaml: str = "",
    ready_timeout: float = 20.0,
) -> Iterator[ProxyProcess]:
    """`kvproxy serve` in front of `upstream`, default checks unless `rules` adds topic rules.

    `rules` is YAML appended to the config (say `RECORD_LEVEL_RULE.format(pattern="rl-*")`);
    `listen_yaml` more keys of the `listen` mapping (", sni: {...}").
    Stopped with SIGTERM (then SIGKILL) on exit; its stderr goes to a file, printed on failure.
    """
    with tempfile.TemporaryDirectory(prefix="kvbench-") as tmp:
        base = free_port_range(200)
        port = free_port()
        config = Path(tmp) / "kvproxy.yaml"
        config.write_text(
            f"listen: {{port: {port}, broker_port_base: {base}, max_brokers: 200{listen_yaml}}}\n"
            f"upstream: {{bootstrap_servers: ['{upstream}']}}\n"
            "metrics: {port: 0}\n" + extra_yaml + rules
        )
        log_path = Path(tmp) / "kvproxy.log"
        command = [sys.executable, "-m", "kvproxy.cli", "serve", "-c", str(config)]
        command += ["--reload-interval", "0"]
        if workers != 1:
            command += ["--workers", str(workers)]
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(command, stderr=log_file, stdout=log_file, cwd=ROOT)
            proxy = ProxyProcess(process, port, config)
            try:
                deadline = time.monotonic() + ready_timeout
                while not _answers_api_versions(port):
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            "kvproxy did not start:\n" + log_path.read_text(errors="replace")
                        )
                    time.sleep(0.1)
                if workers > 1:
                    time.sleep(0.5 * workers)  # every worker has its listeners open
                yield proxy
            finally:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(5)


HAPROXY_CONFIG = """\
# The floor: HAProxy in TCP mode relaying to one broker listener, copying bytes and reading none.
# Defaults otherwise (threads, buffers, no splicing): what any proxy pays, not a tuned relay.
defaults
    mode tcp
    timeout connect 5s
    timeout client 10m
    timeout server 10m

frontend floor
    bind {host}:{port}
    default_backend broker

backend broker
    server broker {server}
"""
"""Idle connections are cut after 10 minutes, as Kafka's own `connections.max.idle.ms` does."""


def haproxy_config(port: int, server: str) -> str:
    """HAProxy's configuration: TCP mode on HOST:`port`, one backend server `server` (host:port)."""
    return HAPROXY_CONFIG.format(host=HOST, port=port, server=server)


def haproxy_binary() -> str:
    """Where `haproxy` is (Debian puts it in /usr/sbin, off a non-root user's PATH)."""
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise RuntimeError(
            "haproxy is not installed: `make bench` installs it "
            "(apt-get install -y --no-install-recommends haproxy)"
        )
    return found


@contextlib.contextmanager
def start_haproxy(
    port: int, server: str, *, ready_timeout: float = 20.0
) -> Iterator[HAProxyProcess]:
    """HAProxy in the foreground with `haproxy_config(port, server)` from a temporary directory,
    ready once an ApiVersions request passes through it; SIGTERM (then SIGKILL) on exit."""
    with tempfile.TemporaryDirectory(prefix="kvbench-haproxy-") as tmp:
        config = Path(tmp) / "haproxy.cfg"
        config.write_text(haproxy_config(port, server))
        command = [haproxy_binary(), "-db", "-f", str(config)]
        with _relay_process("haproxy", command, port, Path(tmp), ready_timeout) as process:
            yield HAProxyProcess(process, port, config)


@contextlib.contextmanager
def start_uvloop_relay(
    port: int, server: str, *, ready_timeout: float = 20.0
) -> Iterator[UvloopRelayProcess]:
    """bench/uvloop_relay.py on HOST:`port` relaying to `server` (host:port), ready once an
    ApiVersions request passes through it; SIGTERM (then SIGKILL) on exit."""
    command = [
        sys.executable,
        "-m",
        "bench.uvloop_relay",
        "--port",
        str(port),
        "--upstream",
        server,
    ]
    with (
        tempfile.TemporaryDirectory(prefix="kvbench-uvloop-") as tmp,
        _relay_process("the uvloop relay", command, port, Path(tmp), ready_timeout) as process,
    ):
        yield UvloopRelayProcess(process, port)


@contextlib.contextmanager
def _relay_process(
    name: str, command: list[str], port: int, directory: Path, ready_timeout: float
) -> Iterator[subprocess.Popen[bytes]]:
    """`command` run with its output in `directory`, yielded once an ApiVersions request passes
    through `port` (its output in the error when it does not); SIGTERM, then SIGKILL, on exit."""
    log_path = directory / "relay.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=log_file, cwd=ROOT)
        try:
            deadline = time.monotonic() + ready_timeout
            while not _answers_api_versions(port):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{name} did not start:\n" + log_path.read_text(errors="replace")
                    )
                time.sleep(0.1)
            yield process
        finally:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def metadata_brokers(port: int) -> list[tuple[int, str, int]]:
    """(node id, host, port) of every broker a Metadata v1 answer (no topics) from HOST:`port`
    names: through HAProxy, the floor listener must name HAProxy's port."""
    request = struct.pack(">hhih", 3, 1, 2, 5) + b"bench" + struct.pack(">i", 0)
    with socket.create_connection((HOST, port), timeout=5) as sock:
        sock.settimeout(5)
        sock.sendall(struct.pack(">i", len(request)) + request)
        answer = read_frame(sock)
    (count,) = struct.unpack_from(">i", answer, 4)  # after the correlation id
    offset = 8
    brokers = []
    for _ in range(count):
        node_id, host_len = struct.unpack_from(">ih", answer, offset)
        offset += 6
        host = answer[offset : offset + host_len].decode()
        offset += host_len
        broker_port, rack_len = struct.unpack_from(">ih", answer, offset)
        offset += 6 + max(rack_len, 0)
        brokers.append((node_id, host, broker_port))
    return brokers
