"""Small requests at fixed rates: Kafka's `kafka-producer-perf-test` direct, through HAProxy in
TCP mode, through the uvloop relay and through kvproxy, alternating (benchmark 8, the
small-request goals).

`org.apache.kafka.tools.ProducerPerformance` of Apache Kafka 4.4.0 (the Java client) sends
`--record-size` bytes (100) at `--throughput` records/s for `--seconds` to a fresh one-partition
topic, with `linger.ms=0` and `acks=1`. The tool paces itself by sleeping 2 ms or more at a time
(its ThroughputThrottler), so records leave in bursts and share requests: about seven a request at
5k/s, 27 at 20k/s (kvproxy counts its Produce requests: `requests/record`). CPU is given per
record, as the tool counts, and for kvproxy per request too. Each rate runs `--rounds` rounds of
the four sides, in turn (direct, HAProxy, the uvloop relay, kvproxy), each run a new JVM; one
unmeasured run per side and rate first. The broker is one Apache Kafka 4.4.0 node; HAProxy and
kvproxy stand in front of it, each named alone in the Metadata clients get through it
(`bench/_brokers.py`); the uvloop relay (`bench/uvloop_relay.py`, a Python relay on uvloop that
reads nothing) is the floor of a Python proxy: what kvproxy costs above it is its own work.

A run counts only when the tool exits 0, sent every record, printed no exception, the broker
holds them all, and (kvproxy) the proxy accepted exactly that many. Per run: the tool's own
latencies (send() to acknowledgement: avg, and p50 / p99 in whole milliseconds, as it prints
them), the relay's user + system CPU per record (HAProxy's process, kvproxy's), and for kvproxy
the Produce requests it counted per record (1.00 when every record was a request of its own).

The goals, read from the medians of one run: kvproxy's CPU per record at most 2x HAProxy's;
p50 at most HAProxy's + 0.2 ms and p99 at most HAProxy's + 2 ms. The tool's percentiles are
whole milliseconds: a p50 goal of 0.2 ms is shown by the average (a fraction of a millisecond)
beside them.

    .venv/bin/python -m bench.perf_rates [--rates 5000 20000] [--seconds 10] [--rounds 5]
        [--record-size 100] [--quick] [--profile DIR]

`--profile DIR` samples kvproxy with py-spy (the GIL-holding stacks, 250 a second) during each
of its measured runs into DIR and prints the first round's heaviest frames per rate.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from bench._brokers import BrokerUnderTest, floor_settings, upstream
from bench._load import BenchmarkError, check_stored, metric, metrics_url
from bench._profiles import profile_lines, sampling
from bench._relays import ProxyProcess, RelayProcess, start_proxy
from bench._results import median, write_results
from bench.producer_perf import MAIN_CLASS, checked_summary, perf_command
from tests.harness.kafka_broker import KAFKA_4

SIDES = ("direct", "haproxy", "uvloop", "proxy")
PROPERTIES = ("acks=1", "linger.ms=0")
TOOL_TIMEOUT_MARGIN = 120.0
"""Seconds a run may take beyond its records / rate (the JVM's start, the last answers)."""
CPU_GOAL = 2.0
P50_GOAL_MS = 0.2
P99_GOAL_MS = 2.0


@dataclass(frozen=True)
class RateRun:
    """One checked run of the tool at a fixed rate, on one side."""

    side: str
    rate: int
    round: int
    records: int
    records_per_s: float
    avg_ms: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    relay_cpu_us_per_record: float | None
    """The relay's CPU per record (None direct: no relay)."""
    requests_per_record: float | None
    """kvproxy's counted Produce requests per record (None on the other sides)."""
    relay_system_share: float | None = None
    """The share of the relay's CPU spent in the kernel (system time: its socket calls)."""
    compiled_share: float | None = None
    """kvproxy: the share of its Produce requests the compiled fast accept decided."""


def _relay(side: str, broker: BrokerUnderTest, proxy: ProxyProcess) -> RelayProcess | None:
    if side == "proxy":
        return proxy
    if side == "haproxy":
        if broker.floor is None:
            raise BenchmarkError("HAProxy is not running in front of the broker")
        return broker.floor
    if side == "uvloop":
        if broker.uvloop_relay is None:
            raise BenchmarkError("the uvloop relay is not running in front of the broker")
        return broker.uvloop_relay
    return None


def rate_run(
    side: str,
    broker: BrokerUnderTest,
    proxy: ProxyProcess,
    *,
    rate: int,
    records: int,
    record_size: int,
    rnd: int,
    profile: Path | None = None,
) -> RateRun:
    """One run of the tool at `rate` records/s to a fresh topic, checked end to end (kvproxy
    sampled by py-spy into `profile` when given)."""
    relay = _relay(side, broker, proxy)
    topic = broker.create_topic(f"rate-{side}-{rate}-r{rnd}-{uuid.uuid4().hex[:8]}")
    url = metrics_url(proxy)
    before = {name: metric(url, name, labels) for name, labels in _COUNTED}
    split0 = _cpu_split(relay)
    command = perf_command(
        relay.bootstrap if relay is not None else broker.bootstrap,
        topic,
        records,
        record_size,
        PROPERTIES,
        throughput=rate,
    )
    with contextlib.ExitStack() as stack:
        if profile is not None and side == "proxy":
            stack.enter_context(sampling(proxy.process.pid, profile))
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=records / rate + TOOL_TIMEOUT_MARGIN,
            check=False,
        )
    user, system = (now - then for now, then in zip(_cpu_split(relay), split0, strict=True))
    cpu = user + system
    summary = checked_summary(done, records, f"{side} {rate}/s r{rnd}")
    check_stored(broker.bootstrap, topic, records)
    counted = {name: metric(url, name, labels) - before[name] for name, labels in _COUNTED}
    accepted = counted["kvproxy_produce_records_total"]
    if accepted != (records if side == "proxy" else 0):
        raise BenchmarkError(f"{side} {rate}/s r{rnd}: the proxy accepted {accepted:.0f}")
    return RateRun(
        side=side,
        rate=rate,
        round=rnd,
        records=records,
        records_per_s=summary.records_per_s,
        avg_ms=summary.avg_ms,
        p50_ms=summary.p50_ms,
        p99_ms=summary.p99_ms,
        max_ms=summary.max_ms,
        relay_cpu_us_per_record=cpu / records * 1e6 if relay is not None else None,
        requests_per_record=(
            counted["kvproxy_requests_total"] / records if side == "proxy" else None
        ),
        relay_system_share=system / cpu if relay is not None and cpu else None,
        compiled_share=(
            counted["kvproxy_produce_decided_total"] / counted["kvproxy_requests_total"]
            if side == "proxy" and counted["kvproxy_requests_total"]
            else None
        ),
    )


