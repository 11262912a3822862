"""The registry catalog (registry/) against the test registry, and the `schema` policy reading it:
what a lookup finds, how it fails, one lookup per id, the cache's bounds, URL failover, and the
policy's record errors end to end (no Kafka: a batch is built, parsed and validated)."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

import kvproxy.registry.catalog as catalog_module
import kvproxy.registry.client as registry_client
from kvproxy.policies.api import ACCEPT, PolicyContext, Verdict
from kvproxy.policies.builtin.schema import SchemaPolicy
from kvproxy.policies.chain import PolicyChain
from kvproxy.policies.schemas.ids import schema_ids_wanted
from kvproxy.policies.schemas.model import (
    ReferencedSchema,
    RegistryUnavailable,
    ResolvedSchema,
    SchemaCatalog,
    SchemaReference,
    SchemaType,
    UnknownSchema,
)
from kvproxy.policies.schemas.wire import read_schema_id, write_message_indexes
from kvproxy.protocol import error_codes
from kvproxy.protocol.records.writer import build_batch
from kvproxy.registry.catalog import LOOKUPS_AT_ONCE, RegistryCatalog
from kvproxy.registry.client import RegistryClient
from kvproxy.settings.schema_registry import SchemaRegistryConfig
from tests.harness.avro_schemas import MONEY_AVRO, PAYMENT_AVRO
from tests.harness.produced import produced
from tests.harness.protobuf_messages import Order
from tests.harness.schema_registry import Reference, TestRegistry
from tests.harness.tls import make_tls_files

TOPIC = "orders"
ORDER_AVRO = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "namespace": "shop",
        "fields": [{"name": "id", "type": "string"}, {"name": "units", "type": "long"}],
    }
)
ORDER_JSON = json.dumps(
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "shop.Order",
        "type": "object",
        "properties": {"id": {"type": "string"}},
        "required": ["id"],
    }
)


# -- helpers --------------------------------------------------------------------------------------


@pytest.fixture
def registry() -> Iterator[TestRegistry]:
    with TestRegistry(slow_s=1.0) as running:
        yield running


def config_for(*urls: str, **options: Any) -> SchemaRegistryConfig:
    return SchemaRegistryConfig(url=list(urls), **{"timeout_ms": 1_000, **options})


@pytest.fixture
async def catalogs() -> AsyncIterator[list[RegistryCatalog]]:
    """Catalogs a test makes (`open_catalog`), closed afterwards."""
    made: list[RegistryCatalog] = []
    yield made
    for catalog in made:
        await catalog.aclose()


def open_catalog(catalogs: list[RegistryCatalog], *urls: str, **options: Any) -> RegistryCatalog:
    catalog = RegistryCatalog(config_for(*urls, **options))
    catalogs.append(catalog)
    return catalog


async def fetched(catalog: RegistryCatalog, schema_id: int) -> Any:
    await catalog.fetch({schema_id})
    return catalog.entry(schema_id)


def framed(schema_id: int, payload: bytes = b"", indexes: tuple[int, ...] | None = None) -> bytes:
    """A value as Confluent's serializers frame it (Protobuf: with message indexes)."""
    out = bytearray(b"\x00" + schema_id.to_bytes(4, "big"))
    if indexes is not None:
        write_message_indexes(out, indexes)
    return bytes(out + payload)


def avro_order(order_id: str = "o-1", units: int = 3) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(
        out, fastavro.parse_schema(json.loads(ORDER_AVRO)), {"id": order_id, "units": units}
    )
    return out.getvalue()


def register_protobuf_order(registry: TestRegistry) -> tuple[int, bytes]:
    """`Order` registered as confluent-kafka's ProtobufSerializer registers it (orders.proto as a
    base64 FileDescriptorProto under orders-value, money.proto as its reference), and a value
    it wrote."""
    client = SchemaRegistryClient({"url": registry.url, "max.retries": 0})
    serializer = ProtobufSerializer(
        Order, client, {"auto.register.schemas": True, "use.deprecated.format": False}
    )
    order = Order(id="o-1")
    order.amount.currency = "EUR"
    order.amount.units = 3
    written = serializer(order, SerializationContext(TOPIC, MessageField.VALUE))
    assert written is not None
    return read_schema_id(written), written


