"""Kafka's own producer benchmark, `kafka-producer-perf-test`, direct to the broker and through
kvproxy in the same run (benchmark 7).

`org.apache.kafka.tools.ProducerPerformance` from Apache Kafka 4.4.0's kafka-tools jar (what
`kafka-producer-perf-test.sh` runs), with the Java client of the same version: `--records`
records of `--record-size` bytes (1 KiB, the payload the tool generates, no key) to a fresh
one-partition topic, `--throughput -1` (as fast as it goes), acks=all, linger.ms=5, everything
else the Java producer's defaults (idempotent, batch.size 16 KiB, 5 in flight, no compression).
Each run is a new JVM, as a user runs the tool; `direct` points it at the broker, `proxy` at a
`kvproxy serve` process with the default checks, started once before the rounds. One unmeasured
run per side warms the broker and the proxy up; then the sides alternate round by round.

The broker is Apache Kafka 4.4.0 (one KRaft node, the tests' harness), always: against Tansu 0.6
the Java producer's idempotent batches expired unanswered (120 s, direct, no proxy in the way),
so this benchmark has no `--upstream`. A run counts only when the tool exits 0, its summary line
says every record was sent, nothing it printed names an exception, the broker's high watermark
equals the records sent and, through the proxy, its
`kvproxy_produce_records_total{outcome="accepted"}` grew by exactly that many; otherwise the
benchmark fails.

How to read it: records/s and MB/s are the tool's own (its MB is 2^20 bytes); `ratio` divides
the proxy side's median by the direct side's, and "round ratios" each proxy run by the direct run
of its round. The latencies are the tool's, from send() to the acknowledgement: at
`--throughput -1` they are mostly time spent queued in the producer's 32 MiB buffer, so they
follow the rate (benchmark 3 measures added latency at a fixed rate). CPU s/GiB is user + system
CPU seconds during a run per GiB of record values: the proxy's, the broker's and the tool's JVM's
(the client; its start-up included).

    .venv/bin/python -m bench.producer_perf [--records 200000] [--rounds 4] [--record-size 1024]
        [--property KEY=VALUE ...] [--quick]
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench._brokers import BrokerUnderTest, upstream
from bench._load import BenchmarkError, check_stored, metric, metrics_url
from bench._relays import ProxyProcess, start_proxy
from bench._results import median, write_results
from tests.harness.kafka_broker import KAFKA_4, java_command

MAIN_CLASS = "org.apache.kafka.tools.ProducerPerformance"
PROPERTIES = ("acks=all", "linger.ms=5")
"""Producer settings given to every run (`--property` adds more)."""
WARM_UP_RECORDS = 50_000
TOOL_TIMEOUT = 300.0
JVM = ("-Xmx512m",)
SIDES = ("direct", "proxy")
LATENCIES = ("avg_ms", "p50_ms", "p95_ms", "p99_ms", "p999_ms", "max_ms")

_NUMBER = r"(?:\d+(?:\.\d+)?|NaN)"
SUMMARY = re.compile(
    rf"^(?P<records>\d+) (?P<steady>steady state )?records sent, "
    rf"(?P<records_per_s>{_NUMBER}) records/sec \((?P<mb_per_s>{_NUMBER}) MB/sec\), "
    rf"(?P<avg_ms>{_NUMBER}) ms avg latency, "
    rf"(?P<max_ms>{_NUMBER}) ms max latency, (?P<p50_ms>\d+) ms 50th, (?P<p95_ms>\d+) ms 95th, "
    rf"(?P<p99_ms>\d+) ms 99th, (?P<p999_ms>\d+) ms 99\.9th\.$"
)
"""ProducerPerformance's summary of the whole run (its progress lines every 5 s have no
percentiles); with `--warmup-records` a second one follows, of the steady state."""


@dataclass(frozen=True)
class PerfSummary:
    """What ProducerPerformance's summary line says (MB is its 2^20 bytes)."""

    records: int
    records_per_s: float
    mb_per_s: float
    avg_ms: float
    max_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    p999_ms: float


def parse_summary(output: str, *, steady_state: bool = False) -> PerfSummary:
    """The summary of a ProducerPerformance run from what it printed: of the whole run, or of
    the records after `--warmup-records` (`steady_state`).

    Raises ValueError when there is none (the tool failed before it finished)."""
    found = [SUMMARY.match(line.strip()) for line in output.splitlines()]
    matches = [m for m in found if m is not None and bool(m["steady"]) == steady_state]
    if not matches:
        kind = "steady-state summary" if steady_state else "summary"
        raise ValueError(f"no ProducerPerformance {kind} line in its output")
    fields = matches[-1].groupdict()
    del fields["steady"]
    return PerfSummary(
        records=int(fields.pop("records")), **{k: float(v) for k, v in fields.items()}
    )


def tool_errors(output: str) -> list[str]:
    """Lines of the tool's output that report a failure (a send's exception, an ERROR log)."""
    return [
        line
        for line in output.splitlines()
        if "Exception" in line or " ERROR " in line or line.startswith("Error")
    ]


