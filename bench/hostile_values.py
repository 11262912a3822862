"""Hostile values through the content checks: what a parser costs on one large value a tiny
compressed batch delivers, and what it keeps afterwards.

Each scenario runs in a fresh subprocess: it reads a zstd batch (a few KB, written by this
process), configures one policy, resets the kernel's peak-RSS mark (`/proc/self/clear_refs`),
calls `validate` once (the time it takes is how long the event loop, or the decoding thread,
is held), then drops the batch and verdict and collects garbage. Figures: the verdict and first
record error, seconds in `validate`, peak RSS above the RSS before the call, and RSS still
above it afterwards (what a parser kept).

    json-60mib         `json`: one 60 MiB array of small objects (valid JSON)
    json-60mib-bigint  `json`: the same with a 65-bit integer at its end (simdjson declines it)
    json-8mib-bigint   `json`: an 8 MiB array with a 65-bit integer at its end
    json-schema-60mib  `json_schema` ({"type": "array"}): the 60 MiB array
    avro-60mib         `avro` (an array of records of an int and a string): a 60 MiB datum
    avro-declared      `avro` (a string, an array of longs, a map of strings): 10-byte values
                       declaring 2^31 characters, items and entries
    innocent           `json`: one batch of 100 records of 1 KiB (the baseline)

    .venv/bin/python -m bench.hostile_values [--scenarios json-60mib,...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvproxy.protocol.compression import Codec
from kvproxy.protocol.records import build_batch

ROOT = Path(__file__).resolve().parents[1]

MIB = 1 << 20
ITEM = b'{"id":1234,"name":"abcdef","tags":[1,2,3]},'
BIG_INTEGER = b"36893488147419103232"  # 2**65
AVRO_SCHEMA = {
    "type": "array",
    "items": {
        "type": "record",
        "name": "Item",
        "fields": [{"name": "id", "type": "int"}, {"name": "name", "type": "string"}],
    },
}


def json_array(size: int, last: bytes = b"0") -> bytes:
    """A JSON array of small objects of about `size` bytes, ending with `last`."""
    return b"[" + ITEM * (size // len(ITEM)) + last + b"]"


def zigzag(number: int) -> bytes:
    """An Avro long: zigzag, then a varint."""
    encoded = (number << 1) ^ (number >> 63)
    out = bytearray()
    while encoded > 0x7F:
        out.append(encoded & 0x7F | 0x80)
        encoded >>= 7
    out.append(encoded)
    return bytes(out)


def avro_array(size: int) -> bytes:
    """An Avro datum of AVRO_SCHEMA of about `size` bytes: one block of items."""
    item = zigzag(1234) + zigzag(6) + b"abcdef"
    count = size // len(item)
    return zigzag(count) + item * count + zigzag(0)


def scenarios() -> dict[str, tuple[str, dict[str, Any], list[bytes]]]:
    """name -> (policy, options, record values)."""
    schema = {"type": "array"}
    return {
        "json-60mib": ("json", {}, [json_array(60 * MIB)]),
        "json-60mib-bigint": ("json", {}, [json_array(60 * MIB, BIG_INTEGER)]),
        "json-8mib-bigint": ("json", {}, [json_array(8 * MIB, BIG_INTEGER)]),
        "json-schema-60mib": ("json_schema", {"value": schema}, [json_array(60 * MIB)]),
        "avro-60mib": ("avro", {"value": AVRO_SCHEMA}, [avro_array(60 * MIB)]),
        "avro-declared": (
            "avro",
            {"value": {"type": "array", "items": "long"}},
            [zigzag(2**31) + b"\x02" * 4],
        ),
        "innocent": ("json", {}, [json_array(1024)] * 100),
    }


CHILD = r"""
import gc, json, resource, sys, time
from pathlib import Path
from kvproxy.policies.api import PolicyContext
from kvproxy.policies.plugins import find_factory
from tests.harness.produced import produced

def rss():
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()

def hwm():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")

name, options_file, batch_file = sys.argv[1:4]
options = json.loads(Path(options_file).read_text())
for key, value in list(options.items()):
    if isinstance(value, dict):  # a schema: written to a file next to the batch
        path = Path(batch_file).with_suffix(".schema")
        path.write_text(json.dumps(value))
        options[key] = str(path)
raw = Path(batch_file).read_bytes()
policy = find_factory(name)(PolicyContext())
policy.configure(options)
policy.validate("t", 0, produced(raw))  # warm: every lazy import and first allocation
gc.collect()
before = rss()
Path("/proc/self/clear_refs").write_text("5")
batch = produced(raw)
began = time.perf_counter()
verdict = policy.validate("t", 0, batch)
seconds = time.perf_counter() - began
peak = hwm()
errors = [e.message for e in verdict.record_errors]
code = verdict.code
del batch, verdict
gc.collect()
after = rss()
print(json.dumps({
    "code": code, "errors": len(errors), "first_error": errors[0][:300] if errors else None,
    "seconds": seconds, "peak_mib": (peak - before) / 2**20, "after_mib": (after - before) / 2**20,
    "rss_before_mib": before / 2**20,
}))
"""


def run(name: str, policy: str, options: dict[str, Any], values: list[bytes]) -> dict[str, Any]:
    batch = build_batch([(None, value, None, None) for value in values], codec=Codec.ZSTD)
    with tempfile.TemporaryDirectory() as folder:
        batch_file = Path(folder) / "batch.bin"
        batch_file.write_bytes(batch)
        options_file = Path(folder) / "options.json"
        options_file.write_text(json.dumps(options))
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", CHILD, policy, str(options_file), str(batch_file)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"{name}: {done.stderr[-2000:]}")
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    row.update(
        scenario=name,
        batch_bytes=len(batch),
        value_bytes=max(map(len, values)),
        wall_s=time.monotonic() - began,
    )
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | batch | largest value | verdict | validate | peak RSS | RSS after |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        verdict = "accepted" if r["code"] == 0 else f"code {r['code']}, {r['errors']} error(s)"
        lines.append(
            f"| {r['scenario']} | {r['batch_bytes']:,} B | {r['value_bytes'] / MIB:.1f} MiB | "
            f"{verdict} | {r['seconds']:.3f} s | +{r['peak_mib']:.0f} MiB | "
            f"+{r['after_mib']:.0f} MiB |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    known = scenarios()
    parser.add_argument("--scenarios", default=",".join(known), help="comma-separated names")
    parser.add_argument("--json", type=Path, help="write every figure here too")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.scenarios.split(",") if name.strip()]
    rows = []
    for name in chosen:
        policy, options, values = known[name]
        row = run(name, policy, options, values)
        print(f"{name}: {json.dumps(row)}", flush=True)
        rows.append(row)
    print("\n" + table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
