"""The quarantine journal under a bad-CRC flood, and a refused batch sent again and again.

A fresh Tansu broker and `kvproxy serve` from this file's checkout (default checks, a journal in
a temporary folder, dead letters of the retry phase's topic to `<topic>.dlq`). Two phases:

- flood: `--connections` (default 4) connections each send, one after the other for `--seconds`
  (default 60), Produce v9 requests of 16 partitions of one 256 KiB batch with a bad CRC, every
  batch different (a counter in its value), so each refusal is a new journal entry.
  With `--dead-letter-flood` the flood's topic gets dead letters too.
- retry: one connection sends the same bad-CRC batch `--retries` times (default 10), as a
  client retrying CORRUPT_MESSAGE does.

Figures: the proxy's RSS before, its peak (VmHWM) and its RSS at the end of the flood; requests
and partitions refused; the proxy's log lines about the journal ("cannot keep up", "queue
full") and its rejection lines; for the retry phase the dead letters read back from the broker
and the journal entries holding that batch.

    .venv/bin/python -m bench.hostile_journal [--seconds 60] [--connections 4] [--queue-bytes N]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import hostile
from bench._brokers import create_topic, tansu
from bench._hostile_inputs import framed, produce_request
from bench._hostile_watch import proc_status
from bench._relays import start_proxy
from bench._results import ROOT, report
from kvproxy.protocol.journal import iter_entries
from kvproxy.protocol.records import build_batch
from tests.harness.produce import stored_batches
from tests.harness.socket_frames import read_frame

PARTITIONS = 16
PARTITION_BYTES = 256 * 1024
TOPIC = "journal-flood"
RETRY_TOPIC = "journal-retry"


def bad_crc_batch(tag: bytes, size: int) -> bytes:
    """One magic-2 batch of one record of about `size` bytes whose CRC does not match."""
    data = build_batch([(b"k", tag + bytes(size - len(tag)), None, None)])
    return data[:-1] + bytes([data[-1] ^ 0x01])


def flood(port: int, index: int, until: float, counts: list[int]) -> None:
    """Distinct 16-partition bad-CRC requests, one answered before the next, until `until`."""
    n = 0
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        while time.monotonic() < until:
            batches = [
                bad_crc_batch(f"{index}-{n}-{p}".encode(), PARTITION_BYTES)
                for p in range(PARTITIONS)
            ]
            sock.sendall(framed(produce_request(TOPIC, batches), n + 1))
            read_frame(sock)
            n += 1
    counts[index] = n


def journal_entries(directory: Path) -> list[tuple[dict[str, Any], bytes]]:
    found: list[tuple[dict[str, Any], bytes]] = []
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not path.name.startswith("."):
            for _, _, metadata, records in iter_entries(path.read_bytes()):
                found.append((dict(metadata), bytes(records)))
    return found


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kvbench-journal-") as tmp:
        journal_dir = Path(tmp) / "journal"
        extra = (
            f"quarantine: {{dir: '{journal_dir}', dead_letter_suffix: .dlq, "
            f"dead_letter_topics: [{RETRY_TOPIC}{', ' + TOPIC if args.dead_letter_flood else ''}]"
            + (f", queue_bytes: {args.queue_bytes}" if args.queue_bytes else "")
            + "}\n"
        )
        with tansu() as server:
            broker = server.broker
            create_topic(broker.bootstrap, TOPIC, PARTITIONS)
            create_topic(broker.bootstrap, TOPIC + ".dlq", PARTITIONS)
            create_topic(broker.bootstrap, RETRY_TOPIC, 1)
            create_topic(broker.bootstrap, RETRY_TOPIC + ".dlq", 1)
            with start_proxy(broker.bootstrap, extra_yaml=extra) as proxy:
                log_path = proxy.config_path.parent / "kvproxy.log"
                pid = proxy.process.pid
                idle = proc_status(pid)["VmRSS"]
                counts = [0] * args.connections
                until = time.monotonic() + args.seconds
                threads = [
                    threading.Thread(target=flood, args=(proxy.port, i, until, counts))
                    for i in range(args.connections)
                ]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(args.seconds + 120)
                status = proc_status(pid)
                flood_lines = log_path.read_text(errors="replace").splitlines()

                retried = bad_crc_batch(b"retried", 1024)
                with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as sock:
                    for n in range(args.retries):
                        payload = produce_request(RETRY_TOPIC, [retried], version=args.version)
                        sock.sendall(framed(payload, 10_000 + n))
                        read_frame(sock)
                time.sleep(3)  # dead letters are sent in the background
                all_lines = log_path.read_text(errors="replace").splitlines()
            dead = [
                r.value
                for b in stored_batches(broker, RETRY_TOPIC + ".dlq", 0)
                for r in b.records()
                if r.value == retried
            ]
        entries = journal_entries(journal_dir)
    retry_lines = all_lines[len(flood_lines) :]
    return {
        "code": hostile.code_location(),
        "root": str(ROOT),
        "connections": args.connections,
        "seconds": args.seconds,
        "queue_bytes": args.queue_bytes,
        "dead_letter_flood": args.dead_letter_flood,
        "requests": sum(counts),
        "partitions_refused": sum(counts) * PARTITIONS,
        "rss_idle_mib": round(idle / 2**20, 1),
        "rss_peak_mib": round(status["VmHWM"] / 2**20, 1),
        "rss_peak_above_idle_mib": round((status["VmHWM"] - idle) / 2**20, 1),
        "rss_end_mib": round(status["VmRSS"] / 2**20, 1),
        "journal_error_lines": sum(
            1 for line in flood_lines if "ERROR" in line and "quarantine journal" in line
        ),
        "journal_cannot_keep_up_lines": [
            line.split("cannot keep up: ", 1)[1][:60]
            for line in flood_lines
            if "cannot keep up" in line
        ][:8],
        "journal_lines_sample": [line for line in flood_lines if "quarantine journal" in line][:3],
        "retries": args.retries,
        "retry_produce_version": args.version,
        "retry_dead_letters": len(dead),
        "retry_journal_entries": sum(1 for _, records in entries if records == retried),
        "retry_marks": [m.get("attempts") for m, _ in entries if m.get("kind") == "repeated"],
        "retry_rejection_lines": sum(1 for line in retry_lines if f"{RETRY_TOPIC}-0" in line),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--retries", type=int, default=10)
    parser.add_argument("--version", type=int, default=3)
    parser.add_argument("--queue-bytes", type=int, help="quarantine.queue_bytes (newer code)")
    parser.add_argument(
        "--dead-letter-flood", action="store_true", help="the flood's topic gets dead letters too"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    return report(run(args), args.json)


if __name__ == "__main__":
    main()
