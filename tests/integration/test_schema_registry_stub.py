"""The test registry (tests/harness/schema_registry.py) against confluent-kafka's own registry
client and serializers: if they can register, look up and read back through it, the proxy's
registry tests talk to something shaped like Confluent Schema Registry."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.schema_registry import (
    Schema,
    SchemaReference,
    SchemaRegistryClient,
    SchemaRegistryError,
)
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer

# the HTTP library the client uses (httpx2 when installed, else httpx), for its transport errors
from confluent_kafka.schema_registry.common._httpx_compat import httpx
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2

from tests.harness.avro_schemas import MONEY_AVRO, PAYMENT_AVRO
from tests.harness.protobuf_messages import Order
from tests.harness.schema_registry import CONTENT_TYPE, Reference, TestRegistry
from tests.harness.tls import make_tls_files

USER_AVRO = json.dumps(
    {"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"}]}
)
USER_AVRO_V2 = json.dumps(
    {
        "type": "record",
        "name": "User",
        "fields": [
            {"name": "name", "type": "string"},
            {"name": "age", "type": "int", "default": 0},
        ],
    }
)
USER_JSON = json.dumps(
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"name": {"type": "string"}},
        "required": ["name"],
    }
)
ASSOCIATIONS = "/associations/resources/-/{topic}?resourceType=topic&associationType=value"


@pytest.fixture
def registry() -> Iterator[TestRegistry]:
    with TestRegistry() as running:
        yield running


def client_for(registry: TestRegistry, **extra: Any) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": registry.url, "max.retries": 0, **extra})


def sr_error(call: Any) -> SchemaRegistryError:
    with pytest.raises(SchemaRegistryError) as caught:
        call()
    return caught.value


def value_of(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


def http_get(registry: TestRegistry, path: str) -> tuple[int, str, Any]:
    """(status, content type, JSON body) of a GET, errors included."""
    try:
        with urllib.request.urlopen(registry.url + path, timeout=5) as answer:
            return answer.status, answer.headers["Content-Type"], json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], json.loads(error.read())


# -- the registry client's calls ----------------------------------------------------------------


def test_register_gives_one_id_per_schema_and_versions_per_subject(registry: TestRegistry) -> None:
    client = client_for(registry)
    user_id = client.register_schema("users-value", Schema(USER_AVRO, "AVRO"))
    assert client_for(registry).register_schema("users-value", Schema(USER_AVRO, "AVRO")) == user_id
    assert client.register_schema("people-value", Schema(USER_AVRO, "AVRO")) == user_id
    v2_id = client.register_schema("users-value", Schema(USER_AVRO_V2, "AVRO"))

    assert v2_id != user_id
    assert client.get_subjects() == ["people-value", "users-value"]
    assert client.get_versions("users-value") == [1, 2]
    assert client.get_versions("people-value") == [1]
    assert client_for(registry).get_schema(user_id).schema_str == USER_AVRO
    first = client.get_version("users-value", 1)
    assert (first.schema_id, first.version, first.subject) == (user_id, 1, "users-value")
    latest = client.get_latest_version("users-value")
    assert (latest.schema_id, latest.version, latest.schema.schema_str) == (v2_id, 2, USER_AVRO_V2)
    found = client_for(registry).lookup_schema("people-value", Schema(USER_AVRO, "AVRO"))
    assert (found.schema_id, found.version, found.subject) == (user_id, 1, "people-value")
    pairs = client.get_schema_versions(user_id)
    assert [(p.subject, p.version) for p in pairs] == [("people-value", 1), ("users-value", 1)]
    assert registry.requests[0] == ("POST", "/subjects/users-value/versions?normalize=False")


def test_direct_registration_is_what_the_client_reads(registry: TestRegistry) -> None:
    schema_id = registry.register("users-value", USER_JSON, "JSON")
    got = client_for(registry).get_schema(schema_id)
    assert (got.schema_str, got.schema_type) == (USER_JSON, "JSON")
    assert registry.register("other-value", USER_JSON, "JSON") == schema_id
    assert registry.latest_version("other-value") == 1


def test_not_found_errors_carry_confluent_codes(registry: TestRegistry) -> None:
    client = client_for(registry)
    schema_id = client.register_schema("users-value", Schema(USER_AVRO, "AVRO"))

    unknown_subject = sr_error(lambda: client.get_version("nobody-value", 1))
    assert (unknown_subject.http_status_code, unknown_subject.error_code) == (404, 40401)
    assert unknown_subject.error_message == "Subject 'nobody-value' not found."
    unknown_version = sr_error(lambda: client.get_version("users-value", 7))
    assert (unknown_version.http_status_code, unknown_version.error_code) == (404, 40402)
    unknown_id = sr_error(lambda: client.get_schema(schema_id + 41))
    assert (unknown_id.http_status_code, unknown_id.error_code) == (404, 40403)
    assert unknown_id.error_message == f"Schema {schema_id + 41} not found"
    not_under = sr_error(lambda: client.lookup_schema("users-value", Schema(USER_AVRO_V2, "AVRO")))
    assert (not_under.http_status_code, not_under.error_code) == (404, 40403)
    lookup_subject = sr_error(lambda: client.lookup_schema("nobody", Schema(USER_AVRO, "AVRO")))
    assert (lookup_subject.http_status_code, lookup_subject.error_code) == (404, 40401)
    no_versions = sr_error(lambda: client.get_versions("nobody"))
    assert no_versions.error_code == 40401
    id_versions = sr_error(lambda: client.get_schema_versions(schema_id + 41))
    assert id_versions.error_code == 40403
    bad_version = sr_error(lambda: client.get_version("users-value", 0))
    assert (bad_version.http_status_code, bad_version.error_code) == (422, 42202)


def test_invalid_schemas_are_refused_with_42201(registry: TestRegistry) -> None:
    client = client_for(registry)
    for schema in (
        Schema("{not json", "AVRO"),
        Schema(json.dumps({"type": "record", "name": "R", "fields": [{"name": "x"}]}), "AVRO"),
        Schema(PAYMENT_AVRO, "AVRO"),  # shop.Money is neither defined nor referenced
        Schema(USER_AVRO, "AVRO", [SchemaReference("shop.Money", "missing", 1)]),
    ):
        refused = sr_error(lambda schema=schema: client.register_schema("bad-value", schema))
        assert (refused.http_status_code, refused.error_code) == (422, 42201)
    assert client.get_subjects() == []


def test_answers_have_confluents_wire_shape(registry: TestRegistry) -> None:
    avro_id = registry.register("users-value", USER_AVRO)
    money_id = registry.register("money", MONEY_AVRO)
    payment_id = registry.register(
        "payments-value", PAYMENT_AVRO, references=[Reference("shop.Money", "money", 1)]
    )
    json_id = registry.register("json-value", USER_JSON, "JSON")

    assert http_get(registry, f"/schemas/ids/{avro_id}") == (
        200,
        CONTENT_TYPE,
        {"schema": USER_AVRO},
    )
    assert http_get(registry, f"/schemas/ids/{json_id}?subject=json-value&format=serialized")[
        2
    ] == {"schema": USER_JSON, "schemaType": "JSON"}
    assert http_get(registry, "/subjects/payments-value/versions/latest")[2] == {
        "subject": "payments-value",
        "version": 1,
        "id": payment_id,
        "schema": PAYMENT_AVRO,
        "references": [{"name": "shop.Money", "subject": "money", "version": 1}],
    }
    assert http_get(registry, "/subjects/money/versions/1/referencedby")[2] == [payment_id]
    assert http_get(registry, f"/schemas/ids/{money_id}/versions")[2] == [
        {"subject": "money", "version": 1}
    ]
    assert http_get(registry, "/schemas/ids/99") == (
        404,
        CONTENT_TYPE,
        {"error_code": 40403, "message": "Schema 99 not found"},
    )
    assert http_get(registry, "/subjects/nobody/versions") == (
        404,
        CONTENT_TYPE,
        {"error_code": 40401, "message": "Subject 'nobody' not found."},
    )
    assert http_get(registry, "/no/such/endpoint")[:2] == (404, CONTENT_TYPE)
    assert http_get(registry, "/config")[2] == {"compatibilityLevel": "BACKWARD"}
    assert http_get(registry, "/config/users-value")[2]["error_code"] == 40408


def test_deleting_a_subject_keeps_its_ids_readable(registry: TestRegistry) -> None:
    client = client_for(registry)
    schema_id = client.register_schema("users-value", Schema(USER_AVRO, "AVRO"))
    client.register_schema("users-value", Schema(USER_AVRO_V2, "AVRO"))
    assert client.delete_subject("users-value") == [1, 2]
    assert sr_error(lambda: client.get_versions("users-value")).error_code == 40401
    assert client_for(registry).get_schema(schema_id).schema_str == USER_AVRO
    registry.register("people-value", USER_AVRO)
    assert registry.delete_subject("people-value") == [1]
    assert client.get_subjects() == []


# -- serializers and deserializers ----------------------------------------------------------------


def test_avro_round_trip_and_the_calls_it_makes(registry: TestRegistry) -> None:
    written = AvroSerializer(client_for(registry), USER_AVRO)({"name": "ada"}, value_of("users"))
    assert written is not None
    assert registry.requests == [
        ("GET", ASSOCIATIONS.format(topic="users")),
        ("POST", "/subjects/users-value/versions?normalize=False"),
    ]
    registry.clear_requests()

    reader = AvroDeserializer(client_for(registry))
    assert reader(written, value_of("users")) == {"name": "ada"}
    assert reader(written, value_of("users")) == {"name": "ada"}
    assert registry.requests == [
        ("GET", ASSOCIATIONS.format(topic="users")),
        ("GET", "/schemas/ids/1?subject=users-value"),
    ]
    assert registry.count("/schemas/ids/1") == 1
    assert written[:5] == b"\x00\x00\x00\x00\x01"


def test_avro_with_a_reference_round_trips(registry: TestRegistry) -> None:
    registry.register("money", MONEY_AVRO)
    schema = Schema(PAYMENT_AVRO, "AVRO", [SchemaReference("shop.Money", "money", 1)])
    payment = {"id": "p1", "amount": {"currency": "EUR", "units": 12}}
    written = AvroSerializer(client_for(registry), schema)(payment, value_of("payments"))
    assert written is not None
    registry.clear_requests()

    assert AvroDeserializer(client_for(registry))(written, value_of("payments")) == payment
    assert ("GET", "/subjects/money/versions/1?deleted=true") in registry.requests


def test_json_schema_round_trip(registry: TestRegistry) -> None:
    written = JSONSerializer(USER_JSON, client_for(registry))({"name": "ada"}, value_of("people"))
    assert written is not None
    registered = client_for(registry).get_latest_version("people-value")
    assert registered.schema.schema_type == "JSON"

    reader = JSONDeserializer(None, schema_registry_client=client_for(registry))
    assert reader(written, value_of("people")) == {"name": "ada"}


def test_protobuf_registers_its_imports_as_references_and_round_trips(
    registry: TestRegistry,
) -> None:
    order = Order(id="o-1")
    order.amount.currency = "EUR"
    order.amount.units = 3
    order.placed.seconds = 1_700_000_000
    serializer = ProtobufSerializer(Order, client_for(registry), {"use.deprecated.format": False})
    written = serializer(order, value_of("orders"))
    assert written is not None
    assert registry.requests == [
        ("GET", ASSOCIATIONS.format(topic="orders")),
        ("POST", "/subjects/money.proto/versions?normalize=False"),
        ("POST", "/subjects/money.proto?normalize=False&deleted=False"),
        ("POST", "/subjects/orders-value/versions?normalize=False"),
    ]
    # the well-known timestamp.proto is skipped (skip.known.types); money.proto is a reference
    client = client_for(registry)
    registered = client.get_latest_version("orders-value")
    assert registered.schema.schema_type == "PROTOBUF"
    assert [(r.name, r.subject, r.version) for r in registered.schema.references] == [
        ("money.proto", "money.proto", 1)
    ]
    file_proto = descriptor_pb2.FileDescriptorProto.FromString(
        base64.b64decode(registered.schema.schema_str)
    )
    assert file_proto.name == "orders.proto"
    assert list(file_proto.dependency) == ["money.proto", "google/protobuf/timestamp.proto"]
    registry.clear_requests()

    deserializer = ProtobufDeserializer(
        Order, {"use.deprecated.format": False}, client_for(registry)
    )
    assert deserializer(written, value_of("orders")) == order
    assert registry.requests == [
        ("GET", ASSOCIATIONS.format(topic="orders")),
        ("GET", f"/schemas/ids/{registered.schema_id}?subject=orders-value&format=serialized"),
        ("GET", "/subjects/money.proto/versions/1?deleted=true&format=serialized"),
    ]


# -- authentication and TLS -----------------------------------------------------------------------


def test_basic_auth() -> None:
    with TestRegistry(basic_auth=("alice", "s3cret")) as registry:
        good = client_for(registry, **{"basic.auth.user.info": "alice:s3cret"})
        assert good.register_schema("users-value", Schema(USER_AVRO, "AVRO")) == 1
        for extra in ({"basic.auth.user.info": "alice:wrong"}, {}):
            refused = sr_error(lambda extra=extra: client_for(registry, **extra).get_subjects())
            assert (refused.http_status_code, refused.error_code) == (401, 401)
            assert refused.error_message == "Unauthorized"


def test_bearer_token() -> None:
    with TestRegistry(bearer_token="tok-123") as registry:

        def bearer(token: str) -> SchemaRegistryClient:
            return client_for(
                registry,
                **{
                    "bearer.auth.credentials.source": "STATIC_TOKEN",
                    "bearer.auth.token": token,
                    "bearer.auth.logical.cluster": "lsrc-test",
                },
            )

        assert bearer("tok-123").register_schema("users-value", Schema(USER_AVRO, "AVRO")) == 1
        refused = sr_error(lambda: bearer("tok-999").get_subjects())
        assert (refused.http_status_code, refused.error_code) == (401, 401)


def test_tls_with_the_test_ca() -> None:
    with make_tls_files() as tls, TestRegistry(tls=tls) as registry:
        assert registry.url.startswith("https://127.0.0.1:")
        client = client_for(registry, **{"ssl.ca.location": str(tls.ca)})
        schema_id = client.register_schema("users-value", Schema(USER_AVRO, "AVRO"))
        assert client_for(registry, **{"ssl.ca.location": str(tls.ca)}).get_schema(schema_id)
        with pytest.raises(httpx.ConnectError):  # the system CAs do not know the test CA
            client_for(registry).get_subjects()


# -- failure modes --------------------------------------------------------------------------------


def test_error500_and_garbage(registry: TestRegistry) -> None:
    client = client_for(registry)
    registry.fail = "error500"
    failed = sr_error(lambda: client.get_schema(1))
    assert (failed.http_status_code, failed.error_code) == (500, 50001)
    registry.fail = "garbage"
    with pytest.raises(json.JSONDecodeError):
        client.get_subjects()
    registry.fail = None
    assert client.get_subjects() == []


def test_down_refuses_connections_then_comes_back_on_the_same_port(
    registry: TestRegistry,
) -> None:
    client = client_for(registry)
    client.register_schema("users-value", Schema(USER_AVRO, "AVRO"))
    port = registry.port
    registry.fail = "down"
    with pytest.raises(httpx.ConnectError):
        client.get_subjects()
    assert registry.count("/subjects") == 0
    registry.fail = None
    assert registry.port == port
    assert client.get_subjects() == ["users-value"]
    assert registry.count("/subjects") == 1


def test_hangup_and_slow(registry: TestRegistry) -> None:
    registry.fail = "hangup"
    with pytest.raises(httpx.RemoteProtocolError):
        client_for(registry).get_subjects()
    assert registry.count("/subjects", "GET") == 1

    registry.fail = "slow"
    registry.slow_s = 0.5
    with pytest.raises(httpx.ReadTimeout):
        client_for(registry, timeout=0.1).get_subjects()
    assert client_for(registry, timeout=3).get_subjects() == []
