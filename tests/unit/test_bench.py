"""The benchmark suite still runs: `make bench`'s driver on the engine benchmark, smoke-sized.

The network benchmarks need a broker and minutes; the engine one runs in seconds and exercises
the same public calls the proxy makes per request (parse_records, the chains, decode_request,
ProduceEngine.decide), so an API change that would break `make bench` fails here first.

bench/hostile.py builds its decompression bombs by hand; they are checked here against the
project's own reader (a bomb the proxy refused as malformed would measure nothing), and so are
its reading of answers and of the loop-lag metric.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.types import TopicName
from kio.static.primitive import i32, i32Timedelta, i64

from bench import producer_perf, run_all
from bench._hostile_inputs import XerialWriter, legacy_gzip_wrapper, read_answer, snappy_zero_batch
from bench._hostile_watch import lag_figures
from kvproxy.protocol.compression import Codec, compress, decompress
from kvproxy.protocol.messages import encode_response, make_response
from kvproxy.protocol.records import read_batch

ROOT = Path(__file__).resolve().parents[2]


def test_run_all_quick_engine_writes_its_figures(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench.run_all", "--quick", "--only", "engine"],
        cwd=ROOT,
        env={**os.environ, "KVPROXY_BENCH_RESULTS": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1/1 ran" in result.stdout
    figures = json.loads((tmp_path / "engine.json").read_text())
    assert figures["benchmark"] == "engine"
    assert figures["machine"]["cpus"] >= 1
    report = (tmp_path / "latest.md").read_text()
    assert "## 4. Validation engine alone" in report
    assert "record-level checks" in report


def test_schema_bench_quick_writes_every_row(tmp_path: Path) -> None:
    """bench/schema.py (not in `make bench`) on the schema policy and a StaticCatalog."""
    result = subprocess.run(
        [sys.executable, "-m", "bench.schema", "--quick"],
        cwd=ROOT,
        env={**os.environ, "KVPROXY_BENCH_RESULTS": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads((tmp_path / "schema.json").read_text())
    rows = {(row["name"], row["input"].split(",")[0]) for row in figures["rows"]}
    assert rows == {
        ("schema ids", "16 KiB"),
        ("schema ids", "1 MiB"),
        ("schema payload avro", "16 KiB"),
        ("schema payload json", "16 KiB"),
        ("schema payload protobuf", "16 KiB"),
    }
    assert all(row["records_per_s"] > 0 for row in figures["rows"])


# ---- bench/hostile.py: its hand-built inputs are what they claim, its readings parse ----


def test_the_xerial_writer_frames_as_the_proxy_codec_does() -> None:
    writer = XerialWriter()
    writer.write(b"head")
    writer.zeros(100_000)  # whole zero blocks take the shortcut
    writer.write(b"tail")
    plain = b"head" + bytes(100_000) + b"tail"
    assert writer.plain_bytes == len(plain)
    stream = writer.finish()
    assert stream == compress(Codec.SNAPPY, plain)
    assert decompress(Codec.SNAPPY, stream) == plain


def test_the_snappy_bomb_is_a_valid_batch_of_zero_records() -> None:
    batch, end = read_batch(snappy_zero_batch(3, 100_000))
    assert end == batch.size
    assert (batch.magic, batch.codec, batch.record_count) == (2, Codec.SNAPPY, 3)
    assert batch.crc_valid()
    records = list(batch.records())
    assert [(r.offset_delta, r.key, r.value) for r in records] == [
        (i, None, bytes(100_000)) for i in range(3)
    ]


def test_the_legacy_wrapper_holds_every_inner_message() -> None:
    batch, _ = read_batch(legacy_gzip_wrapper(1000))
    assert (batch.magic, batch.codec, batch.base_offset) == (1, Codec.GZIP, 999)
    assert batch.crc_valid() and batch.inner_crcs_valid()
    records = list(batch.records())
    assert [(r.offset_delta, r.key, r.value) for r in records] == [
        (i, None, b"") for i in range(1000)
    ]


def test_a_produce_answer_is_summarised_and_checked() -> None:
    schema = importlib.import_module("kio.schema.produce.v9.response")

    def part(index: int, code: ErrorCode, errors: int) -> Any:
        return schema.PartitionProduceResponse(
            index=i32(index),
            error_code=code,
            base_offset=i64(-1),
            log_append_time=None,
            log_start_offset=i64(-1),
            record_errors=tuple(
                schema.BatchIndexAndErrorMessage(batch_index=i32(i), batch_index_error_message="x")
                for i in range(errors)
            ),
            error_message="bad" if errors else None,
        )

    body = schema.ProduceResponse(
        responses=(
            schema.TopicProduceResponse(
                name=TopicName("hostile"),
                partition_responses=(part(0, ErrorCode.none, 0), part(1, ErrorCode(87), 2)),
            ),
        ),
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
    )
    payload = encode_response(0, 9, make_response(0, 9, 7, body))
    answer = read_answer(payload, 9, 7, "hostile", 2)
    assert answer.well_formed, answer.problem
    assert answer.said() == "1 x NONE (0), 1 x INVALID_RECORD (87), 2 record errors"
    assert answer.size == len(payload)
    assert read_answer(payload, 9, 8, "hostile", 2).said() == (
        "malformed answer (correlation id 7, sent 8)"
    )
    assert read_answer(payload, 9, 7, "hostile", 3).problem == ("answers 2 partitions, 3 were sent")
    assert (
        read_answer(payload[:-3], 9, 7, "hostile", 2)
        .said()
        .startswith("malformed answer (does not decode")
    )


def test_the_loop_lag_is_read_from_metrics_when_the_proxy_has_it() -> None:
    histogram = "".join(
        f'kvproxy_event_loop_lag_seconds_bucket{{le="{le}"}} {n}\n'
        for le, n in (("1.0", 5.0), ("2.5", 5.0), ("5.0", 6.0), ("+Inf", 6.0))
    )
    text = histogram + "kvproxy_event_loop_lag_seconds_count 6.0\n"
    assert lag_figures(text) == (None, "2.5-5 s")
    assert lag_figures(text + "kvproxy_event_loop_lag_max_seconds 3.25\n") == (
        3.25,
        "2.5-5 s",
    )
    beyond = text.replace('le="+Inf"} 6.0', 'le="+Inf"} 7.0').replace("count 6.0", "count 7.0")
    assert lag_figures(beyond) == (None, "> 5 s")
    assert lag_figures("kvproxy_requests_total 3.0\n") == (None, None)
    assert lag_figures(None) == (None, None)


def test_the_hostile_bench_refuses_an_unknown_scenario() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench.hostile", "--scenarios", "zstd-5,nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "unknown scenarios ['nope']" in result.stderr
    assert "zstd-5, zstd-20, zstd-60, gzip-bomb" in result.stderr


# ---- bench/producer_perf.py: reading kafka-producer-perf-test's output ----

PERF_OUTPUT = """\
Option --producer-props has been deprecated and will be removed in a future version.
[2026-11-26 16:49:54,846] INFO [Producer clientId=perf-producer-client] Instantiated an \
idempotent producer. (org.apache.kafka.clients.producer.KafkaProducer)
40276 records sent, 8052.0 records/sec (7.86 MB/sec), 2163.9 ms avg latency, 2716.0 ms max \
latency.
[2026-11-26 16:50:01,261] INFO [Producer clientId=perf-producer-client] Closing the Kafka \
producer with timeoutMillis = 9223372036854775807 ms.
100000 records sent, 13090.718680 records/sec (12.78 MB/sec), 1762.25 ms avg latency, 2716.00 \
ms max latency, 1702 ms 50th, 2636 ms 95th, 2686 ms 99th, 2712 ms 99.9th.
"""
"""What ProducerPerformance of Kafka 4.4.0 printed for 100,000 records of 1 KiB (abridged)."""

PERF_WARM_UP_OUTPUT = """\
Warmup first 20000 records. Steady state results will print after the complete test summary.
1516 records sent, 301.3 records/sec (0.29 MB/sec), 1270.5 ms avg latency, 2142.0 ms max latency.
In steady state.
18120 records sent, 3596.7 records/sec (3.51 MB/sec), 15780.0 ms avg latency, 17613.0 ms max \
latency.
60000 records sent, 1795.170990 records/sec (1.75 MB/sec), 11641.26 ms avg latency, 17613.00 ms \
max latency, 11947 ms 50th, 17336 ms 95th, 17575 ms 99th, 17597 ms 99.9th.
40000 steady state records sent, 1596.678908 records/sec (1.56 MB/sec), 13547.27 ms avg latency, \
17613.00 ms max latency, 14105 ms 50th, 17444 ms 95th, 17579 ms 99th, 17598 ms 99.9th.
"""
"""The same tool with `--warmup-records 20000` (60,000 records): a second, steady-state summary."""


def test_the_perf_summary_is_read_and_progress_lines_are_not() -> None:
    summary = producer_perf.parse_summary(PERF_OUTPUT)
    assert summary == producer_perf.PerfSummary(
        records=100_000,
        records_per_s=13090.71868,
        mb_per_s=12.78,
        avg_ms=1762.25,
        max_ms=2716.0,
        p50_ms=1702,
        p95_ms=2636,
        p99_ms=2686,
        p999_ms=2712,
    )


def test_the_whole_run_and_the_steady_state_are_told_apart() -> None:
    whole = producer_perf.parse_summary(PERF_WARM_UP_OUTPUT)
    steady = producer_perf.parse_summary(PERF_WARM_UP_OUTPUT, steady_state=True)
    assert (whole.records, whole.records_per_s, whole.p99_ms) == (60_000, 1795.17099, 17575)
    assert (steady.records, steady.records_per_s, steady.p50_ms) == (40_000, 1596.678908, 14105)
    with pytest.raises(ValueError, match="no ProducerPerformance steady-state summary"):
        producer_perf.parse_summary(PERF_OUTPUT, steady_state=True)


def test_a_run_that_did_not_finish_has_no_summary() -> None:
    """Progress lines alone (the tool killed, or stuck until its timeout) are no result."""
    cut = PERF_OUTPUT.rsplit("100000 records sent", 1)[0]
    with pytest.raises(ValueError, match="no ProducerPerformance summary line"):
        producer_perf.parse_summary(cut)
    nan = "0 records sent, NaN records/sec (NaN MB/sec), NaN ms avg latency, NaN ms max latency, "
    empty = producer_perf.parse_summary(nan + "0 ms 50th, 0 ms 95th, 0 ms 99th, 0 ms 99.9th.\n")
    assert empty.records == 0


def test_a_send_that_failed_is_found_in_the_output() -> None:
    failed = PERF_OUTPUT + (
        "org.apache.kafka.common.InvalidRecordException: One or more records have been rejected\n"
        "[2026-11-26 16:50:02,000] ERROR [Producer clientId=perf-producer-client] boom\n"
    )
    assert producer_perf.tool_errors(PERF_OUTPUT) == []
    assert len(producer_perf.tool_errors(failed)) == 2


def test_the_perf_command_is_kafka_tools_producer_performance() -> None:
    command = producer_perf.perf_command("127.0.0.1:9", "t", 1000, 1024, ["acks=all", "x=1"])
    tail = command[command.index(producer_perf.MAIN_CLASS) :]
    assert tail == [
        "org.apache.kafka.tools.ProducerPerformance",
        "--topic",
        "t",
        "--num-records",
        "1000",
        "--record-size",
        "1024",
        "--throughput",
        "-1",
        "--bootstrap-server",
        "127.0.0.1:9",
        "--command-property",
        "acks=all",
        "x=1",
    ]
    assert command[command.index("-cp") + 1].endswith("/4.4.0/*")


def test_run_all_passes_upstream_only_to_benchmarks_that_take_it() -> None:
    """`bench.run_all --upstream` goes to 1, 2 and 3; each of them must accept it."""
    names = {name for name, _ in run_all.BENCHMARKS}
    assert {"throughput", "request_rate", "latency"} == run_all.WITH_UPSTREAM
    assert names >= run_all.WITH_UPSTREAM
    for name in sorted(run_all.WITH_UPSTREAM):
        shown = subprocess.run(
            [sys.executable, "-m", f"bench.{name}", "--help"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert shown.returncode == 0, shown.stderr
        assert "--upstream {kafka,tansu}" in shown.stdout, name
