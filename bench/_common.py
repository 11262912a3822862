"""What the benchmarks share: the broker (Apache Kafka or Tansu), a `kvproxy serve` process, CPU
and memory readings, alternating runs and the results file.

Every benchmark compares kvproxy with a baseline measured in the same run (these machines are
noisy): it alternates the variants run by run and reports medians and ratios. Each one writes its
figures to `bench/results/<name>.json`; `bench/run_all.py` collects them into
`bench/results/latest.md`.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka.admin import AdminClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.harness.kafka_broker import KAFKA_4, run_kafka  # noqa: E402
from tests.harness.proxy import free_port_range  # noqa: E402
from tests.harness.tansu import TansuServer, create_topic, free_port, run_tansu  # noqa: E402

__all__ = [
    "ROOT",
    "UPSTREAMS",
    "BrokerUnderTest",
    "ProxyProcess",
    "add_upstream_option",
    "alternate",
    "create_topic",
    "free_port",
    "machine",
    "median",
    "run_tansu",
    "start_proxy",
    "tansu",
    "upstream",
    "write_results",
]

RESULTS = Path(os.environ.get("KVPROXY_BENCH_RESULTS", ROOT / "bench" / "results"))
"""Where figures go (`KVPROXY_BENCH_RESULTS` moves them, e.g. for the smoke test)."""
HOST = "127.0.0.1"

RECORD_LEVEL_RULE = """\
topics:
  - match: "{pattern}"
    compacted: true
    policies:
      - compacted_key
      - {{max_record_bytes: {{limit: 1048576}}}}
      - json
"""
"""A topic rule with the record-level policies of benchmark 1 (keys needed, values JSON)."""


@contextlib.contextmanager
def tansu() -> Iterator[TansuServer]:
    """Tansu on a free loopback port, in memory."""
    with run_tansu() as server:
        yield server


UPSTREAMS = ("kafka", "tansu")
"""The brokers a benchmark can run against; Apache Kafka (KAFKA_4) is the default."""


@dataclass
class BrokerUnderTest:
    """The broker a benchmark measures against: where clients reach it, what it is, its process.

    `label` names it in printed tables ("Kafka" or "Tansu"), `version` in the results file."""

    kind: str
    label: str
    version: str
    bootstrap: str
    process: psutil.Process

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the broker process so far."""
        times = self.process.cpu_times()
        return float(times.user + times.system)

    def create_topic(self, name: str, partitions: int = 1, timeout: float = 30.0) -> str:
        """Create `name` and wait until Metadata gives every partition a leader (Kafka elects
        them a moment after CreateTopics answers)."""
        create_topic(self.bootstrap, name, partitions, None, timeout)
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + timeout
        while True:
            topic = admin.list_topics(name, timeout=timeout).topics.get(name)
            if topic is not None and all(p.leader >= 0 for p in topic.partitions.values()):
                return name
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name} has no leader for every partition: {topic}")
            time.sleep(0.05)


def add_upstream_option(parser: Any) -> None:
    """`--upstream kafka|tansu` on a benchmark's argument parser."""
    parser.add_argument(
        "--upstream",
        choices=UPSTREAMS,
        default="kafka",
        help=f"the broker: Apache Kafka {KAFKA_4} (default, one KRaft node) or Tansu (in memory)",
    )


@contextlib.contextmanager
def upstream(kind: str = "kafka") -> Iterator[BrokerUnderTest]:
    """A fresh broker on loopback for one benchmark: Apache Kafka KAFKA_4 (one combined KRaft
    node, log directory in a temporary directory removed afterwards) or Tansu in memory."""
    if kind == "kafka":
        with run_kafka(KAFKA_4) as cluster:
            node = cluster.brokers[0]
            assert node.proc is not None
            yield BrokerUnderTest(
                "kafka", "Kafka", KAFKA_4, cluster.bootstrap, psutil.Process(node.proc.pid)
            )
    elif kind == "tansu":
        with tansu() as server:
            assert server.proc is not None
            yield BrokerUnderTest(
                "tansu", "Tansu", "0.6", server.broker.bootstrap, psutil.Process(server.proc.pid)
            )
    else:
        raise ValueError(f"unknown upstream {kind!r}: one of {', '.join(UPSTREAMS)}")


@dataclass
class ProxyProcess:
    """A running `kvproxy serve` and where clients reach it."""

    process: subprocess.Popen[bytes]
    port: int
    config_path: Path
    _ps: psutil.Process = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._ps = psutil.Process(self.process.pid)

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def processes(self) -> list[psutil.Process]:
        """The proxy and its workers (`--workers N`)."""
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


def _answers_api_versions(port: int) -> bool:
    """True when the proxy relays an ApiVersions v0 request and answers it."""
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
    ready_timeout: float = 20.0,
) -> Iterator[ProxyProcess]:
    """`kvproxy serve` in front of `upstream`, default checks unless `rules` adds topic rules.

    `rules` is YAML appended to the config (say `RECORD_LEVEL_RULE.format(pattern="rl-*")`).
    Stopped with SIGTERM (then SIGKILL) on exit; its stderr goes to a file, printed on failure.
    """
    with tempfile.TemporaryDirectory(prefix="kvbench-") as tmp:
        base = free_port_range(200)
        port = free_port()
        config = Path(tmp) / "kvproxy.yaml"
        config.write_text(
            f"listen: {{port: {port}, broker_port_base: {base}, max_brokers: 200}}\n"
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


def alternate(
    rounds: int, variants: Mapping[str, Callable[[int], float]]
) -> dict[str, list[float]]:
    """Run every variant once per round, in turn (variant(round) -> figure); figures by name."""
    results: dict[str, list[float]] = {name: [] for name in variants}
    for round_index in range(rounds):
        for name, run in variants.items():
            figure = run(round_index)
            results[name].append(figure)
            print(f"  round {round_index + 1}/{rounds} {name}: {figure:,.2f}", flush=True)
    return results


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def write_results(name: str, figures: Mapping[str, Any]) -> Path:
    """Save one benchmark's figures (with the machine) as bench/results/<name>.json."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), **figures}, indent=2))
    print(f"figures written to {path}")
    return path


def read_frame(sock: socket.socket) -> bytes:
    """One size-prefixed Kafka frame from `sock` (without its prefix)."""

    def read(size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("connection closed by the proxy")
            data += chunk
        return bytes(data)

    return read(int.from_bytes(read(4), "big"))


def report(result: dict[str, Any], json_path: Path | None) -> dict[str, Any]:
    """Print a benchmark's result as JSON, and write it to `json_path` when given."""
    print(json.dumps(result, indent=2), flush=True)
    if json_path:
        json_path.write_text(json.dumps(result, indent=2))
    return result
