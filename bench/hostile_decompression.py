"""Decompression bombs in flight together: the other client's latency while they are decoded.

`bench/hostile.py` sends one hostile request at a time; here three are in flight at once
(pipelined on one connection), so the decoding thread is never idle while the other client
keeps producing. The figures and the proxy are those of `bench/hostile.py` (its docstring).

    zstd-60-x3      three Produce requests of 60 partitions, each a zstd batch of one record of
                    60 MiB of zeros (about 2 KB compressed)
    gzip-bomb-x3    three Produce requests of one gzip batch of 60 MiB of zeros (about 60 KB)
    zstd-window     one Produce request of 60 partitions, each a 40-byte zstd frame declaring a
                    128 MiB window (what the decoder allocates unless it is charged first)

    .venv/bin/python -m bench.hostile_decompression [--scenarios zstd-60-x3,gzip-bomb-x3]
        [--json out.json] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crc32c

from bench import hostile
from bench._hostile_inputs import FULL, GIB, SMOKE, TOPIC, Sizes, produce_request, zero_value_batch
from bench._hostile_report import table
from bench._hostile_scenarios import Plan, Scenario, repeated_frames, size_text
from kvproxy.protocol.compression import Codec
from kvproxy.protocol.records import build_batch
from kvproxy.protocol.records.layout import V2_ATTRIBUTES_POS, V2_HEADER_SIZE

IN_FLIGHT = 3


def plan_bombs(codec: Codec, partitions: int) -> Callable[[Sizes], Plan]:
    def plan(sizes: Sizes) -> Plan:
        count = partitions if sizes is FULL else 2
        batch = zero_value_batch(codec, sizes.inflate)
        payload = produce_request(TOPIC, [batch] * count)
        return Plan(
            f"{IN_FLIGHT} requests in flight, each {size_text(len(payload))}: {count} "
            f"partitions of a {codec.name.lower()} batch inflating to "
            f"{size_text(sizes.inflate)}",
            partitions=count,
            frames=repeated_frames(payload, IN_FLIGHT),
        )

    return plan


def window_frame(window_log: int, content: bytes) -> bytes:
    """A zstd frame that declares a window of 2**window_log bytes (no content size, no
    checksum) and holds `content` in one raw block."""
    magic = b"\x28\xb5\x2f\xfd"
    descriptor = b"\x00"  # no content size, not single segment, no checksum, no dictionary
    window = bytes([(window_log - 10) << 3])
    last_raw_block = (len(content) << 3 | 1).to_bytes(3, "little")
    return magic + descriptor + window + last_raw_block + content


def window_batch(window_log: int) -> bytes:
    """A zstd batch of one 1-byte record whose frame declares a 2**window_log byte window."""
    plain = build_batch([(None, b"x", None, None)], codec=Codec.NONE)
    header = bytearray(plain[:V2_HEADER_SIZE])
    body = header + window_frame(window_log, plain[V2_HEADER_SIZE:])
    struct.pack_into(">i", body, 8, len(body) - 12)  # batch length
    attributes = struct.unpack_from(">h", body, V2_ATTRIBUTES_POS)[0] | Codec.ZSTD
    struct.pack_into(">h", body, V2_ATTRIBUTES_POS, attributes)
    struct.pack_into(">I", body, 17, crc32c.crc32c(bytes(body[V2_ATTRIBUTES_POS:])))
    return bytes(body)


def plan_window(sizes: Sizes) -> Plan:
    count = 60 if sizes is FULL else 2
    payload = produce_request(TOPIC, [window_batch(27)] * count)
    return Plan(
        f"{size_text(len(payload))}, {count} partitions, each a zstd frame declaring a "
        "128 MiB window",
        partitions=count,
        frames=repeated_frames(payload, 1),
    )


SCENARIOS = (
    Scenario("zstd-60-x3", plan_bombs(Codec.ZSTD, 60), 900),
    Scenario("gzip-bomb-x3", plan_bombs(Codec.GZIP, 1), 300),
    Scenario("zstd-window", plan_window, 180),
)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = [s.name for s in SCENARIOS]
    parser.add_argument("--scenarios", default=",".join(names), help="comma-separated names")
    parser.add_argument("--json", type=Path, help="write every figure here too")
    parser.add_argument("--memory-guard-gib", type=float, default=8.0)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the bench runs")
    args = parser.parse_args(argv)
    chosen = {name.strip() for name in args.scenarios.split(",") if name.strip()}
    sizes = SMOKE if args.smoke else FULL
    where = hostile.code_location()
    print(f"decompression bombs against {where['proxy_module']} (commit {where['commit']})")
    began = time.monotonic()
    rows = [
        hostile.run_scenario(s, sizes, int(args.memory_guard_gib * GIB), None)
        for s in SCENARIOS
        if s.name in chosen
    ]
    print("\n" + table(rows))
    print(f"\ntook {time.monotonic() - began:.0f} s")
    if args.json is not None:
        args.json.write_text(json.dumps({"code": where, "rows": rows}, indent=2))
    return rows


if __name__ == "__main__":
    main()
