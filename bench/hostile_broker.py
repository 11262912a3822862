"""A hostile broker: a Metadata answer naming a million brokers, to a client and to the proxy's
own Metadata refresh. What it holds the proxy's event loop, what it costs in memory, and what an
innocent client meanwhile waits.

An in-process proxy (`tests.harness.proxy.run_proxy`, default checks, `max_brokers` 10) in front
of the stub cluster (`tests.harness.stub_upstream`, three nodes), whose Metadata answers (v1)
name `--brokers` more brokers (host "h", ids 100...) once told to: to a client's request
(scenario `client`) or to the proxy's own (scenario `refresh`, the refresh asked for by this
script on the proxy's loop). A probe on the proxy's loop sleeps 5 ms at a time and keeps the
largest overshoot (max loop lag); an innocent client sends ApiVersions one at a time on its own
connection throughout. Figures: max loop lag, peak RSS growth of the process (VmHWM reset before
the hostile answer; the stub's prebuilt answer is built before), the innocent client's max and
p99 latency, and what the hostile client or the refresh got.

    .venv/bin/python -m bench.hostile_broker [--brokers 1000000] [--json out.json]

`KVPROXY_ROOT=/path/to/checkout` measures another checkout's proxy with this script.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import threading
import time
from pathlib import Path
from typing import Any

from tests.harness.proxy import run_proxy
from tests.harness.raw_client import RawClientError, RawKafkaClient
from tests.harness.requests import api_versions_request, metadata_request
from tests.harness.stub_upstream import StubCluster

ROOT = Path(os.environ.get("KVPROXY_ROOT", Path(__file__).resolve().parents[1]))


def metadata_v1_body(nodes: dict[int, tuple[str, int]], extra: int) -> bytes:
    """A Metadata v1 answer body (after the correlation id): the nodes, `extra` brokers more."""
    parts = [struct.pack(">i", len(nodes) + extra)]
    for node_id, (host, port) in nodes.items():
        raw = host.encode()
        parts.append(struct.pack(">ih", node_id, len(raw)) + raw + struct.pack(">ih", port, -1))
    entry = struct.Struct(">ihcih")
    parts.extend(entry.pack(100 + n, 1, b"h", 9092, -1) for n in range(extra))
    parts.append(struct.pack(">ii", next(iter(nodes)), 0))  # controller, no topics
    return b"".join(parts)


class BigStub(StubCluster):
    """Answers Metadata v1 with the prebuilt body when `mode` matches the asker."""

    def __init__(self, extra: int) -> None:
        super().__init__((1, 2, 3))
        self.body = metadata_v1_body(self.nodes, extra)
        self.mode = ""
        self._asker = threading.local()

    def _handle(self, node: Any, state: Any, payload: bytes) -> bytes | object | None:
        (length,) = struct.unpack_from(">h", payload, 8)
        proxy = payload[10 : 10 + max(length, 0)] == b"kvproxy"
        api_key, version, cid = struct.unpack_from(">hhi", payload, 0)
        wanted = "refresh" if proxy else "client"
        if api_key == 3 and version == 1 and self.mode == wanted:
            self._record(node, api_key, version, cid)
            return struct.pack(">i", cid) + self.body
        return super()._handle(node, state, payload)


def reset_peak() -> int:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss("VmRSS")


def rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)


async def probe(stop: threading.Event, lags: list[float]) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        start = loop.time()
        await asyncio.sleep(0.005)
        lags.append(loop.time() - start - 0.005)


def innocent(host: str, port: int, stop: threading.Event, latencies: list[float]) -> None:
    with RawKafkaClient(host, port) as client:
        cid = 1
        while not stop.is_set():
            started = time.perf_counter()
            client.request(api_versions_request(3, cid), timeout=120)
            latencies.append(time.perf_counter() - started)
            cid += 1
            time.sleep(0.002)


def scenario(name: str, brokers: int) -> dict[str, Any]:
    stub = BigStub(brokers)
    try:
        with run_proxy(stub.bootstrap, max_brokers=10) as running:
            stop, lags, latencies = threading.Event(), [], []
            lagging = asyncio.run_coroutine_threadsafe(probe(stop, lags), running.loop)
            other = threading.Thread(
                target=innocent, args=(running.host, running.port, stop, latencies)
            )
            other.start()
            time.sleep(0.5)
            lags.clear()
            latencies.clear()
            before = reset_peak()
            started = time.perf_counter()
            stub.mode = name
            if name == "client":
                with RawKafkaClient(running.host, running.port) as hostile:
                    try:
                        answer = hostile.request(metadata_request(1, 9, []), timeout=120)
                        outcome = f"answered, {len(answer)} bytes"
                    except (RawClientError, OSError) as exc:
                        outcome = f"closed ({type(exc).__name__})"
            else:
                refresh = running.server.listeners.metadata.refresh
                outcome = f"refresh returned {running.call(refresh(), timeout=300)}"
            took = time.perf_counter() - started
            stub.mode = ""
            time.sleep(0.5)
            peak = rss("VmHWM")
            stop.set()
            other.join(150)
            lagging.result(10)
    finally:
        stub.close()
    latencies.sort()
    return {
        "scenario": name,
        "brokers": brokers,
        "outcome": outcome,
        "seconds": round(took, 3),
        "max_loop_lag_s": round(max(lags, default=0.0), 3),
        "rss_growth_mib": round((peak - before) / (1 << 20), 1),
        "innocent_answers": len(latencies),
        "innocent_max_s": round(latencies[-1], 3) if latencies else None,
        "innocent_p99_s": round(latencies[int(len(latencies) * 0.99) - 1], 3)
        if latencies
        else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", type=int, default=1_000_000)
    parser.add_argument("--scenarios", default="client,refresh")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = [scenario(name, args.brokers) for name in args.scenarios.split(",")]
    for row in rows:
        print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