def schema_policy(**options: Any) -> SchemaPolicy:
    return SchemaPolicy.create(PolicyContext(), options)


async def decide(
    policy: SchemaPolicy,
    catalog: RegistryCatalog,
    values: list[bytes | None],
    *,
    keys: list[bytes | None] | None = None,
    compacted: bool = False,
    now_ms: int | None = None,
) -> tuple[Verdict, int]:
    """The policy's verdict on one batch of `values` arriving at `now_ms` (default: now), the
    ids it will read gathered and looked up first as the proxy does; and how many lookup rounds
    that took (0 or 1)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    keys = keys if keys is not None else [None] * len(values)
    raw = build_batch([(key, value, None, None) for key, value in zip(keys, values, strict=True)])
    gathered = produced(raw, topic=TOPIC, compacted=compacted, now_ms=now_ms, schemas=catalog)
    wanted = schema_ids_wanted(PolicyChain([policy]), gathered)
    schemas: SchemaCatalog = catalog
    if wanted:
        schemas = catalog.with_answers(await catalog.fetch(wanted), exhausted=True)
    batch = produced(raw, topic=TOPIC, compacted=compacted, now_ms=now_ms, schemas=schemas)
    return policy.validate(TOPIC, 0, batch), int(bool(wanted))


def errors(verdict: Verdict) -> list[tuple[int, str]]:
    assert verdict.code == error_codes.INVALID_RECORD, verdict
    return [(error.index, error.message) for error in verdict.record_errors]


# -- what a lookup finds --------------------------------------------------------------------------


async def test_avro_id_resolves_with_its_subjects_and_references(
    registry: TestRegistry, catalogs: list[RegistryCatalog]
) -> None:
    money_id = registry.register("shop.Money", MONEY_AVRO)
    payment_id = registry.register(
        "payments-value", PAYMENT_AVRO, references=[Reference("shop.Money", "shop.Money", 1)]
    )
    registry.register(
        "payments-archive-value",
        PAYMENT_AVRO,
        references=[Reference("shop.Money", "shop.Money", 1)],
    )
    catalog = open_catalog(catalogs, registry.url)

    entry = await fetched(catalog, payment_id)
    assert isinstance(entry, ResolvedSchema)
    assert entry.problem is None and entry.compiled is not None
    assert entry.registered.schema_type is SchemaType.AVRO
    assert entry.registered.schema == PAYMENT_AVRO
    assert entry.subjects == {"payments-value", "payments-archive-value"}
    assert entry.registered.references == (SchemaReference("shop.Money", "shop.Money", 1),)
    assert entry.registered.resolved_references == (
        ReferencedSchema("shop.Money", SchemaType.AVRO, MONEY_AVRO),
    )
    assert money_id != payment_id


async def test_json_schema_id_resolves(
    registry: TestRegistry, catalogs: list[RegistryCatalog]
) -> None:
    schema_id = registry.register("orders-value", ORDER_JSON, "JSON")
    entry = await fetched(open_catalog(catalogs, registry.url), schema_id)
    assert isinstance(entry, ResolvedSchema)
    assert entry.registered.schema_type is SchemaType.JSON
    assert entry.subjects == {"orders-value"}
    assert entry.registered.references == ()
    assert entry.compiled is not None
    assert entry.compiled.mismatch(framed(schema_id, b'{"id": "o-1"}'), 5) is None


async def test_protobuf_id_resolves_with_its_imported_file(
    registry: TestRegistry, catalogs: list[RegistryCatalog]
) -> None:
    schema_id, written = register_protobuf_order(registry)
    entry = await fetched(open_catalog(catalogs, registry.url), schema_id)

    assert isinstance(entry, ResolvedSchema)
    assert entry.problem is None and entry.compiled is not None
    assert entry.registered.schema_type is SchemaType.PROTOBUF
    assert entry.subjects == {"orders-value"}
    assert entry.registered.references == (SchemaReference("money.proto", "money.proto", 1),)
    [money] = entry.registered.resolved_references
    assert (money.name, money.schema_type) == ("money.proto", SchemaType.PROTOBUF)
    # the value the serializer wrote decodes, and names the message its indexes point at
    assert entry.compiled.mismatch(written, 5) is None
    assert entry.compiled.record_name(written, 5) == "shop.Order"


async def test_unknown_id(registry: TestRegistry, catalogs: list[RegistryCatalog]) -> None:
    assert await fetched(open_catalog(catalogs, registry.url), 99) == UnknownSchema(99)


# -- how a lookup fails ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("down", "{url}: ConnectError: All connection attempts failed (Connection refused)"),
        ("hangup", "{url}: RemoteProtocolError: Server disconnected without sending a response."),
        ("slow", "{url}: no answer within 150 ms"),
        ("error500", "{url}: HTTP 500 (error 50001): Error in the backend data store"),
        (
            "garbage",
            "the answer is not JSON: '<html><body>not a registry answer</body></html>'",
        ),
    ],
)
async def test_failure_modes_are_unavailable_with_their_reason(
    registry: TestRegistry, catalogs: list[RegistryCatalog], mode: Any, reason: str
) -> None:
    schema_id = registry.register("orders-value", ORDER_AVRO)
    registry.fail = mode
    catalog = open_catalog(catalogs, registry.url, timeout_ms=150)
    started = time.perf_counter()
    entry = await fetched(catalog, schema_id)
    assert entry == RegistryUnavailable(schema_id, reason.format(url=registry.url))
    assert time.perf_counter() - started < 0.9  # slow: the timeout, not the registry's 1 s


async def test_building_the_http_client_does_not_count_against_the_timeout(
    registry: TestRegistry, catalogs: list[RegistryCatalog], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading a CA bundle takes tens of milliseconds; the first lookup's time limit is for
    the registry's answer, not for that."""
    make_context = registry_client.tls_context

    def slow_tls_context(config: SchemaRegistryConfig) -> Any:
        time.sleep(0.3)
        return make_context(config)

    monkeypatch.setattr(registry_client, "tls_context", slow_tls_context)
    schema_id = registry.register("orders-value", ORDER_AVRO)
    catalog = open_catalog(catalogs, registry.url, timeout_ms=200)
    assert isinstance(await fetched(catalog, schema_id), ResolvedSchema)


