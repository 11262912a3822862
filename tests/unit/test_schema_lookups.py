"""`LookupNeeded` in the chain: passed to the caller when the records came with a catalog to
fetch into, a failure of the policy (fail closed) when they did not."""

from __future__ import annotations

import pytest

from kvproxy.policies.api import ProducedRecords, Verdict
from kvproxy.policies.chain import Mode, PolicyChain
from kvproxy.policies.schemas.model import LookupNeeded, SchemaEntry
from kvproxy.protocol.records.writer import build_batch
from tests.harness.produced import produced

INVALID_RECORD = 87


class AsksForIds:
    name = "asks"

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        raise LookupNeeded(frozenset({42}))


class EmptyCatalog:
    accept_unavailable = False
    recheck_ms = 0

    def entry(self, schema_id: int) -> SchemaEntry | None:
        return None


def _produced(schemas: EmptyCatalog | None) -> ProducedRecords:
    raw = build_batch([(None, b"\x00\x00\x00\x00\x2a", None, None)])
    return produced(raw, topic="orders", compacted=False, schemas=schemas)


def test_a_lookup_is_the_callers_to_make_when_there_is_a_catalog() -> None:
    chain = PolicyChain([AsksForIds()], Mode.ENFORCE)
    with pytest.raises(LookupNeeded) as raised:
        chain.check(_produced(EmptyCatalog()))
    assert raised.value.schema_ids == {42}


def test_a_lookup_with_nobody_to_make_it_fails_the_policy_closed() -> None:
    chain = PolicyChain([AsksForIds()], Mode.ENFORCE)
    verdict = chain.check(_produced(None))
    assert (verdict.code, verdict.policy) == (INVALID_RECORD, "asks")
    assert chain.crash_counts == {"asks": 1}
