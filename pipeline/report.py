"""Render the audit job's ``report.html`` from its summary and sample violations.

The page is one self-contained file (inline CSS, inline SVG drawn here, no scripts, nothing
fetched) so it can be mailed, archived or opened straight from a bucket. Every string that comes
from data goes through `html.escape`: topics, keys and messages are producer-controlled.
"""

from __future__ import annotations

import colorsys
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any

__all__ = ["render_report"]

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
MAX_LABEL_CHARS = 28
MAX_TIME_SLOTS = 500  # beyond this a to-scale time axis would make bars thinner than a pixel

SECOND_MS = 1000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS

STYLE = """
:root{--fg:#1f2328;--muted:#656d76;--line:#d0d7de;--bg:#f6f8fa;--bad:#cf222e;--ok:#1a7f37}
*{box-sizing:border-box}
body{margin:0;font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
color:var(--fg);background:#fff}
main{max-width:1160px;margin:0 auto;padding:24px}
h1{font-size:26px;margin:0 0 12px}
h2{font-size:18px;margin:32px 0 12px;padding-bottom:4px;border-bottom:1px solid var(--line)}
h3{font-size:15px;margin:0 0 8px}
.meta{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;margin:0}
.meta dt{color:var(--muted)}
.meta dd{margin:0}
.meta ul{margin:0;padding:0;list-style:none}
code{font:12.5px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;overflow-wrap:anywhere}
.notice{margin:16px 0 0;padding:10px 14px;border:1px solid #d4a72c;border-radius:6px;
background:#fff8c5}
.errors{margin:16px 0 0;padding:10px 14px;border:1px solid #ff8182;border-radius:6px;
background:#ffebe9}
.errors h2{margin:0 0 6px;border:0;padding:0;font-size:16px;color:var(--bad)}
.errors ul{margin:0;padding-left:20px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:12px;margin-top:24px}
.card{border:1px solid var(--line);border-radius:8px;padding:12px 16px;background:var(--bg)}
.card .label{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.card .value{font-size:26px;font-weight:600;font-variant-numeric:tabular-nums}
.card .sub{color:var(--muted);font-size:12px}
.card.bad .value{color:var(--bad)}
.card.good .value{color:var(--ok)}
.clean{margin-top:24px;padding:16px 20px;border:1px solid #aceebb;border-radius:8px;
background:#dafbe1}
.clean h2{margin:0 0 4px;border:0;padding:0;color:var(--ok)}
.clean p{margin:0}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(440px,1fr));gap:24px}
figure{margin:0}
figcaption{color:var(--muted);font-size:12px;margin-top:4px}
svg{max-width:100%;height:auto;display:block}
svg text{font-size:12px;fill:var(--fg)}
svg .axis text{font-size:11px;fill:var(--muted)}
svg .axis line{stroke:#8c959f}
svg .grid{stroke:#eaeef2}
svg .value{fill:var(--muted)}
.legend{list-style:none;padding:0;margin:0 0 8px;display:flex;flex-wrap:wrap;gap:4px 16px;
font-size:13px}
.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px}
.table-wrap{overflow-x:auto}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{padding:6px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{background:var(--bg);font-weight:600;white-space:nowrap}
.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.hot{color:var(--bad);font-weight:600}
.msg{white-space:pre-wrap;overflow-wrap:anywhere;min-width:16em;max-width:40em}
.wrap{overflow-wrap:anywhere}
.nowrap{white-space:nowrap}
.muted{color:var(--muted)}
.chip{display:inline-block;padding:0 6px;margin:1px 2px;border-radius:10px;background:#eef1f4;
font-size:12px;white-space:nowrap}
p.empty{color:var(--muted);font-style:italic}
"""


def render_report(summary: Mapping[str, Any], samples: Sequence[Mapping[str, Any]]) -> str:
    """The whole report.html as a string."""
    violations = _int(summary.get("violations"))
    colours = _policy_colours(summary, samples)
    title = str(summary.get("title") or "kvproxy audit")

    body: list[str] = [_header(summary, title)]
    body.append(_input_errors(summary.get("errors") or []))
    body.append(_headline(summary))
    if violations == 0:
        body.append(_clean_state(summary))
    else:
        body.append(_charts(summary, colours))
        body.append(_codes_table(summary.get("violations_by_code") or {}, violations))
    body.append(_partitions_table(summary.get("partitions") or {}, colours))
    if violations:
        body.append(_samples_table(samples, violations, colours))

    return "".join(
        [
            "<!DOCTYPE html>\n",
            '<html lang="en">\n<head>\n<meta charset="utf-8">\n',
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n',
            f"<title>{_e(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<main>\n",
            *body,
            "</main>\n</body>\n</html>\n",
        ]
    )