@pytest.mark.parametrize(
    ("server", "client", "accepted"),
    [
        (
            {"basic_auth": ("alice", "s3cret")},
            {"basic_auth": {"username": "alice", "password": "s3cret"}},
            True,
        ),
        (
            {"basic_auth": ("alice", "s3cret")},
            {"basic_auth": {"username": "alice", "password": "wrong"}},
            False,
        ),
        ({"basic_auth": ("alice", "s3cret")}, {}, False),
        ({"bearer_token": "tok-1"}, {"bearer_token": "tok-1"}, True),
        ({"bearer_token": "tok-1"}, {"bearer_token": "tok-2"}, False),
    ],
)
async def test_credentials(
    catalogs: list[RegistryCatalog], server: Any, client: Any, accepted: bool
) -> None:
    with TestRegistry(**server) as secured:
        schema_id = secured.register("orders-value", ORDER_AVRO)
        entry = await fetched(open_catalog(catalogs, secured.url, **client), schema_id)
    if accepted:
        assert isinstance(entry, ResolvedSchema)
        assert entry.subjects == {"orders-value"}
    else:
        assert entry == RegistryUnavailable(schema_id, "HTTP 401 (error 401): Unauthorized")


async def test_tls_with_the_registrys_ca(catalogs: list[RegistryCatalog]) -> None:
    with make_tls_files() as tls, TestRegistry(tls=tls) as secured:
        assert secured.url.startswith("https://")
        schema_id = secured.register("orders-value", ORDER_AVRO)
        trusting = open_catalog(catalogs, secured.url, tls={"ca_file": tls.ca})
        assert isinstance(await fetched(trusting, schema_id), ResolvedSchema)
        # without the CA the certificate is not trusted
        untrusting = open_catalog(catalogs, secured.url)
        entry = await fetched(untrusting, schema_id)
        assert isinstance(entry, RegistryUnavailable)
        assert entry.reason.startswith(f"{secured.url}: ConnectError: [SSL: CERTIFICATE_VERIFY")