def _cpu_split(relay: RelayProcess | None) -> tuple[float, float]:
    """User and system CPU seconds so far of `relay` and its children (0 for no relay)."""
    user = system = 0.0
    for proc in relay.processes() if relay is not None else []:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = proc.cpu_times()
            user, system = user + times.user, system + times.system
    return user, system


_COUNTED = (
    ("kvproxy_produce_records_total", {"outcome": "accepted"}),
    ("kvproxy_requests_total", {"api": "produce"}),
    ("kvproxy_produce_decided_total", {"path": "compiled"}),
)


_FIGURES = (
    "avg_ms",
    "p50_ms",
    "p99_ms",
    "relay_cpu_us_per_record",
    "requests_per_record",
    "relay_system_share",
    "compiled_share",
)


def summarize(runs: Sequence[RateRun]) -> dict[int, dict[str, Any]]:
    """Per rate: each side's medians, and kvproxy against HAProxy on the goals."""
    rates: dict[int, dict[str, Any]] = {}
    for rate in sorted({r.rate for r in runs}):
        sides: dict[str, dict[str, float | None]] = {}
        for side in SIDES:
            mine = [r for r in runs if r.rate == rate and r.side == side]
            if not mine:
                continue
            sides[side] = {key: _median_or_none(getattr(r, key) for r in mine) for key in _FIGURES}
        rates[rate] = {"sides": sides, "goals": goals(sides)}
    return rates