# --- sections ---------------------------------------------------------------------------------


def _header(summary: Mapping[str, Any], title: str) -> str:
    started = _iso(summary.get("started"))
    finished = _iso(summary.get("finished"))
    if started and finished and finished[:10] == started[:10]:
        finished = finished[11:]  # same day: the date once is enough
    run = f"{_e(started or '?')} → {_e(finished or '?')}"
    duration = summary.get("duration_s")
    if isinstance(duration, int | float):
        run += f" <span class=muted>({_e(_duration(float(duration)))})</span>"

    inputs = "".join(f"<li><code>{_e(i)}</code></li>" for i in summary.get("inputs") or [])
    config = summary.get("config")
    config_html = f"<code>{_e(config)}</code>" if config else "built-in defaults"

    time_range = summary.get("time_range") or {}
    first, last = time_range.get("first_ms"), time_range.get("last_ms")
    if first is None and last is None:
        seen = '<span class="muted">no record carried a timestamp</span>'
    else:
        seen = f"{_e(_utc(first) if first is not None else '?')} → "
        seen += _e(_utc(last) if last is not None else "?")

    now_ms = summary.get("now_ms")
    rows = [
        ("Run", run),
        ("Inputs", f"<ul>{inputs}</ul>" if inputs else '<span class="muted">none</span>'),
        ("Config", config_html),
        ("“Now” for timestamp checks", _e(_utc(now_ms)) if now_ms is not None else "not recorded"),
        ("Record timestamps", seen),
    ]
    meta = "".join(f"<dt>{label}</dt><dd>{value}</dd>" for label, value in rows)
    out = f"<header>\n<h1>{_e(title)}</h1>\n<dl class=meta>{meta}</dl>\n"
    sample = summary.get("sample")
    if sample is not None:
        out += (
            f'<p class="notice"><strong>Sampled run:</strong> only the first {_e(_n(sample))} '
            "records were checked; every figure below covers those records only.</p>\n"
        )
    return out + "</header>\n"


def _input_errors(errors: Sequence[Any]) -> str:
    if not errors:
        return ""
    items = "".join(f'<li class="wrap">{_e(err)}</li>' for err in errors)
    plural = "s" if len(errors) != 1 else ""
    return (
        f'<section class="errors">\n<h2>{len(errors)} input error{plural}</h2>\n'
        f"<p>These inputs could not be read completely; their records are missing from the "
        f"figures.</p>\n<ul>{items}</ul>\n</section>\n"
    )


def _headline(summary: Mapping[str, Any]) -> str:
    records = _int(summary.get("records_scanned"))
    violations = _int(summary.get("violations"))
    size = _int(summary.get("bytes_scanned"))
    control = _int(summary.get("control_batches"))
    if records:
        rate, rate_sub = _rate(violations, records), "of records scanned"
    else:
        rate, rate_sub = "n/a", "no records scanned"
    cards = [
        ("", "Records scanned", _n(records), ""),
        ("", "Batches scanned", _n(summary.get("batches_scanned")), f"{_n(control)} control"),
        ("", "Bytes scanned", _bytes(size), f"{_n(size)} bytes"),
        ("bad" if violations else "good", "Violations", _n(violations), ""),
        ("bad" if violations else "good", "Violation rate", rate, rate_sub),
    ]
    out = ['<section class="cards" aria-label="Headline figures">\n']
    for tone, label, value, sub in cards:
        classes = f"card {tone}" if tone else "card"
        out.append(
            f'<div class="{classes}"><div class="label">{_e(label)}</div>'
            f'<div class="value">{_e(value)}</div><div class="sub">{_e(sub)}</div></div>\n'
        )
    out.append("</section>\n")
    return "".join(out)


def _clean_state(summary: Mapping[str, Any]) -> str:
    records = _int(summary.get("records_scanned"))
    if records:
        text = (
            f"All {_n(records)} records in {_n(summary.get('batches_scanned'))} batches "
            "passed every check."
        )
    else:
        text = "No records were scanned, so there was nothing to flag."
    return f'<section class="clean">\n<h2>No violations</h2>\n<p>{_e(text)}</p>\n</section>\n'


