"""The schema ids a chain's checks will read in one partition, gathered before the chain runs.

One function for both readers: the proxy gathers the ids its catalog cannot answer yet before it
decides a request (`kvproxy.proxy.lookups.schema_ids`), looks them up, then runs the chain once; the
audit's id pass gathers every id (`kvproxy.pipeline.schema_ids`) and looks them all up once on
its driver before the check pass runs the chains.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvproxy.policies.api import Need, ProducedRecords
from kvproxy.policies.schemas.wire import SCHEMA_ID_HEADER, read_schema_id

if TYPE_CHECKING:
    from kvproxy.policies.chain import PolicyChain

__all__ = ["carried_schema_ids", "schema_ids_wanted"]


def schema_ids_wanted(chain: PolicyChain, produced: ProducedRecords) -> set[int]:
    """The ids the `Need.SCHEMAS` policies of `chain` will ask `produced.schemas` about that it
    cannot answer yet; every id they read when `produced.schemas` is None.

    A policy says which through its own `schema_ids_wanted(topic, produced)`; one without it is
    given every id its records' keys and values carry. Records that do not decode raise
    `DecodeError` (the check answers them)."""
    wanted: set[int] = set()
    if Need.SCHEMAS not in chain.needs:
        return wanted
    for declared in chain.declarations:
        if Need.SCHEMAS not in declared.needs:
            continue
        own = declared.schema_ids_wanted
        if own is not None:
            wanted |= own(produced.topic, produced)
            continue
        carried = carried_schema_ids(produced, values=True, keys=True)
        catalog = produced.schemas
        wanted |= {i for i in carried if catalog is None or catalog.peek(i) is None}
    return wanted


def carried_schema_ids(produced: ProducedRecords, *, values: bool, keys: bool) -> set[int]:
    """The id in the header of each record's value and key (as asked); bytes without the magic
    byte carry none (the check says so)."""
    ids: set[int] = set()
    if values and not keys:
        for batch in produced.batches:
            for value in batch.values():
                if value is not None:
                    _add(ids, value)
        return ids
    for record in produced.records():
        if values and record.value is not None:
            _add(ids, record.value)
        if keys and record.key is not None:
            _add(ids, record.key)
    return ids


def _add(ids: set[int], data: bytes) -> None:
    if len(data) >= SCHEMA_ID_HEADER and data[0] == 0:
        ids.add(read_schema_id(data))
