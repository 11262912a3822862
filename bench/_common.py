"""What the benchmarks share: a Tansu broker, a `kvproxy serve` process, CPU and memory readings,
alternating runs and the results file.

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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.harness.proxy import free_port_range  # noqa: E402
from tests.harness.tansu import TansuServer, create_topic, free_port, run_tansu  # noqa: E402

__all__ = [
    "ROOT",
    "ProxyProcess",
    "alternate",
    "create_topic",
    "free_port",
    "machine",
    "median",
    "run_tansu",
    "start_proxy",
    "tansu",
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
