"""How the audit report writes values: escaped text, counts, sizes, rates, durations, times."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from html import escape
from typing import Any

MAX_LABEL_CHARS = 28

SECOND_MS = 1000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS


def esc(value: Any) -> str:
    return escape(str(value), quote=True)


def as_int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def num(value: Any) -> str:
    return f"{as_int(value):,}"


def opt(value: Any) -> str:
    return "" if value is None else str(value)


def short(text: str) -> str:
    return text if len(text) <= MAX_LABEL_CHARS else text[: MAX_LABEL_CHARS - 1] + "…"


def sorted_counts(counts: Mapping[str, Any]) -> list[tuple[str, int]]:
    return sorted(((str(k), as_int(v)) for k, v in counts.items()), key=lambda kv: (-kv[1], kv[0]))


def byte_size(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            break
    return f"{value:.1f} {unit}"


def percent(part: int, whole: int) -> str:
    if whole <= 0:
        return "n/a"
    pct = part / whole * 100
    if pct == 0:
        return "0%"
    if 0 < pct < 0.01:
        return "<0.01%"
    return f"{pct:.2f}%" if pct < 10 else f"{pct:.1f}%"


def duration_text(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def span(ms: int) -> str:
    for unit_ms, one, many in (
        (DAY_MS, "day", "days"),
        (HOUR_MS, "hour", "hours"),
        (MINUTE_MS, "minute", "minutes"),
        (SECOND_MS, "second", "seconds"),
    ):
        if ms % unit_ms == 0:
            count = ms // unit_ms
            return one if count == 1 else f"{count} {many}"
    return f"{ms} ms"


def to_datetime(ms: Any) -> datetime | None:
    try:
        return datetime.fromtimestamp(int(ms) / 1000, tz=UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def utc(ms: Any, millis: bool = False) -> str:
    dt = to_datetime(ms)
    if dt is None:
        return str(ms)
    text = dt.strftime("%Y-%m-%d %H:%M:%S")
    if millis and dt.microsecond:
        text += f".{dt.microsecond // 1000:03d}"
    return text + " UTC"


def iso(value: Any) -> str:
    """An ISO 8601 stamp from summary.json, shown the same way as the millisecond ones."""
    if not value:
        return ""
    try:
        dt = datetime.fromisoformat(str(value))
    except ValueError:
        return str(value)
    if dt.tzinfo is not None:
        dt = dt.astimezone(UTC)
    return dt.strftime("%Y-%m-%d %H:%M:%S") + " UTC"
