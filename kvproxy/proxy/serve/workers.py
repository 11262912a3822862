"""`kvproxy serve --workers N`: N proxy processes sharing the listeners, one supervisor.

Python runs one core's worth of checks per process; several processes spread clients over cores.
Each worker is a whole `kvproxy serve` (see `server.WorkerRole`): its listeners bind the same
ports with SO_REUSEPORT, so the kernel spreads new connections (not requests) over the workers;
one client connection, with its upstream connection and its ordering, stays in one worker.

The supervisor owns no client traffic. It starts the workers and restarts one that dies, passes
SIGHUP on (each worker reloads its rules) and SIGTERM/SIGINT (each drains, then exits), and
serves the configured metrics port: /metrics gathers every worker's metrics with a `worker`
label (sum them with `sum without (worker)`) plus `kvproxy_workers_running` and
`kvproxy_worker_restarts_total`, /readyz is ready when every worker is, /healthz answers while
the supervisor runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from kvproxy.proxy.config.proxy_config import ProxyConfig
from kvproxy.proxy.ops.metrics import start_http_endpoint
from kvproxy.proxy.serve.signals import queue_sighup

log = logging.getLogger("kvproxy")

__all__ = ["WorkerSettings", "merge_exposition", "run_workers"]

RESTART_DELAY_S = (1.0, 2.0, 5.0, 10.0, 30.0)
"""Waits before restarting a worker that died, by how many times it died in a row."""
STABLE_AFTER_S = 60.0
"""A worker that ran this long has its restart delay reset."""
START_TIMEOUT_S = 60.0
_SCRAPE_TIMEOUT_S = 5.0


class WorkersError(Exception):
    """The workers cannot be started (the message says why); `serve` exits with `exit_code`."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """How the supervisor starts each worker: the `serve` options that workers repeat."""

    config_path: Path
    count: int
    log_format: str = "text"
    reload_interval: float = 1.0


def check_config(config: ProxyConfig, count: int) -> None:
    """Refuse what cannot work with several processes (WorkersError)."""
    if count < 1:
        raise WorkersError(f"--workers must be at least 1, not {count}")
    if config.upstream.embedded:
        raise WorkersError(
            "--workers needs an upstream cluster: each worker would start its own embedded "
            "broker (upstream.embedded is for one process)"
        )
    listen = config.listen
    if listen.port_per_broker and listen.port == 0:
        raise WorkersError(
            "--workers needs a fixed listen.port: with port 0 each worker would listen on a "
            "different port"
        )
    if listen.sni is not None and listen.sni.port == 0:
        raise WorkersError(
            "--workers needs a fixed listen.sni.port: with port 0 each worker would listen on a "
            "different port"
        )


def shared_ports(config: ProxyConfig) -> str:
    """The listeners every worker shares, in words."""
    listen = config.listen
    where = []
    if listen.port_per_broker:
        where.append(f"bootstrap {listen.public_host}:{listen.port}, {listen.port_rule}")
    if listen.sni is not None:
        where.append(f"SNI port {listen.sni.port} ({listen.sni.bootstrap}, {listen.sni.brokers})")
    return "; ".join(where)


class _Worker:
    """One worker process and what the supervisor knows of it."""

    def __init__(self, index: int, state_dir: Path) -> None:
        self.index = index
        self.port_file = state_dir / f"worker-{index}.port"
        self.process: asyncio.subprocess.Process | None = None
        self.started_at = 0.0
        self.failures = 0
        self.restarts = 0

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def metrics_port(self) -> int | None:
        """The worker's own metrics port, once it has started (None before, or when off)."""
        try:
            text = self.port_file.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    @property
    def started(self) -> bool:
        return self.port_file.exists()