def _charts(summary: Mapping[str, Any], colours: Mapping[str, str]) -> str:
    by_policy = _sorted_counts(summary.get("violations_by_policy") or {})
    by_topic = _sorted_counts(summary.get("violations_by_topic") or {})
    policy_rows = [(name, n, colours.get(name, OTHERS_COLOUR), name) for name, n in by_policy]
    topic_rows = [(name, n, TOPIC_COLOUR, None) for name, n in by_topic]
    out = ["<h2>Violations</h2>\n<div class=charts>\n"]
    out.append(
        _figure(
            "By policy",
            _hbar_chart("chart-policy", "Violations by policy", policy_rows, "policies")
            if policy_rows
            else '<p class="empty">No per-policy breakdown was recorded.</p>',
        )
    )
    out.append(
        _figure(
            "By topic",
            _hbar_chart("chart-topic", "Violations by topic", topic_rows, "topics")
            if topic_rows
            else '<p class="empty">No per-topic breakdown was recorded.</p>',
        )
    )
    out.append("</div>\n")
    out.append("<h2>Violations over time</h2>\n")
    out.append(_timeline(summary.get("timeline") or {}, colours))
    return "".join(out)


def _figure(heading: str, content: str) -> str:
    return f"<figure>\n<h3>{_e(heading)}</h3>\n{content}</figure>\n"


def _codes_table(by_code: Mapping[str, Any], violations: int) -> str:
    rows = []
    for name, entry in by_code.items():
        if isinstance(entry, Mapping):
            code, count = entry.get("code"), _int(entry.get("count"))
        else:
            code, count = None, _int(entry)
        rows.append((count, str(name), code))
    rows.sort(key=lambda r: (-r[0], r[1]))
    if not rows:
        return '<h2>Error codes</h2>\n<p class="empty">No error codes were recorded.</p>\n'
    body = "".join(
        f"<tr><td><code>{_e(name)}</code></td><td class=num>{_e('' if code is None else code)}"
        f"</td><td class=num>{_n(count)}</td><td class=num>{_e(_rate(count, violations))}</td>"
        "</tr>\n"
        for count, name, code in rows
    )
    return (
        "<h2>Error codes</h2>\n<div class=table-wrap><table>\n<thead><tr><th>Error</th>"
        "<th class=num>Code</th><th class=num>Violations</th><th class=num>Share</th></tr>"
        f"</thead>\n<tbody>\n{body}</tbody>\n</table></div>\n"
    )


def _partitions_table(partitions: Mapping[str, Any], colours: Mapping[str, str]) -> str:
    heading = f"<h2>Partitions ({len(partitions)})</h2>\n"
    if not partitions:
        return heading + '<p class="empty">No partitions were scanned.</p>\n'
    entries = []
    for key, value in partitions.items():
        part = value if isinstance(value, Mapping) else {}
        topic = part.get("topic")
        entries.append(
            (
                -_int(part.get("violations")),
                -_int(part.get("records")),
                str(topic if topic is not None else key),
                _int(part.get("partition")) if part.get("partition") is not None else -1,
                part,
            )
        )
    entries.sort(key=lambda e: e[:4])
    rows = []
    for _, _, topic, partition, part in entries:
        records, violations = _int(part.get("records")), _int(part.get("violations"))
        rate = _rate(violations, records) if records else ""
        compacted = part.get("compacted")
        chips = "".join(_policy_chip(str(p), colours) for p in part.get("policies") or [])
        hot = " hot" if violations else ""
        rows.append(
            f'<tr><td class="wrap">{_e(topic)}</td>'
            f"<td class=num>{'' if partition < 0 else partition}</td>"
            f"<td class=num>{_n(records)}</td><td class=num>{_n(part.get('batches'))}</td>"
            f'<td class="num{hot}">{_n(violations)}</td><td class=num>{_e(rate)}</td>'
            f"<td>{_e(part.get('mode') or '')}</td>"
            f"<td>{'yes' if compacted else 'no' if compacted is not None else ''}</td>"
            f"<td>{chips}</td></tr>\n"
        )
    return (
        heading + "<div class=table-wrap><table>\n<thead><tr><th>Topic</th>"
        "<th class=num>Partition</th><th class=num>Records</th><th class=num>Batches</th>"
        "<th class=num>Violations</th><th class=num>Rate</th><th>Mode</th><th>Compacted</th>"
        f"<th>Policies</th></tr></thead>\n<tbody>\n{''.join(rows)}</tbody>\n</table></div>\n"
    )


def _policy_chip(policy: str, colours: Mapping[str, str]) -> str:
    colour = colours.get(policy)
    if colour is None:  # no violations from this policy: no colour to keep consistent
        return f"<span class=chip>{_e(policy)}</span>"
    return f"<span class=chip>{_swatch(policy, colour)}{_e(policy)}</span>"


