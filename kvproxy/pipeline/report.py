"""Render the audit job's ``report.html`` from its summary and sample violations.

The page is one self-contained file (inline CSS, inline SVG drawn here, no scripts, nothing
fetched) so it can be mailed, archived or opened straight from a bucket. Every string that comes
from data goes through `html.escape`: topics, keys and messages are producer-controlled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvproxy.pipeline.report_charts import (
    OTHERS_COLOUR,
    TOPIC_COLOUR,
    hbar_chart,
    policy_colours,
    swatch,
    timeline_chart,
)
from kvproxy.pipeline.report_format import (
    as_int,
    byte_size,
    duration_text,
    esc,
    iso,
    num,
    opt,
    percent,
    sorted_counts,
    utc,
)

__all__ = ["render_report"]

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
td,td code{word-break:normal;overflow-wrap:normal}
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
.card.warn .value{color:#9a6700}
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
.table-wrap{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{padding:6px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{background:var(--bg);font-weight:600;white-space:nowrap}
.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.hot{color:var(--bad);font-weight:600}
.msg{white-space:pre-wrap;min-width:16em;max-width:40em}
.wrap{overflow-wrap:anywhere}
td.name{white-space:nowrap}
.nowrap{white-space:nowrap}
.muted{color:var(--muted)}
.chip{display:inline-block;padding:0 6px;margin:1px 2px;border-radius:10px;background:#eef1f4;
font-size:12px;white-space:nowrap}
p.empty{color:var(--muted);font-style:italic}
p.untimed{color:var(--muted);margin:4px 0 0}
"""


def render_report(summary: Mapping[str, Any], samples: Sequence[Mapping[str, Any]]) -> str:
    """The whole report.html as a string."""
    violations = as_int(summary.get("violations"))
    colours = policy_colours(summary, samples)
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
            f"<title>{esc(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<main>\n",
            *body,
            "</main>\n</body>\n</html>\n",
        ]
    )


def _header(summary: Mapping[str, Any], title: str) -> str:
    started = iso(summary.get("started"))
    finished = iso(summary.get("finished"))
    if started and finished and finished[:10] == started[:10]:
        finished = finished[11:]  # same day: the date once is enough
    run = f"{esc(started or '?')} → {esc(finished or '?')}"
    duration = summary.get("duration_s")
    if isinstance(duration, int | float):
        run += f" <span class=muted>({esc(duration_text(float(duration)))})</span>"

    inputs = "".join(f"<li><code>{esc(i)}</code></li>" for i in summary.get("inputs") or [])
    config = summary.get("config")
    config_html = f"<code>{esc(config)}</code>" if config else "built-in defaults"

    time_range = summary.get("time_range") or {}
    first, last = time_range.get("first_ms"), time_range.get("last_ms")
    if first is None and last is None:
        seen = '<span class="muted">no record carried a timestamp</span>'
    else:
        seen = f"{esc(utc(first) if first is not None else '?')} → "
        seen += esc(utc(last) if last is not None else "?")

    now_ms = summary.get("now_ms")
    rows = [
        ("Run", run),
        ("Inputs", f"<ul>{inputs}</ul>" if inputs else '<span class="muted">none</span>'),
        ("Config", config_html),
        ("“Now” for timestamp checks", esc(utc(now_ms)) if now_ms is not None else "not recorded"),
        ("Record timestamps", seen),
    ]
    meta = "".join(f"<dt>{label}</dt><dd>{value}</dd>" for label, value in rows)
    out = f"<header>\n<h1>{esc(title)}</h1>\n<dl class=meta>{meta}</dl>\n"
    sample = summary.get("sample")
    if sample is not None:
        out += (
            f'<p class="notice"><strong>Sampled run:</strong> only the first {esc(num(sample))} '
            "records were checked; every figure below covers those records only.</p>\n"
        )
    lookups = summary.get("schema_registry")
    if isinstance(lookups, Mapping) and lookups.get("unavailable"):
        passed = "passed unchecked" if lookups.get("on_error") == "accept" else "were refused"
        out += (
            f'<p class="notice"><strong>Schema registry:</strong> '
            f"{esc(num(lookups['unavailable']))} of {esc(num(lookups.get('ids')))} schema ids "
            f"could not be looked up; records with them {passed} (on_error: "
            f"{esc(lookups.get('on_error'))}): {esc(lookups.get('first_failure'))}</p>\n"
        )
    return out + "</header>\n"


def _input_errors(errors: Sequence[Any]) -> str:
    if not errors:
        return ""
    items = "".join(f'<li class="wrap">{esc(err)}</li>' for err in errors)
    plural = "s" if len(errors) != 1 else ""
    return (
        f'<section class="errors">\n<h2>{len(errors)} input error{plural}</h2>\n'
        f"<p>These inputs could not be read completely; their records are missing from the "
        f"figures.</p>\n<ul>{items}</ul>\n</section>\n"
    )


