"""The registry's REST answers read into values (sans-IO: bytes in, values out).

The paths and bodies are Confluent Schema Registry's documented API, which other registries
(Karapace, Apicurio's ccompat API, Redpanda) serve too.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson

from kvproxy.policies.schemas.model import SchemaReference, SchemaType

__all__ = [
    "AnswerError",
    "RegistryError",
    "SchemaText",
    "is_serialized_protobuf",
    "read_error",
    "read_schema",
    "read_subjects",
    "schema_path",
    "subject_version_path",
    "versions_path",
]

SCHEMA_NOT_FOUND = 40403


class AnswerError(ValueError):
    """An answer that is not what the API documents (not JSON, fields missing or mistyped)."""


@dataclass(frozen=True, slots=True)
class RegistryError:
    """An error answer: the HTTP status and Confluent's `error_code` and `message`."""

    status: int
    error_code: int
    message: str

    def __str__(self) -> str:
        return f"HTTP {self.status} (error {self.error_code}): {self.message}"


@dataclass(frozen=True, slots=True)
class SchemaText:
    """A schema as `GET /schemas/ids/{id}` or `GET /subjects/{s}/versions/{v}` gives it."""

    schema_type: SchemaType
    schema: str
    references: tuple[SchemaReference, ...]


def schema_path(schema_id: int, *, serialized: bool = False) -> str:
    return f"/schemas/ids/{schema_id}" + ("?format=serialized" if serialized else "")


def versions_path(schema_id: int) -> str:
    return f"/schemas/ids/{schema_id}/versions"


def subject_version_path(subject: str, version: int, *, serialized: bool = False) -> str:
    path = f"/subjects/{quote(subject, safe='')}/versions/{version}"
    return path + ("?format=serialized" if serialized else "")


def _json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        shown = body[:60].decode("utf-8", "backslashreplace")
        raise AnswerError(f"the answer is not JSON: {shown!r}") from None


def read_error(status: int, body: bytes) -> RegistryError:
    """An error answer; a body without Confluent's fields still gives the status."""
    try:
        value = _json(body)
    except AnswerError:
        value = None
    if isinstance(value, dict):
        code = value.get("error_code")
        message = value.get("message")
        if isinstance(code, int) and isinstance(message, str):
            return RegistryError(status, code, message[:200])
    return RegistryError(status, status, "no error body")


def read_schema(body: bytes) -> SchemaText:
    value = _json(body)
    if not isinstance(value, dict) or not isinstance(value.get("schema"), str):
        raise AnswerError("the answer has no schema text")
    type_name = value.get("schemaType", "AVRO")
    try:
        schema_type = SchemaType(type_name)
    except ValueError:
        raise AnswerError(f"unknown schemaType {str(type_name)[:40]!r}") from None
    references = []
    for ref in value.get("references") or ():
        if not (
            isinstance(ref, dict)
            and isinstance(ref.get("name"), str)
            and isinstance(ref.get("subject"), str)
            and isinstance(ref.get("version"), int)
        ):
            raise AnswerError("a reference lacks its name, subject or version")
        references.append(SchemaReference(ref["name"], ref["subject"], ref["version"]))
    return SchemaText(schema_type, value["schema"], tuple(references))


def read_subjects(body: bytes) -> frozenset[str]:
    """`GET /schemas/ids/{id}/versions`: the subjects the id is registered under."""
    value = _json(body)
    if not isinstance(value, list):
        raise AnswerError("the versions answer is not a list")
    subjects = set()
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("subject"), str):
            raise AnswerError("a version lacks its subject")
        subjects.add(item["subject"])
    return frozenset(subjects)


def is_serialized_protobuf(text: str) -> bool:
    """Whether a Protobuf schema came as a base64 `FileDescriptorProto` (`format=serialized`)
    rather than as .proto text."""
    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True
