"""The schema ids records carry, for the sides (values, keys) a topic's rule reads: what is
looked up before the checks run. One reading for the audit's id pass (`kvproxy.pipeline.schema_ids`)
and the proxy's lookups before a request is decided (`kvproxy.proxy.schema_lookups`)."""

from __future__ import annotations

from collections.abc import Iterable

from kvproxy.policies.api import Need, needs_of
from kvproxy.policies.builtin.schema import SchemaPolicy
from kvproxy.policies.chain import PolicyChain
from kvproxy.policies.schemas.wire import SCHEMA_ID_HEADER, read_schema_id
from kvproxy.protocol.records import Record

__all__ = ["Sides", "add_schema_ids", "schema_sides"]

Sides = tuple[bool, bool]
"""(values, keys): whose ids are read."""


def schema_sides(chain: PolicyChain) -> Sides | None:
    """(values, keys) whose ids `chain` reads; None when it reads none."""
    if Need.SCHEMAS not in chain.needs:
        return None
    values = keys = False
    for policy in chain.policies:
        if isinstance(policy, SchemaPolicy):
            values = values or policy.value_mode != "off"
            keys = keys or policy.key_mode != "off"
        elif Need.SCHEMAS in needs_of(policy):
            values = keys = True  # another policy's reading of the records is its own
    return values, keys


def add_schema_ids(ids: set[int], records: Iterable[Record], sides: Sides) -> int:
    """Add to `ids` the id in the header of each record's value and key (as `sides` asks);
    bytes without the magic byte carry none (the check says so). Returns the records read."""
    values, keys = sides
    count = 0
    for record in records:
        if values and record.value is not None:
            _add(ids, record.value)
        if keys and record.key is not None:
            _add(ids, record.key)
        count += 1
    return count


def _add(ids: set[int], data: bytes) -> None:
    if len(data) >= SCHEMA_ID_HEADER and data[0] == 0:
        ids.add(read_schema_id(data))
