"""confluent-kafka's in-memory schema registry (`mock://`) and its real serializers, and what it
stores read back as the `RegisteredSchema` the proxy would build from the registry's answers."""

from __future__ import annotations

from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext

from kvproxy.policies.schemas.model import (
    ReferencedSchema,
    RegisteredSchema,
    SchemaReference,
    SchemaType,
)
from kvproxy.policies.schemas.wire import read_schema_id

TOPIC = "orders"
VALUE = SerializationContext(TOPIC, MessageField.VALUE)
SERIALIZER_CONF = {"auto.register.schemas": True}


def mock_registry() -> Any:
    """A fresh in-memory registry (each instance has its own store)."""
    return SchemaRegistryClient.new_client({"url": "mock://"})


def _resolved(registry: Any, schema: Schema, seen: dict[str, ReferencedSchema]) -> None:
    """Every schema `schema` references, transitively, each after the ones it imports."""
    for reference in schema.references or ():
        if reference.name in seen:
            continue
        found = registry.get_version(reference.subject, reference.version)
        _resolved(registry, found.schema, seen)
        seen[reference.name] = ReferencedSchema(
            name=reference.name,
            schema_type=SchemaType(found.schema.schema_type or "AVRO"),
            schema=found.schema.schema_str,
        )


def registered_schema(registry: Any, schema_id: int) -> RegisteredSchema:
    """What the registry holds for `schema_id`, references resolved."""
    schema = registry.get_schema(schema_id)
    seen: dict[str, ReferencedSchema] = {}
    _resolved(registry, schema, seen)
    return RegisteredSchema(
        schema_id=schema_id,
        schema_type=SchemaType(schema.schema_type or "AVRO"),
        schema=schema.schema_str,
        references=tuple(
            SchemaReference(name=r.name, subject=r.subject, version=r.version)
            for r in schema.references or ()
        ),
        resolved_references=tuple(seen.values()),
    )


def registered_for(registry: Any, framed: bytes) -> RegisteredSchema:
    """The registered schema a serialized value names in its header."""
    return registered_schema(registry, read_schema_id(framed))


def register(registry: Any, subject: str, text: str, schema_type: str) -> int:
    """Register `text` under `subject` (a schema others reference); its version."""
    registry.register_schema(subject, Schema(text, schema_type))
    return int(registry.get_latest_version(subject).version)
