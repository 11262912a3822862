"""The clients of the latency benchmark (bench/latency.py): a librdkafka producer fed on a fixed
schedule, one-at-a-time Produce round trips on the raw client, and their percentiles in ms."""

from __future__ import annotations

import json
import socket
import threading
import time
from array import array
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from bench._load import AnswerCheck, BenchmarkError, ProduceTemplate, leader_address, percentile

PERCENTILES = {"p50": 0.50, "p99": 0.99, "p99.9": 0.999}


class PacedProducer:
    """A librdkafka producer fed on a fixed schedule; latencies from produce() to delivery."""

    def __init__(self, bootstrap: str, topic: str, record_bytes: int) -> None:
        self.topic = topic
        self.value = b"v" * record_bytes
        self.stats: dict[str, Any] = {}
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 0,
                "max.in.flight.requests.per.connection": 5,
                "statistics.interval.ms": 500,
                "stats_cb": self._on_stats,
            }
        )
        self.delivered = 0
        self.errors: list[str] = []
        self._sent_at = array("d")
        self._received_at = array("d")
        self._offsets = array("q")
        self._next_offset = 0
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        """Serve delivery reports as they arrive (poll releases the GIL while it waits)."""
        while not self._stop.is_set():
            self.producer.poll(0.1)

    def _on_stats(self, text: str) -> None:
        self.stats = json.loads(text)

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        now = time.perf_counter()
        if error is not None:
            self.errors.append(str(error))
            return
        self.delivered += 1
        seq = int(message.key() or b"-1")
        self._received_at[seq] = now
        self._offsets[seq] = message.offset() or 0

    def close(self) -> None:
        self._stop.set()
        self._poller.join(5)
        self.producer.flush(10)
        self.producer.close()  # now, while the broker and the proxy still run

    def produce_requests(self) -> tuple[int, int]:
        """(records sent, Produce requests sent) so far, from librdkafka's statistics."""
        time.sleep(0.6)  # one more statistics interval after the last request
        requests = sum(b.get("req", {}).get("Produce", 0) for b in self.stats["brokers"].values())
        return int(self.stats["txmsgs"]), int(requests)

    def paced(self, rate: float, seconds: float, warmup: float) -> dict[str, Any]:
        """Produce for `warmup` + `seconds` at `rate`; latencies of the records after warm-up."""
        interval = 1.0 / rate
        total = round(rate * (warmup + seconds))
        first_measured = round(rate * warmup)
        self._sent_at = sent_at = array("d", bytes(8 * total))
        self._received_at = array("d", bytes(8 * total))
        self._offsets = array("q", bytes(8 * total))
        due = array("d", bytes(8 * total))
        produce, topic, value, on_delivery = (
            self.producer.produce,
            self.topic,
            self.value,
            self._on_delivery,
        )
        delivered_before = self.delivered
        start = time.perf_counter() + 0.001
        sent = 0
        while sent < total:
            now = time.perf_counter()
            while sent < total and start + sent * interval <= now:
                due[sent] = start + sent * interval
                sent_at[sent] = time.perf_counter()
                produce(topic, value, b"%d" % sent, partition=0, on_delivery=on_delivery)
                sent += 1
            wait = start + sent * interval - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        left = self.producer.flush(60)
        if left or self.errors or self.delivered - delivered_before != total:
            raise BenchmarkError(
                f"{self.topic}: {self.delivered - delivered_before} of {total} delivered, "
                f"{left} left; errors: {self.errors[:5]}"
            )
        first = self._next_offset
        if sorted(self._offsets) != list(range(first, first + total)):
            raise BenchmarkError(f"{self.topic}: the acknowledged offsets are not consecutive")
        self._next_offset += total
        received = self._received_at
        latencies = [received[i] - sent_at[i] for i in range(first_measured, total)]
        lags = sorted(sent_at[i] - due[i] for i in range(first_measured, total))
        measured = total - first_measured
        span = sent_at[total - 1] - sent_at[first_measured]
        return {
            "latencies": latencies,
            "records": measured,
            "achieved_rate": (measured - 1) / span if span > 0 else float("nan"),
            "send_lag_p50_ms": percentile(lags, 0.5) * 1e3,
            "send_lag_p99_ms": percentile(lags, 0.99) * 1e3,
        }


def round_trips(bootstrap: str, topic: str, count: int, skip: int = 200) -> list[float]:
    """Seconds from sending one Produce request to reading its answer, one at a time."""
    template = ProduceTemplate(topic, b"r" * 1024)
    check = AnswerCheck(topic)
    out: list[float] = []
    with socket.create_connection(leader_address(bootstrap, topic), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for correlation_id in range(count + skip):
            frame = template.frame(correlation_id)
            started = time.perf_counter()
            sock.sendall(frame)
            size = int.from_bytes(sock.recv(4, socket.MSG_WAITALL), "big")
            payload = sock.recv(size, socket.MSG_WAITALL)
            elapsed = time.perf_counter() - started
            if len(payload) != size:
                raise BenchmarkError("connection closed inside an answer")
            check.offset(payload, correlation_id)
            if correlation_id >= skip:
                out.append(elapsed)
    return out


def percentiles_ms(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {name: percentile(ordered, q) * 1e3 for name, q in PERCENTILES.items()}
