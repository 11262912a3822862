"""What the hostile benchmarks watch while a scenario runs: the proxy's memory (sampled every
10 ms), the other client (one small Produce at a time from another address, each timed) and the
event loop's lag as the proxy's metrics report it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
import urllib.request
from pathlib import Path

from bench._hostile_inputs import (
    KIB,
    OTHER_TOPIC,
    framed,
)
from bench._load import AnswerCheck, BenchmarkError, produce_payload

OTHER_HOST = "127.0.0.2"
"""The other client's source address: the size-prefix scenario takes all 1,000 connections
`limits.max_connections_per_client` allows one address."""

LAG_MAX = "kvproxy_event_loop_lag_max_seconds"

LAG_HISTOGRAM = "kvproxy_event_loop_lag_seconds"

SAMPLE_SECONDS = 0.01


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of `pid` in bytes (empty once it is gone)."""
    found: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                name, value = line.split(":", 1)
                found[name] = int(value.split()[0]) * KIB
    return found


class RssSampler(threading.Thread):
    """Samples VmRSS every 10 ms; SIGKILLs the process when it passes `guard` bytes."""

    def __init__(self, pid: int, guard: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.guard = guard
        self.peak = 0
        self.tripped = 0
        self.hwm = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            status = proc_status(self.pid)
            rss = status.get("VmRSS", 0)
            self.hwm = max(self.hwm, status.get("VmHWM", 0))
            self.peak = max(self.peak, rss)
            if rss > self.guard and not self.tripped:
                self.tripped = rss
                with contextlib.suppress(OSError):
                    os.kill(self.pid, signal.SIGKILL)
            self._halt.wait(SAMPLE_SECONDS)

    def rss(self) -> int:
        return proc_status(self.pid).get("VmRSS", 0)

    def stop(self) -> int:
        """Stop sampling; the peak: VmHWM while the process lives, else the sampled peak."""
        self._halt.set()
        self.join(5)
        self.hwm = max(self.hwm, proc_status(self.pid).get("VmHWM", 0))
        return max(self.hwm, self.peak)


class OtherClient(threading.Thread):
    """One small Produce (acks=1) at a time on its own connection; (sent, answered) per request."""

    def __init__(self, port: int, timeout: float) -> None:
        super().__init__(daemon=True)
        payload = produce_payload(OTHER_TOPIC, b"o" * 100, acks=1)
        self._payload = payload
        self._check = AnswerCheck(OTHER_TOPIC)
        self.sock = socket.socket()
        self.sock.bind((OTHER_HOST, 0))
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.times: list[tuple[float, float]] = []
        self.error = ""
        self.in_flight_since = 0.0
        self._halt = threading.Event()

    def run(self) -> None:
        correlation_id = 0
        try:
            while not self._halt.is_set():
                correlation_id += 1
                frame = framed(self._payload, correlation_id)
                self.in_flight_since = sent = time.perf_counter()
                self.sock.sendall(frame)
                head = self._read(4)
                answer = self._read(int.from_bytes(head, "big"))
                self.times.append((sent, time.perf_counter()))
                self.in_flight_since = 0.0
                self._check.offset(answer, correlation_id)
        except (OSError, BenchmarkError) as exc:
            if not self._halt.is_set():
                self.error = str(exc) or type(exc).__name__

    def _read(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise BenchmarkError("connection closed by the proxy")
            data += chunk
        return bytes(data)

    def stop(self) -> None:
        self._halt.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.join(10)
        self.sock.close()

    def latencies(self, start: float, end: float) -> list[float]:
        """Seconds of each request in flight at some time in [start, end], in order sent."""
        out = [done - sent for sent, done in self.times if done >= start and sent <= end]
        if self.in_flight_since and self.in_flight_since <= end:  # never answered
            out.append(time.perf_counter() - self.in_flight_since)
        return out


def fetch_metrics(url: str, timeout: float) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return str(answer.read().decode())
    except (OSError, ValueError):
        return None


def lag_figures(text: str | None) -> tuple[float | None, str | None]:
    """(the lag max gauge, the histogram's bound on the longest lag) when the proxy has them."""
    if text is None:
        return None, None
    gauge: float | None = None
    buckets: list[tuple[float, float]] = []
    count = 0.0
    for line in text.splitlines():
        if line.startswith(LAG_MAX + " "):
            gauge = float(line.split()[1])
        elif line.startswith(LAG_HISTOGRAM + "_bucket{"):
            bound_text = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(bound_text), float(line.split()[-1])))
        elif line.startswith(LAG_HISTOGRAM + "_count"):
            count = float(line.split()[-1])
    if not buckets or not count:
        return gauge, None
    buckets.sort()
    finite = [le for le, _ in buckets if le != float("inf")]
    for le, cumulative in buckets:
        if cumulative >= count:
            below = max((b for b in finite if b < le), default=0.0)
            bound = f"> {finite[-1]:g} s" if le == float("inf") else f"{below:g}-{le:g} s"
            return gauge, bound
    return gauge, None


class LagWatcher(threading.Thread):
    """Reads the loop-lag gauge every 2 s (it keeps only the last minute's longest)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.longest: float | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(2.0):
            self.note(fetch_metrics(self.url, 60))

    def note(self, text: str | None) -> str | None:
        gauge, _ = lag_figures(text)
        if gauge is not None:
            self.longest = max(self.longest or 0.0, gauge)
        return text

    def stop(self) -> None:
        self._halt.set()
        self.join(65)