# -- one lookup per id ----------------------------------------------------------------------------


async def test_concurrent_fetches_of_one_id_make_one_lookup(
    registry: TestRegistry, catalogs: list[RegistryCatalog]
) -> None:
    schema_id = registry.register("orders-value", ORDER_AVRO)
    catalog = open_catalog(catalogs, registry.url)
    await asyncio.gather(*(catalog.fetch({schema_id}) for _ in range(50)))
    assert isinstance(catalog.entry(schema_id), ResolvedSchema)
    assert registry.count(f"/schemas/ids/{schema_id}") == 1
    assert registry.count(f"/schemas/ids/{schema_id}/versions") == 1


async def test_a_cancelled_waiter_does_not_cancel_the_lookup_for_the_others(
    catalogs: list[RegistryCatalog],
) -> None:
    with TestRegistry(slow_s=0.3) as slow:
        schema_id = slow.register("orders-value", ORDER_AVRO)
        slow.fail = "slow"
        catalog = open_catalog(catalogs, slow.url)
        leaving = asyncio.create_task(catalog.fetch({schema_id}))
        staying = asyncio.create_task(catalog.fetch({schema_id}))
        await asyncio.sleep(0.05)
        leaving.cancel()
        await staying
        assert leaving.cancelled()
        assert isinstance(catalog.entry(schema_id), ResolvedSchema)
        assert slow.count(f"/schemas/ids/{schema_id}") == 1


async def test_lookups_of_many_ids_at_once_are_bounded_for_the_whole_process(
    catalogs: list[RegistryCatalog],
) -> None:
    with TestRegistry(slow_s=0.1) as slow:
        slow.fail = "slow"  # unknown ids, each answered after a while
        catalog = open_catalog(catalogs, slow.url, max_lookups_per_request=100, timeout_ms=10_000)
        first, second = await asyncio.gather(
            catalog.fetch(range(1000, 1040)), catalog.fetch(range(2000, 2040))
        )
        assert {type(entry) for entry in [*first.values(), *second.values()]} == {UnknownSchema}
        assert slow.count("/schemas/ids/1000") == 1
        # two requests per id (the schema and its subjects), for at most LOOKUPS_AT_ONCE ids
        assert 2 * LOOKUPS_AT_ONCE >= slow.most_in_flight > LOOKUPS_AT_ONCE


# -- the cache ------------------------------------------------------------------------------------


async def test_a_found_id_is_answered_from_the_cache(
    registry: TestRegistry, catalogs: list[RegistryCatalog]
) -> None:
    schema_id = registry.register("orders-value", ORDER_AVRO)
    catalog = open_catalog(catalogs, registry.url)
    policy = schema_policy()
    verdict, rounds = await decide(policy, catalog, [framed(schema_id, avro_order())])
    assert (verdict, rounds) == (ACCEPT, 1)
    registry.clear_requests()

    verdict, rounds = await decide(policy, catalog, [framed(schema_id, avro_order())])
    assert (verdict, rounds) == (ACCEPT, 0)
    assert isinstance(catalog.entry(schema_id), ResolvedSchema)
    assert registry.requests == []


