"""kvproxy/pipeline/report.py: the page parses, shows its figures, escapes data, keeps colours
straight."""

from __future__ import annotations

import copy
import re
from html.parser import HTMLParser
from typing import Any

import pytest

from kvproxy.pipeline.report import render_report

HOUR_MS = 3_600_000
T0 = 1_700_000_000_000  # 2023-11-14 22:13:20 UTC
B0 = T0 - T0 % HOUR_MS  # 2023-11-14 22:00:00 UTC, where the job's hourly buckets start
VOID = {"meta", "br", "hr", "img", "input", "link", "wbr", "col", "source", "area", "base"}


def realistic_summary() -> dict[str, Any]:
    """A run over two inputs with three failing policies spread across six hourly buckets."""
    buckets = [
        {"start_ms": B0 + i * HOUR_MS, "counts": counts}
        for i, counts in enumerate(
            [
                {"compacted_key": 3, "timestamps": 1},
                {"compacted_key": 2},
                {"compacted_key": 4, "crc": 1, "timestamps": 2},
                {},
                {"compacted_key": 2, "timestamps": 1},
                {"crc": 1},
            ]
        )
        if counts
    ]
    policies = ["batch_integrity", "crc", "timestamps", "compacted_key"]
    return {
        "title": "kvproxy audit",
        "started": "2026-11-22T02:00:00Z",
        "finished": "2026-11-22T02:01:10Z",
        "duration_s": 70.2,
        "inputs": ["/data/kafka-logs", "kafka://127.0.0.1:9092/orders"],
        "config": "kvproxy.yaml",
        "sample": None,
        "now_ms": 1_795_000_000_000,
        "records_scanned": 381,
        "batches_scanned": 377,
        "bytes_scanned": 123_456,
        "control_batches": 2,
        "violations": 17,
        "violations_by_policy": {"timestamps": 4, "compacted_key": 11, "crc": 2},
        "violations_by_topic": {"air_quality_data": 1, "cities": 14, "orders": 2},
        "violations_by_code": {
            "INVALID_RECORD": {"code": 87, "count": 11},
            "INVALID_TIMESTAMP": {"code": 32, "count": 4},
            "CORRUPT_MESSAGE": {"code": 2, "count": 2},
        },
        "partitions": {
            "orders-0": {
                "topic": "orders",
                "partition": 0,
                "records": 250,
                "batches": 248,
                "violations": 2,
                "mode": "warn",
                "policies": policies[:3],
                "compacted": False,
            },
            "cities-0": {
                "topic": "cities",
                "partition": 0,
                "records": 120,
                "batches": 118,
                "violations": 14,
                "mode": "enforce",
                "policies": policies,
                "compacted": True,
            },
            "air_quality_data-0": {
                "topic": "air_quality_data",
                "partition": 0,
                "records": 11,
                "batches": 11,
                "violations": 1,
                "mode": "enforce",
                "policies": policies[:3],
                "compacted": False,
            },
        },
        "time_range": {"first_ms": T0, "last_ms": T0 + 6 * HOUR_MS - 1},
        "timeline": {"bucket_ms": HOUR_MS, "buckets": buckets},
        "errors": [
            "cannot read /data/kafka-logs/orders-1/00000000000000000000.log: Permission denied"
        ],
    }


def realistic_samples() -> list[dict[str, Any]]:
    rows = []
    for i in range(11):
        rows.append(
            {
                "topic": "cities",
                "partition": 0,
                "offset": 100 + i,
                "timestamp": T0 + i * 1_234_567,
                "key_preview": None,
                "value_size": 57 + i,
                "policy": "compacted_key",
                "error_code": 87,
                "error_name": "INVALID_RECORD",
                "message": "Compacted topic cannot accept message without key in topic partition "
                "cities-0",
                "source": "/data/kafka-logs/cities-0/00000000000000000000.log",
                "position": 4096 + 80 * i,
            }
        )
    rows.append(
        {
            "topic": "orders",
            "partition": 0,
            "offset": -1,
            "timestamp": None,
            "key_preview": "order-17",
            "value_size": None,
            "policy": "crc",
            "error_code": 2,
            "error_name": "CORRUPT_MESSAGE",
            "message": "Record batch CRC mismatch: stored 0x1a2b3c4d, computed 0x5e6f7a8b " * 4,
            "source": "kafka://127.0.0.1:9092/orders",
            "position": -1,
        }
    )
    return rows


