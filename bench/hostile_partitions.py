"""Many partitions, many topics: what one Produce request naming a million empty partitions and
one Metadata request naming 100,000 topics cost `kvproxy serve`.

Each scenario runs a fresh Tansu broker and `kvproxy serve` from this file's checkout (default
checks, a quarantine journal in a temporary directory), with the other client of
`bench/hostile.py` (one small Produce at a time on its own connection from 127.0.0.2): its
longest wait while the hostile request is answered is how long the event loop was held.

    partitions   one Produce v8 (acks=1) naming one topic with 1,000,000 partitions, each with
                 null records (8 MB)
    metadata     one Metadata v12 request naming 100,000 topics that do not exist

Figures: the other client's p50 / p99 / max during the hostile request, the proxy's peak RSS
above idle (VmHWM), the hostile answer's size and what it said (Produce: the partitions and
their codes, read from the bytes; Metadata: the topics named), the proxy's log lines about the
journal. Bounded: `--timeout` seconds per scenario (default 300), after which the proxy is
stopped; `--partitions` and `--topics` change the sizes.

    .venv/bin/python -m bench.hostile_partitions [--scenarios partitions,metadata]
        [--partitions 1000000] [--topics 100000] [--timeout 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._brokers import create_topic, tansu
from bench._hostile_inputs import OTHER_TOPIC, framed
from bench._hostile_watch import OtherClient, proc_status
from bench._load import percentile
from bench._relays import start_proxy
from bench.hostile import Hostile, code_location, watching
from kvproxy.protocol.messages import METADATA, decode_response
from tests.harness.partitions import many_partitions_request
from tests.harness.requests import metadata_request

TOPIC = "hostile"
MIB = 1024 * 1024
GUARD = 8 * 1024 * MIB


def produce_v8_codes(answer: bytes) -> tuple[int, collections.Counter[int]]:
    """(partitions answered, count per error code) of a Produce v8 answer, read from its bytes
    (decoding a million partitions through the codec takes minutes)."""
    offset = 4  # correlation id
    codes: collections.Counter[int] = collections.Counter()
    (topics,) = struct.unpack_from(">i", answer, offset)
    offset += 4
    answered = 0
    for _ in range(topics):
        (name_size,) = struct.unpack_from(">h", answer, offset)
        offset += 2 + max(name_size, 0)
        (partitions,) = struct.unpack_from(">i", answer, offset)
        offset += 4
        for _ in range(partitions):
            _index, code = struct.unpack_from(">ih", answer, offset)
            offset += 4 + 2 + 8 * 3
            (errors,) = struct.unpack_from(">i", answer, offset)
            offset += 4
            for _ in range(max(errors, 0)):
                offset += 4
                offset = _skip_string(answer, offset)
            offset = _skip_string(answer, offset)
            codes[code] += 1
            answered += 1
    return answered, codes


def _skip_string(buf: bytes, offset: int) -> int:
    (size,) = struct.unpack_from(">h", buf, offset)
    return offset + 2 + max(size, 0)


def describe_answer(scenario: str, answer: bytes | None) -> str:
    if answer is None:
        return "connection closed"
    if scenario == "partitions":
        answered, codes = produce_v8_codes(answer)
        said = ", ".join(f"{n:,} x code {code}" for code, n in sorted(codes.items()))
        return f"{answered:,} partitions answered: {said}"
    body = decode_response(answer, METADATA, 12).body
    codes = collections.Counter(int(t.error_code) for t in body.topics)
    said = ", ".join(f"{n:,} x code {code}" for code, n in sorted(codes.items()))
    return f"{len(body.topics):,} topics answered: {said}"


def journal_lines(log: Path) -> list[str]:
    text = log.read_text(errors="replace") if log.exists() else ""
    return [line for line in text.splitlines() if "journal" in line and "ERROR" in line]


def run(scenario: str, count: int, timeout: float) -> dict[str, Any]:
    if scenario == "partitions":
        payload = many_partitions_request(8, {TOPIC: count}, correlation_id=1)
        request = f"Produce v8, 1 topic, {count:,} partitions of null records"
    else:
        names = [f"absent-{i:07d}" for i in range(count)]
        payload = metadata_request(12, 1, names)
        request = f"Metadata v12 naming {count:,} topics that do not exist"
    print(f"\n== {scenario}: {request}, {len(payload) / MIB:.1f} MiB", flush=True)
    with tempfile.TemporaryDirectory(prefix="kvbench-journal-") as journal, tansu() as server:
        extra = f"quarantine: {{dir: '{journal}'}}\n"
        with start_proxy(server.broker.bootstrap, extra_yaml=extra) as proxy:
            create_topic(server.broker.bootstrap, OTHER_TOPIC, 1)
            create_topic(server.broker.bootstrap, TOPIC, 1)
            pid = proxy.process.pid
            log = proxy.config_path.parent / "kvproxy.log"
            other = OtherClient(proxy.port, timeout + 60)
            with watching(pid, GUARD) as sampler:
                other.start()
                time.sleep(1.0)
                idle = sampler.rss()
                idle_hwm = proc_status(pid).get("VmHWM", 0)
                began = time.perf_counter()
                hostile = Hostile(proxy.port, time.monotonic() + timeout)
                answer: bytes | None = None
                try:
                    hostile.send(framed(payload, 1))
                    answer = hostile.read_frame()
                except TimeoutError:
                    print("   no answer before the timeout", flush=True)
                finally:
                    hostile.close()
                ended = time.perf_counter()
                time.sleep(0.5)  # the other client's requests in flight at the end come back
                during = sorted(other.latencies(began, ended))
                other.stop()
            peak = max(sampler.hwm, sampler.peak, idle_hwm)
            lines = journal_lines(log)
    row = {
        "scenario": scenario,
        "request": request,
        "request_bytes": len(payload),
        "seconds": ended - began,
        "idle_rss": idle,
        "peak_above_idle": peak - idle,
        "answer_bytes": len(answer) if answer is not None else None,
        "got": describe_answer(scenario, answer),
        "other_client": {
            "requests": len(during),
            "p50_ms": percentile(during, 0.5) * 1e3,
            "p99_ms": percentile(during, 0.99) * 1e3,
            "max_ms": (during[-1] if during else float("nan")) * 1e3,
            "error": other.error or None,
        },
        "journal_error_lines": len(lines),
        "journal_error_example": lines[0][-200:] if lines else None,
    }
    other_figures = row["other_client"]
    print(
        f"   took {row['seconds']:.1f} s; other client p50/p99/max "
        f"{other_figures['p50_ms']:.0f}/{other_figures['p99_ms']:.0f}/"
        f"{other_figures['max_ms']:.0f} ms over {other_figures['requests']} requests; peak RSS "
        f"+{row['peak_above_idle'] / MIB:.0f} MiB above idle; answer "
        f"{(row['answer_bytes'] or 0) / MIB:.1f} MiB: {row['got']}; journal ERROR lines "
        f"{row['journal_error_lines']}",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="partitions,metadata")
    parser.add_argument("--partitions", type=int, default=1_000_000)
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    where = code_location()
    print(f"many partitions and topics against {where['proxy_module']} ({where['commit']})")
    rows = []
    for scenario in [s.strip() for s in args.scenarios.split(",") if s.strip()]:
        if scenario not in ("partitions", "metadata"):
            parser.error(f"unknown scenario {scenario}")
        count = args.partitions if scenario == "partitions" else args.topics
        rows.append(run(scenario, count, args.timeout))
    if args.json is not None:
        args.json.write_text(json.dumps({"code": where, "rows": rows}, indent=2))
    return rows


if __name__ == "__main__":
    main()