async def test_a_found_id_expires_after_cache_ttl(
    registry: TestRegistry, catalogs: list[RegistryCatalog], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1_000.0]
    monkeypatch.setattr(
        catalog_module, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time)
    )
    schema_id = registry.register("orders-value", ORDER_AVRO)
    catalog = open_catalog(catalogs, registry.url, cache_ttl_ms=1_000)
    assert isinstance(await fetched(catalog, schema_id), ResolvedSchema)
    clock[0] += 0.999
    assert isinstance(catalog.entry(schema_id), ResolvedSchema)
    clock[0] += 0.002
    assert catalog.entry(schema_id) is None

    verdict, rounds = await decide(schema_policy(), catalog, [framed(schema_id, avro_order())])
    assert (verdict, rounds) == (ACCEPT, 1)
    assert registry.count(f"/schemas/ids/{schema_id}") == 2


async def test_an_unknown_id_is_asked_again_after_negative_cache_ttl(
    registry: TestRegistry, catalogs: list[RegistryCatalog]
) -> None:
    catalog = open_catalog(catalogs, registry.url, negative_cache_ttl_ms=200)
    policy = schema_policy()
    verdict, rounds = await decide(policy, catalog, [framed(1)])
    assert errors(verdict) == [(0, "unknown schema id 1")]
    assert rounds == 1
    registry.register("orders-value", ORDER_AVRO)  # id 1 exists now

    verdict, rounds = await decide(policy, catalog, [framed(1, avro_order())])
    assert errors(verdict) == [(0, "unknown schema id 1")]  # still the cached answer
    assert (rounds, registry.count("/schemas/ids/1")) == (0, 1)

    await asyncio.sleep(0.25)
    verdict, rounds = await decide(policy, catalog, [framed(1, avro_order())])
    assert (verdict, rounds) == (ACCEPT, 1)
    assert registry.count("/schemas/ids/1") == 2


async def test_cache_max_schemas_keeps_the_newest(
    registry: TestRegistry, catalogs: list[RegistryCatalog]
) -> None:
    ids = [
        registry.register(f"t{n}-value", ORDER_AVRO.replace("Order", f"Order{n}")) for n in range(4)
    ]
    catalog = open_catalog(catalogs, registry.url, cache_max_schemas=3)
    for schema_id in ids:
        await catalog.fetch({schema_id})
    assert len(catalog) == 3
    assert catalog.entry(ids[0]) is None
    assert all(isinstance(catalog.entry(schema_id), ResolvedSchema) for schema_id in ids[1:])
    assert set(catalog.answers()) == set(ids[1:])


async def test_max_lookups_per_request(
    registry: TestRegistry, catalogs: list[RegistryCatalog]
) -> None:
    ids = [
        registry.register(f"t{n}-value", ORDER_AVRO.replace("Order", f"Order{n}")) for n in range(5)
    ]
    catalog = open_catalog(catalogs, registry.url, max_lookups_per_request=2)
    await catalog.fetch(ids)
    looked_up = [schema_id for schema_id in ids if registry.count(f"/schemas/ids/{schema_id}")]
    assert looked_up == ids[:2]
    assert len(catalog) == 2

    exhausted = catalog.with_answers({}, exhausted=True)
    assert isinstance(exhausted.entry(ids[0]), ResolvedSchema)
    assert exhausted.entry(ids[4]) == RegistryUnavailable(
        ids[4], "the request needs more than 2 schema ids looked up"
    )


# -- URLs in turn, answer size --------------------------------------------------------------------


async def test_the_next_url_is_tried_when_one_is_down(
    registry: TestRegistry, catalogs: list[RegistryCatalog]
) -> None:
    schema_id = registry.register("orders-value", ORDER_AVRO)
    with TestRegistry() as down:
        down.fail = "down"
        entry = await fetched(open_catalog(catalogs, down.url, registry.url), schema_id)
        assert isinstance(entry, ResolvedSchema)

        registry.fail = "down"
        entry = await fetched(open_catalog(catalogs, down.url, registry.url), schema_id)
    refused = "ConnectError: All connection attempts failed (Connection refused)"
    assert entry == RegistryUnavailable(
        schema_id, f"{down.url}: {refused}; {registry.url}: {refused}"
    )


