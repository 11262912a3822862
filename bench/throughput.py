"""Benchmark 1: end-to-end produce throughput, direct to the broker vs through kvproxy.

One librdkafka producer (confluent-kafka; 1 KiB records, acks=all, linger.ms=5,
batch.size=1 MiB) sends `--mib` MiB to a fresh single-partition topic on the broker (Apache
Kafka 4.4.0, one KRaft node, by default; Tansu in memory with `--upstream tansu`), four ways:

- `direct`: straight to the broker (the baseline);
- `haproxy`: through HAProxy in TCP mode (the floor: a relay that reads nothing, bench/_brokers.py),
  on a second listener of the broker that advertises HAProxy's port (Kafka only: Tansu advertises
  one address, so with `--upstream tansu` this variant is left out);
- `default`: through `kvproxy serve` with the default checks (batch_integrity, crc, timestamps,
  compacted_key);
- `record-level`: through a second `kvproxy serve` whose `rl-*` topics are marked compacted and
  checked by compacted_key, max_record_bytes and json (every record has a key and a ~1 KiB JSON
  value, so every record is decoded and parsed).

With `--schema`, a fourth variant:

- `schema`: through a third `kvproxy serve` whose `sc-*` topics are checked by the default
  checks and `{schema: {value: required}}` (ids only, `topic_name` strategy), against a test
  registry (tests/harness/schema_registry.py) started in this process. Each value is the same
  1 KiB as the others' with its first 5 bytes replaced by Confluent's header (magic byte 0, the
  id of a JSON schema registered under every `sc-` topic's `<topic>-value` before the proxy
  starts, so one lookup at the warm-up serves every round). Before the rounds, an unframed
  value is shown to be refused. The summary adds `schema / default`, the ratio to the default
  checks' median from the same run (target >= 0.9).

Every variant sends the same keys and values (framed for `schema`). The proxies start once,
before the rounds; each variant first sends a small unmeasured warm-up, then the variants
alternate round by round and the median of `--rounds` rounds is taken. A run only counts when
flush() returned 0, no delivery callback reported an error and every record was acknowledged
(offsets 0 to records - 1); otherwise the benchmark stops with an error. Before the rounds, one
non-JSON record is sent to an `rl-` topic through the record-level proxy and must be refused, so
that the policies are known to be active.

How to read it: MB/s is the producer's client-side rate (value bytes, 10^6 bytes per MB, from the
first produce() to flush() returning). The ratios divide each median by direct's median from the
same run, which is what the targets in docs/benchmarks.md are about (>= 0.9 default, >= 0.8
record-level); the absolute MB/s move with the machine's load; "round ratios" divide each run by
direct's run of the same round, a second reading. "CPU s/GiB" is user + system CPU during a run
divided by the GiB sent, for the proxy process (HAProxy's, all its threads, for `haproxy`), the
broker and the producer (this process, librdkafka's threads included): CPU seconds per GiB / 1.07 =
cores busy at 1 GB/s. Two cores are shared by all three, so whatever the proxy burns is taken from
the broker and the producer. Against the floor, each kvproxy variant's median CPU s/GiB and MB/s
are divided by HAProxy's (goals: CPU <= 1.5x for the default checks, <= 3x record-level; MB/s
>= 0.95x for the default checks), with the same ratio of each round's two runs beside. Figures
go to bench/results/throughput.json (`against_floor`: those rows).

    .venv/bin/python -m bench.throughput [--mib 200] [--rounds 5] [--quick] [--schema]
        [--upstream kafka|tansu]
"""

from __future__ import annotations

import argparse
import contextlib
import time
from dataclasses import asdict, dataclass
from typing import Any

from bench._brokers import BrokerUnderTest, add_upstream_option
from bench._floor import FloorRow, against_floor, print_floor
from bench._producer_runs import (
    PRODUCER_CONFIG,
    RECORD_BYTES,
    announce_source,
    check_run,
    produce,
    records_for,
)
from bench._relays import RelayProcess
from bench._results import median, write_results
from bench._throughput_variants import Variants, start_variants, topic_name

