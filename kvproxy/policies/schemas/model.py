"""The registry's answers as values, and what a `schema` policy reads them through.

A schema id names one schema for good (the registry never changes what an id means), so what a
lookup learns about an id's text is final; the subjects it is registered under may grow, which
is why every entry expires (`cache_ttl_ms`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "CompiledSchema",
    "ReferencedSchema",
    "RegisteredSchema",
    "RegistryUnavailable",
    "ResolvedSchema",
    "SchemaCatalog",
    "SchemaEntry",
    "SchemaReference",
    "SchemaType",
    "UnknownSchema",
]


class SchemaType(enum.Enum):
    """The registry's `schemaType` (absent in its answer means AVRO)."""

    AVRO = "AVRO"
    JSON = "JSON"
    PROTOBUF = "PROTOBUF"


@dataclass(frozen=True, slots=True)
class SchemaReference:
    """One entry of a schema's `references`: another registered schema it imports by `name`
    (Avro: a full type name; JSON Schema: the `$ref` URL; Protobuf: the import path)."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True, slots=True)
class ReferencedSchema:
    """A referenced schema's text, fetched from `GET /subjects/{subject}/versions/{version}`."""

    name: str
    schema_type: SchemaType
    schema: str


@dataclass(frozen=True, slots=True)
class RegisteredSchema:
    """What the registry says about one id: `GET /schemas/ids/{id}` and `.../versions`."""

    schema_id: int
    schema_type: SchemaType
    schema: str
    """The text as the registry gives it; Protobuf as a base64 `FileDescriptorProto`
    (`?format=serialized`)."""
    references: tuple[SchemaReference, ...] = ()
    resolved_references: tuple[ReferencedSchema, ...] = ()
    """Every schema `references` leads to, transitively, each before the ones that import it."""
    subjects: frozenset[str] = frozenset()
    """The subjects this id is registered under."""


class CompiledSchema(Protocol):
    """A registered schema made ready to check payloads
    (`kvproxy.policies.schemas.formats.compile`)."""

    def record_name(self, data: bytes, start: int) -> str:
        """The fully qualified name of the record type the payload claims (Avro: the top-level
        named type; JSON Schema: `title`; Protobuf: the message the indexes at `start` name):
        what the record_name strategies turn into a subject. Raises ValueError when it has none."""
        ...

    def mismatch(self, data: bytes, start: int) -> str | None:
        """Why `data[start:]` (Protobuf: the message indexes, then the message) does not decode
        with this schema, or None when it does."""
        ...


@dataclass(frozen=True, slots=True)
class ResolvedSchema:
    """A registered schema and its compiled form, as the catalog holds it."""

    registered: RegisteredSchema
    compiled: CompiledSchema | None
    """None when the schema could not be compiled (`problem` says why)."""
    problem: str | None = None
    fetched_ms: int = 0
    """When the registry gave `subjects` (epoch ms): a subject missing from an older answer is
    asked again (`SchemaCatalog.recheck_ms`), since the same schema may have been registered
    under it since."""

    @property
    def schema_id(self) -> int:
        return self.registered.schema_id

    @property
    def subjects(self) -> frozenset[str]:
        return self.registered.subjects


@dataclass(frozen=True, slots=True)
class UnknownSchema:
    """The registry answered that no schema has this id (40403)."""

    schema_id: int


@dataclass(frozen=True, slots=True)
class RegistryUnavailable:
    """The registry could not say (down, timed out, 5xx, an answer that does not parse)."""

    schema_id: int
    reason: str


SchemaEntry = ResolvedSchema | UnknownSchema | RegistryUnavailable


class SchemaCatalog(Protocol):
    """What a `schema` policy reads: the proxy's cache of registry answers, or the ids the audit
    fetched on its driver. Read-only and synchronous: what a check will read is gathered and
    looked up before the chain runs (`kvproxy.policies.schemas.ids`)."""

    accept_unavailable: bool
    """`on_error: accept`: records whose id the registry could not be asked about pass."""
    recheck_ms: int
    """How old an answer may be before a subject missing from it is asked about again."""

    def entry(self, schema_id: int) -> SchemaEntry | None:
        """The answer for `schema_id`, or None when it is not known (or no longer fresh)."""
        ...

    def peek(self, schema_id: int) -> SchemaEntry | None:
        """`entry` for the gathering before a check: not counted as the check's cache hit."""
        ...
