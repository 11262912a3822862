"""Output a peer can cause: log lines while the broker is down, and label values a broker chooses.

1. `--clients` connections (default 3,000) to a proxy (in this process, in front of a stub
   broker that is then stopped): each is closed as no_upstream; the figure is how many WARNING
   lines the `kvproxy` logger wrote for them, and in how long.
2. `--ports` addresses (default 1,500) a broker names for node 0, each dialled once and refused:
   the `kvproxy_upstream_connect_failures_total` series made and the size of the metrics page.

Runs against the checkout it is in (run it from an older commit's worktree for the "before").

    .venv/bin/python -m bench.log_floods [--clients 3000] [--ports 1500] [--json out.json]
"""

from __future__ import annotations

import argparse
import logging
import socket
import time
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from bench._results import report
from kvproxy.proxy.ops.metrics import ProxyMetrics
from tests.harness.metrics import scrape
from tests.harness.named_ports import connect_failure_series, dial_new_ports
from tests.harness.proxy import run_proxy
from tests.harness.stub_upstream import StubCluster


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += 1


def broker_down(clients: int) -> dict[str, Any]:
    counter = _Count()
    log = logging.getLogger("kvproxy")
    log.addHandler(counter)
    log.setLevel(logging.WARNING)
    cluster = StubCluster((1,))
    try:
        with run_proxy(cluster.bootstrap, max_brokers=10) as running:
            cluster.close()
            start = time.monotonic()
            socks = []
            for _ in range(clients):
                socks.append(socket.create_connection((running.host, running.port), timeout=10))
                if len(socks) >= 500:  # once the proxy closed them, this side's descriptors back
                    for sock in socks:
                        sock.settimeout(30)
                        sock.recv(1)  # b"": the proxy closed it
                        sock.close()
                    socks = []
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                reasons = {
                    dict(labels)["reason"]: count
                    for (name, labels), count in scrape(running).items()
                    if name == "kvproxy_connections_closed_total"
                }
                if sum(reasons.values()) >= clients:
                    break
                time.sleep(0.2)
            seconds = time.monotonic() - start
            for sock in socks:
                sock.close()
    finally:
        log.removeHandler(counter)
    return {
        "clients": clients,
        "closed": reasons,
        "warning_lines": counter.lines,
        "seconds": round(seconds, 2),
    }


def new_ports(ports: int) -> dict[str, Any]:
    metrics = ProxyMetrics()
    before = len(generate_latest(metrics.registry))
    logging.getLogger("kvproxy").setLevel(logging.CRITICAL)
    dial_new_ports(ports, metrics)
    return {
        "ports": ports,
        "series": len(connect_failure_series(metrics)),
        "metrics_bytes_before": before,
        "metrics_bytes_after": len(generate_latest(metrics.registry)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=3000)
    parser.add_argument("--ports", type=int, default=1500)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = {"broker_down": broker_down(args.clients), "new_ports": new_ports(args.ports)}
    report(result, args.json)


if __name__ == "__main__":
    main()
