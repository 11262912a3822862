"""Hostile input: what one request can make `kvproxy serve` hold and how long it holds the loop.

Each scenario gets a fresh Tansu broker and a fresh `kvproxy serve` (default checks; the topic
`hostile-compacted` is declared `compacted: true`), so every peak belongs to one scenario. While
the hostile client sends its request, a second client ("the other client", its own connection
from 127.0.0.2) sends one small Produce at a time (one 100-byte record, acks=1) and times each
answer. The figures:

- proxy peak RSS: VmHWM of the serve process (`/proc/PID/status`), and how far above its idle
  RSS (read just before the hostile request) that is. VmRSS is also sampled every 10 ms: when it
  passes the memory guard (`--memory-guard-gib`, default 8) the proxy is killed with SIGKILL and
  the row says so.
- event loop blocked: the other client's longest wait during the hostile request (while the
  loop is held it answers nobody, so this is how long it was held, plus the broker's time), and
  `kvproxy_event_loop_lag_max_seconds` / `kvproxy_event_loop_lag_seconds` from /metrics when
  the proxy has them ("n/a" when it has not).
- the other client's p50 / p99 / max over the requests it had in flight during the hostile
  request (from the first byte sent to the last answer read), and its p50 before it.
- what the hostile client got: the error codes of the answer's partitions, or "connection
  closed", and the answer's size; "well formed" when every answer decodes, has the request's
  correlation id and names every partition sent.

Scenarios (`--scenarios` takes their names, comma-separated; all by default):

    zstd-5, zstd-20, zstd-60  N partitions, each one zstd batch of one record of 60 MiB of zeros
                              (about 2 KB compressed)
    gzip-bomb                 one partition, one gzip batch of 60 MiB of zeros (about 60 KB)
    compacted-null-key        60 partitions of 15,000 records of 4 KiB (zstd, keys key-0..,
                              the last key null) on a compacted topic, sent 3 times: once, then
                              twice back to back unless that would pass the memory guard
    snappy-1gib               one partition, one xerial snappy batch of 1,024 records of 1 MiB
                              of zeros (1 GiB, about 50 MB compressed)
    legacy-gzip               Produce v2, one magic 1 gzip wrapper of 2,000,000 inner messages
    bad-timestamps            one zstd batch of 999,999 records dated a day ahead
    size-prefixes             1,000 connections that each send only a size prefix of 50 MiB,
                              held for 5 s
    target                    the zstd-60 request 10 times back to back on one connection

Everything is bounded: each scenario has a timeout (`--timeout` overrides it), after which the
proxy is stopped; the memory guard kills it. `--smoke` runs every scenario at tiny sizes (a
check that the bench works, not a measurement).

    .venv/bin/python -m bench.hostile [--scenarios zstd-5,target] [--json out.json]
        [--memory-guard-gib 8] [--timeout SECONDS] [--smoke]

The proxy runs from this file's checkout (`python -m kvproxy.cli serve` in its root); the output
names the file its `kvproxy.proxy.serve.server` module is read from and the commit.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import socket
import struct
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench._brokers import create_topic, tansu
from bench._hostile_inputs import (
    FULL,
    GIB,
    MAX_ANSWER,
    MIB,
    OTHER_TOPIC,
    RULES,
    SMOKE,
    Answer,
    Sizes,
    read_answer,
)
from bench._hostile_report import print_row, table
from bench._hostile_scenarios import (
    SCENARIOS,
    Plan,
    Scenario,
    size_text,
)
from bench._hostile_watch import (
    LagWatcher,
    OtherClient,
    RssSampler,
    fetch_metrics,
    lag_figures,
    proc_status,
)
from bench._load import BenchmarkError, metrics_url, percentile
from bench._relays import start_proxy
from bench._results import ROOT, machine, write_results
from bench.connections import raise_fd_limit

# ---- running one ----


@dataclass
class Outcome:
    """What the hostile client saw."""

    payloads: list[bytes] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    sent: int = 0
    expected: int = 0
    closed: bool = False
    timed_out: bool = False
    summary: str = ""
    notes: list[str] = field(default_factory=list)

    def got(self) -> str:
        if not self.expected:
            return self.summary
        said = collections.Counter(answer.said() for answer in self.answers)
        text = "; ".join((f"{n} answers: " if n > 1 else "") + what for what, n in said.items())
        if self.closed:
            text = (text + "; then " if text else "") + "connection closed"
        if self.timed_out:
            text = (text + "; then " if text else "") + "no answer before the timeout"
        if len(self.answers) < self.expected:
            text += f" ({len(self.answers)} of {self.expected} answered)"
        return text


class Hostile:
    """The hostile client's connection: frames out, answers in, each bounded by `deadline`."""

    def __init__(self, port: int, deadline: float) -> None:
        self.deadline = deadline
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = bytearray()

    def _time_left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("scenario timeout")
        return left

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            self.sock.settimeout(self._time_left())
            sent = self.sock.send(view[: 4 * MIB])
            view = view[sent:]

    def read_frame(self) -> bytes | None:
        """The next answer frame's payload, or None when the proxy closed the connection."""
        size = self._fill(4)
        if size is None:
            return None
        length = int.from_bytes(self._buffer[:4], "big", signed=True)
        if length < 0 or length > MAX_ANSWER:
            raise BenchmarkError(f"answer size prefix {length}")
        if self._fill(4 + length) is None:
            return None
        payload = bytes(self._buffer[4 : 4 + length])
        del self._buffer[: 4 + length]
        return payload

    def _fill(self, size: int) -> int | None:
        while len(self._buffer) < size:
            self.sock.settimeout(self._time_left())
            try:
                chunk = self.sock.recv(max(65536, min(size - len(self._buffer), 16 * MIB)))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            self._buffer += chunk
        return size

    def close(self) -> None:
        self.sock.close()


