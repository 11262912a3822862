"""Small-request rate: Produce requests/s direct to the broker vs through kvproxy (benchmark 2).

Every Produce request carries exactly one record (one magic-2 batch of one record, acks=all),
and every connection keeps 5 requests in flight; 4 connections, one partition. The client is a raw
pipelined asyncio client built on `protocol/` (uvloop), so "one record per request" and "5 in
flight" hold by construction. Every answer is checked (correlation id, error code 0, its layout),
the N answers of a run must carry the offsets 0 .. N-1 of the run's fresh topic, and the broker
must then hold all N records (`check_stored`); through the proxy, its
`kvproxy_requests_total{api="produce"}` counter must have grown by N. Any error fails the
benchmark.

A third side, `haproxy`, sends the same load through HAProxy in TCP mode (the floor: a relay that
reads nothing, bench/_brokers.py) on a second listener of the broker that advertises HAProxy's
port, so the leader's address the client is given is HAProxy's (Kafka only: Tansu advertises one
address, so with `--upstream tansu` it is left out). A fourth, `uvloop`, sends it through
bench/uvloop_relay.py, a Python relay on uvloop that reads nothing either, wired the same way on a
third listener (`--no-uvloop-relay` leaves it out): kvproxy's CPU per request over the relay's
is what kvproxy's own work per request costs beyond the event loop and Python's I/O, and the
relay's over HAProxy's what those cost beyond HAProxy's.

Direct, haproxy, uvloop and proxied runs alternate (fixed duration each, default 10 s) after an
unmeasured `--warmup` run of each; the figures are medians of 3 rounds. How to read it: `ratio` =
proxied requests/s / direct requests/s, target >= 0.8 (docs/benchmarks.md, "Results against the
targets"); `proxy CPU` is the proxy's user+system CPU seconds per 100,000 requests (HAProxy's and
the uvloop relay's the same way, over all their threads), `broker CPU` the broker's, for scale.
Against the floor: kvproxy's median CPU per request over HAProxy's (goal <= 2), and each round's
pair, then kvproxy over the uvloop relay and the relay over HAProxy (no goal); requests per CPU
second is the other way to read the same figure. The broker is Apache Kafka 4.4.0 (one KRaft node)
unless `--upstream tansu` asks for Tansu. `client CPU` is the load generator's share of a core:
well below 1 means it waits on the server, so the server side sets the figure. One client process
is the default: on a 2-core machine, more processes only take CPU from the servers (four
processes measured a lower direct rate than one, on Tansu).

    .venv/bin/python -m bench.request_rate [--seconds 10] [--rounds 3] [--connections 4]
        [--in-flight 5] [--record-bytes 100] [--client-processes 1] [--warmup 3] [--quick]
        [--upstream kafka|tansu] [--no-uvloop-relay]

The raw client (`run_load`, `ProduceTemplate`, `AnswerCheck`, ...) is shared with
bench/latency.py and bench/connections.py.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from typing import Any

from bench._brokers import (
    BrokerUnderTest,
    add_upstream_option,
    add_uvloop_relay_option,
    floor_settings,
    relay_sides,
    upstream,
)
from bench._floor import SIDE_NAMES, FloorRow, against_floor, print_floor
from bench._load import (
    PRODUCE_VERSION,
    BenchmarkError,
    check_offsets,
    check_stored,
    cpu_seconds,
    leader_address,
    metric,
    metrics_url,
    run_load,
)
from bench._relays import RelayProcess, start_proxy
from bench._results import alternate, median, write_results

CPU_PER_REQUEST_GOAL = 2.0
"""kvproxy's CPU per request over HAProxy's, at most (issue 30)."""


# ---- benchmark 2 ----


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument(
        "--in-flight", type=int, default=5, help="requests in flight per connection"
    )
    parser.add_argument("--record-bytes", type=int, default=100, help="value size of the record")
    parser.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="processes sharing the connections (one is enough: see the module docstring)",
    )
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds per side")
    parser.add_argument("--quick", action="store_true", help="1 round of 2 s: a smoke run")
    add_upstream_option(parser)
    add_uvloop_relay_option(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds, args.warmup = 2.0, 1, 1.0
    return args


def _one_run(
    args: argparse.Namespace,
    server: BrokerUnderTest,
    relays: dict[str, RelayProcess],
    url: str,
    *,
    side: str,
    round_index: int,
    seconds: float,
) -> dict[str, Any]:
    """One run of one side on a fresh topic: the load, the CPU of the broker and of the side's
    relay, every answer and stored record checked, and the proxy's count of Produce requests."""
    bootstraps = {"direct": server.bootstrap} | {s: r.bootstrap for s, r in relays.items()}
    topic = server.create_topic(f"rate-{side}-r{round_index + 1}")  # warm-up: r0
    host, port = leader_address(bootstraps[side], topic)
    produce_before = metric(url, "kvproxy_requests_total", {"api": "produce"})
    relay = relays.get(side)
    relay_before = relay.cpu_seconds() if relay else 0.0
    broker_before = cpu_seconds(server.process)
    result = run_load(
        host,
        port,
        topic,
        connections=args.connections,
        depth=args.in_flight,
        seconds=seconds,
        record_bytes=args.record_bytes,
        processes=args.client_processes,
    )
    relay_cpu = relay.cpu_seconds() - relay_before if relay else 0.0
    broker_cpu = cpu_seconds(server.process) - broker_before
    check_offsets(result.offsets, result.answered)
    stored = check_stored(server.bootstrap, topic, result.answered)
    relayed = metric(url, "kvproxy_requests_total", {"api": "produce"}) - produce_before
    expected = result.answered if side == "proxy" else 0
    if relayed != expected:
        raise BenchmarkError(
            f"{topic}: the proxy counted {relayed:.0f} Produce requests, not {expected}"
        )
    figures = {
        "requests_per_s": result.rate,
        "requests_in_window": result.requests,
        "acknowledged": result.answered,
        "stored_check": stored,
        "window_seconds": result.seconds,
        "client_cpu_share": result.client_cpu_seconds / result.seconds,
        "broker_cpu_s_per_100k": broker_cpu / result.answered * 100_000,
    }
    if relay is not None:  # "proxy_cpu_..." for kvproxy, "haproxy_cpu_..." for HAProxy
        # and "uvloop_cpu_..." for the uvloop relay
        figures[f"{side}_cpu_seconds"] = relay_cpu
        figures[f"{side}_cpu_s_per_100k"] = relay_cpu / result.answered * 100_000
        figures["requests_per_cpu_s"] = (
            result.answered / relay_cpu if relay_cpu > 0 else float("nan")
        )
    if side == "proxy":
        figures["proxy_counted_produce_requests"] = relayed
    return figures


