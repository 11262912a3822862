"""Many connections: memory per idle connection, and 100 busy ones, direct vs kvproxy (benchmark 5).

(a) Idle: 1,000 client connections are opened one after the other, each sending one ApiVersions
request and reading its answer (through the proxy, that means its upstream connection exists
too); they then stay idle for `--idle-seconds`, and each must still answer a second ApiVersions.
Reported: the RSS of the process they land on, before and after, and the difference per
connection; first straight to Tansu (its RSS, the reference), then through kvproxy (the proxy's
RSS; Tansu's growth from the proxy's upstream connections is shown too). The proxy's
`kvproxy_client_connections` / `kvproxy_upstream_connections` gauges must show them all, and fall
back to where they were once the connections are closed.

(b) Busy: 100 connections each sending Produce requests of one 1 KiB record (v9, acks=all) one at
a time (`--in-flight 1`), for `--seconds` per run, direct and through the proxy alternating for
`--rounds` rounds (medians). Reported: requests/s, p50/p99 latency (request sent to answer read),
and the proxy's RSS while they run (sampled every 0.2 s). The raw client of bench/request_rate.py
checks every answer (error code 0, correlation ids, offsets 0..N-1) and the partition must hold
every acknowledged record. Any error fails the benchmark. At the end every connection is closed
and the proxy's connection gauges must come back down.

How to read it: bytes per idle connection is the memory a connection costs while nothing happens
(the design target is memory bounded per connection); the busy figures are a ratio against the
same 100 connections straight to Tansu. The file-descriptor soft limit is raised to the hard
limit first (Tansu and the proxy inherit it).

    .venv/bin/python -m bench.connections [--idle 1000] [--idle-seconds 5] [--active 100]
        [--seconds 10] [--rounds 3] [--in-flight 1] [--record-bytes 1024]
        [--client-processes 2] [--quick]
"""

from __future__ import annotations

import argparse
import resource
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import psutil

from bench._brokers import TansuServer, create_topic, tansu
from bench._load import (
    BenchmarkError,
    check_offsets,
    check_stored,
    leader_address,
    metric,
    metrics_url,
    percentile,
    run_load,
)
from bench._relays import ProxyProcess, start_proxy
from bench._results import alternate, median, write_results
from tests.harness.socket_frames import read_frame

GAUGES = ("kvproxy_client_connections", "kvproxy_upstream_connections")
MIB = 2**20


def raise_fd_limit() -> tuple[int, int]:
    """Soft RLIMIT_NOFILE up to the hard limit (children inherit it); the new limits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def api_versions(sock: socket.socket, correlation_id: int) -> None:
    """One ApiVersions v0 round trip; BenchmarkError unless it answers error code 0."""
    request = struct.pack(">hhih", 18, 0, correlation_id, 7) + b"kvbench"
    sock.sendall(struct.pack(">i", len(request)) + request)
    body = read_frame(sock)
    got, error = struct.unpack_from(">ih", body)
    if got != correlation_id or error != 0:
        raise BenchmarkError(f"ApiVersions answered correlation id {got}, error {error}")


def settle() -> None:
    """Let the servers finish what the last connections started before reading memory."""
    time.sleep(1.0)


def idle_connections(
    host: str,
    port: int,
    count: int,
    *,
    idle_seconds: float,
    rss: Callable[[], int],
    observe: Callable[[], dict[str, float]] | None = None,
) -> dict[str, Any]:
    """Open `count` connections (one ApiVersions each), idle, re-check, close; memory readings."""
    figures: dict[str, Any] = {}
    settle()
    figures["rss_before"] = rss()
    if observe is not None:
        figures["before"] = observe()
    sockets: list[socket.socket] = []
    started = time.perf_counter()
    try:
        for index in range(count):
            sock = socket.create_connection((host, port), timeout=10)
            sockets.append(sock)
            api_versions(sock, index + 1)
        figures["open_seconds"] = time.perf_counter() - started
        time.sleep(idle_seconds)
        figures["rss_after"] = rss()
        if observe is not None:
            figures["open"] = observe()
        for index, sock in enumerate(sockets):  # still there after idling
            api_versions(sock, count + index + 1)
    finally:
        for sock in sockets:
            sock.close()
    figures["bytes_per_connection"] = (figures["rss_after"] - figures["rss_before"]) / count
    return figures


def wait_for_gauges(
    url: str, expected: dict[str, float], timeout: float = 15.0
) -> dict[str, float]:
    """The proxy's connection gauges once they equal `expected` (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        now = {name: metric(url, name) for name in GAUGES}
        if now == expected or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=int, default=1000, help="idle connections")
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--active", type=int, default=100, help="busy connections")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each busy run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=1, help="requests in flight each")
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.idle, args.idle_seconds, args.active, args.seconds, args.rounds = 200, 1, 20, 2, 1
    return args


