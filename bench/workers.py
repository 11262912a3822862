"""Benchmark 6: `kvproxy serve --workers 1` vs `--workers 2`, with several producers at once.

`--workers N` runs N proxy processes sharing the listeners with SO_REUSEPORT, which spreads
connections, not requests; so `--producers` P producer processes (multiprocessing, "spawn") each
open their own connections and send an equal share of `--mib` MiB to their own single-partition
topic, all starting together (a barrier after each has fetched its metadata). The producer is the
one of benchmark 1 (bench/throughput.py: librdkafka, 1 KiB keyed JSON records, acks=all,
linger.ms=5, batch.size=1 MiB). Three variants alternate round by round: `direct` to the broker,
`workers 1` and `workers 2`, both proxies with the default checks and started once before the
rounds; the median of `--rounds` rounds is taken. A run only counts when every producer's flush()
returned 0, no delivery failed and every record was acknowledged; otherwise the benchmark stops.

How to read it: MB/s is the aggregate over the producers (value bytes, 10^6 bytes per MB, from
the first producer's start to the last one's flush()). "/ workers 1" is what the second worker
buys (medians; "round ratios" divide each run by workers 1's run of the same round); "/ direct" is
each proxied median against direct's in the same run. "CPU s/GiB" is user + system
CPU during a run per GiB sent: the proxy (all its processes), the broker and the producer
processes; "proxy CPU split" is each proxy process's share of the proxy's CPU, median over the
runs, which shows whether the connections landed on both workers. The machine has 2 cores shared by
the broker, the producers and the proxy, so a second worker cannot double anything here: it only
helps as far as one proxy process was the bottleneck. Figures go to bench/results/workers.json.

    .venv/bin/python -m bench.workers [--mib 200] [--rounds 3] [--producers 4] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import multiprocessing.synchronize
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import psutil

from bench._brokers import BrokerUnderTest, create_topic, upstream
from bench._producer_runs import (
    RECORD_BYTES,
    ProduceRun,
    announce_source,
    check_run,
    produce,
    records_for,
)
from bench._relays import ProxyProcess, start_proxy
from bench._results import ROOT, median, write_results

BARRIER_TIMEOUT = 60.0
RESULT_TIMEOUT = 300.0
TARGET_NOTE = "no target in docs/benchmarks.md; 2 cores shared by broker, producers and proxy"


def workers_flag_available() -> bool:
    """True once `kvproxy serve` has the `--workers` option."""
    helptext = subprocess.run(
        [sys.executable, "-m", "kvproxy.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=60,
    ).stdout
    return "--workers" in helptext


def _producer_process(
    commands: multiprocessing.Queue[tuple[str, str, int] | None],
    results: multiprocessing.Queue[tuple[str, ProduceRun | str]],
    barrier: multiprocessing.synchronize.Barrier,
) -> None:
    """One producer process: per (bootstrap, topic, records): connect, meet the others, send."""
    while (command := commands.get()) is not None:
        bootstrap, topic, records = command
        try:
            run = produce(bootstrap, topic, records, ready=lambda: barrier.wait(BARRIER_TIMEOUT))
        except Exception as exc:  # reported to the parent, which stops the benchmark
            barrier.abort()
            results.put((topic, f"{type(exc).__name__}: {exc}"))
        else:
            results.put((topic, run))


class ProducerPool:
    """P long-lived producer processes (spawned once, not per run) sending together on command."""

    def __init__(self, count: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.barrier = ctx.Barrier(count)
        self.results: multiprocessing.Queue[tuple[str, ProduceRun | str]] = ctx.Queue()
        self.commands: list[multiprocessing.Queue[tuple[str, str, int] | None]] = [
            ctx.Queue() for _ in range(count)
        ]
        self.processes = [
            ctx.Process(target=_producer_process, args=(q, self.results, self.barrier), daemon=True)
            for q in self.commands
        ]
        for process in self.processes:
            process.start()

    def run(self, bootstrap: str, topics: list[str], records: list[int]) -> list[ProduceRun]:
        """Every producer sends its share to its own topic; their runs, in topic order."""
        for queue, topic, count in zip(self.commands, topics, records, strict=True):
            queue.put((bootstrap, topic, count))
        by_topic: dict[str, ProduceRun] = {}
        for _ in topics:
            topic, outcome = self.results.get(timeout=RESULT_TIMEOUT)
            if isinstance(outcome, str):
                raise RuntimeError(f"producer for {topic} failed: {outcome}")
            by_topic[topic] = outcome
        return [by_topic[topic] for topic in topics]

    def close(self) -> None:
        for queue in self.commands:
            queue.put(None)
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.terminate()
                process.join(5)


def cpu_by_process(proxy: ProxyProcess) -> dict[int, float]:
    """User + system CPU seconds of each proxy process (the proxy and its workers), by pid."""
    seconds: dict[int, float] = {}
    for proc in proxy.processes():
        with contextlib.suppress(psutil.NoSuchProcess):
            times = proc.cpu_times()
            seconds[proc.pid] = times.user + times.system
    return seconds


@dataclass
class WorkersRun:
    """One measured run of one variant: P producers at once."""

    round: int
    mb_per_s: float
    seconds: float
    records: int
    producer_mb_per_s: list[float]
    client_cpu_s_per_gib: float
    """All producer processes together (librdkafka's threads included)."""
    broker_cpu_s_per_gib: float
    proxy_cpu_seconds: float | None
    proxy_cpu_s_per_gib: float | None
    cpu_split: list[float] | None
    """Each proxy process's share of the proxy's CPU in this run, largest first."""
    proxy_processes: int | None
    proxy_rss_mib: float | None


def measure(
    pool: ProducerPool,
    broker: BrokerUnderTest,
    proxy: ProxyProcess | None,
    *,
    records: int,
    producers: int,
    label: str,
    rnd: int,
) -> WorkersRun:
    """One checked run: `producers` fresh topics, an equal share of `records` each, all at once."""
    shares = [records // producers + (i < records % producers) for i in range(producers)]
    topics = [
        create_topic(broker.bootstrap, f"wk-{label}-p{i}-{uuid.uuid4().hex[:8]}", 1, None)
        for i in range(producers)
    ]
    cpu0 = cpu_by_process(proxy) if proxy else {}
    broker_cpu0 = broker.cpu_seconds()
    runs = pool.run(proxy.bootstrap if proxy else broker.bootstrap, topics, shares)
    broker_cpu = broker.cpu_seconds() - broker_cpu0
    cpu1 = cpu_by_process(proxy) if proxy else {}
    for i, run in enumerate(runs):
        check_run(run, f"{label} producer {i}")
    seconds = max(r.finished_at for r in runs) - min(r.started_at for r in runs)
    value_bytes = sum(r.value_bytes for r in runs)
    gib = value_bytes / 2**30
    proxy_cpu = cpu_split = None
    if proxy:
        deltas = [cpu1[pid] - cpu0.get(pid, 0.0) for pid in cpu1]
        proxy_cpu = sum(deltas)
        cpu_split = sorted((d / proxy_cpu if proxy_cpu else 0.0 for d in deltas), reverse=True)
    return WorkersRun(
        round=rnd,
        mb_per_s=value_bytes / seconds / 1e6,
        seconds=seconds,
        records=sum(r.records for r in runs),
        producer_mb_per_s=[r.mb_per_s for r in runs],
        client_cpu_s_per_gib=sum(r.client_cpu_seconds for r in runs) / gib,
        broker_cpu_s_per_gib=broker_cpu / gib,
        proxy_cpu_seconds=proxy_cpu,
        proxy_cpu_s_per_gib=proxy_cpu / gib if proxy_cpu is not None else None,
        cpu_split=cpu_split,
        proxy_processes=len(cpu1) if proxy else None,
        proxy_rss_mib=proxy.rss_bytes() / 2**20 if proxy else None,
    )


def summarize(runs: dict[str, list[WorkersRun]]) -> dict[str, dict[str, Any]]:
    """Medians, ratios against direct and against workers 1, CPU per GiB and the CPU split."""
    direct = median([r.mb_per_s for r in runs["direct"]])
    one = median([r.mb_per_s for r in runs["workers 1"]])
    summary: dict[str, dict[str, Any]] = {}
    for name, variant_runs in runs.items():
        mbs = median([r.mb_per_s for r in variant_runs])
        cpus = [r.proxy_cpu_s_per_gib for r in variant_runs if r.proxy_cpu_s_per_gib is not None]
        splits = [r.cpu_split for r in variant_runs if r.cpu_split]
        width = max((len(s) for s in splits), default=0)
        split = [
            median([s[i] if i < len(s) else 0.0 for s in splits]) for i in range(width)
        ] or None
        pairs = zip(variant_runs, runs["workers 1"], strict=True)
        round_ratios = [run.mb_per_s / one_run.mb_per_s for run, one_run in pairs]
        summary[name] = {
            "median_mb_per_s": mbs,
            "ratio_to_direct": mbs / direct,
            "ratio_to_workers_1": mbs / one if name != "direct" else None,
            "round_ratios_to_workers_1": round_ratios if name != "direct" else None,
            "median_proxy_cpu_s_per_gib": median(cpus) if cpus else None,
            "median_broker_cpu_s_per_gib": median([r.broker_cpu_s_per_gib for r in variant_runs]),
            "median_client_cpu_s_per_gib": median([r.client_cpu_s_per_gib for r in variant_runs]),
            "median_cpu_split": split,
        }
    return summary


def print_table(runs: dict[str, list[WorkersRun]], summary: dict[str, dict[str, Any]]) -> None:
    """Every run's aggregate MB/s, then the medians, ratios, CPU per GiB and CPU split."""
    rounds = max(len(v) for v in runs.values())
    print("\naggregate MB/s per round (all producers, 10^6 bytes of values per second)")
    heads = "".join(f"{'r' + str(i + 1):>8}" for i in range(rounds))
    print(f"{'variant':<11}{heads}  median")
    for name, variant_runs in runs.items():
        cells = "".join(f"{r.mb_per_s:8.1f}" for r in variant_runs)
        print(f"{name:<11}{cells}{summary[name]['median_mb_per_s']:8.1f}")
    print(
        f"\n{'variant':<11}{'median MB/s':>12}{'/ direct':>10}{'/ workers 1':>13}"
        f"{'CPU s/GiB: proxy':>19}{'broker':>7}{'clients':>8}  proxy CPU split"
        "   round ratios / workers 1"
    )
    for name, figures in summary.items():
        ratio_one = figures["ratio_to_workers_1"]
        cpu = figures["median_proxy_cpu_s_per_gib"]
        split = figures["median_cpu_split"]
        rounds_one = figures["round_ratios_to_workers_1"]
        print(
            f"{name:<11}{figures['median_mb_per_s']:12.1f}{figures['ratio_to_direct']:10.2f}"
            f"{format(ratio_one, '.2f') if ratio_one is not None else '-':>13}"
            f"{format(cpu, '.2f') if cpu is not None else '-':>19}"
            f"{figures['median_broker_cpu_s_per_gib']:7.2f}"
            f"{figures['median_client_cpu_s_per_gib']:8.2f}"
            f"  {' / '.join(f'{x:.0%}' for x in split) if split else '-':<15}"
            f"   {' '.join(f'{x:.2f}' for x in rounds_one) if rounds_one else '-'}"
        )


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=200, help="MiB per run, all producers")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three (default 3)")
    parser.add_argument("--producers", type=int, default=4, help="producer processes (default 4)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 20 MiB, 2 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.mib, args.rounds = 20, 2
    return args


def _announce(args: argparse.Namespace, records: int, has_workers: bool) -> None:
    print(
        f"workers: {records:,} records of {RECORD_BYTES} B ({args.mib:g} MiB) per run over "
        f"{args.producers} producer processes, {args.rounds} rounds of direct / workers 1 / "
        "workers 2",
        flush=True,
    )
    if not has_workers:
        print(
            "NOTE: `kvproxy serve` has no --workers option yet: the 'workers 2' variant runs "
            "with ONE worker (a second copy of 'workers 1')",
            flush=True,
        )


def _print_run(run: WorkersRun, name: str, rnd: int, rounds: int) -> None:
    extra = ""
    if run.proxy_cpu_s_per_gib is not None and run.cpu_split:
        extra = (
            f", proxy CPU {run.proxy_cpu_s_per_gib:.2f} s/GiB over "
            f"{run.proxy_processes} processes, split "
            + " / ".join(f"{x:.0%}" for x in run.cpu_split)
        )
    print(
        f"  round {rnd}/{rounds} {name:<9} {run.mb_per_s:7.1f} MB/s ({run.seconds:.2f} s{extra})",
        flush=True,
    )


def _run_rounds(args: argparse.Namespace, records: int, second: int) -> dict[str, list[WorkersRun]]:
    """Tansu, kvproxy with 1 and with `second` workers, a warm-up of each, then the rounds."""
    runs: dict[str, list[WorkersRun]] = {"direct": [], "workers 1": [], "workers 2": []}
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(upstream("tansu"))
        proxies: dict[str, ProxyProcess | None] = {
            "direct": None,
            "workers 1": stack.enter_context(start_proxy(broker.bootstrap, workers=1)),
            "workers 2": stack.enter_context(start_proxy(broker.bootstrap, workers=second)),
        }
        pool = ProducerPool(args.producers)
        stack.callback(pool.close)
        shape = {"records": records_for(4), "producers": args.producers}
        for name, proxy in proxies.items():  # warm-up: spawned imports, connections, first batches
            measure(pool, broker, proxy, **shape, label=f"warmup-{name[0]}", rnd=0)
        for rnd in range(1, args.rounds + 1):
            for name, proxy in proxies.items():
                run = measure(
                    pool,
                    broker,
                    proxy,
                    records=records,
                    producers=args.producers,
                    label=f"r{rnd}-{name.replace(' ', '')}",
                    rnd=rnd,
                )
                runs[name].append(run)
                _print_run(run, name, rnd, args.rounds)
    return runs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _arguments(argv)
    started = time.monotonic()
    records = records_for(args.mib)
    has_workers = workers_flag_available()
    second = 2 if has_workers else 1
    _announce(args, records, has_workers)
    source = announce_source()
    runs = _run_rounds(args, records, second)
    summary = summarize(runs)
    elapsed = time.monotonic() - started
    print_table(runs, summary)
    if not has_workers:
        print("NOTE: no --workers option: 'workers 2' ran with one worker")
    print(f"\ntook {elapsed:.0f} s")
    results: dict[str, Any] = {
        "settings": {
            "mib_per_run": args.mib,
            "records_per_run": records,
            "record_bytes": RECORD_BYTES,
            "rounds": args.rounds,
            "producers": args.producers,
            "policies": "default",
            "workers_flag_available": has_workers,
            "second_variant_workers": second,
        },
        "source": source,
        "note": TARGET_NOTE,
        "runs": {name: [asdict(r) for r in variant_runs] for name, variant_runs in runs.items()},
        "summary": summary,
        "elapsed_seconds": round(elapsed, 1),
    }
    write_results("workers", results)
    return results


if __name__ == "__main__":
    main()
