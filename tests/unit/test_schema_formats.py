"""compile_schema and the per-format checks, on values made by confluent-kafka's own
serializers against its in-memory registry, and on values those serializers would not make."""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import orjson
import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from google.protobuf import descriptor_pb2

from kvproxy.policies.schemas.formats import (
    PROTOBUF_TEXT_NOT_SUPPORTED,
    SchemaCompileError,
    compile_schema,
)
from kvproxy.policies.schemas.model import (
    CompiledSchema,
    ReferencedSchema,
    RegisteredSchema,
    SchemaType,
)
from kvproxy.policies.schemas.wire import SCHEMA_ID_HEADER
from tests.harness.mock_registry import (
    SERIALIZER_CONF,
    VALUE,
    mock_registry,
    register,
    registered_for,
)
from tests.harness.protobuf_messages import Header, Order, OrderLine

START = SCHEMA_ID_HEADER


def framed(schema_id: int, payload: bytes) -> bytes:
    return struct.pack(">BI", 0, schema_id) + payload


def text(schema: Any) -> str:
    return orjson.dumps(schema).decode()


# --- Avro ---------------------------------------------------------------------------------

AVRO_ADDRESS = text(
    {
        "type": "record",
        "name": "Address",
        "namespace": "shop",
        "fields": [{"name": "city", "type": "string"}],
    }
)
AVRO_ORDER = text(
    {
        "type": "record",
        "name": "Order",
        "namespace": "shop",
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "amount", "type": "long"},
            {"name": "note", "type": ["null", "string"]},
            {"name": "ship_to", "type": "shop.Address"},
        ],
    }
)
AVRO_ORDERS = [
    {"id": "o1", "amount": 5, "note": None, "ship_to": {"city": "Oslo"}},
    {"id": "", "amount": -(2**63), "note": "fragile", "ship_to": {"city": "Zürich"}},
    {"id": "o3" * 100, "amount": 2**63 - 1, "note": "", "ship_to": {"city": ""}},
]


@pytest.fixture(scope="module")
def avro() -> tuple[CompiledSchema, list[bytes]]:
    """Order's values, serialized with Order referencing shop.Address in another subject."""
    registry = mock_registry()
    version = register(registry, "address-value", AVRO_ADDRESS, "AVRO")
    reference = SchemaReference("shop.Address", "address-value", version)
    serialize = AvroSerializer(
        registry, Schema(AVRO_ORDER, "AVRO", [reference]), conf=SERIALIZER_CONF
    )
    values = [serialize(order, VALUE) for order in AVRO_ORDERS]
    registered = registered_for(registry, values[0])
    assert [r.name for r in registered.resolved_references] == ["shop.Address"]
    return compile_schema(registered), values


def test_avro_every_serialized_value_matches(avro: tuple[CompiledSchema, list[bytes]]) -> None:
    compiled, values = avro
    assert [compiled.mismatch(value, START) for value in values] == [None, None, None]
    assert compiled.record_name(values[0], START) == "shop.Order"


def test_avro_a_value_cut_anywhere_is_truncated(avro: tuple[CompiledSchema, list[bytes]]) -> None:
    compiled, values = avro
    value = values[0]
    for size in range(START, len(value)):
        assert compiled.mismatch(value[:size], START) == f"truncated at byte {size}"


def test_avro_bytes_after_the_record_are_a_mismatch(
    avro: tuple[CompiledSchema, list[bytes]],
) -> None:
    compiled, values = avro
    assert compiled.mismatch(values[0] + b"abc", START) == "3 bytes after the record"
    assert compiled.mismatch(values[0] + b"\x00", START) == "1 byte after the record"


def test_avro_a_record_missing_its_last_field_is_truncated(
    avro: tuple[CompiledSchema, list[bytes]],
) -> None:
    compiled, _ = avro
    payload = b"\x04o1\x0a\x00"  # id, amount, note: no ship_to
    assert compiled.mismatch(framed(1, payload), START) == "truncated at byte 10"