def checked_summary(done: subprocess.CompletedProcess[str], records: int, run: str) -> PerfSummary:
    """The summary of a finished run of the tool, which must have exited 0, printed no failure
    and sent all `records`; `BenchmarkError` naming `run` otherwise."""
    output = done.stdout + done.stderr
    errors = tool_errors(output)
    if done.returncode != 0 or errors:
        raise BenchmarkError(
            f"{run}: ProducerPerformance exited {done.returncode}; {errors[:5] or output[-2000:]}"
        )
    summary = parse_summary(output)
    if summary.records != records:
        raise BenchmarkError(f"{run}: the tool sent {summary.records} of {records}")
    return summary


def perf_command(
    bootstrap: str,
    topic: str,
    records: int,
    record_size: int,
    properties: Sequence[str],
    *,
    throughput: int = -1,
) -> list[str]:
    """The `kafka-producer-perf-test` command line, as `java` with kafka-tools' classpath
    (`throughput` records/s at most; -1: as fast as it goes)."""
    return java_command(
        KAFKA_4,
        MAIN_CLASS,
        "--topic",
        topic,
        "--num-records",
        str(records),
        "--record-size",
        str(record_size),
        "--throughput",
        str(throughput),
        "--bootstrap-server",
        bootstrap,
        "--command-property",
        *properties,
        jvm=JVM,
    )


@dataclass(frozen=True)
class PerfRun(PerfSummary):
    """One checked run of the tool, with the CPU the proxy, the broker and the tool spent."""

    side: str
    round: int
    topic: str
    wall_seconds: float
    proxy_cpu_s_per_gib: float | None
    broker_cpu_s_per_gib: float
    client_cpu_s_per_gib: float


def _children_cpu() -> float:
    """CPU seconds of this process's finished children (the tool's JVM once it has exited)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def perf_run(
    side: str,
    broker: BrokerUnderTest,
    proxy: ProxyProcess,
    *,
    records: int,
    record_size: int,
    properties: Sequence[str],
    rnd: int,
) -> PerfRun:
    """One run of the tool to a fresh topic, direct or through the proxy, checked end to end."""
    topic = broker.create_topic(f"perf-{side}-r{rnd}-{uuid.uuid4().hex[:8]}")
    bootstrap = proxy.bootstrap if side == "proxy" else broker.bootstrap
    url = metrics_url(proxy)
    accepted0 = metric(url, "kvproxy_produce_records_total", {"outcome": "accepted"})
    proxy0, broker0, client0 = proxy.cpu_seconds(), broker.cpu_seconds(), _children_cpu()
    started = time.perf_counter()
    done = subprocess.run(
        perf_command(bootstrap, topic, records, record_size, properties),
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT,
        check=False,
    )
    wall = time.perf_counter() - started
    proxy_cpu = proxy.cpu_seconds() - proxy0
    broker_cpu, client_cpu = broker.cpu_seconds() - broker0, _children_cpu() - client0
    summary = checked_summary(done, records, f"{side} r{rnd}")
    check_stored(broker.bootstrap, topic, records)
    accepted = metric(url, "kvproxy_produce_records_total", {"outcome": "accepted"}) - accepted0
    if accepted != (records if side == "proxy" else 0):
        raise BenchmarkError(f"{side} r{rnd}: the proxy accepted {accepted:.0f} records")
    gib = records * record_size / 2**30
    return PerfRun(
        side=side,
        round=rnd,
        topic=topic,
        **asdict(summary),
        wall_seconds=wall,
        proxy_cpu_s_per_gib=proxy_cpu / gib if side == "proxy" else None,
        broker_cpu_s_per_gib=broker_cpu / gib,
        client_cpu_s_per_gib=client_cpu / gib,
    )


def summarize(runs: dict[str, list[PerfRun]]) -> dict[str, Any]:
    """Medians per side, the proxy/direct ratio of records/s, and the same round by round."""
    sides: dict[str, dict[str, Any]] = {}
    for side, side_runs in runs.items():
        figures: dict[str, Any] = {
            "records_per_s": median([r.records_per_s for r in side_runs]),
            "mb_per_s": median([r.mb_per_s for r in side_runs]),
            "broker_cpu_s_per_gib": median([r.broker_cpu_s_per_gib for r in side_runs]),
            "client_cpu_s_per_gib": median([r.client_cpu_s_per_gib for r in side_runs]),
        }
        figures.update({k: median([getattr(r, k) for r in side_runs]) for k in LATENCIES})
        sides[side] = figures
    proxy_cpu = [r.proxy_cpu_s_per_gib for r in runs["proxy"] if r.proxy_cpu_s_per_gib is not None]
    pairs = zip(runs["direct"], runs["proxy"], strict=True)
    round_ratios = [p.records_per_s / d.records_per_s for d, p in pairs]
    return {
        "sides": sides,
        "ratio": sides["proxy"]["records_per_s"] / sides["direct"]["records_per_s"],
        "round_ratios": round_ratios,
        "median_round_ratio": median(round_ratios),
        "proxy_cpu_s_per_gib": median(proxy_cpu),
    }


def print_summary(summary: dict[str, Any], label: str) -> None:
    sides = summary["sides"]
    print(
        f"\n{'':18}{'records/s':>11}{'MB/s':>8}{'avg':>8}{'p50':>7}{'p95':>7}{'p99':>7}"
        f"{'p99.9':>7}{'max':>7}   (ms; medians of the rounds)"
    )
    for name, side in ((f"direct to {label}", "direct"), ("through kvproxy", "proxy")):
        s = sides[side]
        print(
            f"{name:18}{s['records_per_s']:11,.0f}{s['mb_per_s']:8.1f}{s['avg_ms']:8.1f}"
            + "".join(f"{s[k]:7.0f}" for k in ("p50_ms", "p95_ms", "p99_ms", "p999_ms", "max_ms"))
        )
    print(
        f"ratio (records/s): {summary['ratio']:.2f}; round ratios "
        f"{' '.join(f'{x:.2f}' for x in summary['round_ratios'])} "
        f"({summary['median_round_ratio']:.2f})"
    )
    print(
        f"CPU s/GiB         : proxy {summary['proxy_cpu_s_per_gib']:.2f}; {label} "
        f"{sides['direct']['broker_cpu_s_per_gib']:.2f} direct, "
        f"{sides['proxy']['broker_cpu_s_per_gib']:.2f} through the proxy; tool's JVM "
        f"{sides['direct']['client_cpu_s_per_gib']:.2f} / "
        f"{sides['proxy']['client_cpu_s_per_gib']:.2f}"
    )


def _arguments(argv: list[str] | None) -> tuple[argparse.Namespace, int]:
    """The arguments, and the records of the unmeasured warm-up run of each side."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="records per run")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of direct, then proxy")
    parser.add_argument("--record-size", type=int, default=1024, help="bytes per record")
    parser.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another producer property for every run (repeatable)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 20,000 records, 1 round")
    args = parser.parse_args(argv)
    warm_up = WARM_UP_RECORDS
    if args.quick:
        args.records, args.rounds, warm_up = 20_000, 1, 5_000
    return args, warm_up


