"""The order type of the schema benchmark (bench/schema.py) in its three formats (Avro, JSON
Schema, Protobuf), the ids it is framed with, and the registry's answers for them (a warm cache)."""

from __future__ import annotations

import base64
import json
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from kvproxy.policies.schemas.model import RegisteredSchema, SchemaType
from kvproxy.registry.catalog import StaticCatalog

TOPIC = "bench-schema"
SUBJECT = f"{TOPIC}-value"

ORDER_AVRO: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "customer", "type": "string"},
        {"name": "units", "type": "long"},
        {"name": "price", "type": "double"},
        {"name": "currency", "type": "string"},
        {"name": "paid", "type": "boolean"},
    ],
}
ORDER_JSON: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "shop.Order",
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "customer": {"type": "string"},
        "units": {"type": "integer", "minimum": 1},
        "price": {"type": "number", "minimum": 0},
        "currency": {"type": "string", "enum": ["EUR", "USD", "GBP"]},
        "paid": {"type": "boolean"},
    },
    "required": ["id", "customer", "units", "price", "currency", "paid"],
}


def order_file() -> descriptor_pb2.FileDescriptorProto:
    """orders.proto with `shop.Order`, as a serializer registers it (a FileDescriptorProto)."""
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="bench-orders.proto", package="shop", syntax="proto3"
    )
    message = proto.message_type.add(name="Order")
    for number, (name, kind) in enumerate(
        (
            ("id", field.TYPE_STRING),
            ("customer", field.TYPE_STRING),
            ("units", field.TYPE_INT64),
            ("price", field.TYPE_DOUBLE),
            ("currency", field.TYPE_STRING),
            ("paid", field.TYPE_BOOL),
        ),
        start=1,
    ):
        message.field.add(name=name, number=number, type=kind, label=field.LABEL_OPTIONAL)
    return proto


ORDER_PROTO = order_file()
_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(ORDER_PROTO)
ProtoOrder: Any = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("shop.Order"))

SCHEMA_IDS = {"ids": 1, "avro": 2, "json": 3, "protobuf": 4}


def registered(schema_id: int, schema_type: SchemaType, text: str) -> RegisteredSchema:
    return RegisteredSchema(schema_id, schema_type, text, subjects=frozenset({SUBJECT}))


def make_catalog() -> StaticCatalog:
    """The registry's answers for every id the benchmark frames values with (a warm cache)."""
    avro_text = json.dumps(ORDER_AVRO)
    answers: dict[int, Any] = {
        SCHEMA_IDS["ids"]: registered(SCHEMA_IDS["ids"], SchemaType.AVRO, avro_text),
        SCHEMA_IDS["avro"]: registered(SCHEMA_IDS["avro"], SchemaType.AVRO, avro_text),
        SCHEMA_IDS["json"]: registered(SCHEMA_IDS["json"], SchemaType.JSON, json.dumps(ORDER_JSON)),
        SCHEMA_IDS["protobuf"]: registered(
            SCHEMA_IDS["protobuf"],
            SchemaType.PROTOBUF,
            base64.b64encode(ORDER_PROTO.SerializeToString()).decode(),
        ),
    }
    return StaticCatalog(answers, accept_unavailable=False)