WARM_UP_MIB = 4
"""Sent once per variant before the rounds, not measured: connections, metadata, first batches."""
TARGETS = {"default": 0.9, "record-level": 0.8}
FLOOR_CPU_GOALS = {"default": 1.5, "record-level": 3.0}
"""kvproxy's CPU s/GiB over HAProxy's, at most (issue 30)."""
FLOOR_THROUGHPUT_GOALS = {"default": 0.95}
"""kvproxy's MB/s over HAProxy's, at least (issue 30)."""
SCHEMA_TARGET = 0.9
"""`schema` (ids only) against `default`, same run."""


@dataclass
class VariantRun:
    """One measured run of one variant."""

    round: int
    topic: str
    mb_per_s: float
    seconds: float
    records: int
    client_cpu_s_per_gib: float
    broker_cpu_s_per_gib: float
    proxy_cpu_seconds: float | None
    proxy_cpu_s_per_gib: float | None
    proxy_rss_mib: float | None


def measure(
    variant: str,
    broker: BrokerUnderTest,
    proxy: RelayProcess | None,
    *,
    records: int,
    label: str,
    rnd: int,
    values: list[bytes] | None = None,
) -> VariantRun:
    """One checked run of `variant` to a fresh topic; the proxy's and broker's CPU during it."""
    topic = broker.create_topic(topic_name(variant, label))
    bootstrap = proxy.bootstrap if proxy else broker.bootstrap
    cpu0 = proxy.cpu_seconds() if proxy else 0.0
    broker_cpu0 = broker.cpu_seconds()
    run = produce(bootstrap, topic, records, values=values)
    broker_cpu = broker.cpu_seconds() - broker_cpu0
    proxy_cpu = proxy.cpu_seconds() - cpu0 if proxy else None
    check_run(run, f"{variant} {label}")
    gib = run.value_bytes / 2**30
    return VariantRun(
        round=rnd,
        topic=topic,
        mb_per_s=run.mb_per_s,
        seconds=run.seconds,
        records=run.records,
        client_cpu_s_per_gib=run.client_cpu_seconds / gib,
        broker_cpu_s_per_gib=broker_cpu / gib,
        proxy_cpu_seconds=proxy_cpu,
        proxy_cpu_s_per_gib=proxy_cpu / gib if proxy_cpu is not None else None,
        proxy_rss_mib=proxy.rss_bytes() / 2**20 if proxy else None,
    )


def summarize(
    runs: dict[str, list[VariantRun]], targets: dict[str, float], baseline: str
) -> dict[str, dict[str, Any]]:
    """Medians per variant, ratios against `baseline`'s median, with the target beside.

    The median of the per-round ratios (each run against the baseline's run of the same round)
    is kept too: a second reading, less moved by a slow stretch that spans whole rounds.
    """
    base = median([r.mb_per_s for r in runs[baseline]])
    summary: dict[str, dict[str, Any]] = {}
    for name, variant_runs in runs.items():
        mbs = median([r.mb_per_s for r in variant_runs])
        cpus = [r.proxy_cpu_s_per_gib for r in variant_runs if r.proxy_cpu_s_per_gib is not None]
        pairs = zip(variant_runs, runs[baseline], strict=True)
        round_ratios = [run.mb_per_s / base_run.mb_per_s for run, base_run in pairs]
        summary[name] = {
            "median_mb_per_s": mbs,
            "ratio_to_direct": mbs / base,
            "round_ratios": round_ratios,
            "median_round_ratio": median(round_ratios),
            "target": targets.get(name),
            "meets_target": mbs / base >= targets[name] if name in targets else None,
            "median_proxy_cpu_s_per_gib": median(cpus) if cpus else None,
            "median_broker_cpu_s_per_gib": median([r.broker_cpu_s_per_gib for r in variant_runs]),
            "median_client_cpu_s_per_gib": median([r.client_cpu_s_per_gib for r in variant_runs]),
        }
    return summary


