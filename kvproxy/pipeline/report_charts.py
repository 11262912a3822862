"""The audit report's SVG charts (horizontal bars, the violations timeline) and policy colours."""

from __future__ import annotations

import colorsys
import math
from collections.abc import Mapping, Sequence
from typing import Any

from kvproxy.pipeline.report_format import (
    DAY_MS,
    MINUTE_MS,
    as_int,
    esc,
    num,
    short,
    sorted_counts,
    span,
    to_datetime,
    utc,
)

# Tableau 10 without its grey, which is kept for "others" bars; more policies get generated hues.
PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
)
OTHERS_COLOUR = "#b8bec6"
TOPIC_COLOUR = "#5b6b7f"  # topics are not policies: a neutral colour so no policy is implied

MAX_BARS = 20  # bars per horizontal chart; the rest are folded into one "others" bar
MAX_TIME_SLOTS = 500  # beyond this a to-scale time axis would make bars thinner than a pixel


def hbar_chart(
    chart_id: str, label: str, rows: Sequence[tuple[str, int, str, str | None]], noun: str
) -> str:
    """Horizontal bars, biggest first; past MAX_BARS the rest become one grey bar."""
    if len(rows) > MAX_BARS:
        rest = rows[MAX_BARS - 1 :]
        others = (f"{len(rest)} other {noun}", sum(r[1] for r in rest), OTHERS_COLOUR, None)
        rows = [*rows[: MAX_BARS - 1], others]
    width, row_h, bar_h, pad = 520, 24, 16, 4
    label_w = min(210, max(60, max(len(short(r[0])) for r in rows) * 7 + 12))
    value_w = 64
    plot_w = width - label_w - value_w
    height = pad * 2 + row_h * len(rows)
    top = max(r[1] for r in rows) or 1
    out = [_svg_open(chart_id, label, width, height)]
    for i, (name, count, colour, policy) in enumerate(rows):
        y = pad + i * row_h
        w = count / top * plot_w if count > 0 else 0.0
        w = max(w, 1.0) if count > 0 else 0.0
        data = f' data-policy="{esc(policy)}"' if policy is not None else ""
        out.append(
            f"<g><title>{esc(name)}: {num(count)}</title>"
            f'<text x="{label_w - 8}" y="{y + row_h / 2:.1f}" dy="0.35em" text-anchor="end">'
            f"{esc(short(name))}</text>"
            f'<rect x="{label_w}" y="{y + (row_h - bar_h) / 2:.1f}" width="{w:.1f}" '
            f'height="{bar_h}" rx="2" fill="{colour}"{data} />'
            f'<text class="value" x="{label_w + w + 6:.1f}" y="{y + row_h / 2:.1f}" dy="0.35em">'
            f"{num(count)}</text></g>\n"
        )
    out.append("</svg>\n")
    return "".join(out)


