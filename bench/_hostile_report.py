"""The report of the hostile benchmarks: one line per scenario as it ends, and the table of all."""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from typing import Any

from bench._hostile_scenarios import (
    size_text,
)


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}"


def blocked(row: dict[str, Any]) -> str:
    other = row["other_client"]
    text = "-" if math.isnan(other["max_ms"]) else f"{other['max_ms'] / 1e3:,.2f} s"
    if row["loop_lag_max_s"] is not None:
        text += f" (lag metric {row['loop_lag_max_s']:.2f} s)"
    elif row["loop_lag_histogram"] is not None:
        text += f" (lag metric {row['loop_lag_histogram']})"
    return text


def answer_sizes(row: dict[str, Any]) -> str:
    sizes = collections.Counter(size_text(a["size"]) for a in row["answers"])
    if not sizes:
        return "-"
    return ", ".join(f"{n} x {size}" if n > 1 else size for size, n in sizes.items())


def print_row(row: dict[str, Any]) -> None:
    other = row["other_client"]
    print(
        f"   peak RSS {size_text(row['peak_rss'])} (+{size_text(row['peak_above_idle'])} above "
        f"idle {size_text(row['idle_rss'])}); other client p50/p99/max {_ms(other['p50_ms'])}/"
        f"{_ms(other['p99_ms'])}/{_ms(other['max_ms'])} ms over {other['requests']} requests "
        f"(p50 {other['p50_before_ms']:.1f} ms before); loop blocked {blocked(row)}; Tansu "
        f"CPU {row['tansu_cpu_seconds']:.1f} s",
        flush=True,
    )
    print(f"   got: {row['got']}; answer {answer_sizes(row)}; took {row['seconds']:.1f} s")
    for note in row["notes"]:
        print(f"   note: {note}")


def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| scenario | request | proxy peak RSS (above idle) | event loop blocked | other "
        "client's p50 / p99 / max (ms) | what the hostile client got | answer size |",
        "|---|---|---|---|---|---|---|",
    ]
    notes: list[str] = []
    for row in rows:
        other = row["other_client"]
        got = row["got"] + (" (well formed)" if row["well_formed"] else "")
        lines.append(
            f"| {row['scenario']} | {row['request']} | {size_text(row['peak_rss'])} "
            f"(+{size_text(row['peak_above_idle'])}) | {blocked(row)} | {_ms(other['p50_ms'])} / "
            f"{_ms(other['p99_ms'])} / {_ms(other['max_ms'])} | {got} | {answer_sizes(row)} |"
        )
        notes += [f"- {row['scenario']}: {note}" for note in row["notes"]]
    return "\n".join(lines + (["", *notes] if notes else []))