class Supervisor:
    """Starts, watches and stops the workers; serves their metrics on one port."""

    def __init__(self, config: ProxyConfig, settings: WorkerSettings, state_dir: Path) -> None:
        self.config = config
        self.settings = settings
        self.state_dir = state_dir
        self.workers = [_Worker(i, state_dir) for i in range(settings.count)]
        self._stopping = False
        self._watchers: set[asyncio.Task[None]] = set()

    def command(self, worker: _Worker) -> list[str]:
        settings = self.settings
        return [
            sys.executable,
            "-m",
            "kvproxy.cli",
            "serve",
            "-c",
            str(settings.config_path),
            "--log-format",
            settings.log_format,
            "--reload-interval",
            str(settings.reload_interval),
            "--worker-index",
            str(worker.index),
            "--worker-state",
            str(self.state_dir),
        ]

    async def spawn(self, worker: _Worker) -> None:
        worker.port_file.unlink(missing_ok=True)
        worker.process = await asyncio.create_subprocess_exec(*self.command(worker))
        worker.started_at = time.monotonic()
        log.info("worker %d started (pid %d)", worker.index, worker.process.pid)

    async def start(self) -> None:
        """Start every worker and wait until each has its listeners open (WorkersError if one
        exits first: the same configuration would fail the others too)."""
        for worker in self.workers:
            await self.spawn(worker)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(worker.started for worker in self.workers):
            for worker in self.workers:
                process = worker.process
                if process is not None and process.returncode is not None:
                    await self.stop()
                    code = process.returncode if process.returncode > 0 else 1
                    raise WorkersError(
                        f"worker {worker.index} exited with code {process.returncode} while "
                        "starting (its log above says why)",
                        code,
                    )
            if time.monotonic() > deadline:
                await self.stop()
                raise WorkersError(f"the workers did not start within {START_TIMEOUT_S:.0f} s", 1)
            await asyncio.sleep(0.05)
        for worker in self.workers:
            task = asyncio.get_running_loop().create_task(self._watch(worker))
            self._watchers.add(task)
            task.add_done_callback(self._watchers.discard)

    async def _watch(self, worker: _Worker) -> None:
        """Restart the worker whenever it exits while the supervisor is not stopping."""
        while not self._stopping:
            assert worker.process is not None
            code = await worker.process.wait()
            if self._stopping:
                return
            if time.monotonic() - worker.started_at >= STABLE_AFTER_S:
                worker.failures = 0
            delay = RESTART_DELAY_S[min(worker.failures, len(RESTART_DELAY_S) - 1)]
            worker.failures += 1
            log.error(
                "worker %d (pid %d) exited with code %s: restarting it in %.0f s",
                worker.index,
                worker.process.pid,
                code,
                delay,
            )
            await asyncio.sleep(delay)
            if self._stopping:
                return
            worker.restarts += 1
            await self.spawn(worker)

    def signal_all(self, sig: int) -> None:
        for worker in self.workers:
            if worker.running and worker.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(sig)

    def reload_all(self) -> None:
        """SIGHUP to every worker that has started; one still starting reads the configuration
        file as it starts anyway (and would only queue the signal)."""
        for worker in self.workers:
            if worker.running and worker.started and worker.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(signal.SIGHUP)

    async def stop(self) -> None:
        """SIGTERM every worker (each drains its in-flight requests), SIGKILL what outlives
        the drain timeout by 10 s."""
        self._stopping = True
        for task in list(self._watchers):
            task.cancel()
        self.signal_all(signal.SIGTERM)
        grace = self.config.shutdown.drain_timeout_ms / 1000 + 10.0
        waits = [w.process.wait() for w in self.workers if w.process is not None]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), grace)
        except TimeoutError:
            log.error("workers still running %.0f s after SIGTERM: killing them", grace)
            self.signal_all(signal.SIGKILL)
            await asyncio.gather(*(w.process.wait() for w in self.workers if w.process))

    # ---- the metrics port ----

    async def exposition(self) -> bytes:
        texts: list[tuple[int, str]] = []
        for worker in self.workers:
            port = worker.metrics_port()
            if port is None or not worker.running:
                continue
            status, body = await _http_get(port, "/metrics")
            if status == 200:
                texts.append((worker.index, body))
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Merged(merge_exposition(texts), self.workers))
        return generate_latest(registry)

    async def readiness(self) -> tuple[bool, str]:
        lines = []
        ready = True
        for worker in self.workers:
            port = worker.metrics_port()
            if not worker.running or port is None:
                ready = False
                lines.append(f"worker {worker.index}: not running")
                continue
            status, body = await _http_get(port, "/readyz")
            ready = ready and status == 200
            lines.append(f"worker {worker.index}: {body.strip() or status}")
        return ready, ("ready" if ready else "not ready") + "\n" + "\n".join(lines)