def _swatch(policy: str, colour: str) -> str:
    return f'<span class=swatch data-policy="{_e(policy)}" style="background:{colour}"></span>'


def _samples_table(
    samples: Sequence[Mapping[str, Any]], violations: int, colours: Mapping[str, str]
) -> str:
    heading = "<h2>Sample violations</h2>\n"
    if not samples:
        return heading + '<p class="empty">No sample violations were recorded.</p>\n'
    note = f'<p class="muted">Showing {_n(len(samples))} of {_n(violations)} violations.</p>\n'
    rows = []
    for s in samples:
        policy = str(s.get("policy") or "")
        colour = colours.get(policy, OTHERS_COLOUR)
        offset = s.get("offset")
        ts = s.get("timestamp")
        key = s.get("key_preview")
        size = s.get("value_size")
        position = s.get("position")
        source = f"<code>{_e(s.get('source') or '')}</code>"
        if isinstance(position, int) and position >= 0:
            source += f' <span class="muted nowrap">@ byte {_n(position)}</span>'
        code = s.get("error_code")
        rows.append(
            f'<tr><td class="wrap">{_e(s.get("topic") or "")}</td>'
            f"<td class=num>{_e(_opt(s.get('partition')))}</td>"
            f"<td class=num>{_e(_n(offset) if _int(offset) >= 0 else 'unknown')}</td>"
            f'<td class="nowrap">{_e(_utc(ts, millis=True) if ts is not None else "—")}</td>'
            f'<td class="nowrap">{_swatch(policy, colour)}{_e(policy)}</td>'
            f"<td><code>{_e(s.get('error_name') or '')}</code>"
            f"{f' <span class=muted>({_e(code)})</span>' if code is not None else ''}</td>"
            f'<td class="msg">{_e(s.get("message") or "")}</td>'
            f'<td class="wrap">{_e(key) if key is not None else "<span class=muted>—</span>"}'
            "</td>"
            f"<td class=num>{_e(_n(size) + ' B' if size is not None else '—')}</td>"
            f'<td class="wrap">{source}</td></tr>\n'
        )
    return (
        heading + note + "<div class=table-wrap><table>\n<thead><tr><th>Topic</th>"
        "<th class=num>Partition</th><th class=num>Offset</th><th>Timestamp (UTC)</th>"
        "<th>Policy</th><th>Error</th><th>Message</th><th>Key</th><th class=num>Value size</th>"
        f"<th>Source</th></tr></thead>\n<tbody>\n{''.join(rows)}</tbody>\n</table></div>\n"
    )


# --- charts -----------------------------------------------------------------------------------


def _hbar_chart(
    chart_id: str, label: str, rows: Sequence[tuple[str, int, str, str | None]], noun: str
) -> str:
    """Horizontal bars, biggest first; past MAX_BARS the rest become one grey bar."""
    if len(rows) > MAX_BARS:
        rest = rows[MAX_BARS - 1 :]
        others = (f"{len(rest)} other {noun}", sum(r[1] for r in rest), OTHERS_COLOUR, None)
        rows = [*rows[: MAX_BARS - 1], others]
    width, row_h, bar_h, pad = 520, 24, 16, 4
    label_w = min(210, max(60, max(len(_short(r[0])) for r in rows) * 7 + 12))
    value_w = 64
    plot_w = width - label_w - value_w
    height = pad * 2 + row_h * len(rows)
    top = max(r[1] for r in rows) or 1
    out = [_svg_open(chart_id, label, width, height)]
    for i, (name, count, colour, policy) in enumerate(rows):
        y = pad + i * row_h
        w = count / top * plot_w if count > 0 else 0.0
        w = max(w, 1.0) if count > 0 else 0.0
        data = f' data-policy="{_e(policy)}"' if policy is not None else ""
        out.append(
            f"<g><title>{_e(name)}: {_n(count)}</title>"
            f'<text x="{label_w - 8}" y="{y + row_h / 2:.1f}" dy="0.35em" text-anchor="end">'
            f"{_e(_short(name))}</text>"
            f'<rect x="{label_w}" y="{y + (row_h - bar_h) / 2:.1f}" width="{w:.1f}" '
            f'height="{bar_h}" rx="2" fill="{colour}"{data} />'
            f'<text class="value" x="{label_w + w + 6:.1f}" y="{y + row_h / 2:.1f}" dy="0.35em">'
            f"{_n(count)}</text></g>\n"
        )
    out.append("</svg>\n")
    return "".join(out)