def exchange(
    plan: Plan, port: int, deadline: float, outcome: Outcome, *, sampler: RssSampler, idle: int
) -> None:
    """Send the plan's frames and read an answer for each (acks=1 answers every one)."""
    outcome.expected = len(plan.frames)
    hostile = Hostile(port, deadline)
    try:
        batches = [plan.frames[:1], plan.frames[1:]] if plan.first_alone else [plan.frames]
        for index, frames in enumerate(batches):
            if not frames:
                continue
            if index and plan.first_alone:
                status = proc_status(sampler.pid)
                grown = status.get("VmHWM", 0) - idle
                would = status.get("VmRSS", 0) + grown * len(frames)
                if would > sampler.guard:
                    outcome.notes.append(
                        f"sent once only: the first took the proxy {size_text(grown)} above idle "
                        f"and left it at {size_text(status.get('VmRSS', 0))}; {len(frames)} more "
                        f"could reach {size_text(would)}, past the {size_text(sampler.guard)} "
                        "memory guard"
                    )
                    outcome.expected = 1
                    break
            for frame in frames:
                hostile.send(frame)
                outcome.sent += len(frame)
            for _ in frames:
                payload = hostile.read_frame()
                if payload is None:
                    outcome.closed = True
                    return
                outcome.payloads.append(payload)  # decoded once the window is over
    except TimeoutError:
        outcome.timed_out = True
    except (BrokenPipeError, ConnectionResetError):
        outcome.closed = True
    except BenchmarkError as exc:  # an answer no client could read
        outcome.closed = True
        outcome.notes.append(f"unreadable answer: {exc}")
    finally:
        hostile.close()


