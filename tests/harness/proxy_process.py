"""kvproxy as a process in front of a cluster, on ports kept across restarts: killed or stopped
and started again, one process or a supervisor of workers (`--workers N`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from tests.harness.process_groups import register
from tests.harness.processes import REPO, wait_for_answer, wait_until
from tests.harness.proxy import free_port_range
from tests.harness.tansu import free_port

HOST = "127.0.0.1"


@dataclass
class ProxyProcess:
    """`kvproxy serve -c FILE [--workers N]` in front of a cluster, on ports kept across
    restarts; `start()` again after `stop()` or `kill()` comes back on the same ports."""

    config_path: Path
    config: dict[str, Any]
    workers: int = 1
    arguments: tuple[str, ...] = ()
    """More `kvproxy serve` arguments (`--log-format json`)."""
    proc: subprocess.Popen[bytes] | None = None
    seen: dict[int, psutil.Process] = field(default_factory=dict)
    starts: int = 0

    @classmethod
    def in_front_of(
        cls,
        directory: Path,
        servers: list[str],
        workers: int = 1,
        listen: dict[str, Any] | None = None,
    ) -> ProxyProcess:
        """`listen`: more settings of the listen section (the SNI listener's, for one)."""
        config = {
            "listen": {
                "host": HOST,
                "port": free_port(),
                "broker_port_base": free_port_range(10),
                "lowest_node_id": 0,
                "max_brokers": 10,
                **(listen or {}),
            },
            "upstream": {"bootstrap_servers": servers},
            "shutdown": {"drain_timeout_ms": 2000},
            "metrics": {"host": HOST, "port": free_port()},
        }
        path = directory / "kvproxy.yaml"
        path.write_text(yaml.safe_dump(config))
        return cls(path, config, workers)

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.config['listen']['port']}"

    @property
    def metrics_url(self) -> str:
        metrics = self.config["metrics"]
        return f"http://{metrics['host']}:{metrics['port']}"

    @property
    def ports(self) -> set[int]:
        """The bootstrap port and every broker listener port the proxy may open."""
        listen = self.config["listen"]
        base = listen["broker_port_base"]
        return {listen["port"], *range(base, base + listen["max_brokers"])}

    @property
    def log(self) -> Path:
        return self.config_path.with_suffix(".log")

    def start(self, timeout: float = 90) -> None:
        command = [sys.executable, "-m", "kvproxy.cli", "serve", "-c", str(self.config_path)]
        command += self.arguments
        if self.workers != 1:
            command += ["--workers", str(self.workers), "--reload-interval", "0"]
        self.starts += 1
        with self.log.open("ab") as out:
            out.write(f"--- start {self.starts} ---\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                command,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
            )
            register(self.proc)  # with its workers, if pytest is stopped (process_groups.py)
        wait_for_answer(self.config["listen"]["port"], self.proc, timeout)
        if self.workers != 1:
            wait_until(
                lambda: len(self._children()) >= self.workers, "the workers to start", timeout
            )

    def _children(self) -> list[psutil.Process]:
        assert self.proc is not None
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        self.seen.update((child.pid, child) for child in children)
        return children

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Send `sig` to kvproxy (the supervisor of workers); wait for it and every worker it
        started to exit. Its exit status."""
        assert self.proc is not None
        self._children()
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        if sig == signal.SIGKILL:  # the workers of a killed supervisor are killed too
            for worker in self.seen.values():
                with contextlib.suppress(psutil.NoSuchProcess):
                    worker.kill()
        _, alive = psutil.wait_procs(list(self.seen.values()), timeout=timeout)
        assert not alive, f"workers left after {signal.Signals(sig).name}: {alive}"
        self.seen.clear()
        return code

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop(signal.SIGKILL)
        for worker in self.seen.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.kill()
