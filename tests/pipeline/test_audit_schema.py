"""Backtesting the `schema` policy: the audit looks every schema id of the data up once, on the
driver, and the executors check the records against those answers as the proxy would."""

from __future__ import annotations

import io
import json
import struct
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import fastavro
import pytest

from kvproxy.pipeline.check import check_unit
from kvproxy.pipeline.job import AuditError, load_settings
from kvproxy.pipeline.segments import SegmentRange
from kvproxy.protocol.records import build_batch
from tests.harness.audit import audit, write_config
from tests.harness.schema_registry import TestRegistry
from tests.harness.segments import assign_offsets, write_segment

ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}],
}
REFUND = {
    "type": "record",
    "name": "Refund",
    "namespace": "shop",
    "fields": [{"name": "order", "type": "long"}],
}


def framed(schema_id: int, payload: bytes) -> bytes:
    return struct.pack(">bI", 0, schema_id) + payload


def avro(schema: dict[str, Any], value: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


def rule_config(url: str, on_error: str = "reject") -> str:
    return (
        f"schema_registry:\n  url: {url}\n  timeout_ms: 10000\n  on_error: {on_error}\n"
        "topics:\n"
        "  - match: orders\n"
        "    default_policies: drop\n"
        "    policies: [{schema: {validate_payload: true}}]\n"
    )


@pytest.fixture
def registry() -> Iterator[TestRegistry]:
    with TestRegistry() as started:
        yield started


def write_orders(logs: Path, now_ms: int, order_id: int, refund_id: int) -> None:
    """orders-0 and orders-1 (both with `order_id`), and a `logs` topic no rule checks."""
    good = framed(order_id, avro(ORDER, {"id": 1, "item": "tea"}))
    key_with_id = framed(88, b"")  # keys are not checked (key: off): never looked up
    write_segment(
        logs,
        "orders",
        0,
        assign_offsets(
            [
                build_batch(
                    [
                        (key_with_id, good, None, now_ms),
                        (b"unknown", framed(99, b"\x02"), None, now_ms),
                        (b"plain", b"plain text", None, now_ms),
                        (b"refund", framed(refund_id, avro(REFUND, {"order": 1})), None, now_ms),
                        (b"bad", framed(order_id, b"\x02\x06"), None, now_ms),
                    ]
                )
            ]
        ),
    )
    write_segment(logs, "orders", 1, assign_offsets([build_batch([(b"k", good, None, now_ms)])]))
    write_segment(
        logs, "logs", 0, assign_offsets([build_batch([(b"k", framed(77, b"x"), None, now_ms)])])
    )


def test_each_record_is_checked_against_ids_looked_up_once(
    spark: Any, tmp_path: Path, registry: TestRegistry
) -> None:
    order_id = registry.register("orders-value", json.dumps(ORDER))
    refund_id = registry.register("refunds-value", json.dumps(REFUND))
    now_ms = int(time.time() * 1000)
    write_orders(tmp_path / "logs", now_ms, order_id, refund_id)
    config = write_config(tmp_path, rule_config(registry.url))

    summary, rows = audit(
        spark, tmp_path, inputs=(str(tmp_path / "logs"),), config=config, now_ms=now_ms
    )

    found = sorted(
        (r["topic"], r["partition"], r["offset"], r["policy"], r["message"]) for r in rows
    )
    assert found == [
        ("orders", 0, 1, "schema", "unknown schema id 99"),
        ("orders", 0, 2, "schema", "no schema id: magic byte 0x70, expected 0x00"),
        ("orders", 0, 3, "schema", f"schema {refund_id} is not registered under orders-value"),
        ("orders", 0, 4, "schema", f"does not match schema {order_id}: truncated at byte 7"),
    ]
    assert {r["error_code"] for r in rows} == {87}
    looked_up = {i: registry.count(f"/schemas/ids/{i}") for i in (order_id, refund_id, 99, 77, 88)}
    assert looked_up == {order_id: 1, refund_id: 1, 99: 1, 77: 0, 88: 0}
    assert summary["schema_registry"] == {
        "ids": 3,
        "found": 2,
        "unknown": 1,
        "unavailable": 0,
        "on_error": "reject",
        "first_failure": None,
    }


@pytest.mark.parametrize("on_error", ["reject", "accept"])
def test_a_registry_that_cannot_be_reached_fails_as_on_error_says(
    spark: Any, tmp_path: Path, registry: TestRegistry, on_error: str
) -> None:
    order_id = registry.register("orders-value", json.dumps(ORDER))
    now_ms = int(time.time() * 1000)
    write_orders(tmp_path / "logs", now_ms, order_id, order_id)
    config = write_config(tmp_path, rule_config(registry.url, on_error))
    registry.fail = "down"
    printed = io.StringIO()

    summary, rows = audit(
        spark,
        tmp_path,
        out=printed,
        inputs=(str(tmp_path / "logs"),),
        config=config,
        now_ms=now_ms,
    )

    if on_error == "reject":  # one retriable rejection per batch, as the proxy answers
        assert sorted((r["partition"], r["offset"], r["error_code"]) for r in rows) == [
            (0, 0, 7),
            (1, 0, 7),
        ]
        prefix = f"schema registry unavailable: schema id {order_id}: {registry.url}: "
        assert all(r["message"].startswith(prefix) for r in rows), rows
    else:  # records whose id could not be looked up pass; a record without one still does not
        assert [(r["partition"], r["offset"], r["message"]) for r in rows] == [
            (0, 2, "no schema id: magic byte 0x70, expected 0x00")
        ]
    assert summary["schema_registry"]["unavailable"] == 2  # ids 1 and 99
    assert summary["schema_registry"]["first_failure"].startswith(registry.url)
    action = "rejected" if on_error == "reject" else "records with them pass"
    assert f"2 could not be looked up ({action}, on_error: {on_error})" in printed.getvalue()
    report = (tmp_path / "out" / "report.html").read_text()
    assert "2 of 2 schema ids could not be looked up" in report


class MissingEverything:
    """A catalog that knows no id, as if the id pass had not looked them up."""

    accept_unavailable = False
    recheck_ms = 0

    def entry(self, schema_id: int) -> None:
        return None

    def peek(self, schema_id: int) -> None:
        return None


def test_ids_still_missing_on_an_executor_are_answered_as_the_registry_unavailable(
    tmp_path: Path, registry: TestRegistry
) -> None:
    order_id = registry.register("orders-value", json.dumps(ORDER))
    write_orders(tmp_path / "logs", 0, order_id, order_id)
    settings = replace(
        load_settings(write_config(tmp_path, rule_config(registry.url)), 0),
        schemas=MissingEverything(),
    )
    segment = tmp_path / "logs" / "orders-1" / "00000000000000000000.log"
    unit = SegmentRange(str(segment), "orders", 1, 0, segment.stat().st_size)

    rows, _ = check_unit(unit, settings)

    assert [(r[2], r[6], r[7], r[9]) for r in rows] == [
        (0, "schema", 7, f"schema registry unavailable: schema id {order_id}: not looked up")
    ]


def test_a_schema_rule_without_the_registry_section_is_refused(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        "topics:\n  - match: orders\n    default_policies: drop\n    policies: [{schema: {}}]\n",
    )

    with pytest.raises(AuditError) as refused:
        load_settings(config, 0)

    assert (
        f"{config}:2: topics[0]: the schema policy needs a schema_registry section "
        "(its url at least)"
    ) in str(refused.value)


def test_a_wrong_registry_section_is_reported_by_line(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        "topics:\n  - match: orders\n    default_policies: drop\n    policies: [{schema: {}}]\n"
        "schema_registry:\n  url: ftp://registry\n  timeout: 5\n",
    )

    with pytest.raises(AuditError) as refused:
        load_settings(config, 0)

    message = str(refused.value)
    assert f"{config}:6: schema_registry.url" in message, message
    assert f"{config}:7: schema_registry.timeout: unknown key" in message, message