def test_avro_a_value_of_another_type_is_named_where_it_breaks(
    avro: tuple[CompiledSchema, list[bytes]],
) -> None:
    compiled, _ = avro
    bad_union = b"\x04o1\x0a\x08\x08Oslo"  # note's branch 4 of a two-branch union
    assert compiled.mismatch(framed(1, bad_union), START) == (
        "a union branch or enum symbol index out of range before byte 10"
    )
    not_utf8 = b"\x04\xff\xfe\x0a\x00\x08Oslo"
    assert compiled.mismatch(framed(1, not_utf8), START) == (
        "a string is not UTF-8 (invalid start byte) before byte 8"
    )
    negative_length = b"\x01"
    assert compiled.mismatch(framed(1, negative_length), START) == (
        "a negative length before byte 6"
    )


def test_avro_a_primitive_schema_checks_but_has_no_record_name() -> None:
    compiled = compile_schema(RegisteredSchema(1, SchemaType.AVRO, '"string"'))
    assert compiled.mismatch(framed(1, b"\x04hi"), START) is None
    with pytest.raises(ValueError, match="has no name"):
        compiled.record_name(framed(1, b"\x04hi"), START)


@pytest.mark.parametrize(
    ("schema", "references", "message"),
    [
        ("{nope", (), "Avro schema is not JSON: unexpected character"),
        (AVRO_ORDER, (), "Avro schema does not parse: UnknownType: shop.Address"),
        (
            AVRO_ORDER,
            (ReferencedSchema("shop.Address", SchemaType.AVRO, '{"type": "record"}'),),
            "Avro reference shop.Address does not parse",
        ),
    ],
)
def test_avro_a_schema_that_does_not_parse_is_a_compile_error(
    schema: str, references: tuple[ReferencedSchema, ...], message: str
) -> None:
    registered = RegisteredSchema(1, SchemaType.AVRO, schema, resolved_references=references)
    with pytest.raises(SchemaCompileError) as raised:
        compile_schema(registered)
    assert str(raised.value).startswith(message)


# --- JSON Schema --------------------------------------------------------------------------

JSON_ADDRESS = text(
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Address",
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    }
)
JSON_ORDER = text(
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Order",
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "amount": {"type": "integer"},
            "ship_to": {"$ref": "address.json"},
        },
        "required": ["id", "amount"],
    }
)
JSON_ORDERS = [
    {"id": "o1", "amount": 5, "ship_to": {"city": "Oslo"}},
    {"id": "o2", "amount": -1},
    {"id": "ö", "amount": 0, "ship_to": {"city": ""}, "extra": [1, 2]},
]


@pytest.fixture(scope="module")
def json_schema() -> tuple[CompiledSchema, list[bytes]]:
    """Order's values, serialized with Order's `$ref` to address.json in another subject."""
    registry = mock_registry()
    version = register(registry, "address-value", JSON_ADDRESS, "JSON")
    reference = SchemaReference("address.json", "address-value", version)
    serialize = JSONSerializer(
        Schema(JSON_ORDER, "JSON", [reference]), registry, conf=SERIALIZER_CONF
    )
    values = [serialize(order, VALUE) for order in JSON_ORDERS]
    return compile_schema(registered_for(registry, values[0])), values


def test_json_every_serialized_value_matches(
    json_schema: tuple[CompiledSchema, list[bytes]],
) -> None:
    compiled, values = json_schema
    assert [compiled.mismatch(value, START) for value in values] == [None, None, None]
    assert compiled.record_name(values[0], START) == "Order"


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b'{"id": "o1", "amount": "5"}', "data.amount must be integer"),
        (b'{"id": "o1"}', "data must contain ['amount'] properties"),
        (b'{"id": "o1", "amount": 5, "ship_to": {"city": 3}}', "data.ship_to.city must be string"),
        (
            b'{"id": "o1", "amount": 5, "ship_to": {}}',
            "data.ship_to must contain ['city'] properties",
        ),
        (
            b'{"id": "o1", "amount": 5',
            "not JSON: unexpected end of data: line 1 column 25 (char 24)",
        ),
        (b"", "not JSON: Input is a zero-length, empty document: line 1 column 1 (char 0)"),
        (
            b"\x02\x04o1",
            "not JSON: unexpected character, expected a JSON value: line 1 column 1 (char 0)",
        ),
    ],
)
def test_json_a_value_the_serializer_would_refuse_says_why(
    json_schema: tuple[CompiledSchema, list[bytes]], payload: bytes, message: str
) -> None:
    compiled, _ = json_schema
    assert compiled.mismatch(framed(1, payload), START) == message