def _timeline(timeline: Mapping[str, Any], colours: Mapping[str, str]) -> str:
    """Stacked bars of violations per policy per time bucket, one group per bucket."""
    bucket_ms = _int(timeline.get("bucket_ms"))
    merged: dict[int, dict[str, int]] = {}
    for bucket in timeline.get("buckets") or []:
        counts = merged.setdefault(_int(bucket.get("start_ms")), {})
        for policy, n in (bucket.get("counts") or {}).items():
            counts[str(policy)] = counts.get(str(policy), 0) + _int(n)
    if not merged:
        return (
            '<p class="empty">No violation had a record timestamp, so there is no timeline.</p>\n'
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
            f'<text x="{left - 8}" y="{y:.1f}" dy="0.35em" text-anchor="end">{_n(i * step)}'
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
                f'height="{y0 - y1:.1f}" fill="{colour}" data-policy="{_e(policy)}">'
                f"<title>{_e(when)}\n{_e(policy)}: {_n(n)}</title></rect>"
            )
        out.append("</g>\n")
    out.append("</svg>\n")

    legend = "".join(f"<li>{_swatch(p, colours[p])}{_e(p)}</li>" for p in policies)
    caption = "Record timestamp (UTC)"
    if bucket_ms > 0:
        caption += f", one bar per {_span(bucket_ms)}"
    if not to_scale:
        caption += "; buckets are drawn side by side, gaps between them are not to scale"
    return (
        f"<figure>\n<ul class=legend>{legend}</ul>\n{''.join(out)}"
        f"<figcaption>{_e(caption)}.</figcaption>\n</figure>\n"
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
            f'<tspan x="{x:.1f}" dy="{"0" if j == 0 else "1.2em"}">{_e(t)}</tspan>'
            for j, t in enumerate(lines)
        )
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{base}" y2="{base + 4}" />'
            f'<text x="{x:.1f}" y="{base + 16}" text-anchor="middle">{spans}</text>'
        )
    return "".join(out)


def _tick_text(ms: int, bucket_ms: int) -> tuple[str, str]:
    dt = _datetime(ms)
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
        return _utc(start)
    return f"{_utc(start)} to {_utc(start + bucket_ms)}"


def _nice_axis(peak: int) -> tuple[int, int]:
    """A 1/2/5 step giving at most about five integer gridlines, and the axis top."""
    peak = max(peak, 1)
    raw = peak / 4
    magnitude = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    return step, math.ceil(peak / step) * step


def _svg_open(chart_id: str, label: str, width: int, height: int) -> str:
    return (
        f'<svg id="{chart_id}" class="chart" role="img" aria-label="{_e(label)}" '
        f'xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}">\n'
    )


def _policy_colours(
    summary: Mapping[str, Any], samples: Sequence[Mapping[str, Any]]
) -> dict[str, str]:
    """One colour per policy for the whole page: biggest first gets the first palette colour."""
    names = [name for name, n in _sorted_counts(summary.get("violations_by_policy") or {}) if n]
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


# --- formatting -------------------------------------------------------------------------------


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _n(value: Any) -> str:
    return f"{_int(value):,}"


def _opt(value: Any) -> str:
    return "" if value is None else str(value)


def _short(text: str) -> str:
    return text if len(text) <= MAX_LABEL_CHARS else text[: MAX_LABEL_CHARS - 1] + "…"


def _sorted_counts(counts: Mapping[str, Any]) -> list[tuple[str, int]]:
    return sorted(((str(k), _int(v)) for k, v in counts.items()), key=lambda kv: (-kv[1], kv[0]))


def _bytes(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            break
    return f"{value:.1f} {unit}"


def _rate(part: int, whole: int) -> str:
    if whole <= 0:
        return "n/a"
    pct = part / whole * 100
    if pct == 0:
        return "0%"
    if 0 < pct < 0.01:
        return "<0.01%"
    return f"{pct:.2f}%" if pct < 10 else f"{pct:.1f}%"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def _span(ms: int) -> str:
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


def _datetime(ms: Any) -> datetime | None:
    try:
        return datetime.fromtimestamp(int(ms) / 1000, tz=UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def _utc(ms: Any, millis: bool = False) -> str:
    dt = _datetime(ms)
    if dt is None:
        return str(ms)
    text = dt.strftime("%Y-%m-%d %H:%M:%S")
    if millis and dt.microsecond:
        text += f".{dt.microsecond // 1000:03d}"
    return text + " UTC"


def _iso(value: Any) -> str:
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
