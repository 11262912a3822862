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
nothing, bench/_common.py) on a second listener of the broker that advertises HAProxy's port, so
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

    .venv/bin/python bench/latency.py [--rate 5000] [--seconds 30] [--slices 3] [--warmup 1]
        [--warmup-slice 5]
        [--record-bytes 1024] [--quick] [--upstream kafka|tansu] [--no-uvloop-relay]
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from array import array
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    SIDE_NAMES,
    FloorRow,
    add_upstream_option,
    add_uvloop_relay_option,
    floor_difference,
    floor_settings,
    median,
    print_floor,
    relay_sides,
    start_proxy,
    upstream,
    write_results,
)
from request_rate import (
    AnswerCheck,
    BenchmarkError,
    ProduceTemplate,
    check_stored,
    leader_address,
    metric,
    metrics_url,
    percentile,
)

PERCENTILES = {"p50": 0.50, "p99": 0.99, "p99.9": 0.999}
TARGETS_MS = {"p50": 0.2, "p99": 1.0}
FLOOR_GOALS_MS = {"p50": 0.1, "p99": 0.5}
"""kvproxy's latency minus HAProxy's at a fixed rate, at most (issue 30)."""


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


def main(argv: list[str] | None = None) -> dict[str, Any]:
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
    slice_seconds = args.seconds / args.slices
    began = time.monotonic()

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
                    cpu_before = {name: r.cpu_seconds() for name, r in relays.items()}
                    clock_before = time.perf_counter()
                    result = producer.paced(args.rate, slice_seconds, args.warmup)
                    clock = time.perf_counter() - clock_before
                    latencies = result.pop("latencies")
                    pooled[side].extend(latencies)
                    figures = {
                        **result,
                        **{f"{k}_ms": v for k, v in percentiles_ms(latencies).items()},
                    }
                    for name, relay in relays.items():  # "proxy_cpu_share", "haproxy_...", ...
                        used = relay.cpu_seconds() - cpu_before[name]
                        figures[f"{name}_cpu_share"] = used / clock
                    slices[side].append(figures)
                    print(
                        f"  slice {index + 1}/{args.slices} {side:7}: "
                        + "  ".join(f"{k} {figures[f'{k}_ms']:.3f}" for k in PERCENTILES)
                        + f" ms; {result['achieved_rate']:,.0f}/s sent, "
                        f"send lag p99 {result['send_lag_p99_ms']:.3f} ms",
                        flush=True,
                    )
            per_request: dict[str, float] = {}
            for side, producer in producers.items():
                check_stored(broker, producer.topic, producer.delivered)
                records, requests = producer.produce_requests()
                per_request[side] = records / requests
            accepted = (
                metric(url, "kvproxy_produce_records_total", {"outcome": "accepted"})
                - accepted_before
            )
            proxied = producers["proxy"].delivered
            if accepted != proxied:
                raise BenchmarkError(f"the proxy accepted {accepted:.0f} records, {proxied} sent")
            trips: dict[str, list[float]] = {side: [] for side in bootstraps}
            trip_topics = {s: server.create_topic(f"latency-rt-{s}") for s in trips}
            for _ in range(2):
                for side, bootstrap in bootstraps.items():
                    trips[side] += round_trips(bootstrap, trip_topics[side], args.round_trips)
        finally:
            for producer in producers.values():
                producer.close()

    overall = {side: percentiles_ms(values) for side, values in pooled.items()}
    unloaded = {side: percentiles_ms(values) for side, values in trips.items()}
    unloaded_added = {k: unloaded["proxy"][k] - unloaded["direct"][k] for k in PERCENTILES}
    added = {k: overall["proxy"][k] - overall["direct"][k] for k in PERCENTILES}
    added_per_slice = [
        {k: p[f"{k}_ms"] - d[f"{k}_ms"] for k in PERCENTILES}
        for d, p in zip(slices["direct"], slices["proxy"], strict=True)
    ]
    achieved = {side: median([s["achieved_rate"] for s in slices[side]]) for side in slices}
    lag = {side: max(s["send_lag_p99_ms"] for s in slices[side]) for side in slices}
    proxy_share = median([s["proxy_cpu_share"] for s in slices["proxy"]])
    verdict = {k: added[k] <= TARGETS_MS[k] for k in TARGETS_MS}
    elapsed = time.monotonic() - began
    summary = {
        "direct_ms": overall["direct"],
        "proxy_ms": overall["proxy"],
        "added_ms": added,
        "added_ms_per_slice": added_per_slice,
        "targets_added_ms": TARGETS_MS,
        "meets_target": verdict,
        "achieved_rate": achieved,
        "send_lag_p99_ms_worst_slice": lag,
        "records_per_request": per_request,
        "proxy_cpu_share_during_proxy_slices": proxy_share,
        "samples": {side: len(values) for side, values in pooled.items()},
        "one_at_a_time_ms": unloaded,
        "one_at_a_time_added_ms": unloaded_added,
    }
    floor = floor_rows(overall, slices, unloaded) if "haproxy" in slices else []
    for side in ("haproxy", "uvloop"):
        if side in slices:
            summary[f"{side}_cpu_share_during_{side}_slices"] = median(
                [s[f"{side}_cpu_share"] for s in slices[side]]
            )
    settings = {
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
        "upstream_version": server.version,
        "floor": floor_relay,
        "quick": args.quick,
    }
    samples = {side: len(values) for side, values in pooled.items()}
    print()
    print(
        f"{'ms':16}{'p50':>9}{'p99':>9}{'p99.9':>9}   "
        f"({' / '.join(f'{n:,}' for n in samples.values())} records)"
    )
    shown = {"direct": f"direct to {server.label}", "haproxy": "through HAProxy"}
    shown |= {"uvloop": "via uvloop relay", "proxy": "through kvproxy"}
    for side in overall:
        print(f"{shown[side]:16}" + "".join(f"{overall[side][k]:9.3f}" for k in PERCENTILES))
    print(f"{'added':16}" + "".join(f"{added[k]:9.3f}" for k in PERCENTILES))
    print(f"{'target (added)':16}{'<= 0.2':>9}{'<= 1':>9}{'-':>9}")
    print(
        "added per slice : "
        + "; ".join(" ".join(f"{s[k]:.3f}" for k in PERCENTILES) for s in added_per_slice)
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
        + (f"{per_request['haproxy']:.2f} through HAProxy, " if floor else "")
        + (f"{per_request['uvloop']:.2f} through the uvloop relay, " if "uvloop" in slices else "")
        + f"{per_request['proxy']:.2f} through the proxy (librdkafka batches what queues up)"
    )
    print(f"proxy CPU       : {proxy_share:.2f} of a core during the proxy slices")
    cpu_shown = {"haproxy": "HAProxy CPU     :", "uvloop": "uvloop relay CPU:"}
    for side in [side for side in cpu_shown if side in slices]:
        print(
            f"{cpu_shown[side]} {summary[f'{side}_cpu_share_during_{side}_slices']:.2f} of a core "
            f"during the {side} slices"
        )
    print(f"\none request at a time ({len(trips['direct']):,} per side, 1 KiB record, raw client)")
    print(f"{'ms':16}{'p50':>9}{'p99':>9}{'p99.9':>9}")
    for side in unloaded:
        print(f"{shown[side]:16}" + "".join(f"{unloaded[side][k]:9.3f}" for k in PERCENTILES))
    print(f"{'added':16}" + "".join(f"{unloaded_added[k]:9.3f}" for k in PERCENTILES))
    print("every record delivered without error; stored records = delivered records")
    if floor:
        print_floor(floor)
    print(f"took {elapsed:.0f} s")
    rows = [asdict(row) for row in floor]
    write_results(
        "latency",
        {
            "settings": settings,
            "slices": slices,
            "summary": summary,
            "against_floor": rows,
            "elapsed_seconds": elapsed,
        },
    )
    return {"settings": settings, "slices": slices, "summary": summary, "against_floor": rows}


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