def test_json_a_ref_by_full_url_and_one_relative_to_the_id_resolve_offline() -> None:
    strings = text({"definitions": {"name": {"type": "string"}}})
    by_url = RegisteredSchema(
        1,
        SchemaType.JSON,
        text({"properties": {"a": {"$ref": "https://example.com/s.json#/definitions/name"}}}),
        resolved_references=(
            ReferencedSchema("https://example.com/s.json", SchemaType.JSON, strings),
        ),
    )
    relative = RegisteredSchema(
        1,
        SchemaType.JSON,
        text(
            {
                "$id": "https://example.com/order.json",
                "properties": {"a": {"$ref": "s.json#/definitions/name"}},
            }
        ),
        resolved_references=(ReferencedSchema("s.json", SchemaType.JSON, strings),),
    )
    for registered in (by_url, relative):
        compiled = compile_schema(registered)
        assert compiled.mismatch(framed(1, b'{"a": "x"}'), START) is None
        assert compiled.mismatch(framed(1, b'{"a": 1}'), START) == "data.a must be string"


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (
            {"$ref": "https://example.com/x.json"},
            "JSON schema does not compile: $ref https://example.com/x.json is not among the "
            "schema's references (nothing is fetched)",
        ),
        (
            {"$ref": "address.json"},
            "JSON schema does not compile: $ref address.json is not among the schema's "
            "references (nothing is fetched)",
        ),
        ({"type": 5}, "JSON schema does not compile: Unknown type"),
    ],
)
def test_json_a_schema_that_does_not_compile_is_a_compile_error(schema: Any, message: str) -> None:
    with pytest.raises(SchemaCompileError) as raised:
        compile_schema(RegisteredSchema(1, SchemaType.JSON, text(schema)))
    assert str(raised.value) == message


def test_json_schema_text_that_is_not_json_is_a_compile_error() -> None:
    with pytest.raises(SchemaCompileError, match=r"^JSON schema is not JSON: "):
        compile_schema(RegisteredSchema(1, SchemaType.JSON, "{nope"))


def test_json_a_schema_without_title_has_no_record_name() -> None:
    compiled = compile_schema(RegisteredSchema(1, SchemaType.JSON, '{"type": "object"}'))
    with pytest.raises(ValueError, match="has no title"):
        compiled.record_name(framed(1, b"{}"), START)


# --- Protobuf -----------------------------------------------------------------------------


def order() -> Any:
    message = Order(id="o1")
    message.amount.currency = "EUR"
    message.amount.units = 5
    message.placed.seconds = 1_700_000_000
    return message


@pytest.fixture(scope="module")
def protobuf() -> tuple[CompiledSchema, dict[str, bytes]]:
    """orders.proto's Header, Order and Order.Line values; Order imports money.proto (a
    reference) and google/protobuf/timestamp.proto (a well-known type, not registered)."""
    registry = mock_registry()
    values = {
        "shop.Header": ProtobufSerializer(Header, registry, conf=SERIALIZER_CONF)(
            Header(source="web"), VALUE
        ),
        "shop.Order": ProtobufSerializer(Order, registry, conf=SERIALIZER_CONF)(order(), VALUE),
        "shop.Order.Line": ProtobufSerializer(OrderLine, registry, conf=SERIALIZER_CONF)(
            OrderLine(sku="a", quantity=2), VALUE
        ),
    }
    registered = registered_for(registry, values["shop.Order"])
    assert [r.name for r in registered.resolved_references] == ["money.proto"]
    return compile_schema(registered), values


def test_protobuf_every_serialized_value_matches_and_names_its_message(
    protobuf: tuple[CompiledSchema, dict[str, bytes]],
) -> None:
    compiled, values = protobuf
    assert {name: compiled.mismatch(v, START) for name, v in values.items()} == dict.fromkeys(
        values
    )
    assert {compiled.record_name(v, START) for v in values.values()} == set(values)