def size_prefixes(plan: Plan, port: int, deadline: float, outcome: Outcome) -> None:
    """Open the connections, send each a bare size prefix, hold them, count those closed."""
    sockets: list[socket.socket] = []
    prefix = struct.pack(">i", plan.prefix_size)
    try:
        for _ in range(plan.prefixes):
            if time.monotonic() > deadline:
                outcome.timed_out = True
                break
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sockets.append(sock)
            sock.sendall(prefix)
            outcome.sent += len(prefix)
        time.sleep(max(0.0, min(plan.hold, deadline - time.monotonic())))
        closed = 0
        for sock in sockets:
            sock.setblocking(False)
            try:
                closed += sock.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        outcome.summary = (
            f"{len(sockets) - closed:,} of {len(sockets):,} connections open after "
            f"{plan.hold:g} s, none answered"
        )
    except OSError as exc:
        outcome.summary = f"{len(sockets):,} connections opened, then {exc}"
    finally:
        for sock in sockets:
            sock.close()


def code_location() -> dict[str, str]:
    """Where the proxy's code comes from (the serve command runs in ROOT) and its commit."""
    found = subprocess.run(
        [sys.executable, "-c", "import kvproxy.proxy.serve.server as s; print(s.__file__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    changed = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--", "kvproxy"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {"proxy_module": found, "commit": commit + (" + uncommitted changes" if changed else "")}


def proxy_log_lines(path: Path, start: int) -> list[str]:
    """The proxy's log lines from byte `start` on that say why it closed a connection or what
    went wrong (rejections are left out: the answer's codes say those), shortened."""
    with contextlib.suppress(OSError), path.open("rb") as log:
        log.seek(start)
        text = log.read().decode(errors="replace")
        keep = [
            line.split(" ", 2)[-1]
            for line in text.splitlines()
            if "closing connection" in line or " ERROR " in line or " CRITICAL " in line
        ]
        return [line if len(line) <= 240 else line[:237] + "..." for line in keep]
    return []


@contextlib.contextmanager
def watching(pid: int, guard: int) -> Iterator[RssSampler]:
    sampler = RssSampler(pid, guard)
    sampler.start()
    try:
        yield sampler
    finally:
        sampler.stop()


def run_scenario(
    scenario: Scenario, sizes: Sizes, guard: int, timeout: float | None
) -> dict[str, Any]:
    """One scenario on a fresh broker and proxy; its figures."""
    limit = timeout if timeout is not None else scenario.timeout * sizes.timeout_scale
    plan = scenario.plan(sizes)
    print(f"\n== {scenario.name}: {plan.request} (timeout {limit:g} s)", flush=True)
    outcome = Outcome()
    row: dict[str, Any] = {"scenario": scenario.name, "request": plan.request}
    with tansu() as server, start_proxy(server.broker.bootstrap, rules=RULES) as proxy:
        broker = server.broker.bootstrap
        create_topic(broker, OTHER_TOPIC, 1)
        create_topic(broker, plan.topic, plan.partitions)
        assert server.proc is not None
        tansu_process = psutil.Process(server.proc.pid)
        url = metrics_url(proxy)
        log_path = proxy.config_path.parent / "kvproxy.log"
        pid = proxy.process.pid
        other = OtherClient(proxy.port, limit + 60)
        lag = LagWatcher(url)
        with watching(pid, guard) as sampler:
            other.start()
            time.sleep(1.0)  # warm-up: connections made, the other client's first answers
            started_at = time.perf_counter()
            before = other.latencies(0.0, started_at)[5:]
            has_lag = lag_figures(lag.note(fetch_metrics(url, 10))) != (None, None)
            if has_lag:
                lag.start()
            idle = sampler.rss()
            log_start = log_path.stat().st_size
            tansu_cpu = sum(tansu_process.cpu_times()[:2])
            deadline = time.monotonic() + limit
            began = time.perf_counter()
            if plan.prefixes:
                size_prefixes(plan, proxy.port, deadline, outcome)
            else:
                exchange(plan, proxy.port, deadline, outcome, sampler=sampler, idle=idle)
            ended = time.perf_counter()
            tansu_cpu = sum(tansu_process.cpu_times()[:2]) - tansu_cpu
            during = other.latencies(began, ended)
            alive = proxy.process.poll() is None
            final = fetch_metrics(url, 60) if alive and not outcome.timed_out else None
            if has_lag:
                lag.stop()
                lag.note(final)
            other.stop()
            outcome.answers = [
                read_answer(payload, plan.version, number, plan.topic, plan.partitions)
                for number, payload in enumerate(outcome.payloads, 1)
            ]
            outcome.payloads.clear()
            if outcome.timed_out:  # still busy: do not wait for it to drain
                proxy.process.kill()
        peak = sampler.hwm if sampler.hwm else sampler.peak
        logged = proxy_log_lines(log_path, log_start)
        outcome.notes += [f"proxy log: {line}" for line in logged[:3]]
        if sampler.tripped:
            outcome.notes.append(
                f"the memory guard killed the proxy at {size_text(sampler.tripped)} RSS"
            )
        elif not alive:
            outcome.notes.append(f"the proxy exited (code {proxy.process.returncode})")
        if other.error:
            outcome.notes.append(f"other client: {other.error}")
        _, bound = lag_figures(final)
        ordered = sorted(during)
        row.update(
            {
                "request_bytes": outcome.sent,
                "idle_rss": idle,
                "peak_rss": peak,
                "peak_above_idle": peak - idle,
                "memory_guard_tripped_at": sampler.tripped or None,
                "seconds": ended - began,
                "other_client": {
                    "requests": len(during),
                    "p50_ms": percentile(ordered, 0.5) * 1e3,
                    "p99_ms": percentile(ordered, 0.99) * 1e3,
                    "max_ms": (ordered[-1] if ordered else float("nan")) * 1e3,
                    "p50_before_ms": percentile(sorted(before), 0.5) * 1e3,
                    "error": other.error or None,
                },
                "loop_lag_max_s": lag.longest,
                "loop_lag_histogram": bound,
                "tansu_cpu_seconds": tansu_cpu,
                "got": outcome.got(),
                "answers": [asdict(answer) for answer in outcome.answers],
                "answered": len(outcome.answers),
                "expected_answers": outcome.expected,
                "well_formed": bool(outcome.answers)
                and len(outcome.answers) == outcome.expected
                and all(answer.well_formed for answer in outcome.answers),
                "notes": outcome.notes,
            }
        )
    print_row(row)
    return row


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = [s.name for s in SCENARIOS]
    parser.add_argument("--scenarios", default=",".join(names), help="comma-separated names")
    parser.add_argument("--json", type=Path, help="write every figure here too")
    parser.add_argument("--memory-guard-gib", type=float, default=8.0)
    parser.add_argument("--timeout", type=float, help="seconds per scenario (default: its own)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the bench runs")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.scenarios.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        parser.error(f"unknown scenarios {unknown}; known: {', '.join(names)}")
    sizes = SMOKE if args.smoke else FULL
    guard = int(args.memory_guard_gib * GIB)
    raise_fd_limit()
    where = code_location()
    host = machine()
    print(
        f"hostile input against {where['proxy_module']} (commit {where['commit']}); "
        f"memory guard {size_text(guard)}; load average {host['load_average']}"
        + ("; --smoke" if args.smoke else ""),
        flush=True,
    )
    began = time.monotonic()
    rows: list[dict[str, Any]] = []
    failed: list[str] = []
    for scenario in SCENARIOS:
        if scenario.name in chosen:
            try:
                rows.append(run_scenario(scenario, sizes, guard, args.timeout))
            except Exception as exc:  # the other scenarios still run and report
                traceback.print_exc()
                failed.append(f"- {scenario.name}: the bench failed: {exc!r}")
    report = "\n".join([table(rows), *failed])
    print("\n" + report)
    print(f"\ntook {time.monotonic() - began:.0f} s")
    figures = {
        "code": where,
        "memory_guard_bytes": guard,
        "smoke": args.smoke,
        "sizes": asdict(sizes),
        "rows": rows,
        "table": report,
    }
    write_results("hostile", figures)
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": host, **figures}, indent=2))
    if failed:
        raise SystemExit(1)
    return rows


if __name__ == "__main__":
    main()
