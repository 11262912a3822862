"""The scenarios of bench/hostile.py: for each, what it sends (a Plan, built for the run's
Sizes) and what it is there to show."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench._hostile_inputs import (
    COMPACTED_TOPIC,
    GIB,
    KIB,
    MIB,
    TOPIC,
    Sizes,
    bad_timestamp_batch,
    compacted_batch,
    framed,
    legacy_gzip_wrapper,
    produce_request,
    snappy_zero_batch,
    zero_value_batch,
)
from kvproxy.protocol.compression import Codec


@dataclass(frozen=True)
class Plan:
    """What a scenario sends: `frames` on one connection, or `prefixes` bare size prefixes."""

    request: str
    partitions: int = 1
    topic: str = TOPIC
    version: int = 9
    frames: tuple[bytes, ...] = ()
    first_alone: bool = False
    prefixes: int = 0
    prefix_size: int = 0
    hold: float = 0.0


def repeated_frames(payload: bytes, times: int) -> tuple[bytes, ...]:
    return tuple(framed(payload, correlation_id) for correlation_id in range(1, times + 1))


def size_text(n: float) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def plan_zstd(partitions: int) -> Callable[[Sizes], Plan]:
    def plan(sizes: Sizes) -> Plan:
        count = sizes.partitions[partitions]
        batch = zero_value_batch(Codec.ZSTD, sizes.inflate)
        payload = produce_request(TOPIC, [batch] * count)
        return Plan(
            f"{size_text(len(payload))}, {count} partitions, each a zstd batch inflating to "
            f"{size_text(sizes.inflate)}",
            partitions=count,
            frames=repeated_frames(payload, 1),
        )

    return plan


def plan_gzip(sizes: Sizes) -> Plan:
    payload = produce_request(TOPIC, [zero_value_batch(Codec.GZIP, sizes.inflate)])
    return Plan(
        f"{size_text(len(payload))}: one gzip batch inflating to {size_text(sizes.inflate)}",
        frames=repeated_frames(payload, 1),
    )


def plan_compacted(sizes: Sizes) -> Plan:
    batch = compacted_batch(sizes.compacted_records, sizes.compacted_value)
    count = sizes.compacted_partitions
    payload = produce_request(COMPACTED_TOPIC, [batch] * count)
    return Plan(
        f"{size_text(len(payload))}, {count} partitions of {sizes.compacted_records:,} "
        f"{size_text(sizes.compacted_value)} records (zstd, the last key null, compacted topic), "
        f"sent {sizes.compacted_sends} times",
        partitions=count,
        topic=COMPACTED_TOPIC,
        frames=repeated_frames(payload, sizes.compacted_sends),
        first_alone=True,
    )


def plan_snappy(sizes: Sizes) -> Plan:
    payload = produce_request(TOPIC, [snappy_zero_batch(sizes.snappy_records, sizes.snappy_value)])
    plain = sizes.snappy_records * sizes.snappy_value
    return Plan(
        f"{size_text(len(payload))}: one xerial snappy batch of {size_text(plain)} "
        f"({sizes.snappy_records:,} records)",
        frames=repeated_frames(payload, 1),
    )


def plan_legacy(sizes: Sizes) -> Plan:
    payload = produce_request(TOPIC, [legacy_gzip_wrapper(sizes.legacy_messages)], version=2)
    return Plan(
        f"{size_text(len(payload))}, Produce v2: a magic 1 gzip wrapper of "
        f"{sizes.legacy_messages:,} inner messages ({size_text(34 * sizes.legacy_messages)})",
        version=2,
        frames=repeated_frames(payload, 1),
    )


def plan_timestamps(sizes: Sizes) -> Plan:
    payload = produce_request(TOPIC, [bad_timestamp_batch(sizes.bad_timestamps)])
    return Plan(
        f"{size_text(len(payload))}: one zstd batch of {sizes.bad_timestamps:,} records dated a "
        "day ahead",
        frames=repeated_frames(payload, 1),
    )


def plan_prefixes(sizes: Sizes) -> Plan:
    return Plan(
        f"{sizes.prefixes:,} connections, each sending only a size prefix of "
        f"{size_text(sizes.prefix_size)}, held {sizes.prefix_hold:g} s",
        prefixes=sizes.prefixes,
        prefix_size=sizes.prefix_size,
        hold=sizes.prefix_hold,
    )


def plan_target(sizes: Sizes) -> Plan:
    count = sizes.partitions[2]
    payload = produce_request(TOPIC, [zero_value_batch(Codec.ZSTD, sizes.inflate)] * count)
    return Plan(
        f"{size_text(len(payload))}, {count} partitions of zstd inflating to "
        f"{size_text(sizes.inflate)} each, {sizes.target_repeats} times back to back",
        partitions=count,
        frames=repeated_frames(payload, sizes.target_repeats),
    )


@dataclass(frozen=True)
class Scenario:
    name: str
    plan: Callable[[Sizes], Plan]
    timeout: float


SCENARIOS = (
    Scenario("zstd-5", plan_zstd(0), 180),
    Scenario("zstd-20", plan_zstd(1), 300),
    Scenario("zstd-60", plan_zstd(2), 600),
    Scenario("gzip-bomb", plan_gzip, 180),
    Scenario("compacted-null-key", plan_compacted, 900),
    Scenario("snappy-1gib", plan_snappy, 600),
    Scenario("legacy-gzip", plan_legacy, 300),
    Scenario("bad-timestamps", plan_timestamps, 300),
    Scenario("size-prefixes", plan_prefixes, 180),
    Scenario("target", plan_target, 1200),
)