def zero_summary() -> dict[str, Any]:
    summary = realistic_summary()
    summary.update(
        violations=0,
        violations_by_policy={},
        violations_by_topic={},
        violations_by_code={},
        timeline={"bucket_ms": HOUR_MS, "buckets": []},
        errors=[],
    )
    for part in summary["partitions"].values():
        part["violations"] = 0
    return summary


class Structure(HTMLParser):
    """Checks every opened element is closed in order, and records what the tests look at."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.svg_id: str | None = None
        self.colours: list[tuple[str, str, str | None]] = []  # (policy, colour, svg id or None)
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._record(tag, attrs)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._record(tag, attrs)  # <rect ... />: opened and closed at once

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()
        if tag == "svg":
            self.svg_id = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def _record(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        if tag == "svg":
            self.svg_id = attributes.get("id")
        policy = attributes.get("data-policy")
        if policy is not None:
            colour = attributes.get("fill")
            if colour is None:
                match = re.search(r"background:\s*(#[0-9a-f]{6})", attributes.get("style") or "")
                colour = match.group(1) if match else None
            assert colour, f"{tag} for {policy} has no colour"
            self.colours.append((policy, colour, self.svg_id))


def parse(page: str) -> Structure:
    parser = Structure()
    parser.feed(page)
    parser.close()
    assert parser.problems == []
    assert parser.stack == [], f"left open: {parser.stack}"
    return parser


def text_of(parser: Structure) -> str:
    return " ".join(" ".join(parser.text).split())


def svgs(parser: Structure) -> list[str | None]:
    return [attrs.get("id") for tag, attrs in parser.tags if tag == "svg"]


def bucket_groups(parser: Structure) -> list[dict[str, str | None]]:
    return [a for t, a in parser.tags if t == "g" and a.get("class") == "bucket"]


def test_page_is_balanced_and_shows_the_figures() -> None:
    page = render_report(realistic_summary(), realistic_samples())
    parser = parse(page)
    text = text_of(parser)
    assert page.startswith("<!DOCTYPE html>")
    for figure in ("381", "377", "120.6 KiB", "123,456 bytes", "17", "4.46%", "2 control"):
        assert figure in text, figure
    assert "2026-11-22 02:00:00 UTC → 02:01:10 UTC" in text
    assert "(1 min 10 s)" in text
    assert "/data/kafka-logs" in text
    assert "kafka://127.0.0.1:9092/orders" in text
    assert "kvproxy.yaml" in text
    assert "2026-11-18 11:06:40 UTC" in text  # now_ms
    assert "Permission denied" in text
    assert "Sampled run" not in text
    assert svgs(parser) == ["chart-policy", "chart-topic", "chart-timeline"]
    # error codes, biggest first, with their numbers and shares
    assert re.search(
        r"INVALID_RECORD 87 11 64\.7%.*INVALID_TIMESTAMP 32 4.*CORRUPT_MESSAGE 2 2", text
    )
    # partitions, most violations first
    assert text.index("cities 0 120 118 0 14") < text.index("orders 0 250 248 0 2")
    # sample rows: unknown offset, a source position, sizes
    assert "unknown" in text
    assert "@ byte 4,096" in text
    assert "57 B" in text
    assert "Showing 12 of 17 violations" in text
    # no scripts, nothing fetched
    assert "<script" not in page.lower()
    assert not re.search(r"(src|href)=", page)


def test_bars_are_sorted_biggest_first() -> None:
    parser = parse(render_report(realistic_summary(), realistic_samples()))
    policy_bars = [p for p, _, svg in parser.colours if svg == "chart-policy"]
    assert policy_bars == ["compacted_key", "timestamps", "crc"]
    page = render_report(realistic_summary(), realistic_samples())
    topic_chart = page[page.index('id="chart-topic"') : page.index('id="chart-timeline"')]
    assert topic_chart.index(">cities<") < topic_chart.index(">orders<")
    assert topic_chart.index(">orders<") < topic_chart.index(">air_quality_data<")


def test_sampled_run_and_default_config_are_said() -> None:
    summary = realistic_summary()
    summary.update(sample=1000, config=None)
    text = text_of(parse(render_report(summary, realistic_samples())))
    assert "Sampled run: only the first 1,000 records were checked" in text
    assert "built-in defaults" in text


def test_script_in_data_comes_out_escaped() -> None:
    evil = "<script>alert(1)</script>"
    summary = realistic_summary()
    summary["title"] = evil
    summary["inputs"] = [evil]
    summary["config"] = evil
    summary["errors"] = [evil]
    summary["violations_by_topic"] = {evil: 17}
    summary["violations_by_code"] = {evil: {"code": 87, "count": 17}}
    summary["violations_by_policy"] = {evil: 17}
    summary["timeline"]["buckets"] = [{"start_ms": T0, "counts": {evil: 17}}]
    summary["partitions"] = {
        evil: {
            "topic": evil,
            "partition": 0,
            "records": 1,
            "batches": 1,
            "violations": 1,
            "mode": evil,
            "policies": [evil],
            "compacted": False,
        }
    }
    samples = [
        {**row, "topic": evil, "message": evil, "key_preview": evil, "source": evil, "policy": evil}
        for row in realistic_samples()
    ]
    samples[0]["error_name"] = '"><script>x</script>'
    page = render_report(summary, samples)
    parse(page)
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&quot;&gt;&lt;script&gt;" in page
    assert page.count("&lt;script&gt;") > 10


def test_zero_violations_shows_the_clean_state_and_no_charts() -> None:
    page = render_report(zero_summary(), [])
    parser = parse(page)
    text = text_of(parser)
    assert "No violations" in text
    assert "All 381 records in 377 data batches passed every check." in text
    assert "<svg" not in page
    assert svgs(parser) == []
    assert "0%" in text
    assert "Sample violations" not in text
    assert "cities" in text  # the partition table is still there


def test_zero_records_scanned() -> None:
    summary = zero_summary()
    summary.update(records_scanned=0, batches_scanned=0, bytes_scanned=0, partitions={})
    summary["time_range"] = {"first_ms": None, "last_ms": None}
    text = text_of(parse(render_report(summary, [])))
    assert "No violations" in text
    assert "No records were scanned" in text
    assert "n/a" in text
    assert "0 B" in text
    assert "no record carried a timestamp" in text


@pytest.mark.parametrize("count", [1, 2, 7, 48, 700])
def test_timeline_has_one_bar_group_per_bucket(count: int) -> None:
    summary = realistic_summary()
    summary["timeline"]["buckets"] = [
        {"start_ms": T0 + i * 2 * HOUR_MS, "counts": {"compacted_key": 1 + i % 3, "crc": i % 2}}
        for i in range(count)
    ]
    parser = parse(render_report(summary, realistic_samples()))
    groups = bucket_groups(parser)
    assert len(groups) == count
    assert [int(g["data-start-ms"] or 0) for g in groups] == [
        T0 + i * 2 * HOUR_MS for i in range(count)
    ]
    text = text_of(parser)
    assert "2023-11-14" in text  # the first tick carries the date
    if count == 700:  # too many hours apart to draw to scale
        assert "not to scale" in text
    else:
        assert "not to scale" not in text


def test_timeline_labels_are_utc_and_one_bucket_bar_is_not_stretched() -> None:
    summary = realistic_summary()
    summary["timeline"]["buckets"] = [{"start_ms": T0, "counts": {"crc": 2}}]
    page = render_report(summary, realistic_samples())
    parser = parse(page)
    assert len(bucket_groups(parser)) == 1
    rects = [a for t, a in parser.tags if t == "rect" and a.get("data-policy") == "crc"]
    timeline_rects = [r for r in rects if "rx" not in r]  # the bar chart's bars are rounded
    assert len(timeline_rects) == 1
    assert float(timeline_rects[0]["width"] or 0) <= 72
    text = text_of(parser)
    assert "22:13:20 2023-11-14" in text  # the tick: T0 is not on a whole minute
    assert "2023-11-14 22:13:20 UTC to 2023-11-14 23:13:20 UTC" in text
    assert "one bar per hour" in text


def test_empty_timeline_with_violations_says_so() -> None:
    summary = realistic_summary()
    summary["timeline"] = {"bucket_ms": HOUR_MS, "buckets": []}
    parser = parse(render_report(summary, realistic_samples()))
    assert "chart-timeline" not in svgs(parser)
    assert "no timeline" in text_of(parser)
    assert bucket_groups(parser) == []


def test_policies_keep_one_colour_across_charts() -> None:
    parser = parse(render_report(realistic_summary(), realistic_samples()))
    by_policy: dict[str, set[str]] = {}
    places: dict[str, set[str | None]] = {}
    for policy, colour, svg in parser.colours:
        by_policy.setdefault(policy, set()).add(colour)
        places.setdefault(policy, set()).add(svg)
    assert set(by_policy) == {"compacted_key", "timestamps", "crc"}
    for policy, colours in by_policy.items():
        assert len(colours) == 1, (policy, colours)
        # the bar chart, the timeline and the HTML swatches (legend, tables) all show it
        assert places[policy] >= {"chart-policy", "chart-timeline", None}, policy
    assert len({next(iter(c)) for c in by_policy.values()}) == len(by_policy)


def test_many_policies_and_topics_get_distinct_colours_and_an_others_bar() -> None:
    summary = realistic_summary()
    names = [f"policy_{i:02d}" for i in range(25)]
    summary["violations_by_policy"] = {n: 100 - i for i, n in enumerate(names)}
    summary["violations_by_topic"] = {f"topic-{i}": i + 1 for i in range(40)}
    summary["timeline"]["buckets"] = [{"start_ms": T0, "counts": {n: 1 for n in names}}]
    page = render_report(summary, [])
    parser = parse(page)
    colours = {p: c for p, c, _ in parser.colours}
    assert len(set(colours.values())) == len(colours) == 25
    assert "6 other policies" in page
    assert "21 other topics" in page
    assert "No sample violations were recorded." in text_of(parser)


def test_input_is_not_modified() -> None:
    summary, samples = realistic_summary(), realistic_samples()
    before = copy.deepcopy((summary, samples))
    render_report(summary, samples)
    assert (summary, samples) == before


def test_timeline_ticks_show_the_date_only_when_it_changes() -> None:
    parser = parse(render_report(realistic_summary(), realistic_samples()))
    text = text_of(parser)
    assert "22:00 2023-11-14 23:00 00:00 2023-11-15 01:00 02:00 03:00" in text
    assert len(bucket_groups(parser)) == 5  # the empty hour has no group but keeps its place
    starts = [int(g["data-start-ms"] or 0) for g in bucket_groups(parser)]
    assert starts == [B0, B0 + HOUR_MS, B0 + 2 * HOUR_MS, B0 + 4 * HOUR_MS, B0 + 5 * HOUR_MS]


def untimed_notes(parser: Structure) -> list[int]:
    return [
        int(a.get("data-untimed") or 0) for t, a in parser.tags if a.get("data-untimed") is not None
    ]


def test_every_violation_is_in_the_timeline_or_counted_as_without_a_timestamp() -> None:
    summary = realistic_summary()  # 17 violations, all of them in a bucket
    summary["violations"] = 20
    summary["timeline"]["untimed"] = 3
    parser = parse(render_report(summary, realistic_samples()))
    drawn = 0
    for tag, attrs in parser.tags:
        if tag == "rect" and "rx" not in attrs and attrs.get("data-policy"):
            drawn += 1  # one rect per policy per bucket; the counts are in their titles
    in_buckets = sum(sum(b["counts"].values()) for b in summary["timeline"]["buckets"])
    assert untimed_notes(parser) == [3]
    assert in_buckets + untimed_notes(parser)[0] == summary["violations"]
    assert "3 of 20 violations have no record timestamp" in text_of(parser)
    assert drawn == 9


def test_a_summary_without_the_untimed_count_still_accounts_for_every_violation() -> None:
    summary = realistic_summary()
    summary["violations"] = 20  # 3 more than the buckets hold, and no "untimed" key
    parser = parse(render_report(summary, realistic_samples()))
    assert untimed_notes(parser) == [3]


def test_no_note_when_every_violation_has_a_timestamp() -> None:
    parser = parse(render_report(realistic_summary(), realistic_samples()))
    assert untimed_notes(parser) == []
    assert "no record timestamp" not in text_of(parser)


def test_no_timeline_at_all_counts_the_violations_without_a_timestamp() -> None:
    summary = realistic_summary()
    summary["timeline"] = {"bucket_ms": 0, "buckets": [], "untimed": 17}
    parser = parse(render_report(summary, realistic_samples()))
    assert untimed_notes(parser) == [17]
    assert "No violation (17) had a record timestamp" in text_of(parser)


def css_rules(page: str) -> dict[str, str]:
    style = page.split("<style>", 1)[1].split("</style>", 1)[0]
    rules: dict[str, str] = {}
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", style):
        for selector in selectors.split(","):
            rules[selector.strip()] = rules.get(selector.strip(), "") + ";" + body
    return rules


def test_table_cells_never_break_inside_a_word() -> None:
    page = render_report(realistic_summary(), realistic_samples())
    rules = css_rules(page)
    for selector in ("td", "td code"):
        assert "word-break:normal" in rules[selector], selector
        assert "overflow-wrap:normal" in rules[selector], selector
    assert "overflow-x:auto" in rules[".table-wrap"]  # too wide: the table scrolls, not clips
    parser = parse(page)
    classes = [a.get("class") or "" for t, a in parser.tags if t == "td"]
    assert not [c for c in classes if "wrap" in c.split()]  # no break-anywhere cell left
    assert "anywhere" not in rules[".msg"]
    # names stay whole; long paths may wrap only after a slash
    assert "white-space:nowrap" in rules["td.name"]
    assert "/<wbr>data/<wbr>kafka-logs/<wbr>cities-0/<wbr>00000000000000000000.log" in page
    cells = re.findall(r"<td class=name><code>([^<]*)</code>", page)
    assert "INVALID_RECORD" in cells


def test_headline_separates_enforce_and_warn_violations() -> None:
    summary = realistic_summary()
    summary["violations_by_mode"] = {"enforce": 15, "warn": 2}
    text = text_of(parse(render_report(summary, realistic_samples())))
    assert "Enforce violations 15 would be refused" in text
    assert "Warn violations 2 would pass, logged" in text
    assert "Enforce rate 3.94% enforce violations per record scanned" in text  # 15 / 381
    assert "Violations 17" not in text


def test_control_batches_are_counted_apart_from_data_batches() -> None:
    summary = realistic_summary()
    summary["data_batches"] = 377
    text = text_of(parse(render_report(summary, realistic_samples())))
    assert "Data batches 377 + 2 control batches, not checked" in text
    assert "Data batches Control batches" in text  # the partition table's columns
