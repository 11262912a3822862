"""Produce throughput: direct to the broker vs through kvproxy, alternating, in the same run.

A first cut of benchmark 1 of the performance issue: confluent-kafka (librdkafka) producing
1 KiB records (acks=all, linger.ms=5, batch.size=1 MiB) to Tansu directly and through
`kvproxy serve` with the default checks. Prints MB/s for each and the ratio; bounded by count.

    .venv/bin/python bench/produce_throughput.py [--records 30000] [--runs 3]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.harness.proxy import free_port_range
from tests.harness.tansu import (
    create_topic,
    free_port,
    run_tansu,
)

RECORD = b"x" * 1024


def produce(bootstrap: str, topic: str, records: int) -> float:
    """MB/s for `records` records of 1 KiB, all acknowledged."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 1048576,
            "queue.buffering.max.messages": 200000,
        }
    )
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, RECORD, b"k%d" % i, partition=0)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(120) != 0:
        raise RuntimeError("records left unacknowledged")
    return records * len(RECORD) / (time.perf_counter() - started) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=30000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with run_tansu() as server, tempfile.TemporaryDirectory() as tmp:
        broker = server.broker
        base = free_port_range(200)
        port = free_port()
        config = Path(tmp) / "kvproxy.yaml"
        config.write_text(
            f"listen: {{port: {port}, broker_port_base: {base}, max_brokers: 200}}\n"
            f"upstream: {{bootstrap_servers: ['{broker.bootstrap}']}}\n"
            "metrics: {port: 0}\n"
        )
        proxy = subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", "serve", "-c", str(config)],
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.5)
        ratios = []
        try:
            for run in range(args.runs):
                direct_topic = create_topic(broker.bootstrap, f"direct-{run}", 1, None)
                proxied_topic = create_topic(broker.bootstrap, f"proxied-{run}", 1, None)
                direct = produce(broker.bootstrap, direct_topic, args.records)
                proxied = produce(f"127.0.0.1:{port}", proxied_topic, args.records)
                ratios.append(proxied / direct)
                print(
                    f"run {run}: direct {direct:.1f} MB/s, through kvproxy {proxied:.1f} MB/s, "
                    f"ratio {proxied / direct:.2f}"
                )
        finally:
            proxy.send_signal(signal.SIGTERM)
            proxy.wait(10)
        print(f"median ratio through kvproxy / direct: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
