"""One partition's records parsed as a Produce request delivers them to the policies."""

from __future__ import annotations

from typing import Any

from kvproxy.policies import ProducedRecords, parse_records

NOW = 1_700_000_000_000


def produced(
    raw: bytes | None, *, version: int = 9, topic: str = "t", now_ms: int = NOW, **kw: Any
) -> ProducedRecords:
    result = parse_records(
        topic,
        0,
        raw,
        produce_version=version,
        acks=-1,
        transactional_id=None,
        compacted=kw.pop("compacted", None),
        now_ms=now_ms,
        topic_config=kw.pop("topic_config", None),
        schemas=kw.pop("schemas", None),
    )
    assert isinstance(result, ProducedRecords), result
    return result