def _summary(
    runs: dict[str, list[dict[str, Any]]], rates: dict[str, list[float]]
) -> dict[str, Any]:
    direct = median(rates["direct req/s"])
    proxied = median(rates["proxy req/s"])
    ratios = [p / d for d, p in zip(rates["direct req/s"], rates["proxy req/s"], strict=True)]
    summary = {
        "direct_requests_per_s": direct,
        "proxy_requests_per_s": proxied,
        "ratio": proxied / direct,
        "ratios_per_round": ratios,
        "target_ratio": 0.8,
        "proxy_cpu_s_per_100k_requests": median([r["proxy_cpu_s_per_100k"] for r in runs["proxy"]]),
        "client_cpu_share": {
            side: median([r["client_cpu_share"] for r in runs[side]]) for side in runs
        },
        "broker_cpu_s_per_100k_requests": {
            side: median([r["broker_cpu_s_per_100k"] for r in runs[side]]) for side in runs
        },
        "proxy_requests_per_cpu_s": median([r["requests_per_cpu_s"] for r in runs["proxy"]]),
    }
    for side in ("haproxy", "uvloop"):
        if side in runs:
            summary[f"{side}_requests_per_s"] = median(rates[f"{side} req/s"])
            summary[f"{side}_cpu_s_per_100k_requests"] = median(
                [r[f"{side}_cpu_s_per_100k"] for r in runs[side]]
            )
            summary[f"{side}_requests_per_cpu_s"] = median(
                [r["requests_per_cpu_s"] for r in runs[side]]
            )
    return summary


def _settings(
    args: argparse.Namespace, server: BrokerUnderTest, floor_relay: dict[str, str] | None
) -> dict[str, Any]:
    return {
        "seconds": args.seconds,
        "rounds": args.rounds,
        "connections": args.connections,
        "in_flight": args.in_flight,
        "records_per_request": 1,
        "record_value_bytes": args.record_bytes,
        "produce_version": PRODUCE_VERSION,
        "acks": -1,
        "client": "raw pipelined asyncio client on protocol/ (uvloop)",
        "client_processes": min(args.client_processes, args.connections),
        "proxy": "kvproxy serve, default checks, 1 process",
        "upstream": args.upstream,
        "upstream_version": server.version,
        "floor": floor_relay,
        "quick": args.quick,
    }


