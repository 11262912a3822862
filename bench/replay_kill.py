"""Nothing lost for an idempotent producer, under kill -9: refused records replayed exactly once.

An idempotent confluent-kafka producer sends `--records` JSON values (every 10th is not JSON, so
the `json` policy refuses it) to a topic through `kvproxy serve`, with a quarantine journal.
While it sends, the proxy is killed with SIGKILL `--kills` times and started again on the same
ports and journal. Then the policy is relaxed and `kvproxy quarantine replay` runs twice. The
topic is read back straight from the broker (Tansu), and every value is counted:

- a good value: stored exactly once (the producer's own delivery, retried across the kills, or
  the application's resend of a record refused only for sharing a batch with a bad one, as a
  KIP-467 client does: librdkafka reports those `_INVALID_DIFFERENT_RECORD`);
- a refused value: stored exactly once (by replay), whatever the producer was told;
- anything else (stored twice, or missing) is listed.

    .venv/bin/python -m bench.replay_kill [--records 20000] [--kills 3]

Figures go to bench/results/replay_kill.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from bench._brokers import create_topic, free_port, tansu
from bench._results import ROOT, write_results
from tests.harness.proxy import free_port_range

HOST = "127.0.0.1"


def answers(port: int) -> bool:
    request = struct.pack(">hhih", 18, 0, 1, 5) + b"bench"
    try:
        with socket.create_connection((HOST, port), timeout=2) as sock:
            sock.sendall(struct.pack(">i", len(request)) + request)
            sock.settimeout(2)
            return len(sock.recv(8)) == 8
    except OSError:
        return False


def serve(config: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "kvproxy.cli", "serve", "-c", str(config)]
    with log.open("ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=out, cwd=ROOT)
    deadline = time.monotonic() + 30
    while not answers(port):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("kvproxy did not start:\n" + log.read_text(errors="replace"))
        time.sleep(0.05)
    return process


def value_of(i: int) -> bytes:
    return b"not json %d" % i if i % 10 == 0 else json.dumps({"n": i}).encode()


def stored_values(bootstrap: str, topic: str) -> collections.Counter[bytes]:

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{time.time()}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen: collections.Counter[bytes] = collections.Counter()
    idle = time.monotonic()
    while time.monotonic() - idle < 5:
        message = consumer.poll(0.5)
        if message is None or message.error():
            continue
        seen[message.value() or b""] += 1
        idle = time.monotonic()
    consumer.close()
    return seen


def run(records: int, kills: int) -> dict[str, Any]:
    with tansu() as broker, tempfile.TemporaryDirectory(prefix="kvkill-") as tmp:
        topic = create_topic(broker.broker.bootstrap, f"kill-{int(time.time())}", 1, None)
        port, base = free_port(), free_port_range(200)
        journal = Path(tmp) / "quarantine"
        head = (
            f"listen: {{port: {port}, broker_port_base: {base}, max_brokers: 200}}\n"
            f"upstream: {{bootstrap_servers: ['{broker.broker.bootstrap}']}}\n"
            f"metrics: {{port: 0}}\nquarantine: {{dir: {journal}}}\n"
        )
        strict, relaxed = Path(tmp) / "strict.yaml", Path(tmp) / "relaxed.yaml"
        strict.write_text(head + "defaults: {policies: [batch_integrity, crc, json]}\n")
        relaxed.write_text(head + "defaults: {policies: [batch_integrity, crc]}\n")
        log = Path(tmp) / "kvproxy.log"
        proxy = serve(strict, port, log)
        delivered: collections.Counter[str] = collections.Counter()
        resend: list[Any] = []

        def report(err: Any, message: Any) -> None:
            delivered["ok" if err is None else err.name()] += 1
            if err is not None and err.code() == KafkaError._INVALID_DIFFERENT_RECORD:
                resend.append(message)  # innocent: the application sends it again (KIP-467)

        settings = {
            "bootstrap.servers": f"{HOST}:{port}",
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.num.messages": 20,
            "message.timeout.ms": 120_000,
        }
        producer = Producer(settings)
        # Sending is paced over about `records` / 4,000 seconds; a thread kills the proxy at even
        # intervals meanwhile (requests in flight) and starts it again on the same ports.
        pace_s = records / 4000
        state: dict[str, Any] = {"proxy": proxy, "kills": 0}

        def killer() -> None:
            for _ in range(kills):
                time.sleep(pace_s / (kills + 1))
                state["proxy"].send_signal(signal.SIGKILL)
                state["proxy"].wait()
                state["kills"] += 1
                state["proxy"] = serve(strict, port, log)

        thread = threading.Thread(target=killer)
        thread.start()
        for i in range(records):
            while True:
                try:
                    producer.produce(topic, value=value_of(i), key=b"k%d" % i, on_delivery=report)
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
            if i % 20 == 19:
                time.sleep(0.005)
        thread.join()
        proxy = state["proxy"]
        done_kills = state["kills"]
        left = producer.flush(180)
        while resend:
            # A fresh producer: after a refused batch librdkafka bumps the idempotent epoch on its
            # own, which Tansu answers PRODUCER_FENCED (a Kafka broker accepts it)
            producer = Producer(settings)
            again, resend[:] = list(resend), []
            for message in again:
                producer.produce(
                    topic, value=message.value(), key=message.key(), on_delivery=report
                )
            left = producer.flush(180)
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(30)
        replays = []
        for _ in range(2):
            done = subprocess.run(
                [sys.executable, "-m", "kvproxy.cli", "quarantine", "replay", "-c", str(relaxed),
                 "--topic", topic],
                check=False, cwd=ROOT, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            replays.append({"exit": done.returncode, "summary": done.stdout.splitlines()[-4:]})
        seen = stored_values(broker.broker.bootstrap, topic)
        expected = {value_of(i) for i in range(records)}
        refused = {value_of(i) for i in range(0, records, 10)}
        twice = sorted(v.decode() for v, n in seen.items() if n > 1)
        missing = sorted(v.decode() for v in expected if seen[v] == 0)
        return {
            "records": records,
            "kills": done_kills,
            "unflushed": left,
            "delivery_reports": dict(delivered),
            "stored_distinct": len(seen),
            "refused_stored_once": sum(1 for v in refused if seen[v] == 1),
            "refused": len(refused),
            "good_stored_once": sum(1 for v in expected - refused if seen[v] == 1),
            "good": len(expected - refused),
            "stored_twice": len(twice),
            "stored_twice_sample": twice[:10],
            "missing": len(missing),
            "missing_sample": missing[:10],
            "replays": replays,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--kills", type=int, default=3)
    args = parser.parse_args()
    started = time.monotonic()
    figures = run(args.records, args.kills)
    figures["elapsed_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(figures, indent=2))
    print(f"figures written to {write_results('replay_kill', figures)}")


if __name__ == "__main__":
    main()