def _idle_phase(
    args: argparse.Namespace,
    server: TansuServer,
    proxy: ProxyProcess,
    url: str,
    *,
    baseline: dict[str, float],
    fd_limit: tuple[int, int],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(a): `--idle` connections held open direct to Tansu, then through kvproxy (the gauges and
    Tansu's memory watched); the gauges back to `baseline` once they close. The figures of each."""
    broker = server.broker
    assert server.proc is not None
    broker_process = psutil.Process(server.proc.pid)

    def broker_rss() -> int:
        return int(broker_process.memory_info().rss)

    def gauges_and_broker() -> dict[str, float]:
        return {**{name: metric(url, name) for name in GAUGES}, "tansu_rss": broker_rss()}

    print(f"(a) {args.idle} idle connections (fd limit {fd_limit[0]})", flush=True)
    direct_idle = idle_connections(
        broker.host, broker.port, args.idle, idle_seconds=args.idle_seconds, rss=broker_rss
    )
    proxy_idle = idle_connections(
        "127.0.0.1",
        proxy.port,
        args.idle,
        idle_seconds=args.idle_seconds,
        rss=proxy.rss_bytes,
        observe=gauges_and_broker,
    )
    opened = proxy_idle["open"]
    for name in GAUGES:
        if opened[name] < baseline[name] + args.idle:
            raise BenchmarkError(f"{name} = {opened[name]:.0f} with {args.idle} connections")
    after_idle = wait_for_gauges(url, baseline)
    proxy_idle["after_close"] = after_idle
    proxy_idle["rss_after_close"] = proxy.rss_bytes()
    proxy_idle["tansu_bytes_per_upstream_connection"] = (
        opened["tansu_rss"] - proxy_idle["before"]["tansu_rss"]
    ) / args.idle
    if after_idle != baseline:
        raise BenchmarkError(f"connection gauges {after_idle} after closing, not {baseline}")
    for side, figures in (("direct (Tansu)", direct_idle), ("kvproxy", proxy_idle)):
        print(
            f"  {side:15}: RSS {figures['rss_before'] / MIB:.1f} -> "
            f"{figures['rss_after'] / MIB:.1f} MiB, {figures['bytes_per_connection']:,.0f} "
            f"bytes per connection (opened in {figures['open_seconds']:.1f} s)",
            flush=True,
        )
    return direct_idle, proxy_idle


def _busy_run(
    args: argparse.Namespace, bootstrap: str, proxy: ProxyProcess, url: str, *, side: str, rnd: int
) -> dict[str, Any]:
    """(b), one run of one side: `--active` connections producing for `--seconds`, the proxy's
    memory sampled meanwhile (its gauges once, through the proxy); the run's figures."""
    topic = create_topic(bootstrap, f"busy-{side}-{rnd}", 1, None)
    host, port = leader_address(bootstrap if side == "direct" else proxy.bootstrap, topic)
    samples: list[int] = []
    gauges_seen: list[dict[str, float]] = []

    def sample() -> None:
        samples.append(proxy.rss_bytes())
        if side == "proxy" and len(samples) == 10:
            gauges_seen.append({name: metric(url, name) for name in GAUGES})

    rss_before = proxy.rss_bytes()
    result = run_load(
        host,
        port,
        topic,
        connections=args.active,
        depth=args.in_flight,
        seconds=args.seconds,
        record_bytes=args.record_bytes,
        processes=args.client_processes,
        keep_latencies=True,
        while_running=sample,
    )
    check_offsets(result.offsets, result.answered)
    stored = check_stored(bootstrap, topic, result.answered)
    ordered = sorted(result.latencies)
    figures = {
        "requests_per_s": result.rate,
        "requests_in_window": result.requests,
        "acknowledged": result.answered,
        "stored_check": stored,
        "p50_ms": percentile(ordered, 0.5) * 1e3,
        "p99_ms": percentile(ordered, 0.99) * 1e3,
        "client_cpu_share": result.client_cpu_seconds / result.seconds,
        "proxy_rss_before": rss_before,
        "proxy_rss_max": max(samples, default=0),
        "proxy_rss_median": median(samples),
    }
    if gauges_seen:
        figures["proxy_gauges_while_running"] = gauges_seen[0]
    return figures


def _summary(
    direct_idle: dict[str, Any],
    proxy_idle: dict[str, Any],
    runs: dict[str, list[dict[str, Any]]],
    rates: dict[str, list[float]],
) -> dict[str, Any]:
    """Bytes per idle connection on each side; the busy runs' medians and the proxy's memory."""

    def med(side: str, key: str) -> float:
        return median([r[key] for r in runs[side]])

    direct_rate, proxy_rate = median(rates["direct req/s"]), median(rates["proxy req/s"])
    return {
        "idle_bytes_per_connection": {
            "tansu_direct": direct_idle["bytes_per_connection"],
            "kvproxy": proxy_idle["bytes_per_connection"],
            "tansu_behind_kvproxy": proxy_idle["tansu_bytes_per_upstream_connection"],
        },
        "busy_requests_per_s": {"direct": direct_rate, "proxy": proxy_rate},
        "busy_ratio": proxy_rate / direct_rate,
        "busy_p50_ms": {"direct": med("direct", "p50_ms"), "proxy": med("proxy", "p50_ms")},
        "busy_p99_ms": {"direct": med("direct", "p99_ms"), "proxy": med("proxy", "p99_ms")},
        "proxy_rss_busy_max": max(r["proxy_rss_max"] for r in runs["proxy"]),
    }


def _settings(args: argparse.Namespace, fd_limit: tuple[int, int]) -> dict[str, Any]:
    return {
        "idle_connections": args.idle,
        "idle_seconds": args.idle_seconds,
        "active_connections": args.active,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "in_flight": args.in_flight,
        "record_value_bytes": args.record_bytes,
        "client_processes": args.client_processes,
        "fd_limit": fd_limit,
        "client": "raw client on protocol/ (bench/request_rate.py), Produce v9, acks=all",
        "proxy": "kvproxy serve, default checks, 1 process",
        "quick": args.quick,
    }


def _print_report(
    args: argparse.Namespace,
    summary: dict[str, Any],
    proxy_idle: dict[str, Any],
    runs: dict[str, list[dict[str, Any]]],
) -> None:
    def med(side: str, key: str) -> float:
        return median([r[key] for r in runs[side]])

    idle = summary["idle_bytes_per_connection"]
    after_idle, final = proxy_idle["after_close"], summary["gauges_at_end"]
    rates = summary["busy_requests_per_s"]
    direct_rate, proxy_rate, final_rss = rates["direct"], rates["proxy"], summary["proxy_rss_end"]
    print()
    print(f"(a) {args.idle} idle connections, RSS growth per connection:")
    print(f"    Tansu, direct        : {idle['tansu_direct']:10,.0f} bytes")
    print(f"    kvproxy              : {idle['kvproxy']:10,.0f} bytes  (target: bounded)")
    print(f"    Tansu, behind kvproxy: {idle['tansu_behind_kvproxy']:10,.0f} bytes")
    print(
        f"    proxy RSS {proxy_idle['rss_before'] / MIB:.1f} -> {proxy_idle['rss_after'] / MIB:.1f}"
        f" MiB, {proxy_idle['rss_after_close'] / MIB:.1f} MiB after closing; gauges "
        f"{proxy_idle['open']['kvproxy_client_connections']:.0f} client / "
        f"{proxy_idle['open']['kvproxy_upstream_connections']:.0f} upstream while open, "
        f"{after_idle['kvproxy_client_connections']:.0f} / "
        f"{after_idle['kvproxy_upstream_connections']:.0f} after closing"
    )
    print(f"(b) {args.active} busy connections (median of {args.rounds}):")
    print(f"    {'':16}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}")
    for name, side, rate in (("direct to Tansu", "direct", direct_rate),
                             ("through kvproxy", "proxy", proxy_rate)):  # fmt: skip
        print(f"    {name:16}{rate:10,.0f}{med(side, 'p50_ms'):9.2f}{med(side, 'p99_ms'):9.2f}")
    print(
        f"    ratio {proxy_rate / direct_rate:.2f}; proxy RSS while busy up to "
        f"{summary['proxy_rss_busy_max'] / MIB:.1f} MiB, {final_rss / MIB:.1f} MiB at the end; "
        f"gauges back to {final['kvproxy_client_connections']:.0f} / "
        f"{final['kvproxy_upstream_connections']:.0f}"
    )
    print(
        f"    client CPU {med('direct', 'client_cpu_share'):.2f} (direct) / "
        f"{med('proxy', 'client_cpu_share'):.2f} (proxy) cores over {args.client_processes} "
        "processes"
    )
    print("every request answered without error; stored records = acknowledged requests")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _arguments(argv)
    began = time.monotonic()
    fd_limit = raise_fd_limit()

    with tansu() as server, start_proxy(server.broker.bootstrap) as proxy:
        bootstrap = server.broker.bootstrap
        url = metrics_url(proxy)
        baseline = {name: metric(url, name) for name in GAUGES}
        direct_idle, proxy_idle = _idle_phase(
            args, server, proxy, url, baseline=baseline, fd_limit=fd_limit
        )
        print(
            f"(b) {args.active} busy connections, {args.in_flight} in flight each, one "
            f"{args.record_bytes} B record per request, {args.seconds:g} s per run",
            flush=True,
        )
        runs: dict[str, list[dict[str, Any]]] = {"direct": [], "proxy": []}

        def busy(side: str, round_index: int) -> float:
            runs[side].append(_busy_run(args, bootstrap, proxy, url, side=side, rnd=round_index))
            return float(runs[side][-1]["requests_per_s"])

        rates = alternate(
            args.rounds,
            {
                "direct req/s": lambda i: busy("direct", i),
                "proxy req/s": lambda i: busy("proxy", i),
            },
        )
        final = wait_for_gauges(url, baseline)
        if final != baseline:
            raise BenchmarkError(f"connection gauges {final} after the busy runs, not {baseline}")
        final_rss = proxy.rss_bytes()

    elapsed = time.monotonic() - began
    summary = _summary(direct_idle, proxy_idle, runs, rates)
    summary |= {"proxy_rss_end": final_rss, "gauges_baseline": baseline, "gauges_at_end": final}
    settings = _settings(args, fd_limit)
    _print_report(args, summary, proxy_idle, runs)
    print(f"took {elapsed:.0f} s")
    write_results(
        "connections",
        {
            "settings": settings,
            "idle": {"direct": direct_idle, "proxy": proxy_idle},
            "busy": runs,
            "summary": summary,
            "elapsed_seconds": elapsed,
        },
    )
    return {"settings": settings, "summary": summary}


if __name__ == "__main__":
    main()