def _print_report(
    args: argparse.Namespace, label: str, summary: dict[str, Any], settings: dict[str, Any]
) -> None:
    direct, proxied = summary["direct_requests_per_s"], summary["proxy_requests_per_s"]
    broker_per_100k = summary["broker_cpu_s_per_100k_requests"]
    client_share = summary["client_cpu_share"]
    print()
    print(f"{'direct to ' + label:16}: {direct:10,.0f} requests/s (median of {args.rounds})")
    if "haproxy_requests_per_s" in summary:
        print(f"through HAProxy : {summary['haproxy_requests_per_s']:10,.0f} requests/s")
    if "uvloop_requests_per_s" in summary:
        print(f"through uvloop relay: {summary['uvloop_requests_per_s']:6,.0f} requests/s")
    print(f"through kvproxy : {proxied:10,.0f} requests/s")
    print(
        f"ratio           : {proxied / direct:10.2f}   (target >= 0.8; per round: "
        + ", ".join(f"{r:.2f}" for r in summary["ratios_per_round"])
        + ")"
    )
    print(
        f"proxy CPU       : {summary['proxy_cpu_s_per_100k_requests']:10.2f} s per 100k requests, "
        f"{summary['proxy_requests_per_cpu_s']:,.0f} requests per CPU second"
    )
    shown = {"haproxy": "HAProxy CPU     :", "uvloop": "uvloop relay CPU:"}
    for side in [side for side in shown if f"{side}_requests_per_s" in summary]:
        print(
            f"{shown[side]} {summary[f'{side}_cpu_s_per_100k_requests']:10.2f} s per 100k "
            f"requests, {summary[f'{side}_requests_per_cpu_s']:,.0f} requests per CPU second"
        )
    print(
        f"{label + ' CPU':16}: {broker_per_100k['direct']:10.2f} s per 100k requests "
        f"direct, {broker_per_100k['proxy']:.2f} through the proxy"
    )
    print(
        f"client CPU      : {client_share['direct']:.2f} (direct) / {client_share['proxy']:.2f} "
        f"(proxy) cores over {settings['client_processes']} client processes"
    )
    print("every request acknowledged without error; stored records = acknowledged requests")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _arguments(argv)
    began = time.monotonic()

    with (
        upstream(args.upstream, floor=True, uvloop_relay=args.uvloop_relay) as server,
        start_proxy(server.bootstrap) as proxy,
    ):
        url = metrics_url(proxy)
        floor_relay = floor_settings(server)
        relays = relay_sides(server, proxy)
        runs: dict[str, list[dict[str, Any]]] = {"direct": []} | {side: [] for side in relays}

        def one_run(side: str, round_index: int, seconds: float = args.seconds) -> float:
            figures = _one_run(
                args, server, relays, url, side=side, round_index=round_index, seconds=seconds
            )
            runs[side].append(figures)
            return float(runs[side][-1]["requests_per_s"])

        print(
            f"small-request rate: {args.connections} connections x {args.in_flight} in flight, "
            f"1 record ({args.record_bytes} B value) per Produce v{PRODUCE_VERSION} request, "
            f"acks=all, {args.seconds:g} s per run, {args.rounds} rounds",
            flush=True,
        )
        for side, side_runs in runs.items():  # not measured: a JVM's JIT, the first requests
            one_run(side, -1, args.warmup)
            side_runs.clear()
        rates = alternate(
            args.rounds,
            {f"{side} req/s": lambda i, side=side: one_run(side, i) for side in runs},
        )

    elapsed = time.monotonic() - began
    summary = _summary(runs, rates)
    floor = floor_rows(runs) if "haproxy" in runs else []
    settings = _settings(args, server, floor_relay)
    _print_report(args, server.label, summary, settings)
    if floor:
        print_floor(floor)
    print(f"took {elapsed:.0f} s")
    rows = [asdict(row) for row in floor]
    write_results(
        "request_rate",
        {
            "settings": settings,
            "runs": runs,
            "summary": summary,
            "against_floor": rows,
            "elapsed_seconds": elapsed,
        },
    )
    return {"settings": settings, "runs": runs, "summary": summary, "against_floor": rows}


def floor_rows(runs: dict[str, list[dict[str, Any]]]) -> list[FloorRow]:
    """kvproxy against HAProxy in the same run: CPU per request (the goal) and requests/s; with
    the uvloop relay, kvproxy against it and it against HAProxy, the same two figures."""
    cpu = "request rate: CPU s per 100k requests"
    rate = "request rate: requests/s"
    rows = [
        against_floor(
            cpu,
            [r["haproxy_cpu_s_per_100k"] for r in runs["haproxy"]],
            [r["proxy_cpu_s_per_100k"] for r in runs["proxy"]],
            at_most=CPU_PER_REQUEST_GOAL,
        ),
        against_floor(
            rate,
            [r["requests_per_s"] for r in runs["haproxy"]],
            [r["requests_per_s"] for r in runs["proxy"]],
        ),
    ]
    if "uvloop" not in runs:
        return rows
    for measured, floor in (("proxy", "uvloop"), ("uvloop", "haproxy")):
        names = {"measured": SIDE_NAMES[measured], "floor": SIDE_NAMES[floor]}
        rows += [
            against_floor(
                cpu,
                [r[f"{floor}_cpu_s_per_100k"] for r in runs[floor]],
                [r[f"{measured}_cpu_s_per_100k"] for r in runs[measured]],
                **names,
            ),
            against_floor(
                rate,
                [r["requests_per_s"] for r in runs[floor]],
                [r["requests_per_s"] for r in runs[measured]],
                **names,
            ),
        ]
    return rows


if __name__ == "__main__":
    main()