def test_protobuf_the_serializer_frames_order_with_its_message_indexes(
    protobuf: tuple[CompiledSchema, dict[str, bytes]],
) -> None:
    _, values = protobuf
    assert values["shop.Header"][START] == 0
    assert values["shop.Order"][START : START + 2] == b"\x02\x02"
    assert values["shop.Order.Line"][START : START + 3] == b"\x04\x02\x00"


@pytest.mark.parametrize(
    ("indexes", "message"),
    [
        (b"\x02\x06", "message index [3] is not in the schema"),
        (b"\x04\x02\x0a", "message index [1, 5] is not in the schema"),
        (b"\x04\x02", "message indexes truncated at byte 7"),
    ],
)
def test_protobuf_bad_message_indexes_are_a_mismatch(
    protobuf: tuple[CompiledSchema, dict[str, bytes]], indexes: bytes, message: str
) -> None:
    compiled, _ = protobuf
    value = framed(1, indexes)
    assert compiled.mismatch(value, START) == message
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        compiled.record_name(value, START)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\x08\x05", "field 1 (id, string) of shop.Order has wire type varint"),
        (b"\x38\x01", "shop.Order has no field 7 (wire type varint)"),
        (
            b"\x12\x02\x10\x01" + b"\x12\x02\x08\x01",  # amount.units, then currency as varint
            "field 1 (currency, string) of shop.Money has wire type varint",
        ),
        (
            b"\x1a\x02\x0a\x00",  # placed.seconds as length-delimited
            "field 1 (seconds, int64) of google.protobuf.Timestamp has wire type length-delimited",
        ),
        (
            b"\x12\x02\x15\x00",  # amount with field 2 (units, int64) as a truncated 32-bit value
            "Error parsing message with type 'shop.Order': Wire format was corrupt",
        ),
        (b"\x0a\x05ab", "Error parsing message with type 'shop.Order': Wire format was corrupt"),
        (b"\x0f", "Error parsing message with type 'shop.Order': Wire format was corrupt"),
    ],
)
def test_protobuf_bytes_that_are_not_an_order_say_why(
    protobuf: tuple[CompiledSchema, dict[str, bytes]], payload: bytes, message: str
) -> None:
    compiled, _ = protobuf
    assert compiled.mismatch(framed(1, b"\x02\x02" + payload), START) == message


def test_protobuf_a_serialized_order_cut_short_is_a_mismatch(
    protobuf: tuple[CompiledSchema, dict[str, bytes]],
) -> None:
    compiled, values = protobuf
    value = values["shop.Order"]
    assert compiled.mismatch(value[:-1], START) == (
        "Error parsing message with type 'shop.Order': Wire format was corrupt"
    )


def test_protobuf_schema_text_is_refused_with_the_reason() -> None:
    registered = RegisteredSchema(1, SchemaType.PROTOBUF, 'syntax = "proto3"; message A {}')
    with pytest.raises(SchemaCompileError) as raised:
        compile_schema(registered)
    assert str(raised.value) == PROTOBUF_TEXT_NOT_SUPPORTED
    assert PROTOBUF_TEXT_NOT_SUPPORTED == (
        "Protobuf schema text is not supported; the registry must serve it with format=serialized"
    )


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (
            "AAAA",
            "Protobuf schema is not a serialized FileDescriptorProto: Error parsing message "
            "with type 'google.protobuf.FileDescriptorProto': Wire format was corrupt",
        ),
        ("", "Protobuf schema has no message types"),
    ],
)
def test_protobuf_base64_that_is_no_schema_is_a_compile_error(schema: str, message: str) -> None:
    with pytest.raises(SchemaCompileError) as raised:
        compile_schema(RegisteredSchema(1, SchemaType.PROTOBUF, schema))
    assert str(raised.value) == message


