"""Produce latency at a steady 5,000 records/s, direct to the broker vs through kvproxy (bench 3).

The broker is Apache Kafka 4.4.0 (one KRaft node) by default, Tansu with `--upstream tansu`.

One librdkafka producer per side (confluent-kafka; acks=all, linger.ms=0, at most 5 requests in
flight, 1 KiB records to one partition) is fed on a fixed schedule: one `produce()` every
1/rate seconds, the main thread sleeping until the next one is due, so the records are spread
evenly rather than bunched. A record's latency is the time from just before its `produce()` call
to its delivery report, read by a thread blocked in `poll()` (it wakes when the report arrives, so
the reading does not depend on the pacing loop). With linger.ms=0, librdkafka sends what is queued
as soon as it can: mostly one record per request, more when requests back up. The records per
Produce request of each side (librdkafka's statistics) are printed, since they change what is
measured. Every delivery report must be a success, the acknowledged offsets of each slice must be
consecutive, and the broker must hold every delivered record at the end; through the proxy, its
`kvproxy_produce_records_total{outcome="accepted"}` counter must have grown by the number
delivered. Any error fails the benchmark.

A third side, `haproxy`, produces through HAProxy in TCP mode (the floor: a relay that reads
nothing, bench/_brokers.py) on a second listener of the broker that advertises HAProxy's port, so
every request passes through it (Kafka only: Tansu advertises one address, so with `--upstream
tansu` it is left out). A fourth, `uvloop`, produces through bench/uvloop_relay.py, a Python relay
on uvloop that reads nothing either, wired the same way on a third listener (`--no-uvloop-relay`
leaves it out): what a Python proxy on the same event loop adds before it does any work.

The sides are interleaved to be fair under noise: slices of `--seconds / --slices` seconds
(default 3 slices of 10 s per side, 30 s each), direct, haproxy, uvloop, then proxy, each
preceded by a warm-up second whose records are not counted. Before the first slice, each side
runs one unmeasured slice of `--warmup-slice` seconds (default 5): the broker's first seconds
under load are slow (a p50 of 3 to 4 ms for the first measured slice of direct and haproxy without
it) and would otherwise fall on the sides that come first. The producers stay connected for the
whole run.

A second, shorter part measures the floor: one raw Produce request (one 1 KiB record) at a time on
one connection, send to answer, `--round-trips` of them per side (default 3,000, after 200 not
counted), the sides alternating twice. At 5,000 records/s Tansu itself is near its limit on
this machine, which dominates its paced figures; one request at a time shows what the proxy's
two extra hops and its own work add when nothing else is queued.

How to read it: p50/p99/p99.9 of each side over all its slices, and the added latency (proxy minus
direct at each percentile); targets (docs/benchmarks.md, "Results against the targets"): added
p50 <= 0.2 ms, added p99 <= 1 ms. Against the floor: kvproxy minus HAProxy at p50 and p99 of the
paced slices (goals <= +0.1 ms and <= +0.5 ms), per slice beside, and the same for one request at
a time (no goal); then the same differences for kvproxy minus the uvloop relay and the relay minus
HAProxy (no goal). `achieved` is the measured produce() rate and `send lag` how
late the calls were against their schedule (a late record is measured from its actual call).

    .venv/bin/python -m bench.latency [--rate 5000] [--seconds 30] [--slices 3] [--warmup 1]
        [--warmup-slice 5]
        [--record-bytes 1024] [--quick] [--upstream kafka|tansu] [--no-uvloop-relay]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass
from typing import Any

from bench._brokers import (
    add_upstream_option,
    add_uvloop_relay_option,
    floor_settings,
    relay_sides,
    upstream,
)
from bench._floor import SIDE_NAMES, FloorRow, floor_difference, print_floor
from bench._latency_clients import PERCENTILES, PacedProducer, percentiles_ms, round_trips
from bench._load import BenchmarkError, check_stored, metric, metrics_url
from bench._relays import RelayProcess, start_proxy
from bench._results import median, write_results

TARGETS_MS = {"p50": 0.2, "p99": 1.0}
FLOOR_GOALS_MS = {"p50": 0.1, "p99": 0.5}
"""kvproxy's latency minus HAProxy's at a fixed rate, at most (issue 30)."""


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=5000.0, help="records per second")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured seconds per side")
    parser.add_argument("--slices", type=int, default=3, help="alternating slices per side")
    parser.add_argument("--warmup", type=float, default=1.0, help="uncounted seconds per slice")
    parser.add_argument(
        "--warmup-slice",
        type=float,
        default=5.0,
        help="seconds of one unmeasured slice per side before the measured ones (0: none)",
    )
    parser.add_argument("--record-bytes", type=int, default=1024, help="value size of a record")
    parser.add_argument(
        "--round-trips", type=int, default=3000, help="one-at-a-time requests per side and round"
    )
    parser.add_argument("--quick", action="store_true", help="3 slices of 1 s: a smoke run")
    add_upstream_option(parser)
    add_uvloop_relay_option(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.warmup, args.warmup_slice = 3.0, 0.3, 1.0
        args.round_trips = 300
    return args


@dataclass
class Measured:
    """What one run measured on every side: the paced slices (and their latencies pooled), the
    records per Produce request, the one-at-a-time round trips, and the broker it ran against."""

    label: str
    version: str
    floor_relay: dict[str, str] | None
    slices: dict[str, list[dict[str, Any]]]
    pooled: dict[str, list[float]]
    per_request: dict[str, float]
    trips: dict[str, list[float]]


def _paced_slice(
    producer: PacedProducer,
    relays: dict[str, RelayProcess],
    args: argparse.Namespace,
    slice_seconds: float,
) -> tuple[dict[str, Any], list[float]]:
    """One measured slice of one side: its figures (with each relay's CPU share) and latencies."""
    cpu_before = {name: r.cpu_seconds() for name, r in relays.items()}
    clock_before = time.perf_counter()
    result = producer.paced(args.rate, slice_seconds, args.warmup)
    clock = time.perf_counter() - clock_before
    latencies = result.pop("latencies")
    figures = {**result, **{f"{k}_ms": v for k, v in percentiles_ms(latencies).items()}}
    for name, relay in relays.items():  # "proxy_cpu_share", "haproxy_...", ...
        used = relay.cpu_seconds() - cpu_before[name]
        figures[f"{name}_cpu_share"] = used / clock
    return figures, latencies


def _print_slice(figures: dict[str, Any], index: int, side: str, slices: int) -> None:
    print(
        f"  slice {index + 1}/{slices} {side:7}: "
        + "  ".join(f"{k} {figures[f'{k}_ms']:.3f}" for k in PERCENTILES)
        + f" ms; {figures['achieved_rate']:,.0f}/s sent, "
        f"send lag p99 {figures['send_lag_p99_ms']:.3f} ms",
        flush=True,
    )


def _measure(args: argparse.Namespace) -> Measured:
    """A broker with the floor, kvproxy in front of it, paced producers on every side in
    alternating slices, their records checked as stored, then the one-at-a-time round trips."""
    slice_seconds = args.seconds / args.slices
    with (
        upstream(args.upstream, floor=True, uvloop_relay=args.uvloop_relay) as server,
        start_proxy(server.bootstrap) as proxy,
    ):
        broker = server.bootstrap
        url = metrics_url(proxy)
        floor_relay = floor_settings(server)
        relays = relay_sides(server, proxy)
        bootstraps = {"direct": broker} | {side: r.bootstrap for side, r in relays.items()}
        producers: dict[str, PacedProducer] = {}
        slices: dict[str, list[dict[str, Any]]] = {side: [] for side in bootstraps}
        pooled: dict[str, list[float]] = {side: [] for side in bootstraps}
        try:
            for side, bootstrap in bootstraps.items():
                topic = server.create_topic(f"latency-{side}")
                producers[side] = PacedProducer(bootstrap, topic, args.record_bytes)
            print(
                f"latency: {args.rate:,.0f} records/s of {args.record_bytes} B, librdkafka "
                f"(acks=all, linger.ms=0, 5 in flight), {args.slices} x {slice_seconds:g} s per "
                f"side (+{args.warmup:g} s warm-up each, after an unmeasured "
                f"{args.warmup_slice:g} s slice per side), alternating",
                flush=True,
            )
            accepted_before = metric(url, "kvproxy_produce_records_total", {"outcome": "accepted"})
            if args.warmup_slice > 0:  # not measured: the broker's first seconds under load
                for producer in producers.values():
                    producer.paced(args.rate, args.warmup_slice, 0.0)
            for index in range(args.slices):
                for side, producer in producers.items():
                    figures, latencies = _paced_slice(producer, relays, args, slice_seconds)
                    pooled[side].extend(latencies)
                    slices[side].append(figures)
                    _print_slice(figures, index, side, args.slices)
            per_request = _check_delivered(broker, producers, url, accepted_before)
            trips: dict[str, list[float]] = {side: [] for side in bootstraps}
            trip_topics = {s: server.create_topic(f"latency-rt-{s}") for s in trips}
            for _ in range(2):
                for side, bootstrap in bootstraps.items():
                    trips[side] += round_trips(bootstrap, trip_topics[side], args.round_trips)
        finally:
            for producer in producers.values():
                producer.close()
    return Measured(server.label, server.version, floor_relay, slices, pooled, per_request, trips)


def _check_delivered(
    broker: str, producers: dict[str, PacedProducer], url: str, accepted_before: float
) -> dict[str, float]:
    """Every side's records stored, the proxy's accepted count equal to what it was sent; the
    records per Produce request of every side."""
    per_request: dict[str, float] = {}
    for side, producer in producers.items():
        check_stored(broker, producer.topic, producer.delivered)
        records, requests = producer.produce_requests()
        per_request[side] = records / requests
    accepted = (
        metric(url, "kvproxy_produce_records_total", {"outcome": "accepted"}) - accepted_before
    )
    proxied = producers["proxy"].delivered
    if accepted != proxied:
        raise BenchmarkError(f"the proxy accepted {accepted:.0f} records, {proxied} sent")
    return per_request


def _summary(
    run: Measured,
) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """The summary of the results file, and the pooled percentiles of every side."""
    slices, pooled, trips = run.slices, run.pooled, run.trips
    overall = {side: percentiles_ms(values) for side, values in pooled.items()}
    unloaded = {side: percentiles_ms(values) for side, values in trips.items()}
    unloaded_added = {k: unloaded["proxy"][k] - unloaded["direct"][k] for k in PERCENTILES}
    added = {k: overall["proxy"][k] - overall["direct"][k] for k in PERCENTILES}
    added_per_slice = [
        {k: p[f"{k}_ms"] - d[f"{k}_ms"] for k in PERCENTILES}
        for d, p in zip(slices["direct"], slices["proxy"], strict=True)
    ]
    summary = {
        "direct_ms": overall["direct"],
        "proxy_ms": overall["proxy"],
        "added_ms": added,
        "added_ms_per_slice": added_per_slice,
        "targets_added_ms": TARGETS_MS,
        "meets_target": {k: added[k] <= TARGETS_MS[k] for k in TARGETS_MS},
        "achieved_rate": {
            side: median([s["achieved_rate"] for s in slices[side]]) for side in slices
        },
        "send_lag_p99_ms_worst_slice": {
            side: max(s["send_lag_p99_ms"] for s in slices[side]) for side in slices
        },
        "records_per_request": run.per_request,
        "proxy_cpu_share_during_proxy_slices": median(
            [s["proxy_cpu_share"] for s in slices["proxy"]]
        ),
        "samples": {side: len(values) for side, values in pooled.items()},
        "one_at_a_time_ms": unloaded,
        "one_at_a_time_added_ms": unloaded_added,
    }
    for side in ("haproxy", "uvloop"):
        if side in slices:
            summary[f"{side}_cpu_share_during_{side}_slices"] = median(
                [s[f"{side}_cpu_share"] for s in slices[side]]
            )
    return summary, overall


def _settings(args: argparse.Namespace, run: Measured) -> dict[str, Any]:
    return {
        "rate": args.rate,
        "seconds_per_side": args.seconds,
        "slices": args.slices,
        "warmup_seconds_per_slice": args.warmup,
        "warmup_slice_seconds_per_side": args.warmup_slice,
        "record_value_bytes": args.record_bytes,
        "client": "confluent-kafka (librdkafka), acks=all, linger.ms=0, max.in.flight 5",
        "producers_per_side": 1,
        "proxy": "kvproxy serve, default checks, 1 process",
        "upstream": args.upstream,
        "upstream_version": run.version,
        "floor": run.floor_relay,
        "quick": args.quick,
    }


def _print_paced(
    args: argparse.Namespace,
    run: Measured,
    summary: dict[str, Any],
    overall: dict[str, dict[str, float]],
    shown: dict[str, str],
) -> None:
    """The paced table: every side's percentiles, what kvproxy adds, the verdict and the rates."""
    added, verdict = summary["added_ms"], summary["meets_target"]
    achieved, lag = summary["achieved_rate"], summary["send_lag_p99_ms_worst_slice"]
    per_request = run.per_request
    print()
    print(
        f"{'ms':16}{'p50':>9}{'p99':>9}{'p99.9':>9}   "
        f"({' / '.join(f'{n:,}' for n in summary['samples'].values())} records)"
    )
    for side in overall:
        print(f"{shown[side]:16}" + "".join(f"{overall[side][k]:9.3f}" for k in PERCENTILES))
    print(f"{'added':16}" + "".join(f"{added[k]:9.3f}" for k in PERCENTILES))
    print(f"{'target (added)':16}{'<= 0.2':>9}{'<= 1':>9}{'-':>9}")
    print(
        "added per slice : "
        + "; ".join(
            " ".join(f"{s[k]:.3f}" for k in PERCENTILES) for s in summary["added_ms_per_slice"]
        )
    )
    print(
        f"verdict         : added p50 {'meets' if verdict['p50'] else 'MISSES'} the target, "
        f"added p99 {'meets' if verdict['p99'] else 'MISSES'} it"
    )
    print(
        f"achieved rate   : {achieved['direct']:,.0f}/s direct, {achieved['proxy']:,.0f}/s "
        f"through the proxy (asked {args.rate:,.0f}); worst send lag p99 "
        f"{max(lag.values()):.3f} ms"
    )
    print(
        f"records/request : {per_request['direct']:.2f} direct, "
        + (f"{per_request['haproxy']:.2f} through HAProxy, " if "haproxy" in run.slices else "")
        + (
            f"{per_request['uvloop']:.2f} through the uvloop relay, "
            if "uvloop" in run.slices
            else ""
        )
        + f"{per_request['proxy']:.2f} through the proxy (librdkafka batches what queues up)"
    )
    proxy_share = summary["proxy_cpu_share_during_proxy_slices"]
    print(f"proxy CPU       : {proxy_share:.2f} of a core during the proxy slices")
    cpu_shown = {"haproxy": "HAProxy CPU     :", "uvloop": "uvloop relay CPU:"}
    for side in [side for side in cpu_shown if side in run.slices]:
        print(
            f"{cpu_shown[side]} {summary[f'{side}_cpu_share_during_{side}_slices']:.2f} of a core "
            f"during the {side} slices"
        )


def _print_one_at_a_time(run: Measured, summary: dict[str, Any], shown: dict[str, str]) -> None:
    unloaded, unloaded_added = summary["one_at_a_time_ms"], summary["one_at_a_time_added_ms"]
    print(
        f"\none request at a time ({len(run.trips['direct']):,} per side, 1 KiB record, raw client)"
    )
    print(f"{'ms':16}{'p50':>9}{'p99':>9}{'p99.9':>9}")
    for side in unloaded:
        print(f"{shown[side]:16}" + "".join(f"{unloaded[side][k]:9.3f}" for k in PERCENTILES))
    print(f"{'added':16}" + "".join(f"{unloaded_added[k]:9.3f}" for k in PERCENTILES))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _arguments(argv)
    began = time.monotonic()
    run = _measure(args)
    summary, overall = _summary(run)
    unloaded = summary["one_at_a_time_ms"]
    floor = floor_rows(overall, run.slices, unloaded) if "haproxy" in run.slices else []
    elapsed = time.monotonic() - began
    settings = _settings(args, run)
    shown = {"direct": f"direct to {run.label}", "haproxy": "through HAProxy"}
    shown |= {"uvloop": "via uvloop relay", "proxy": "through kvproxy"}
    _print_paced(args, run, summary, overall, shown)
    _print_one_at_a_time(run, summary, shown)
    print("every record delivered without error; stored records = delivered records")
    if floor:
        print_floor(floor)
    print(f"took {elapsed:.0f} s")
    rows = [asdict(row) for row in floor]
    write_results(
        "latency",
        {
            "settings": settings,
            "slices": run.slices,
            "summary": summary,
            "against_floor": rows,
            "elapsed_seconds": elapsed,
        },
    )
    return {"settings": settings, "slices": run.slices, "summary": summary, "against_floor": rows}


def floor_rows(
    overall: dict[str, dict[str, float]],
    slices: dict[str, list[dict[str, Any]]],
    unloaded: dict[str, dict[str, float]],
) -> list[FloorRow]:
    """kvproxy minus HAProxy at p50 and p99: paced (per slice beside, the goals), then one
    request at a time (no goal: a reading of what each relay adds when nothing is queued); with
    the uvloop relay, kvproxy minus the relay and the relay minus HAProxy the same way (no goal)."""
    pairs = [("proxy", "haproxy")]
    if "uvloop" in slices:
        pairs += [("proxy", "uvloop"), ("uvloop", "haproxy")]
    rows = []
    for measured, floor in pairs:
        names = {"measured": SIDE_NAMES[measured], "floor": SIDE_NAMES[floor]}
        goals = FLOOR_GOALS_MS if floor == "haproxy" and measured == "proxy" else {}
        rows += [
            floor_difference(
                f"latency, paced: {k} ms",
                overall[floor][k],
                overall[measured][k],
                [
                    m[f"{k}_ms"] - f[f"{k}_ms"]
                    for f, m in zip(slices[floor], slices[measured], strict=True)
                ],
                at_most=goals.get(k),
                **names,
            )
            for k in FLOOR_GOALS_MS
        ]
        rows += [
            floor_difference(
                f"latency, one at a time: {k} ms",
                unloaded[floor][k],
                unloaded[measured][k],
                [],
                **names,
            )
            for k in FLOOR_GOALS_MS
        ]
    return rows


if __name__ == "__main__":
    main()