def timeline_chart(
    timeline: Mapping[str, Any], colours: Mapping[str, str], *, violations: int | None = None
) -> str:
    """Stacked bars of violations per policy per time bucket, one group per bucket, and a note
    counting the violations that have no record timestamp and so no place on it."""
    bucket_ms = as_int(timeline.get("bucket_ms"))
    merged: dict[int, dict[str, int]] = {}
    for bucket in timeline.get("buckets") or []:
        counts = merged.setdefault(as_int(bucket.get("start_ms")), {})
        for policy, n in (bucket.get("counts") or {}).items():
            counts[str(policy)] = counts.get(str(policy), 0) + as_int(n)
    timed = sum(sum(counts.values()) for counts in merged.values())
    untimed = as_int(timeline.get("untimed"))
    if violations is not None:
        untimed = max(untimed, violations - timed)
    if not merged:
        count = f" ({num(untimed)})" if untimed else ""
        return (
            f'<p class="empty untimed" data-untimed="{untimed}">No violation{count} had a record '
            "timestamp, so there is no timeline.</p>\n"
        )
    starts = sorted(merged)
    to_scale = bucket_ms > 0 and (starts[-1] - starts[0]) // bucket_ms < MAX_TIME_SLOTS
    slots = [(s - starts[0]) // bucket_ms for s in starts] if to_scale else list(range(len(starts)))
    n_slots = slots[-1] + 1

    policies = [p for p in colours if any(p in merged[s] for s in starts)]
    totals = [sum(merged[s].values()) for s in starts]
    step, y_max = _nice_axis(max(totals))

    width, height = 1000, 280
    left, right, top, bottom = 56, 16, 12, 48
    plot_w, plot_h = width - left - right, height - top - bottom
    slot_w = plot_w / n_slots
    bar_w = min(slot_w * 0.8, 72.0)

    def y_of(value: float) -> float:
        return top + plot_h - value / y_max * plot_h

    out = [_svg_open("chart-timeline", "Violations over time by policy", width, height)]
    out.append('<g class="axis">')
    for i in range(int(y_max // step) + 1):
        y = y_of(i * step)
        out.append(
            f'<line class="grid" x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" />'
            f'<text x="{left - 8}" y="{y:.1f}" dy="0.35em" text-anchor="end">{num(i * step)}'
            "</text>"
        )
    base = top + plot_h
    out.append(f'<line x1="{left}" x2="{width - right}" y1="{base}" y2="{base}" />')
    every = max(1, math.ceil(n_slots / max(1, int(plot_w // 90))))  # a label about every 90 px
    if to_scale:
        ticks = [(i, starts[0] + i * bucket_ms) for i in range(0, n_slots, every)]
    else:
        ticks = [(slots[i], starts[i]) for i in range(0, len(starts), every)]
    out.append(_x_ticks([(left + (i + 0.5) * slot_w, ms) for i, ms in ticks], bucket_ms, base))
    out.append("</g>\n")

    for start, slot in zip(starts, slots, strict=True):
        x = left + slot * slot_w + (slot_w - bar_w) / 2
        when = _bucket_label(start, bucket_ms)
        out.append(f'<g class="bucket" data-start-ms="{start}">')
        acc = 0
        for policy in [*policies, *sorted(set(merged[start]) - set(policies))]:
            n = merged[start].get(policy, 0)
            if n <= 0:
                continue
            y0, y1 = y_of(acc), y_of(acc + n)
            acc += n
            colour = colours.get(policy, OTHERS_COLOUR)
            out.append(
                f'<rect x="{x:.1f}" y="{y1:.1f}" width="{max(bar_w, 0.5):.1f}" '
                f'height="{y0 - y1:.1f}" fill="{colour}" data-policy="{esc(policy)}" '
                f'data-count="{n}">'
                f"<title>{esc(when)}\n{esc(policy)}: {num(n)}</title></rect>"
            )
        out.append("</g>\n")
    out.append("</svg>\n")

    legend = "".join(f"<li>{swatch(p, colours[p])}{esc(p)}</li>" for p in policies)
    caption = "Record timestamp (UTC)"
    if bucket_ms > 0:
        caption += f", one bar per {span(bucket_ms)}"
    if not to_scale:
        caption += "; buckets are drawn side by side, gaps between them are not to scale"
    note = ""
    if untimed:
        note = (
            f'<p class="untimed" data-untimed="{untimed}">{num(untimed)} of {num(timed + untimed)}'
            " violations have no record timestamp (corrupt bytes, offset order, quarantined "
            "requests without one) and are not in this timeline.</p>\n"
        )
    return (
        f"<figure>\n<ul class=legend>{legend}</ul>\n{''.join(out)}"
        f"<figcaption>{esc(caption)}.</figcaption>\n{note}</figure>\n"
    )


def _x_ticks(ticks: list[tuple[float, int]], bucket_ms: int, base: float) -> str:
    """UTC time labels; the date only under the first tick and where it changes."""
    out = []
    prev_date = ""
    for x, ms in ticks:
        time_text, date_text = _tick_text(ms, bucket_ms)
        if date_text == prev_date and time_text:
            date_text = ""
        else:
            prev_date = date_text
        lines = [t for t in (time_text, date_text) if t]
        spans = "".join(
            f'<tspan x="{x:.1f}" dy="{"0" if j == 0 else "1.2em"}">{esc(t)}</tspan>'
            for j, t in enumerate(lines)
        )
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{base}" y2="{base + 4}" />'
            f'<text x="{x:.1f}" y="{base + 16}" text-anchor="middle">{spans}</text>'
        )
    return "".join(out)


def _tick_text(ms: int, bucket_ms: int) -> tuple[str, str]:
    dt = to_datetime(ms)
    if dt is None:
        return str(ms), ""
    date = dt.strftime("%Y-%m-%d")
    if bucket_ms >= DAY_MS and dt.hour == dt.minute == dt.second == 0:
        return "", date
    whole_minutes = bucket_ms > 0 and bucket_ms % MINUTE_MS == 0 and ms % MINUTE_MS == 0
    fmt = "%H:%M" if whole_minutes else "%H:%M:%S"
    return dt.strftime(fmt), date


def _bucket_label(start: int, bucket_ms: int) -> str:
    if bucket_ms <= 0:
        return utc(start)
    return f"{utc(start)} to {utc(start + bucket_ms)}"


def _nice_axis(peak: int) -> tuple[int, int]:
    """A 1/2/5 step giving at most about five integer gridlines, and the axis top."""
    peak = max(peak, 1)
    raw = peak / 4
    magnitude = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    return step, math.ceil(peak / step) * step


def _svg_open(chart_id: str, label: str, width: int, height: int) -> str:
    return (
        f'<svg id="{chart_id}" class="chart" role="img" aria-label="{esc(label)}" '
        f'xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}">\n'
    )


def swatch(policy: str, colour: str) -> str:
    return f'<span class=swatch data-policy="{esc(policy)}" style="background:{colour}"></span>'


def policy_colours(
    summary: Mapping[str, Any], samples: Sequence[Mapping[str, Any]]
) -> dict[str, str]:
    """One colour per policy for the whole page: biggest first gets the first palette colour."""
    names = [name for name, n in sorted_counts(summary.get("violations_by_policy") or {}) if n]
    extra: set[str] = set()
    for bucket in (summary.get("timeline") or {}).get("buckets") or []:
        extra.update(str(p) for p in (bucket.get("counts") or {}))
    extra.update(str(s.get("policy")) for s in samples if s.get("policy"))
    names += sorted(extra - set(names))
    return {name: _colour(i) for i, name in enumerate(names)}


def _colour(index: int) -> str:
    if index < len(PALETTE):
        return PALETTE[index]
    hue = (index * 0.618033988749895) % 1.0  # golden-angle steps keep new hues apart
    r, g, b = colorsys.hls_to_rgb(hue, 0.55, 0.55)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"
