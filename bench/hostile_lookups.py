"""Schema lookups under a slow registry: how long one client's uncached id waits while another
client's ids keep the registry busy, and how long that other client waits.

A fresh Tansu broker and `kvproxy serve` from this file's checkout, and the test registry
(`tests/harness/schema_registry.TestRegistry`) whose gates hold the requests about the hostile
client's ids for `--registry-delay` seconds (each id's gate opens that long after its first
request). The hostile client B sends one Produce request whose 64 records carry 64 ids nobody
registered; half a second later client A, on its own connection, sends one record with a valid
id the proxy has not looked up yet. The figures: A's wait and B's wait (first byte sent to the
answer read), and the error codes each got.

    .venv/bin/python -m bench.hostile_lookups [--registry-delay 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

from bench._brokers import create_topic, tansu
from bench._hostile_inputs import framed, produce_request
from bench._relays import start_proxy
from kvproxy.protocol.messages import PRODUCE, decode_response
from kvproxy.protocol.records import build_batch
from tests.harness.schema_registry import TestRegistry
from tests.harness.socket_frames import read_frame

HOSTILE_TOPIC = "lookups-hostile"
INNOCENT_TOPIC = "lookups-innocent"
HOSTILE_IDS = range(5_000, 5_064)
ORDER_AVRO = json.dumps(
    {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "string"}]}
)
REQUEST_TIMEOUT = 600.0


def _value(schema_id: int) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + b"\x02a"


def _send(port: int, frame: bytes, out: dict[str, Any], name: str) -> None:
    began = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=REQUEST_TIMEOUT) as sock:
        sock.sendall(frame)
        answer = read_frame(sock)
    seconds = time.perf_counter() - began
    body = decode_response(answer, PRODUCE, 9).body
    codes = sorted({int(p.error_code) for t in body.responses for p in t.partition_responses})
    out[name] = {"seconds": round(seconds, 3), "error_codes": codes}


def _open_gates_later(registry: TestRegistry, delay: float, stop: threading.Event) -> None:
    """Each hostile id's gate opens `delay` s after the registry first saw a request for it."""
    first_seen: dict[int, float] = {}
    while not stop.is_set():
        now = time.monotonic()
        for schema_id in HOSTILE_IDS:
            if schema_id not in first_seen and registry.count(f"/schemas/ids/{schema_id}"):
                first_seen[schema_id] = now
            if schema_id in first_seen and now - first_seen[schema_id] >= delay:
                registry.gate(schema_id).set()
        stop.wait(0.05)


def run(delay: float) -> dict[str, Any]:
    out: dict[str, Any] = {"registry_delay_s": delay}
    with TestRegistry() as registry:
        innocent_id = registry.register(f"{INNOCENT_TOPIC}-value", ORDER_AVRO)
        for schema_id in HOSTILE_IDS:
            registry.gate(schema_id)
        stop = threading.Event()
        opener = threading.Thread(target=_open_gates_later, args=(registry, delay, stop))
        opener.start()
        rules = "topics:\n" + "".join(
            f'  - match: "{topic}"\n    default_policies: drop\n'
            "    policies: [crc, {schema: {value: required}}]\n"
            for topic in (HOSTILE_TOPIC, INNOCENT_TOPIC)
        )
        extra = f"schema_registry: {{url: '{registry.url}', timeout_ms: 600000}}\n"
        hostile_frame = framed(
            produce_request(
                HOSTILE_TOPIC, [build_batch([(b"k", _value(i), None, None) for i in HOSTILE_IDS])]
            ),
            1,
        )
        innocent_frame = framed(
            produce_request(
                INNOCENT_TOPIC, [build_batch([(b"k", _value(innocent_id), None, None)])]
            ),
            2,
        )
        try:
            with (
                tansu() as server,
                start_proxy(server.broker.bootstrap, rules=rules, extra_yaml=extra) as proxy,
            ):
                create_topic(server.broker.bootstrap, HOSTILE_TOPIC, 1)
                create_topic(server.broker.bootstrap, INNOCENT_TOPIC, 1)
                b = threading.Thread(target=_send, args=(proxy.port, hostile_frame, out, "B"))
                b.start()
                time.sleep(0.5)
                _send(proxy.port, innocent_frame, out, "A")
                b.join(REQUEST_TIMEOUT)
        finally:
            stop.set()
            opener.join()
            for schema_id in HOSTILE_IDS:
                registry.gate(schema_id).set()
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry-delay", type=float, default=10.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    figures = run(args.registry_delay)
    print(json.dumps(figures, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()