def _headline(summary: Mapping[str, Any]) -> str:
    records = as_int(summary.get("records_scanned"))
    violations = as_int(summary.get("violations"))
    size = as_int(summary.get("bytes_scanned"))
    control = as_int(summary.get("control_batches"))
    enforced, warned = _by_mode(summary)
    if records:
        rate, rate_sub = percent(enforced, records), "enforce violations per record scanned"
    else:
        rate, rate_sub = "n/a", "no records scanned"
    control_sub = f"+ {num(control)} control batch{'es' if control != 1 else ''}, not checked"
    cards = [
        ("", "Records scanned", num(records), ""),
        ("", "Data batches", num(_data_batches(summary)), control_sub),
        ("", "Bytes scanned", byte_size(size), f"{num(size)} bytes"),
        ("bad" if enforced else "good", "Enforce violations", num(enforced), "would be refused"),
        ("warn" if warned else "good", "Warn violations", num(warned), "would pass, logged"),
        ("bad" if enforced else "good", "Enforce rate", rate, rate_sub),
    ]
    out = ['<section class="cards" aria-label="Headline figures">\n']
    for tone, label, value, sub in cards:
        classes = f"card {tone}" if tone else "card"
        out.append(
            f'<div class="{classes}"><div class="label">{esc(label)}</div>'
            f'<div class="value">{esc(value)}</div><div class="sub">{esc(sub)}</div></div>\n'
        )
    out.append("</section>\n")
    if enforced + warned != violations:
        out.append(
            f'<p class="muted">{num(violations)} violations in all, '
            f"{num(violations - enforced - warned)} of them in neither mode.</p>\n"
        )
    return "".join(out)


def _by_mode(summary: Mapping[str, Any]) -> tuple[int, int]:
    """(enforce, warn) violations; a summary without the split counts every one as enforce."""
    by_mode = summary.get("violations_by_mode")
    if not isinstance(by_mode, Mapping):
        return as_int(summary.get("violations")), 0
    return as_int(by_mode.get("enforce")), as_int(by_mode.get("warn"))


def _data_batches(summary: Mapping[str, Any]) -> Any:
    return summary.get("data_batches", summary.get("batches_scanned"))


def _clean_state(summary: Mapping[str, Any]) -> str:
    records = as_int(summary.get("records_scanned"))
    if records:
        text = (
            f"All {num(records)} records in {num(_data_batches(summary))} data batches "
            "passed every check."
        )
    else:
        text = "No records were scanned, so there was nothing to flag."
    return f'<section class="clean">\n<h2>No violations</h2>\n<p>{esc(text)}</p>\n</section>\n'


def _charts(summary: Mapping[str, Any], colours: Mapping[str, str]) -> str:
    violations = as_int(summary.get("violations"))
    by_policy = sorted_counts(summary.get("violations_by_policy") or {})
    by_topic = sorted_counts(summary.get("violations_by_topic") or {})
    policy_rows = [(name, n, colours.get(name, OTHERS_COLOUR), name) for name, n in by_policy]
    topic_rows = [(name, n, TOPIC_COLOUR, None) for name, n in by_topic]
    out = ["<h2>Violations</h2>\n<div class=charts>\n"]
    out.append(
        _figure(
            "By policy",
            hbar_chart("chart-policy", "Violations by policy", policy_rows, "policies")
            if policy_rows
            else '<p class="empty">No per-policy breakdown was recorded.</p>',
        )
    )
    out.append(
        _figure(
            "By topic",
            hbar_chart("chart-topic", "Violations by topic", topic_rows, "topics")
            if topic_rows
            else '<p class="empty">No per-topic breakdown was recorded.</p>',
        )
    )
    out.append("</div>\n")
    out.append("<h2>Violations over time</h2>\n")
    out.append(timeline_chart(summary.get("timeline") or {}, colours, violations=violations))
    return "".join(out)


def _figure(heading: str, content: str) -> str:
    return f"<figure>\n<h3>{esc(heading)}</h3>\n{content}</figure>\n"


