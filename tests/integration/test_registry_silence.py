"""A registry that takes connections and does not answer (a tarpit, a hung process): lookups
behind it fail fast once it is known silent, it is probed again after
`negative_cache_ttl_ms`, and cancelled lookups racing the freed slots end cleanly (no
InvalidStateError, no "Task exception was never retrieved")."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kvproxy.policies.schemas.model import RegistryUnavailable, ResolvedSchema
from kvproxy.registry.catalog import RegistryCatalog
from kvproxy.settings.schema_registry import SchemaRegistryConfig
from tests.harness.schema_registry import TestRegistry

ORDER_AVRO = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "fields": [{"name": "id", "type": "string"}],
    }
)


def _avro(n: int) -> str:
    return ORDER_AVRO.replace("Order", f"Order{n}")


@pytest.fixture
async def catalogs() -> AsyncIterator[list[RegistryCatalog]]:
    made: list[RegistryCatalog] = []
    yield made
    for catalog in made:
        await catalog.aclose()


def open_catalog(catalogs: list[RegistryCatalog], url: str, **options: Any) -> RegistryCatalog:
    catalog = RegistryCatalog(SchemaRegistryConfig(url=[url], **options))
    catalogs.append(catalog)
    return catalog


async def test_a_silent_registry_is_not_asked_again_until_negative_cache_ttl(
    catalogs: list[RegistryCatalog],
) -> None:
    with TestRegistry(slow_s=5.0) as tarpit:
        ids = [tarpit.register(f"t{n}-value", _avro(n)) for n in range(3)]
        tarpit.fail = "slow"
        catalog = open_catalog(catalogs, tarpit.url, timeout_ms=200, negative_cache_ttl_ms=600)
        first = (await catalog.fetch({ids[0]}))[ids[0]]
        assert first == RegistryUnavailable(ids[0], f"{tarpit.url}: no answer within 200 ms")

        # a fresh id while the registry is known silent: answered without asking it
        second = (await catalog.fetch({ids[1]}))[ids[1]]
        assert isinstance(second, RegistryUnavailable)
        assert second.reason.startswith("the registry has not answered for ")
        assert "no answer within 200 ms" in second.reason
        assert second.reason.endswith("asked again at most every 600 ms")
        assert tarpit.count(f"/schemas/ids/{ids[1]}") == 0

        # after negative_cache_ttl_ms the next fresh id starts a probe (answered at once
        # itself); the registry answers it, and ids are asked again
        tarpit.fail = None
        await asyncio.sleep(0.7)
        assert isinstance((await catalog.fetch({ids[2]}))[ids[2]], RegistryUnavailable)
        for _ in range(100):
            if catalog.health.not_asked() is None:
                break
            await asyncio.sleep(0.02)
        assert tarpit.count("/schemas/types") == 1
        assert isinstance((await catalog.fetch({ids[2]}))[ids[2]], ResolvedSchema)
        assert isinstance((await catalog.fetch({ids[1]}))[ids[1]], ResolvedSchema)


async def test_no_request_waits_for_the_probe_of_a_silent_registry(
    catalogs: list[RegistryCatalog],
) -> None:
    with TestRegistry(slow_s=5.0) as tarpit:
        ids = [tarpit.register(f"t{n}-value", _avro(n)) for n in range(4)]
        tarpit.fail = "slow"
        catalog = open_catalog(catalogs, tarpit.url, timeout_ms=300, negative_cache_ttl_ms=200)
        await catalog.fetch({ids[0]})
        await asyncio.sleep(0.25)
        answered = await asyncio.wait_for(catalog.fetch({ids[1], ids[2], ids[3]}), 0.2)
        assert all(isinstance(entry, RegistryUnavailable) for entry in answered.values())
        assert [tarpit.count(f"/schemas/ids/{schema_id}") for schema_id in ids] == [1, 0, 0, 0]
        for _ in range(50):  # the probe, beside the lookups, waits its time-out
            if tarpit.count("/schemas/types"):
                break
            await asyncio.sleep(0.02)
        assert tarpit.count("/schemas/types") == 1
        await asyncio.sleep(0.4)  # the probe timed out: still silent, the next probe later
        again = (await catalog.fetch({ids[1]}))[ids[1]]
        assert isinstance(again, RegistryUnavailable)
        assert "no answer within 300 ms" in again.reason
        assert tarpit.count(f"/schemas/ids/{ids[1]}") == 0


@pytest.mark.parametrize("mode", ["error500", "garbage"])
async def test_a_registry_that_answers_badly_is_still_asked_for_each_id(
    catalogs: list[RegistryCatalog], mode: Any
) -> None:
    with TestRegistry() as failing:
        ids = [failing.register(f"t{n}-value", _avro(n)) for n in range(2)]
        failing.fail = mode
        catalog = open_catalog(catalogs, failing.url, negative_cache_ttl_ms=60_000)
        await catalog.fetch({ids[0]})
        failing.fail = None
        assert isinstance((await catalog.fetch({ids[1]}))[ids[1]], ResolvedSchema)


async def test_a_negative_cache_ttl_of_zero_asks_every_time(
    catalogs: list[RegistryCatalog],
) -> None:
    with TestRegistry(slow_s=5.0) as tarpit:
        ids = [tarpit.register(f"t{n}-value", _avro(n)) for n in range(2)]
        tarpit.fail = "slow"
        catalog = open_catalog(catalogs, tarpit.url, timeout_ms=100, negative_cache_ttl_ms=0)
        await catalog.fetch({ids[0]})
        second = (await catalog.fetch({ids[1]}))[ids[1]]
        assert second == RegistryUnavailable(ids[1], f"{tarpit.url}: no answer within 100 ms")


async def test_lookups_abandoned_behind_a_tarpit_end_without_task_errors(
    catalogs: list[RegistryCatalog], caplog: pytest.LogCaptureFixture
) -> None:
    """Requests giving up on their lookups (`request_wait_ms`) while other lookups time out
    and free their slots: every lookup task ends cancelled or with its entry."""
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    with TestRegistry(slow_s=5.0) as tarpit:
        tarpit.fail = "slow"
        catalog = open_catalog(
            catalogs,
            tarpit.url,
            timeout_ms=120,
            negative_cache_ttl_ms=0,  # every lookup asks: as many slot hand-overs as can be
            lookups_per_connection=2,
        )

        async def client(owner: int) -> None:
            for round_ in range(10):
                ids = {1_000 * owner + round_ * 10 + n for n in range(4)}
                await catalog.fetch(ids, owner=owner % 3, wait_s=0.04 + 0.03 * (owner % 4))

        with caplog.at_level(logging.ERROR, logger="asyncio"):
            await asyncio.gather(*(client(owner) for owner in range(16)))
            await asyncio.sleep(0.3)
            gc.collect()
            await asyncio.sleep(0)
    loop.set_exception_handler(None)
    assert [context.get("message") for context in unhandled] == []
    assert "never retrieved" not in caplog.text
    assert catalog.slots.free == catalog.slots.total