def _median_or_none(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return median(present) if present else None


def goals(sides: dict[str, dict[str, float | None]]) -> dict[str, Any]:
    """kvproxy against HAProxy: CPU ratio, p50 and p99 differences, and whether each goal holds."""
    proxy, floor = sides.get("proxy"), sides.get("haproxy")
    if proxy is None or floor is None:
        return {}
    cpu = _ratio(proxy["relay_cpu_us_per_record"], floor["relay_cpu_us_per_record"])
    figures: dict[str, Any] = {
        "cpu_ratio": cpu,
        "avg_added_ms": _difference(proxy["avg_ms"], floor["avg_ms"]),
        "p50_added_ms": _difference(proxy["p50_ms"], floor["p50_ms"]),
        "p99_added_ms": _difference(proxy["p99_ms"], floor["p99_ms"]),
    }
    for key, figure, goal in (
        ("cpu_met", "cpu_ratio", CPU_GOAL),
        ("p50_met", "p50_added_ms", P50_GOAL_MS),
        ("p99_met", "p99_added_ms", P99_GOAL_MS),
    ):
        figures[key] = figures[figure] is not None and figures[figure] <= goal
    return figures


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _difference(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def report(rates: dict[int, dict[str, Any]]) -> list[str]:
    """The printed table: per rate and side the medians, then kvproxy against HAProxy."""
    lines = [
        f"{'rate/s':>7} {'side':<8}{'avg ms':>8}{'p50':>6}{'p99':>6}"
        f"{'relay CPU us/record':>21}{'system':>8}{'requests/record':>17}{'CPU us/request':>16}"
        f"{'compiled':>10}"
    ]
    for rate, figures in rates.items():
        for side, s in figures["sides"].items():
            cpu, per = s["relay_cpu_us_per_record"], s["requests_per_record"]
            per_request = cpu / per if cpu is not None and per else None
            lines.append(
                f"{rate:>7} {side:<8}{s['avg_ms']:8.2f}{s['p50_ms']:6.0f}{s['p99_ms']:6.0f}"
                f"{format(cpu, '.1f') if cpu is not None else '-':>21}"
                f"{_share(s['relay_system_share']):>8}"
                f"{format(per, '.3f') if per is not None else '-':>17}"
                f"{format(per_request, '.0f') if per_request is not None else '-':>16}"
                f"{_share(s['compiled_share']):>10}"
            )
        g = figures["goals"]
        if g:
            lines.append(
                f"{rate:>7} kvproxy / HAProxy: CPU {_shown(g['cpu_ratio'], 'x')} (goal <= "
                f"{CPU_GOAL:g}x: {_met(g['cpu_met'])}), p50 {_shown(g['p50_added_ms'], ' ms')} "
                f"(<= +{P50_GOAL_MS:g}: {_met(g['p50_met'])}; avg "
                f"{_shown(g['avg_added_ms'], ' ms')}), p99 {_shown(g['p99_added_ms'], ' ms')} "
                f"(<= +{P99_GOAL_MS:g}: {_met(g['p99_met'])})"
            )
    return lines


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _shown(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}{unit}" if unit == "x" else f"{value:+.2f}{unit}"


def _met(met: bool) -> str:
    return "met" if met else "NOT MET"


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rates", type=int, nargs="+", default=[5000, 20000])
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of sending per run")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the four sides")
    parser.add_argument("--record-size", type=int, default=100, help="bytes per record")
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 s runs, 1 round")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="sample kvproxy with py-spy in each of its measured runs into DIR (folded stacks)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds = 3.0, 1
    return args


def _profile_path(folder: Path | None, side: str, rate: int, rnd: int) -> Path | None:
    if folder is None or side != "proxy":
        return None
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"kvproxy-{rate}-r{rnd}.txt"


def _measure(args: argparse.Namespace) -> tuple[list[RateRun], dict[str, Any]]:
    """Kafka with HAProxy and kvproxy in front; per rate a warm-up run of each side, then the
    rounds; the runs and the settings to record."""
    runs: list[RateRun] = []
    with (
        upstream("kafka", floor=True, uvloop_relay=True) as broker,
        start_proxy(broker.bootstrap) as proxy,
    ):
        print(
            f"perf rates: Kafka {KAFKA_4}'s ProducerPerformance, {args.record_size} B records "
            f"({' '.join(PROPERTIES)}) for {args.seconds:g} s at {args.rates} records/s, "
            f"{args.rounds} rounds of {' / '.join(SIDES)}",
            flush=True,
        )
        for rate in args.rates:
            records = max(int(rate * args.seconds), 1)
            options = {"rate": rate, "record_size": args.record_size}
            for side in SIDES:  # not measured: JIT, connections, the relays' first requests
                rate_run(side, broker, proxy, records=min(records, rate), rnd=0, **options)
            for rnd in range(1, args.rounds + 1):
                for side in SIDES:
                    profile = _profile_path(args.profile, side, rate, rnd)
                    run = rate_run(
                        side, broker, proxy, records=records, rnd=rnd, profile=profile, **options
                    )
                    runs.append(run)
                    print(
                        f"  {rate}/s round {rnd} {side:8} avg {run.avg_ms:.2f} ms, p50 "
                        f"{run.p50_ms:.0f}, p99 {run.p99_ms:.0f}, relay CPU "
                        f"{run.relay_cpu_us_per_record or 0:.1f} us/record",
                        flush=True,
                    )
        settings = {
            "tool": f"{MAIN_CLASS} (kafka-tools {KAFKA_4})",
            "producer_properties": list(PROPERTIES),
            "record_size": args.record_size,
            "rates": args.rates,
            "seconds": args.seconds,
            "rounds": args.rounds,
            "proxy": "kvproxy serve, default checks, 1 process",
            "floors": floor_settings(broker),
            "upstream_version": broker.version,
            "quick": args.quick,
        }
    return runs, settings


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _arguments(argv)
    began = time.monotonic()
    runs, settings = _measure(args)
    rates = summarize(runs)
    print()
    print("\n".join(report(rates)))
    if args.profile is not None:
        for rate in args.rates:
            print("\n".join(profile_lines(args.profile / f"kvproxy-{rate}-r1.txt")))
    print(f"took {time.monotonic() - began:.0f} s")
    results = {
        "settings": settings,
        "runs": [asdict(r) for r in runs],
        "summary": {str(rate): figures for rate, figures in rates.items()},
    }
    write_results("perf_rates", results)
    return results


if __name__ == "__main__":
    main()