async def test_an_answer_over_max_schema_bytes(
    registry: TestRegistry, catalogs: list[RegistryCatalog]
) -> None:
    big = json.loads(ORDER_AVRO) | {"doc": "x" * 2_000}
    big_id = registry.register("orders-value", json.dumps(big))
    small_id = registry.register("orders-value", ORDER_AVRO)
    catalog = open_catalog(catalogs, registry.url, max_schema_bytes=1_024)
    assert await fetched(catalog, big_id) == RegistryUnavailable(
        big_id, f"{registry.url}: the answer is over max_schema_bytes (1024)"
    )
    assert isinstance(await fetched(catalog, small_id), ResolvedSchema)


# -- RegistryClient.check -------------------------------------------------------------------------


async def test_check_names_each_url() -> None:
    with (
        TestRegistry() as good,
        TestRegistry(bearer_token="tok-1") as secured,
        TestRegistry() as down,
    ):
        down.fail = "down"
        client = RegistryClient(config_for(good.url, secured.url, down.url))
        try:
            lines = await client.check()
        finally:
            await client.aclose()
    assert [ok for ok, _ in lines] == [True, False, False]
    assert lines[0][1].startswith(f"{good.url}: ok (")
    assert lines[1][1] == f"{secured.url}: refused: HTTP 401 (error 401): Unauthorized"
    assert lines[2][1] == (
        f"{down.url}: unreachable: ConnectError: All connection attempts failed "
        "(Connection refused)"
    )


# -- the schema policy with the catalog -----------------------------------------------------------


async def test_policy_record_errors(
    registry: TestRegistry, catalogs: list[RegistryCatalog]
) -> None:
    schema_id = registry.register("orders-value", ORDER_AVRO)
    elsewhere_id = registry.register("payments-value", MONEY_AVRO)
    catalog = open_catalog(catalogs, registry.url)
    verdict, _ = await decide(
        schema_policy(),
        catalog,
        [
            framed(schema_id, avro_order()),
            b"\x01plain",
            b"\x00\x00\x01",
            framed(99),
            framed(elsewhere_id),
            None,
        ],
    )
    assert errors(verdict) == [
        (1, "no schema id: magic byte 0x01, expected 0x00"),
        (2, "no schema id: 3 bytes, a schema id header is 5"),
        (3, "unknown schema id 99"),
        (4, f"schema {elsewhere_id} is not registered under orders-value"),
        (5, "no schema id: the value is null"),
    ]


async def test_policy_numbers_record_errors_across_the_partitions_batches(
    registry: TestRegistry, catalogs: list[RegistryCatalog]
) -> None:
    schema_id = registry.register("orders-value", ORDER_AVRO)
    registry.register("orders-key", ORDER_AVRO)
    catalog = open_catalog(catalogs, registry.url)
    await catalog.fetch({schema_id})
    good = framed(schema_id, avro_order())
    first = [(good, good, None, None)] * 3
    second = [(good, good, None, None), (good, b"\x01plain", None, None), (good, good, None, None)]
    raw = build_batch(first) + build_batch(second, base_offset=3)
    for options in ({}, {"key": "required"}, {"validate_payload": True}):
        batch = produced(
            raw, topic=TOPIC, compacted=False, now_ms=int(time.time() * 1000), schemas=catalog
        )
        verdict = schema_policy(**options).validate(TOPIC, 0, batch)
        assert errors(verdict) == [(4, "no schema id: magic byte 0x01, expected 0x00")], options


async def test_policy_tombstones_pass_on_a_compacted_topic(
    registry: TestRegistry, catalogs: list[RegistryCatalog]
) -> None:
    schema_id = registry.register("orders-value", ORDER_AVRO)
    catalog = open_catalog(catalogs, registry.url)
    values = [framed(schema_id, avro_order()), None]
    assert (await decide(schema_policy(), catalog, values, compacted=True))[0] == ACCEPT
    verdict, _ = await decide(schema_policy(), catalog, values, compacted=False)
    assert errors(verdict) == [(1, "no schema id: the value is null")]