async def _http_get(port: int, path: str) -> tuple[int, str]:
    """GET http://127.0.0.1:port/path from a worker; (0, why) when it does not answer."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port), _SCRAPE_TIMEOUT_S
        )
    except (OSError, TimeoutError) as exc:
        return 0, f"unreachable: {exc}"
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
        answer = await asyncio.wait_for(reader.read(), _SCRAPE_TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        return 0, f"no answer: {exc}"
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0, "not an HTTP answer"
    return status, body.decode("utf-8", "replace")


def merge_exposition(texts: Iterable[tuple[int, str]]) -> list[Metric]:
    """Each worker's metric families, merged into one family per name, every sample labelled
    `worker="<index>"` (the text format wants a family's samples together)."""
    merged: dict[str, Metric] = {}
    for index, text in texts:
        for family in text_string_to_metric_families(text):
            target = merged.get(family.name)
            if target is None:
                target = merged[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            for sample in family.samples:
                labels = {"worker": str(index), **sample.labels}
                target.samples.append(
                    Sample(sample.name, labels, sample.value, sample.timestamp, sample.exemplar)
                )
    return list(merged.values())


class _Merged(Collector):
    def __init__(self, families: Sequence[Metric], workers: Sequence[_Worker]) -> None:
        self._families = families
        self._workers = workers

    def collect(self) -> Iterable[Metric]:
        yield from self._families
        running = GaugeMetricFamily(
            "kvproxy_workers_running", "Worker processes running (kvproxy serve --workers)"
        )
        running.add_metric([], sum(1 for w in self._workers if w.running))
        yield running
        restarts = CounterMetricFamily(
            "kvproxy_worker_restarts",
            "Worker processes restarted after they exited",
            labels=["worker"],
        )
        for worker in self._workers:
            restarts.add_metric([str(worker.index)], worker.restarts)
        yield restarts


async def supervise(config: ProxyConfig, settings: WorkerSettings) -> None:
    """Run the workers until SIGTERM or SIGINT."""
    check_config(config, settings.count)
    state_dir = Path(tempfile.mkdtemp(prefix="kvproxy-workers-"))
    supervisor = Supervisor(config, settings, state_dir)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, supervisor.reload_all)
    http = None
    try:
        await supervisor.start()
        metrics = config.metrics
        if metrics.enabled:
            try:
                http = await start_http_endpoint(
                    metrics.host, metrics.port, supervisor.exposition, supervisor.readiness
                )
            except OSError as exc:
                log.error("metrics endpoint %s:%s unavailable: %s", metrics.host, metrics.port, exc)
        log.info(
            "kvproxy workers started: %d sharing %s (each says when it is ready; /readyz on the "
            "metrics port sums them up)",
            settings.count,
            shared_ports(config),
        )
        await stop.wait()
        log.info("stopping: SIGTERM to every worker, each drains its in-flight requests")
        await supervisor.stop()
        log.info("kvproxy stopped")
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
        queue_sighup()  # while cleaning up and exiting: never the default action, which kills
        if http is not None:
            http.close()
        shutil.rmtree(state_dir, ignore_errors=True)


def run_workers(config: ProxyConfig, settings: WorkerSettings) -> None:
    """Blocking entry point of `kvproxy serve --workers N` (N > 1)."""
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        asyncio.run(supervise(config, settings))
    else:
        uvloop.run(supervise(config, settings))
