"""Upstream amplification: what producing to thousands of invented topic names costs the cluster.

A fresh Tansu broker, a counting relay in front of it (`tests.harness.counting_relay`: it counts
the connections the proxy opens and the requests of each api key), and `kvproxy serve` from this
file's checkout in front of the relay, default checks. The hostile client produces one record to
each of `--names` names that are no topic (default 5,000), one Produce v8 at a time on
`--connections` connections (the names split between them). The other client of
`bench/hostile.py` (one small Produce at a time on an existing topic) runs throughout.

Figures: connections the proxy opened to the cluster for its own requests (those carrying
DescribeConfigs or Metadata), DescribeConfigs and Metadata requests sent, the hostile client's
time to get every answer and the codes it got, the other client's p50 before and p50/p99 during.

    .venv/bin/python -m bench.hostile_upstream [--names 5000] [--connections 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import socket
import threading
import time
from pathlib import Path
from typing import Any

from bench import hostile
from bench._brokers import create_topic, tansu
from bench._hostile_inputs import OTHER_TOPIC
from bench._hostile_watch import OtherClient
from bench._load import percentile
from bench._relays import start_proxy
from bench._results import ROOT, report
from kvproxy.protocol.messages import DESCRIBE_CONFIGS, METADATA, PRODUCE, decode_response
from tests.harness.counting_relay import run_counting_relay
from tests.harness.requests import produce_request
from tests.harness.socket_frames import read_frame


def hostile_client(port: int, names: list[str], codes: collections.Counter[str]) -> None:
    """One Produce v8 per name, each answered before the next; counts the answer codes."""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        for n, name in enumerate(names):
            payload = produce_request(8, n + 1, name, [(b"k", b"v")])
            sock.sendall(len(payload).to_bytes(4, "big") + payload)
            try:
                answer = decode_response(read_frame(sock), PRODUCE, 8).body
            except (OSError, ConnectionError) as exc:
                codes[f"failed: {exc}"] += len(names) - n
                return
            for entry in answer.responses:
                for partition in entry.partition_responses:
                    codes[str(int(partition.error_code))] += 1


def run(args: argparse.Namespace) -> dict[str, Any]:
    names = [f"invented-{n}" for n in range(args.names)]
    with tansu() as server:
        broker = server.broker
        create_topic(broker.bootstrap, OTHER_TOPIC, 1)
        with (
            run_counting_relay((broker.host, broker.port)) as relay,
            start_proxy(relay.bootstrap) as proxy,
        ):
            other = OtherClient(proxy.port, 120)
            other.start()
            time.sleep(2)  # the other client's figures before
            codes: collections.Counter[str] = collections.Counter()
            opened_before = relay.connections_with(DESCRIBE_CONFIGS, METADATA)
            described_before = relay.requests(DESCRIBE_CONFIGS)
            metadata_before = relay.requests(METADATA)
            began = time.perf_counter()
            threads = [
                threading.Thread(
                    target=hostile_client, args=(proxy.port, names[i :: args.connections], codes)
                )
                for i in range(args.connections)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(args.timeout)
            took = time.perf_counter() - began
            time.sleep(1)  # the proxy's own requests still under way
            during = sorted(other.latencies(began, began + took))
            before = sorted(other.latencies(began - 2, began))
            other.stop()
            opened = relay.connections_with(DESCRIBE_CONFIGS, METADATA) - opened_before
            described = relay.requests(DESCRIBE_CONFIGS) - described_before
            metadata = relay.requests(METADATA) - metadata_before
    return {
        "code": hostile.code_location(),
        "root": str(ROOT),
        "names": args.names,
        "connections": args.connections,
        "upstream_connections_opened": opened,
        "describe_configs_requests": described,
        "metadata_requests": metadata,
        "hostile_answer_codes": dict(codes),
        "hostile_time_s": round(took, 2),
        "other_p50_before_ms": round(percentile(before, 0.5) * 1e3, 1) if before else None,
        "other_requests_during": len(during),
        "other_p50_ms": round(percentile(during, 0.5) * 1e3, 1) if during else None,
        "other_p99_ms": round(percentile(during, 0.99) * 1e3, 1) if during else None,
        "other_error": other.error,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--names", type=int, default=5000)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    return report(run(args), args.json)


if __name__ == "__main__":
    main()