async def test_policy_payload_mismatch_per_format(
    registry: TestRegistry, catalogs: list[RegistryCatalog]
) -> None:
    avro_id = registry.register("orders-value", ORDER_AVRO)
    json_id = registry.register("orders-value", ORDER_JSON, "JSON")
    protobuf_id, written = register_protobuf_order(registry)
    catalog = open_catalog(catalogs, registry.url)
    values = [
        framed(avro_id, avro_order()),
        framed(avro_id, avro_order() + b"\x00"),
        framed(avro_id, avro_order()[:3]),
        framed(json_id, b'{"id": "o-1"}'),
        framed(json_id, b'{"id": 7}'),
        framed(json_id, b'{"id": '),
        written,
        # field 9 (varint 1) is not in shop.Order
        framed(protobuf_id, b"\x48\x01", indexes=(1,)),
        framed(protobuf_id, b"", indexes=(7,)),
    ]
    verdict, _ = await decide(schema_policy(validate_payload=True), catalog, values)
    assert [message for _, message in errors(verdict)] == [
        f"does not match schema {avro_id}: 1 byte after the record",
        f"does not match schema {avro_id}: truncated at byte 8",
        f"does not match schema {json_id}: data.id must be string",
        f"does not match schema {json_id}: not JSON: unexpected end of data: line 1 column 8 "
        "(char 7)",
        f"does not match schema {protobuf_id}: shop.Order has no field 9 (wire type varint)",
        f"does not match schema {protobuf_id}: message index [7] is not in the schema",
    ]
    assert [index for index, _ in errors(verdict)] == [1, 2, 4, 5, 7, 8]
    # without validate_payload only the header and the subject count
    assert (await decide(schema_policy(), catalog, values))[0] == ACCEPT


async def test_policy_payload_over_max_payload_bytes_is_refused_undecoded(
    registry: TestRegistry, catalogs: list[RegistryCatalog], monkeypatch: pytest.MonkeyPatch
) -> None:
    avro_id = registry.register("orders-value", ORDER_AVRO)
    catalog = open_catalog(catalogs, registry.url)
    large = framed(avro_id, avro_order("o" * 3_000))
    policy = schema_policy(validate_payload=True, max_payload_bytes=2_048)
    verdict, _ = await decide(policy, catalog, [framed(avro_id, avro_order()), large])
    assert errors(verdict) == [
        (
            1,
            f"{len(large)} bytes exceed max_payload_bytes (2048): the payload is not decoded "
            f"against schema {avro_id}",
        )
    ]


async def test_policy_key_side(registry: TestRegistry, catalogs: list[RegistryCatalog]) -> None:
    value_id = registry.register("orders-value", ORDER_AVRO)
    key_id = registry.register("orders-key", json.dumps({"type": "string"}))
    catalog = open_catalog(catalogs, registry.url)
    value = framed(value_id, avro_order())
    keys = [framed(key_id, b"\x02k"), None, b"plain", framed(99), framed(value_id)]
    values = [value] * len(keys)

    verdict, _ = await decide(schema_policy(key="required"), catalog, values, keys=keys)
    assert errors(verdict) == [
        (1, "key: no schema id: the key is null"),
        (2, "key: no schema id: magic byte 0x70, expected 0x00"),
        (3, "key: unknown schema id 99"),
        (4, f"key: schema {value_id} is not registered under orders-key"),
    ]
    verdict, _ = await decide(schema_policy(key="optional"), catalog, values, keys=keys)
    assert errors(verdict) == [
        (3, "key: unknown schema id 99"),
        (4, f"key: schema {value_id} is not registered under orders-key"),
    ]


async def test_policy_record_name_strategies_avro(
    registry: TestRegistry, catalogs: list[RegistryCatalog]
) -> None:
    by_record = registry.register("shop.Order", ORDER_AVRO)
    by_topic_record = registry.register("orders-shop.Money", MONEY_AVRO)
    catalog = open_catalog(catalogs, registry.url)
    values = [framed(by_record, avro_order()), framed(by_topic_record)]

    verdict, _ = await decide(schema_policy(strategy="record_name"), catalog, values)
    assert errors(verdict) == [(1, f"schema {by_topic_record} is not registered under shop.Money")]
    verdict, _ = await decide(schema_policy(strategy="topic_record_name"), catalog, values)
    assert errors(verdict) == [(0, f"schema {by_record} is not registered under orders-shop.Order")]