def basket_schema() -> str:
    """basket.proto: Basket { repeated Item items = 1; map<string, Item> by_sku = 2; }."""
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="basket.proto", package="shop", syntax="proto3")
    basket = proto.message_type.add(name="Basket")
    basket.field.add(
        name="items",
        number=1,
        type=field.TYPE_MESSAGE,
        type_name=".shop.Item",
        label=field.LABEL_REPEATED,
    )
    basket.field.add(
        name="by_sku",
        number=2,
        type=field.TYPE_MESSAGE,
        type_name=".shop.Basket.BySkuEntry",
        label=field.LABEL_REPEATED,
    )
    entry = basket.nested_type.add(name="BySkuEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    entry.field.add(
        name="value",
        number=2,
        type=field.TYPE_MESSAGE,
        type_name=".shop.Item",
        label=field.LABEL_OPTIONAL,
    )
    item = proto.message_type.add(name="Item")
    item.field.add(name="sku", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    return base64.b64encode(proto.SerializeToString()).decode()


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (
            b"\x0a\x03\x0a\x01a" + b"\x0a\x02\x08\x01",
            "field 1 (sku, string) of shop.Item has wire type varint",
        ),
        (
            b"\x12\x07\x0a\x01k\x12\x02\x08\x01",
            "field 1 (sku, string) of shop.Item has wire type varint",
        ),
        (b"\x12\x07\x0a\x01k\x12\x02\x0a\x00" + b"\x0a\x00", None),
    ],
)
def test_protobuf_fields_the_schema_lacks_are_found_in_repeated_and_map_values(
    payload: bytes, message: str | None
) -> None:
    compiled = compile_schema(RegisteredSchema(1, SchemaType.PROTOBUF, basket_schema()))
    assert compiled.mismatch(framed(1, b"\x00" + payload), START) == message
    assert compiled.record_name(framed(1, b"\x00"), START) == "shop.Basket"
    assert compiled.record_name(framed(1, b"\x04\x00\x00"), START) == "shop.Basket.BySkuEntry"


def test_protobuf_an_import_that_is_no_reference_is_a_compile_error(
    protobuf: tuple[CompiledSchema, dict[str, bytes]],
) -> None:
    registry = mock_registry()
    value = ProtobufSerializer(Order, registry, conf=SERIALIZER_CONF)(order(), VALUE)
    registered = registered_for(registry, value)
    without = RegisteredSchema(1, SchemaType.PROTOBUF, registered.schema)
    with pytest.raises(SchemaCompileError) as raised:
        compile_schema(without)
    assert (
        str(raised.value) == "orders.proto imports money.proto, which is not among the references"
    )


def test_compiled_schemas_are_reused_across_many_calls(
    protobuf: tuple[CompiledSchema, dict[str, bytes]],
) -> None:
    compiled, values = protobuf
    value = values["shop.Order"]
    assert all(compiled.mismatch(value, START) is None for _ in range(1000))


# ---- a payload cannot hold the decoder ----

_ARRAYS_OF_NOTHING = {
    "null items": {"type": "array", "items": "null"},
    "empty records": {"type": "array", "items": {"type": "record", "name": "E", "fields": []}},
    "zero-size fixed in a union": [
        "null",
        {"type": "array", "items": {"type": "fixed", "name": "F", "size": 0}},
    ],
    "in a map's values": {"type": "map", "values": {"type": "array", "items": "null"}},
}


@pytest.mark.parametrize("field_type", _ARRAYS_OF_NOTHING.values(), ids=_ARRAYS_OF_NOTHING.keys())
def test_an_avro_array_of_items_that_take_no_bytes_is_not_decoded(field_type: object) -> None:
    # a block count of 2**62 with nothing after it would keep fastavro building items for ever
    schema = {"type": "record", "name": "A", "fields": [{"name": "x", "type": field_type}]}
    with pytest.raises(SchemaCompileError, match="an array whose items take no bytes"):
        compile_schema(RegisteredSchema(1, SchemaType.AVRO, json.dumps(schema)))


def test_recursive_and_ordinary_avro_arrays_are_decoded() -> None:
    schema = {
        "type": "record",
        "name": "Node",
        "fields": [
            {"name": "next", "type": ["null", "Node"]},
            {"name": "children", "type": {"type": "array", "items": "Node"}},
            {"name": "counts", "type": {"type": "array", "items": "long"}},
        ],
    }
    compiled = compile_schema(RegisteredSchema(1, SchemaType.AVRO, json.dumps(schema)))
    # next: null; children: none; counts: [2]
    assert compiled.mismatch(b"\x00\x00\x00\x00\x01" + b"\x00\x00\x02\x04\x00", 5) is None