def _codes_table(by_code: Mapping[str, Any], violations: int) -> str:
    rows = []
    for name, entry in by_code.items():
        if isinstance(entry, Mapping):
            code, count = entry.get("code"), as_int(entry.get("count"))
        else:
            code, count = None, as_int(entry)
        rows.append((count, str(name), code))
    rows.sort(key=lambda r: (-r[0], r[1]))
    if not rows:
        return '<h2>Error codes</h2>\n<p class="empty">No error codes were recorded.</p>\n'
    body = "".join(
        f"<tr><td class=name><code>{esc(name)}</code></td>"
        f"<td class=num>{esc('' if code is None else code)}</td>"
        f"<td class=num>{num(count)}</td><td class=num>{esc(percent(count, violations))}</td>"
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
                -as_int(part.get("violations")),
                -as_int(part.get("records")),
                str(topic if topic is not None else key),
                as_int(part.get("partition")) if part.get("partition") is not None else -1,
                part,
            )
        )
    entries.sort(key=lambda e: e[:4])
    rows = []
    for _, _, topic, partition, part in entries:
        records, violations = as_int(part.get("records")), as_int(part.get("violations"))
        rate = percent(violations, records) if records else ""
        compacted = part.get("compacted")
        chips = "".join(_policy_chip(str(p), colours) for p in part.get("policies") or [])
        hot = " hot" if violations else ""
        rows.append(
            f'<tr><td class="name">{esc(topic)}</td>'
            f"<td class=num>{'' if partition < 0 else partition}</td>"
            f"<td class=num>{num(records)}</td>"
            f"<td class=num>{num(part.get('data_batches', part.get('batches')))}</td>"
            f"<td class=num>{num(part.get('control_batches'))}</td>"
            f'<td class="num{hot}">{num(violations)}</td><td class=num>{esc(rate)}</td>'
            f"<td>{esc(part.get('mode') or '')}</td>"
            f"<td>{'yes' if compacted else 'no' if compacted is not None else ''}</td>"
            f"<td>{chips}</td></tr>\n"
        )
    return (
        heading + "<div class=table-wrap><table>\n<thead><tr><th>Topic</th>"
        "<th class=num>Partition</th><th class=num>Records</th><th class=num>Data batches</th>"
        "<th class=num>Control batches</th><th class=num>Violations</th><th class=num>Rate</th>"
        "<th>Mode</th><th>Compacted</th>"
        f"<th>Policies</th></tr></thead>\n<tbody>\n{''.join(rows)}</tbody>\n</table></div>\n"
    )


def _policy_chip(policy: str, colours: Mapping[str, str]) -> str:
    colour = colours.get(policy)
    if colour is None:  # no violations from this policy: no colour to keep consistent
        return f"<span class=chip>{esc(policy)}</span>"
    return f"<span class=chip>{swatch(policy, colour)}{esc(policy)}</span>"


def _path_breaks(path: str) -> str:
    """An escaped path that may wrap after each `/`, between names, never inside one."""
    return "/<wbr>".join(esc(part) for part in path.split("/"))


def _samples_table(
    samples: Sequence[Mapping[str, Any]], violations: int, colours: Mapping[str, str]
) -> str:
    heading = "<h2>Sample violations</h2>\n"
    if not samples:
        return heading + '<p class="empty">No sample violations were recorded.</p>\n'
    note = f'<p class="muted">Showing {num(len(samples))} of {num(violations)} violations.</p>\n'
    rows = []
    for s in samples:
        policy = str(s.get("policy") or "")
        colour = colours.get(policy, OTHERS_COLOUR)
        offset = s.get("offset")
        ts = s.get("timestamp")
        key = s.get("key_preview")
        size = s.get("value_size")
        position = s.get("position")
        source = f"<code>{_path_breaks(str(s.get('source') or ''))}</code>"
        if isinstance(position, int) and position >= 0:
            source += f' <span class="muted nowrap">@ byte {num(position)}</span>'
        code = s.get("error_code")
        rows.append(
            f'<tr><td class="name">{esc(s.get("topic") or "")}</td>'
            f"<td class=num>{esc(opt(s.get('partition')))}</td>"
            f"<td class=num>{esc(num(offset) if as_int(offset) >= 0 else 'unknown')}</td>"
            f'<td class="nowrap">{esc(utc(ts, millis=True) if ts is not None else "—")}</td>'
            f'<td class="nowrap">{swatch(policy, colour)}{esc(policy)}</td>'
            f"<td class=name><code>{esc(s.get('error_name') or '')}</code>"
            f"{f' <span class=muted>({esc(code)})</span>' if code is not None else ''}</td>"
            f'<td class="msg">{esc(s.get("message") or "")}</td>'
            f"<td>{esc(key) if key is not None else '<span class=muted>—</span>'}</td>"
            f"<td class=num>{esc(num(size) + ' B' if size is not None else '—')}</td>"
            f"<td class=source>{source}</td></tr>\n"
        )
    return (
        heading + note + "<div class=table-wrap><table>\n<thead><tr><th>Topic</th>"
        "<th class=num>Partition</th><th class=num>Offset</th><th>Timestamp (UTC)</th>"
        "<th>Policy</th><th>Error</th><th>Message</th><th>Key</th><th class=num>Value size</th>"
        f"<th>Source</th></tr></thead>\n<tbody>\n{''.join(rows)}</tbody>\n</table></div>\n"
    )
