"""A Kafka Connect distributed worker (Apache Kafka's own `ConnectDistributed`) for tests.

`connect_plugins/` holds a source connector (emits the records of its config, declares
exactly-once support) and a sink connector (appends what it receives to a file). They are
compiled with javac against the cached Kafka jars once, into
``~/.cache/kvproxy/connect-plugins/<hash of sources and Kafka version>/`` (a lock lets parallel
pytest workers share it), and put on the worker's classpath; their `META-INF/services` files let
the worker find them with `plugin.discovery=service_load`, which skips scanning every jar.

    with run_connect_worker(proxy.bootstrap, tmp_path) as worker:
        worker.put_connector("src", {"connector.class": SOURCE_CONNECTOR, ...})
        worker.wait_for_status("src", lambda s: ...)
        worker.log()                     # what the worker logged so far
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness.kafka_broker import KAFKA_4, java_command, kafka_classpath
from tests.harness.process_groups import register
from tests.harness.proxy import free_port_range

PLUGINS = Path(__file__).with_name("connect_plugins")
SOURCE_CONNECTOR = "kvproxy.connect.KvproxySourceConnector"
SINK_CONNECTOR = "kvproxy.connect.KvproxySinkConnector"
HOST = "127.0.0.1"
JVM_OPTIONS = ("-Xms64m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


class ConnectError(RuntimeError):
    """The plugins did not compile or the worker did not come up (with its log's tail)."""


def cache_root() -> Path:
    default = Path.home() / ".cache" / "kvproxy" / "connect-plugins"
    return Path(os.environ.get("KVPROXY_CONNECT_PLUGINS_CACHE", default))


def _sources() -> list[Path]:
    return sorted(p for p in PLUGINS.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def compiled_plugins(version: str = KAFKA_4) -> Path:
    """The directory of the compiled plugin classes and their service files; javac on first use."""
    digest = hashlib.sha256(version.encode())
    for path in _sources():
        digest.update(str(path.relative_to(PLUGINS)).encode() + b"\0" + path.read_bytes())
    target = cache_root() / digest.hexdigest()[:16]
    done = target / ".complete"
    if done.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return target
        javac = shutil.which("javac")
        if javac is None:
            raise ConnectError("javac is not installed: `make test` installs a JDK")
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        java_files = [str(p) for p in _sources() if p.suffix == ".java"]
        command = [javac, "-d", str(target), "-cp", kafka_classpath(version), *java_files]
        built = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        if built.returncode != 0:
            raise ConnectError(f"javac failed:\n{built.stdout}\n{built.stderr}")
        shutil.copytree(PLUGINS / "META-INF", target / "META-INF")
        done.write_text(version + "\n")
    return target


@dataclass
class ConnectWorker:
    bootstrap: str
    rest_url: str
    log_file: Path
    group_id: str
    topics: dict[str, str]
    """The internal topics by role: `config`, `offset`, `status`."""
    proc: subprocess.Popen[bytes]

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def wait_for_log(self, patterns: list[str], timeout: float = 60) -> str:
        """The worker's log once every regular expression of `patterns` is found in it (a task
        is FAILED in its status before its producer is closed and says so); raises naming the
        first missing pattern otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            log = self.log()
            missing = [pattern for pattern in patterns if not re.search(pattern, log)]
            if not missing:
                return log
            if time.monotonic() > deadline:
                raise ConnectError(f"not in the worker's log within {timeout}s: {missing[0]}")
            time.sleep(0.2)

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """(HTTP status, decoded JSON answer or None) of one REST call."""
        data = None if body is None else json.dumps(body).encode()
        call = urllib.request.Request(
            self.rest_url + path, data=data, method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(call, timeout=30) as answer:
                raw = answer.read()
                return answer.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as error:
            raw = error.read()
            return error.code, json.loads(raw) if raw else None

    def put_connector(self, name: str, config: Mapping[str, str], timeout: float = 60) -> Any:
        """PUT /connectors/NAME/config, asked again while the worker answers 409 (a rebalance
        under way, as after start-up or another connector's creation)."""
        deadline = time.monotonic() + timeout
        while True:
            status, answer = self.request("PUT", f"/connectors/{name}/config", dict(config))
            if status in (200, 201):
                return answer
            if status != 409 or time.monotonic() > deadline:
                raise ConnectError(f"PUT /connectors/{name}/config: {status} {answer}")
            time.sleep(0.2)

    def status(self, name: str) -> Any:
        status, answer = self.request("GET", f"/connectors/{name}/status")
        return answer if status == 200 else None

    def wait_for_status(
        self, name: str, condition: Callable[[Any], bool], timeout: float = 60
    ) -> Any:
        """Poll the connector's REST status until `condition` holds; the last status otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            answer = self.status(name)
            if answer is not None and condition(answer):
                return answer
            if time.monotonic() > deadline:
                raise ConnectError(f"{name}'s status never matched within {timeout}s: {answer}")
            time.sleep(0.2)


def task_states(status: Any) -> list[str]:
    return [task["state"] for task in status.get("tasks", [])]


def worker_properties(
    bootstrap: str, rest_port: int, group_id: str, topics: Mapping[str, str]
) -> dict[str, str]:
    """A distributed worker's settings: one-partition internal topics, exactly-once source."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "listeners": f"http://{HOST}:{rest_port}",
        "rest.advertised.host.name": HOST,
        "rest.advertised.port": str(rest_port),
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.storage.StringConverter",
        "config.storage.topic": topics["config"],
        "offset.storage.topic": topics["offset"],
        "status.storage.topic": topics["status"],
        "config.storage.replication.factor": "1",
        "offset.storage.replication.factor": "1",
        "status.storage.replication.factor": "1",
        "offset.storage.partitions": "1",
        "status.storage.partitions": "1",
        "exactly.once.source.support": "enabled",
        "plugin.discovery": "service_load",
        "offset.flush.interval.ms": "1000",
        "scheduled.rebalance.max.delay.ms": "0",
    }


@contextlib.contextmanager
def run_connect_worker(
    bootstrap: str,
    directory: Path,
    *,
    settings: Mapping[str, str] | None = None,
    version: str = KAFKA_4,
    timeout: float = 120,
) -> Iterator[ConnectWorker]:
    """Start a worker against `bootstrap`, wait (at most `timeout` s) until GET /health says it
    has joined its group and read its config topic, yield it, kill it on exit. Its log stays in
    `directory`."""
    plugins = compiled_plugins(version)
    rest_port = free_port_range(1)
    group_id = f"connect-{uuid.uuid4().hex[:8]}"
    topics = {role: f"{group_id}-{role}s" for role in ("config", "offset", "status")}
    props = {**worker_properties(bootstrap, rest_port, group_id, topics), **(settings or {})}
    directory.mkdir(parents=True, exist_ok=True)
    config_file = directory / "worker.properties"
    config_file.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    log_file = directory / "worker.log"
    argv = java_command(
        version, "org.apache.kafka.connect.cli.ConnectDistributed", str(config_file),
        jvm=JVM_OPTIONS,
    )  # fmt: skip
    argv[argv.index("-cp") + 1] = f"{plugins}:{kafka_classpath(version)}"
    with open(log_file, "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    register(proc, group=False)  # killed if pytest is stopped (process_groups.py)
    rest_url = f"http://{HOST}:{rest_port}"
    worker = ConnectWorker(bootstrap, rest_url, log_file, group_id, topics, proc)
    try:
        _wait_healthy(worker, timeout)
        yield worker
    finally:
        proc.kill()
        proc.wait(30)


def _wait_healthy(worker: ConnectWorker, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if worker.proc.poll() is not None:
            raise ConnectError(f"the worker exited with {worker.proc.returncode}:\n{_tail(worker)}")
        with contextlib.suppress(OSError):
            status, answer = worker.request("GET", "/health")
            if status == 200 and answer and answer.get("status") == "healthy":
                return
        if time.monotonic() > deadline:
            raise ConnectError(f"the worker was not healthy within {timeout}s:\n{_tail(worker)}")
        time.sleep(0.25)


def _tail(worker: ConnectWorker, lines: int = 60) -> str:
    return "\n".join(worker.log().splitlines()[-lines:])