def _print_run(run: PerfRun, side: str, rnd: int, rounds: int) -> None:
    cpu = (
        f", proxy CPU {run.proxy_cpu_s_per_gib:.2f} s/GiB"
        if run.proxy_cpu_s_per_gib is not None
        else ""
    )
    print(
        f"  round {rnd}/{rounds} {side:6} {run.records_per_s:9,.0f} records/s "
        f"({run.mb_per_s:.1f} MB/s), p50 {run.p50_ms:.0f} ms, p99 {run.p99_ms:.0f} ms"
        f"{cpu}",
        flush=True,
    )


def _measure(
    args: argparse.Namespace, warm_up: int, properties: list[str]
) -> tuple[dict[str, list[PerfRun]], str, str]:
    """Kafka and kvproxy in front of it, a warm-up run of each side, then the rounds; the runs,
    and the broker's label and version."""
    runs: dict[str, list[PerfRun]] = {side: [] for side in SIDES}
    with upstream("kafka") as broker, start_proxy(broker.bootstrap) as proxy:
        print(
            f"producer-perf-test: Kafka {KAFKA_4}'s ProducerPerformance, {args.records:,} records "
            f"of {args.record_size} B per run ({' '.join(properties)}), {args.rounds} rounds of "
            f"direct / proxy against {broker.label} {broker.version}",
            flush=True,
        )
        size = args.record_size
        for side in SIDES:  # not measured: JIT, connections, the proxy's first requests
            perf_run(
                side, broker, proxy, records=warm_up, record_size=size, properties=properties, rnd=0
            )
        for rnd in range(1, args.rounds + 1):
            for side in SIDES:
                run = perf_run(
                    side,
                    broker,
                    proxy,
                    records=args.records,
                    record_size=size,
                    properties=properties,
                    rnd=rnd,
                )
                runs[side].append(run)
                _print_run(run, side, rnd, args.rounds)
        return runs, broker.label, broker.version


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args, warm_up = _arguments(argv)
    properties = [*PROPERTIES, *args.property]
    began = time.monotonic()
    runs, label, version = _measure(args, warm_up, properties)
    summary = summarize(runs)
    elapsed = time.monotonic() - began
    print_summary(summary, label)
    print("every record acknowledged; the broker holds them all; the proxy accepted them all")
    print(f"took {elapsed:.0f} s")
    settings = {
        "tool": f"{MAIN_CLASS} (kafka-tools {KAFKA_4})",
        "records_per_run": args.records,
        "record_size": args.record_size,
        "rounds": args.rounds,
        "warm_up_records": warm_up,
        "throughput": -1,
        "producer_properties": properties,
        "jvm": list(JVM),
        "partitions": 1,
        "proxy": "kvproxy serve, default checks, 1 process",
        "upstream": "kafka",
        "upstream_version": version,
        "quick": args.quick,
    }
    results = {
        "settings": settings,
        "runs": {side: [asdict(r) for r in side_runs] for side, side_runs in runs.items()},
        "summary": summary,
        "elapsed_seconds": round(elapsed, 1),
    }
    write_results("producer_perf", results)
    return results


if __name__ == "__main__":
    main()
