"""Receive memory held by slow senders: how long another client's large request waits.

A fresh Tansu broker and `kvproxy serve` from this file's checkout, default limits (512 MiB of
receive memory, 100 MiB frames, `request_timeout_ms` 30 s). The hostile client opens 6
connections whose size prefixes declare 100 MiB x 5 + 12 MiB, all of the receive memory, sends
100 bytes of each, then one byte per connection every `--interval` seconds (20 by default: never
quiet for 30 s, never done). Once the memory is full, the waiting client sends one Produce of a
100 KiB record (a large frame: it must reserve receive memory) and times its answer, up to
`--bound` seconds (90). The other client of `bench/hostile.py` (one small Produce at a time,
below 64 KiB, so it needs no receive memory) runs throughout.

Figures: the waiting client's wait (or "no answer" at the bound), how many hostile connections
the proxy closed and when, `kvproxy_connections_closed_total` by reason and
`kvproxy_receive_memory_waits_total` from /metrics, the other client's p99.

    .venv/bin/python -m bench.hostile_receive [--interval 20] [--bound 90] [--json out.json]
"""

from __future__ import annotations

import argparse
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

from bench import hostile
from bench._brokers import create_topic, tansu
from bench._hostile_inputs import OTHER_TOPIC, framed, produce_request, read_answer
from bench._hostile_watch import OtherClient, fetch_metrics
from bench._load import metrics_url, percentile
from bench._relays import start_proxy
from bench._results import ROOT, report
from kvproxy.protocol.records import build_batch

MiB = 1024 * 1024
DECLARED = (100 * MiB,) * 5 + (12 * MiB,)
"""The hostile size prefixes: 512 MiB together, the default `limits.receive_buffer_bytes`."""
WAITER_TOPIC = "receive-waiter"


class Trickler(threading.Thread):
    """Holds connections whose frames declare `DECLARED`, one byte each per `interval`; notes
    when the proxy closes each one."""

    def __init__(self, port: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.socks: list[socket.socket] = []
        for size in DECLARED:
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(struct.pack(">i", size) + b"x" * 100)
            sock.setblocking(False)
            self.socks.append(sock)
        self.closed_at: dict[int, float] = {}
        self.bytes_sent = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            for index, sock in enumerate(self.socks):
                if index in self.closed_at:
                    continue
                try:
                    sock.send(b"x")
                    self.bytes_sent += 1
                except OSError:
                    self.closed_at[index] = time.perf_counter()

    def poll_closed(self) -> None:
        """Notice the connections the proxy closed (a read returns end of file)."""
        for index, sock in enumerate(self.socks):
            if index in self.closed_at:
                continue
            try:
                if sock.recv(1) == b"":
                    self.closed_at[index] = time.perf_counter()
            except BlockingIOError:
                pass
            except OSError:
                self.closed_at[index] = time.perf_counter()

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
        for sock in self.socks:
            sock.close()


def _metric(text: str | None, name: str, label: str = "") -> float:
    for line in (text or "").splitlines():
        if line.startswith(name + label + " ") or (not label and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _wait_for_answer(
    sock: socket.socket, trickler: Trickler, deadline: float
) -> tuple[bytes | None, str]:
    data = bytearray()
    sock.setblocking(False)
    while time.perf_counter() < deadline:
        trickler.poll_closed()
        try:
            chunk = sock.recv(65536)
        except BlockingIOError:
            time.sleep(0.05)
            continue
        if not chunk:
            return None, "connection closed by the proxy"
        data += chunk
        if len(data) >= 4 and len(data) >= 4 + int.from_bytes(data[:4], "big"):
            return bytes(data[4:]), "answered"
    return None, "no answer"


def run(args: argparse.Namespace) -> dict[str, Any]:
    value = bytes(100 * 1024)
    request = framed(produce_request(WAITER_TOPIC, [build_batch([(b"k", value, None, None)])]), 7)
    with tansu() as server, start_proxy(server.broker.bootstrap) as proxy:
        create_topic(server.broker.bootstrap, OTHER_TOPIC, 1)
        create_topic(server.broker.bootstrap, WAITER_TOPIC, 1)
        url = metrics_url(proxy)
        other = OtherClient(proxy.port, args.bound + 30)
        other.start()
        trickler = Trickler(proxy.port, args.interval)
        deadline = time.perf_counter() + 10
        while _metric(fetch_metrics(url, 10), "kvproxy_receive_memory_bytes") < sum(DECLARED):
            if time.perf_counter() > deadline:
                raise RuntimeError("the hostile frames never reserved the receive memory")
            time.sleep(0.05)
        trickler.start()
        with socket.create_connection(("127.0.0.1", proxy.port)) as waiter:
            began = time.perf_counter()
            waiter.sendall(request)
            answer, said = _wait_for_answer(waiter, trickler, began + args.bound)
            waited = time.perf_counter() - began
        during = sorted(other.latencies(began, began + waited))
        metrics = fetch_metrics(url, 10)
        other.stop()
        trickler.poll_closed()
        trickler.stop()
    codes = ""
    if answer is not None:
        codes = read_answer(answer, 9, 7, WAITER_TOPIC, 1).said()
    return {
        "code": hostile.code_location(),
        "root": str(ROOT),
        "interval_s": args.interval,
        "bound_s": args.bound,
        "waiter": said,
        "waiter_answer": codes,
        "waiter_wait_s": round(waited, 2),
        "hostile_bytes_trickled": trickler.bytes_sent,
        "hostile_connections_closed": len(trickler.closed_at),
        "hostile_closed_after_s": sorted(round(t - began, 2) for t in trickler.closed_at.values()),
        "closed_frame_receive_timeout": _metric(
            metrics, "kvproxy_connections_closed_total", '{reason="frame_receive_timeout"}'
        ),
        "closed_slow_request": _metric(
            metrics, "kvproxy_connections_closed_total", '{reason="slow_request"}'
        ),
        "receive_memory_waits": _metric(metrics, "kvproxy_receive_memory_waits_total"),
        "other_requests": len(during),
        "other_p99_ms": round(percentile(during, 0.99) * 1e3, 1) if during else None,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=20.0)
    parser.add_argument("--bound", type=float, default=90.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    return report(run(args), args.json)


if __name__ == "__main__":
    main()
