"""Quarantine journal entries of a fixed size for the journal and worker tests."""

from __future__ import annotations

from kvproxy.journal import QuarantineEntry
from kvproxy.protocol.records import build_batch

BATCH = build_batch([(b"k1", b"bad value", [("h", b"v")], 1000), (None, b"\xff", None, 1001)])


def entry(n: int = 0, *, time_ms: int | None = None, **fields: object) -> QuarantineEntry:
    values: dict[str, object] = {
        "id": f"{n:032x}",
        "time_ms": 1_800_000_000_000 + n if time_ms is None else time_ms,
        "kind": "rejected",
        "topic": "orders",
        "partition": n % 3,
        "client_id": "client-1",
        "client_address": "127.0.0.1:50000",
        "produce_version": 9,
        "policy": "json",
        "code": 87,
        "message": f"record {n:04d} is not JSON",  # every entry(n) has the same size
        "record_indexes": (0, 1),
        "records": BATCH,
    }
    values.update(fields)
    return QuarantineEntry(**values)  # type: ignore[arg-type]