async def test_policy_record_name_strategies_protobuf_by_message_index(
    registry: TestRegistry, catalogs: list[RegistryCatalog]
) -> None:
    protobuf_id, written = register_protobuf_order(registry)
    # the same file registered under the topic_record_name subject of shop.Order too
    registered = (await fetched(open_catalog(catalogs, registry.url), protobuf_id)).registered
    references = [Reference(r.name, r.subject, r.version) for r in registered.references]
    assert registry.register("orders-shop.Order", registered.schema, "PROTOBUF", references) == (
        protobuf_id
    )
    catalog = open_catalog(catalogs, registry.url)
    header = framed(protobuf_id, b"", indexes=(0,))  # shop.Header, the file's first message
    line = framed(protobuf_id, b"", indexes=(1, 0))  # shop.Order.Line

    verdict, _ = await decide(
        schema_policy(strategy="topic_record_name"), catalog, [written, header, line]
    )
    assert errors(verdict) == [
        (1, f"schema {protobuf_id} is not registered under orders-shop.Header"),
        (2, f"schema {protobuf_id} is not registered under orders-shop.Order.Line"),
    ]
    verdict, _ = await decide(schema_policy(strategy="record_name"), catalog, [written])
    assert errors(verdict) == [(0, f"schema {protobuf_id} is not registered under shop.Order")]


@pytest.mark.parametrize("on_error", ["reject", "accept"])
async def test_policy_when_the_registry_is_down(
    registry: TestRegistry, catalogs: list[RegistryCatalog], on_error: str
) -> None:
    schema_id = registry.register("orders-value", ORDER_AVRO)
    registry.fail = "down"
    catalog = open_catalog(catalogs, registry.url, on_error=on_error)
    values = [framed(schema_id, avro_order()), b"\x01plain"]
    verdict, _ = await decide(schema_policy(), catalog, values)
    if on_error == "accept":
        # the records with the id pass unchecked; the others are still checked
        assert errors(verdict) == [(1, "no schema id: magic byte 0x01, expected 0x00")]
        return
    assert verdict == Verdict(
        error_codes.REQUEST_TIMED_OUT,
        f"schema registry unavailable: schema id {schema_id}: {registry.url}: ConnectError: "
        "All connection attempts failed (Connection refused)",
        policy="schema",
        resend=True,  # retriable: the batch comes again, so it is not journaled
    )
    assert verdict.code == 7


async def test_policy_accepts_a_subject_registered_after_the_first_lookup(
    registry: TestRegistry, catalogs: list[RegistryCatalog]
) -> None:
    schema_id = registry.register("payments-value", ORDER_AVRO)
    catalog = open_catalog(catalogs, registry.url, negative_cache_ttl_ms=200)
    policy = schema_policy()
    value = [framed(schema_id, avro_order())]
    verdict, rounds = await decide(policy, catalog, value)
    assert errors(verdict) == [(0, f"schema {schema_id} is not registered under orders-value")]
    assert rounds == 1
    assert registry.register("orders-value", ORDER_AVRO) == schema_id
    entry = catalog.entry(schema_id)
    assert isinstance(entry, ResolvedSchema)

    # the answer is negative_cache_ttl_ms old: still the registry's word
    verdict, rounds = await decide(policy, catalog, value, now_ms=entry.fetched_ms + 200)
    assert errors(verdict) == [(0, f"schema {schema_id} is not registered under orders-value")]
    assert rounds == 0

    # older: the registry is asked again, and the subject is there now
    verdict, rounds = await decide(policy, catalog, value, now_ms=entry.fetched_ms + 201)
    assert (verdict, rounds) == (ACCEPT, 1)
    assert registry.count(f"/schemas/ids/{schema_id}/versions") == 2
