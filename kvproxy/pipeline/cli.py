"""`kvproxy audit`: backtest the proxy's policies on log segments, the quarantine, a live topic."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from datetime import UTC, datetime
from typing import Any

__all__ = ["add_commands", "parse_now"]

EXAMPLES = """\
examples:
  kvproxy audit -c kvproxy.yaml --input /var/lib/kafka/data --output audit/
  kvproxy audit -c kvproxy.yaml --input ./quarantine --output audit/
  kvproxy audit -c kvproxy.yaml --bootstrap kafka:9092 --topic orders \\
      --from 2026-11-01 --to 2026-11-02 --output audit/
  kvproxy audit -c kvproxy.yaml --master spark://spark-master:7077 \\
      --input hdfs:///kafka/tiered --output hdfs:///audits/orders
"""


def add_commands(subparsers: Any) -> None:
    """The audit's subcommand, `kvproxy audit`."""
    parser = subparsers.add_parser(
        "audit",
        help="run the policies over historical data on Spark (backtest, audit)",
        description=(
            "Run the proxy's policies over Kafka log segments, the quarantine journal and/or a "
            "live topic on Spark, and write violations/ (Parquet), summary.json and report.html."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-c", "--config", help="the proxy's YAML (defaults and topics are used)")
    parser.add_argument(
        "--input",
        nargs="+",
        action="extend",
        default=[],
        metavar="PATH",
        help="log directory, <topic>-<partition> folder, segment file or quarantine journal "
        "directory; local path or a URI Spark's workers can read (fsspec)",
    )
    parser.add_argument("--output", required=True, metavar="DIR", help="where results go")
    parser.add_argument(
        "--bootstrap",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a broker of the cluster: read --topic from it, and topic compaction for every "
        "audited topic the YAML does not mark",
    )
    parser.add_argument("--topic", action="append", default=[], help="a live topic to audit")
    parser.add_argument(
        "--from",
        dest="start",
        metavar="OFFSET|TIME",
        help="live topics: first offset, or an ISO 8601 time (default: earliest)",
    )
    parser.add_argument(
        "--to",
        dest="end",
        metavar="OFFSET|TIME",
        help="live topics: end offset (exclusive), or an ISO 8601 time (default: latest)",
    )
    parser.add_argument(
        "--sample", type=int, metavar="N", help="a quick look: check about N records in total"
    )
    parser.add_argument(
        "--now",
        metavar="MS|TIME",
        help="the time `timestamps` compares against (default: when the audit starts)",
    )
    parser.add_argument(
        "--master", default="local[*]", help="Spark master URL (default local[*], this machine)"
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting, e.g. --conf spark.executor.memory=4g (repeatable)",
    )
    logs = parser.add_mutually_exclusive_group()
    logs.add_argument(
        "--spark-logs",
        action="store_true",
        help="show Spark's own log lines and warnings on the console, among the audit's lines",
    )
    logs.add_argument(
        "--spark-log-file",
        metavar="FILE",
        help="where Spark's own log lines and warnings go (default: a new file in the temporary "
        "directory, named when the audit starts)",
    )
    parser.add_argument(
        "--range-mb",
        type=int,
        default=32,
        metavar="MB",
        help="size of the byte range one task checks (default 32)",
    )
    parser.add_argument(
        "--fail-on-violations",
        action="store_true",
        help="exit with status 3 when any violation is found (for CI gates)",
    )
    parser.set_defaults(func=run)


def parse_now(text: str) -> int:
    """Milliseconds since the epoch, from a number or an ISO 8601 time (naive = UTC)."""
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not a time: {text!r} (milliseconds or ISO 8601)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def spark_log_path(args: argparse.Namespace) -> str | None:
    """The file Spark's own output goes to; None with --spark-logs (the console)."""
    if args.spark_logs:
        return None
    if args.spark_log_file:
        return str(args.spark_log_file)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return os.path.join(tempfile.gettempdir(), f"kvproxy-audit-spark-{stamp}-{os.getpid()}.log")


def _fail(message: str, code: int = 2) -> int:
    print(f"kvproxy audit: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    from kvproxy.pipeline.job import AuditError, AuditRequest, run_audit  # noqa: PLC0415

    conf: dict[str, str] = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            return _fail(f"--conf takes KEY=VALUE, not {item!r}")
        conf[key] = value
    if args.sample is not None and args.sample <= 0:
        return _fail("--sample must be a positive number of records")
    if args.range_mb <= 0:
        return _fail("--range-mb must be positive")
    start = end = None
    try:
        now_ms = parse_now(args.now) if args.now is not None else None
        if args.start is not None or args.end is not None:
            from kvproxy.pipeline.live import parse_offset_spec  # noqa: PLC0415

            start, end = parse_offset_spec(args.start), parse_offset_spec(args.end)
    except ValueError as exc:
        return _fail(str(exc))
    bootstrap = tuple(s.strip() for item in args.bootstrap for s in item.split(",") if s.strip())
    request = AuditRequest(
        output=args.output,
        inputs=tuple(args.input),
        config=args.config,
        bootstrap=bootstrap,
        topics=tuple(args.topic),
        start=start,
        end=end,
        sample=args.sample,
        now_ms=now_ms,
        range_bytes=args.range_mb * 1024 * 1024,
        master=args.master,
        spark_conf=conf,
        spark_logs=spark_log_path(args),
    )
    try:
        summary = run_audit(request)
    except AuditError as exc:
        return _fail(str(exc))
    if summary["errors"]:
        return 1
    if args.fail_on_violations and summary["violations"]:
        return 3
    return 0