def print_table(
    runs: dict[str, list[VariantRun]], summary: dict[str, dict[str, Any]], baseline: str
) -> None:
    """Every run's MB/s, then the medians, ratios, targets and CPU per GiB."""
    rounds = max(len(v) for v in runs.values())
    head = f"{'variant':<14}" + "".join(f"{'r' + str(i + 1):>8}" for i in range(rounds))
    print("\nMB/s per round (client side, 10^6 bytes of values per second)")
    print(head + f"{'median':>9}")
    for name, variant_runs in runs.items():
        cells = "".join(f"{r.mb_per_s:8.1f}" for r in variant_runs)
        print(f"{name:<14}{cells}{summary[name]['median_mb_per_s']:9.1f}")
    print(
        f"\n{'variant':<14}{'median MB/s':>12}{'/ ' + baseline:>10}{'target':>8}{'met':>6}"
        f"{'CPU s/GiB: proxy':>19}{'broker':>7}{'client':>7}  round ratios (median)"
    )
    for name, figures in summary.items():
        target = figures["target"]
        met = figures["meets_target"]
        cpu = figures["median_proxy_cpu_s_per_gib"]
        print(
            f"{name:<14}{figures['median_mb_per_s']:12.1f}{figures['ratio_to_direct']:10.2f}"
            f"{'>= ' + format(target, '.1f') if target else '-':>8}"
            f"{('yes' if met else 'NO') if met is not None else '-':>6}"
            f"{format(cpu, '.2f') if cpu is not None else '-':>19}"
            f"{figures['median_broker_cpu_s_per_gib']:7.2f}"
            f"{figures['median_client_cpu_s_per_gib']:7.2f}"
            f"  {' '.join(f'{x:.2f}' for x in figures['round_ratios'])}"
            f" ({figures['median_round_ratio']:.2f})"
        )
    print(
        f"(ratio = median MB/s / {baseline}'s median MB/s; round ratios = each run / {baseline}'s"
        " run of the same round)"
    )


def floor_rows(runs: dict[str, list[VariantRun]]) -> list[FloorRow]:
    """Each kvproxy variant against `haproxy` in the same run: CPU s/GiB and MB/s ratios."""

    def cpu(name: str) -> list[float]:
        return [r.proxy_cpu_s_per_gib or float("nan") for r in runs[name]]

    rows = []
    for name in ("default", "record-level", "schema"):
        if name not in runs:
            continue
        rows.append(
            against_floor(
                f"throughput, {name}: CPU s/GiB",
                cpu("haproxy"),
                cpu(name),
                at_most=FLOOR_CPU_GOALS.get(name),
            )
        )
        rows.append(
            against_floor(
                f"throughput, {name}: MB/s",
                [r.mb_per_s for r in runs["haproxy"]],
                [r.mb_per_s for r in runs[name]],
                at_least=FLOOR_THROUGHPUT_GOALS.get(name),
            )
        )
    return rows


def schema_vs_default(runs: dict[str, list[VariantRun]]) -> dict[str, Any]:
    """`schema` against `default` in the same run: medians and round by round."""
    schema_mbs = median([r.mb_per_s for r in runs["schema"]])
    default_mbs = median([r.mb_per_s for r in runs["default"]])
    pairs = zip(runs["schema"], runs["default"], strict=True)
    round_ratios = [run.mb_per_s / base.mb_per_s for run, base in pairs]
    ratio = schema_mbs / default_mbs
    cpu = [r.proxy_cpu_s_per_gib for r in runs["schema"] if r.proxy_cpu_s_per_gib is not None]
    return {
        "ratio": ratio,
        "round_ratios": round_ratios,
        "median_round_ratio": median(round_ratios),
        "target": SCHEMA_TARGET,
        "meets_target": ratio >= SCHEMA_TARGET,
        "median_proxy_cpu_s_per_gib": median(cpu) if cpu else None,
    }


