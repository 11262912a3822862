"""Schema ids are gathered before the chain runs, by one function for the proxy and the audit: the
proxy looks up every id a request's checks will read that its catalog lacks, in one round, then
decides the request once (no run of the chain that stops at a missing id)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

import kvproxy.pipeline.schema_ids as audit_ids
import kvproxy.proxy.lookups.schema_ids as proxy_ids
from kvproxy.policies.api import Need, ProducedRecords, Verdict
from kvproxy.policies.chain import PolicyChain
from kvproxy.policies.config import build_routing
from kvproxy.policies.schemas import ids
from kvproxy.policies.schemas.model import (
    RegisteredSchema,
    SchemaEntry,
    SchemaType,
    UnknownSchema,
)
from kvproxy.protocol import error_codes
from kvproxy.protocol.budget import Allowance, MemoryBudget
from kvproxy.protocol.messages import decode_request
from kvproxy.protocol.records import build_batch
from kvproxy.proxy.config.proxy_config import ProxyConfig
from kvproxy.proxy.lookups.topic_configs import TopicConfigCache
from kvproxy.proxy.ops.metrics import ProxyMetrics
from kvproxy.proxy.produce.decider import ProduceDecider
from kvproxy.registry.catalog import RegistryCatalog, compiled
from kvproxy.settings.schema_registry import SchemaRegistryConfig
from tests.harness.fuzz import produce_request

TOPIC = "orders"
ORDER = json.dumps(
    {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "string"}]}
)
REGISTERED = 1
UNKNOWN = 99


class AnsweringCatalog(RegistryCatalog):
    """The proxy's catalog, its lookups answered here (id 1 under orders-value) instead of by a
    registry; `looked_up` lists every id asked for."""

    def __init__(self) -> None:
        super().__init__(SchemaRegistryConfig(url=("http://127.0.0.1:9",)))
        self.looked_up: list[int] = []

    async def _lookup_now(self, schema_id: int) -> SchemaEntry:
        self.looked_up.append(schema_id)
        entry: SchemaEntry = UnknownSchema(schema_id)
        if schema_id == REGISTERED:
            registered = RegisteredSchema(
                schema_id, SchemaType.AVRO, ORDER, subjects=frozenset({f"{TOPIC}-value"})
            )
            entry = compiled(registered, int(time.time() * 1000))
        self._store(entry)
        return entry


def framed(schema_id: int) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + b"\x02a"


def request_of(*schema_ids: int) -> tuple[bytes, Any]:
    """A Produce request with one partition per id, each one record framed with it."""
    parts = [
        (TOPIC, index, build_batch([(None, framed(schema_id), None, None)]))
        for index, schema_id in enumerate(schema_ids)
    ]
    frame = produce_request(9, 7, parts)
    return frame, decode_request(frame)


def test_the_chain_runs_once_per_partition_when_schema_ids_are_looked_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs: list[tuple[str, int]] = []
    check = PolicyChain.check

    def counted(chain: PolicyChain, produced: ProducedRecords) -> Verdict:
        runs.append((produced.topic, produced.partition))
        return check(chain, produced)

    monkeypatch.setattr(PolicyChain, "check", counted)
    routing = build_routing(None, [{"match": TOPIC, "policies": [{"schema": {}}]}], Path("."))
    config = ProxyConfig.model_validate({"upstream": {"bootstrap_servers": "127.0.0.1:9"}})
    topic_configs = TopicConfigCache(lambda: [], None, ttl_s=60, timeout_s=1)

    async def scenario() -> None:
        catalog = AnsweringCatalog()
        decisions = ProduceDecider(
            config, routing, topic_configs, MemoryBudget(64 << 20), ProxyMetrics(), schemas=catalog
        )
        try:
            engine = decisions.engine
            frame, request = request_of(REGISTERED, UNKNOWN)
            assert decisions.decide_now(engine, frame, request) is None  # ids to look up
            assert runs == []
            decision = await decisions.decide_later(engine, frame, request, [])
            assert runs == [(TOPIC, 0), (TOPIC, 1)]
            assert sorted(catalog.looked_up) == [REGISTERED, UNKNOWN]
            accepted, refused = decision.outcomes
            assert accepted.verdict.ok
            assert refused.verdict.code == error_codes.INVALID_RECORD
            assert [e.message for e in refused.verdict.record_errors] == [
                f"unknown schema id {UNKNOWN}"
            ]

            runs.clear()
            again = decisions.decide_now(engine, *request_of(REGISTERED, UNKNOWN))
            assert again is not None and len(again.rejected) == 1  # answered from the cache
            assert runs == [(TOPIC, 0), (TOPIC, 1)]
            assert len(catalog.looked_up) == 2
        finally:
            decisions.close()
            await catalog.aclose()

    asyncio.run(scenario())
    routing.close()


class ReadsOneId:
    """A policy of another distribution that reads schema ids and says which one it reads."""

    name = "reads_one_id"
    needs = frozenset({Need.SCHEMAS})

    def schema_ids_wanted(self, topic: str, produced: ProducedRecords) -> set[int]:
        return {7}

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        raise AssertionError("not run while gathering")


def test_the_proxy_and_the_audit_gather_schema_ids_with_one_function() -> None:
    assert proxy_ids.schema_ids_wanted is ids.schema_ids_wanted
    assert audit_ids.schema_ids_wanted is ids.schema_ids_wanted

    chain = PolicyChain([ReadsOneId()])  # type: ignore[list-item]
    _, request = request_of(REGISTERED, UNKNOWN)
    allowance = Allowance(1 << 20, MemoryBudget(1 << 20))
    catalog = AnsweringCatalog()
    try:
        gathered = proxy_ids.request_schema_ids(request, {TOPIC: chain}, catalog, allowance, 0)
    finally:
        allowance.release()
        asyncio.run(catalog.aclose())
    assert gathered == {7}  # what the policy reads, not every id the records carry