def print_schema_ratio(extra: dict[str, Any]) -> None:
    figures = extra["schema_vs_default"]
    print(
        f"\nschema / default: {figures['ratio']:.2f} (target >= {SCHEMA_TARGET:g}: "
        f"{'met' if figures['meets_target'] else 'NOT MET'}); round ratios "
        f"{' '.join(f'{x:.2f}' for x in figures['round_ratios'])} "
        f"({figures['median_round_ratio']:.2f}); registry requests: "
        f"{extra['registry_requests']} by the end of the warm-up, "
        f"{extra['registry_requests_after_rounds']} after the rounds"
    )


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=200, help="MiB sent per run (default 200)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the three (default 5)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 20 MiB, 2 rounds")
    parser.add_argument(
        "--schema",
        action="store_true",
        help="add the `schema` variant (schema ids checked against a test registry)",
    )
    add_upstream_option(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.mib, args.rounds = 20, 2
    return args


def _measure_rounds(
    args: argparse.Namespace, variants: Variants, records: int
) -> dict[str, list[VariantRun]]:
    """A warm-up of every variant, then `--rounds` rounds of them in turn, each run printed."""
    broker, proxies, values = variants.broker, variants.proxies, variants.values
    runs: dict[str, list[VariantRun]] = {name: [] for name in proxies}
    for name, proxy in proxies.items():
        measure(
            name,
            broker,
            proxy,
            records=records_for(WARM_UP_MIB),
            label="warmup",
            rnd=0,
            values=values.get(name),
        )
    if variants.registry is not None:
        variants.schema_extra["registry_requests"] = len(variants.registry.requests)
    for rnd in range(1, args.rounds + 1):
        for name, proxy in proxies.items():
            run = measure(
                name,
                broker,
                proxy,
                records=records,
                label=f"r{rnd}",
                rnd=rnd,
                values=values.get(name),
            )
            runs[name].append(run)
            cpu = (
                f", proxy CPU {run.proxy_cpu_s_per_gib:.2f} s/GiB"
                if run.proxy_cpu_s_per_gib is not None
                else ""
            )
            print(
                f"  round {rnd}/{args.rounds} {name:<12} {run.mb_per_s:7.1f} MB/s "
                f"({run.seconds:.2f} s{cpu})",
                flush=True,
            )
    return runs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _arguments(argv)
    records = records_for(args.mib)
    started = time.monotonic()
    print(
        f"throughput: {records:,} records of {RECORD_BYTES} B ({args.mib:g} MiB) per run, "
        f"{args.rounds} rounds of direct"
        + " / haproxy" * (args.upstream == "kafka")
        + " / default / record-level"
        + " / schema" * args.schema,
        flush=True,
    )
    source = announce_source()
    with contextlib.ExitStack() as stack:
        variants = start_variants(stack, args)
        runs = _measure_rounds(args, variants, records)
    summary = summarize(runs, TARGETS, "direct")
    elapsed = time.monotonic() - started
    print_table(runs, summary, "direct")
    if variants.registry is not None:
        variants.schema_extra["schema_vs_default"] = schema_vs_default(runs)
        variants.schema_extra["registry_requests_after_rounds"] = len(variants.registry.requests)
        print_schema_ratio(variants.schema_extra)
    floor = floor_rows(runs) if "haproxy" in runs else []
    if floor:
        print_floor(floor)
    print(f"\ntook {elapsed:.0f} s")
    results: dict[str, Any] = {
        "settings": {
            "mib_per_run": args.mib,
            "records_per_run": records,
            "record_bytes": RECORD_BYTES,
            "rounds": args.rounds,
            "warm_up_mib": WARM_UP_MIB,
            "producer": PRODUCER_CONFIG,
            "record_level_rule": variants.rule,
            "partitions": 1,
            "upstream": args.upstream,
            "upstream_version": variants.broker.version,
            "floor": variants.floor_relay,
        },
        "source": source,
        "targets": TARGETS,
        "record_level_refusal": variants.refusal,
        "runs": {name: [asdict(r) for r in variant_runs] for name, variant_runs in runs.items()},
        "summary": summary,
        "against_floor": [asdict(row) for row in floor],
        "elapsed_seconds": round(elapsed, 1),
    }
    if args.schema:
        results["schema"] = variants.schema_extra
    write_results("throughput", results)
    return results


if __name__ == "__main__":
    main()
