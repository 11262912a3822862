"""Registered schemas made ready to check payloads, one class per format (`compile_schema`).

Each is built once per schema id and then called per record, so everything the check needs
(fastavro's parsed schema, fastjsonschema's validator, the Protobuf message classes) is made
here, and nothing is ever fetched: references come resolved in `RegisteredSchema`.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import urljoin, urlsplit

import fastavro
import fastjsonschema
import orjson
from google.protobuf import (
    any_pb2,
    api_pb2,
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    message_factory,
    source_context_pb2,
    struct_pb2,
    timestamp_pb2,
    type_pb2,
    unknown_fields,
    wrappers_pb2,
)
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from kvproxy.policies.linear_regex import compile_json_schema
from kvproxy.policies.schemas.model import CompiledSchema, RegisteredSchema, SchemaType
from kvproxy.policies.schemas.wire import read_message_indexes

__all__ = [
    "PROTOBUF_TEXT_NOT_SUPPORTED",
    "AvroSchema",
    "JsonSchema",
    "ProtobufSchema",
    "SchemaCompileError",
    "compile_schema",
]

PROTOBUF_TEXT_NOT_SUPPORTED = (
    "Protobuf schema text is not supported; the registry must serve it with format=serialized"
)


class SchemaCompileError(ValueError):
    """The registered text (or one of its references) is not a usable schema of its type."""


def compile_schema(registered: RegisteredSchema) -> CompiledSchema:
    """The checker for `registered`'s format; SchemaCompileError when its text does not parse."""
    if registered.schema_type is SchemaType.AVRO:
        return AvroSchema(registered)
    if registered.schema_type is SchemaType.JSON:
        return JsonSchema(registered)
    return ProtobufSchema(registered)


# --- Avro ---------------------------------------------------------------------------------

_NAMED_AVRO_TYPES = frozenset({"record", "error", "enum", "fixed"})


def _avro_json(text: str, what: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise SchemaCompileError(f"{what} is not JSON: {exc}") from None


class AvroSchema:
    """One Avro datum, decoded by fastavro with the writer's schema. The datum must use every
    byte: bytes after it are a mismatch, since a reader would silently drop them."""

    __slots__ = ("_name", "_schema")

    def __init__(self, registered: RegisteredSchema) -> None:
        named: dict[str, Any] = {}
        for reference in registered.resolved_references:
            text = _avro_json(reference.schema, f"Avro reference {reference.name}")
            try:
                fastavro.parse_schema(text, named_schemas=named)
            except Exception as exc:  # fastavro: SchemaParseException, ValueError, KeyError...
                raise SchemaCompileError(
                    f"Avro reference {reference.name} does not parse: {type(exc).__name__}: {exc}"
                ) from None
        text = _avro_json(registered.schema, "Avro schema")
        try:
            self._schema: Any = fastavro.parse_schema(text, named_schemas=named)
        except Exception as exc:
            raise SchemaCompileError(
                f"Avro schema does not parse: {type(exc).__name__}: {exc}"
            ) from None
        if _array_of_nothing(self._schema, named, set()):
            raise SchemaCompileError(
                "Avro schema has an array whose items take no bytes (null, an empty record or "
                "a zero-size fixed): a payload could declare billions of them and hold the "
                "decoder, so its payloads are not decoded (validate_payload: false checks ids)"
            )
        self._name: str | None = None
        if isinstance(self._schema, dict) and self._schema.get("type") in _NAMED_AVRO_TYPES:
            self._name = str(self._schema["name"])

    def record_name(self, data: bytes, start: int) -> str:
        if self._name is None:
            raise ValueError("the Avro schema's top-level type has no name")
        return self._name

    def mismatch(self, data: bytes, start: int) -> str | None:
        stream = io.BytesIO(data)
        stream.seek(start)
        try:
            fastavro.schemaless_reader(stream, self._schema, None)
        except EOFError as exc:
            if str(exc).startswith("Expected -"):
                return f"a negative length before byte {stream.tell()}"
            return f"truncated at byte {len(data)}"
        except IndexError as exc:
            if str(exc).startswith("string index"):  # a varint running past the end
                return f"truncated at byte {len(data)}"
            return f"a union branch or enum symbol index out of range before byte {stream.tell()}"
        except UnicodeDecodeError as exc:
            return f"a string is not UTF-8 ({exc.reason}) before byte {stream.tell()}"
        except Exception as exc:  # fastavro's own errors (ValueError, SchemaResolutionError...)
            return str(exc) or type(exc).__name__
        extra = len(data) - stream.tell()
        if extra:
            return f"{extra} byte{'' if extra == 1 else 's'} after the record"
        return None


def _takes_no_bytes(schema: Any, named: dict[str, Any], seen: set[str]) -> bool:
    """Whether a datum of `schema` may encode to zero bytes (parsed fastavro form)."""
    if isinstance(schema, str):
        if schema == "null":
            return True
        if schema in named and schema not in seen:
            return _takes_no_bytes(named[schema], named, seen | {schema})
        return False
    if isinstance(schema, dict):
        kind = schema.get("type")
        if kind in {"record", "error"}:
            return all(
                _takes_no_bytes(field["type"], named, seen) for field in schema.get("fields", ())
            )
        if kind == "fixed":
            return int(schema.get("size", 1)) == 0
        if isinstance(kind, str | list | dict) and kind not in _COMPLEX_AVRO_TYPES:
            return _takes_no_bytes(kind, named, seen)  # {"type": "null"} and the like
    return False  # a union (its branch index), and every other type, takes at least a byte


def _array_of_nothing(schema: Any, named: dict[str, Any], seen: set[str]) -> bool:
    """Whether `schema` holds, anywhere, an array whose items may take no bytes: fastavro
    would build as many items as a block count says, with nothing left to read."""
    if isinstance(schema, list):
        return any(_array_of_nothing(branch, named, seen) for branch in schema)
    if isinstance(schema, str):
        if schema in named and schema not in seen:
            return _array_of_nothing(named[schema], named, seen | {schema})
        return False
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if kind == "array":
        items = schema.get("items")
        return _takes_no_bytes(items, named, set()) or _array_of_nothing(items, named, seen)
    if kind == "map":
        return _array_of_nothing(schema.get("values"), named, seen)
    if kind in ("record", "error"):
        name = schema.get("name")
        inner = seen | ({str(name)} if name else set())
        return any(_array_of_nothing(field["type"], named, inner) for field in schema["fields"])
    if isinstance(kind, list | dict):
        return _array_of_nothing(kind, named, seen)
    return False


_COMPLEX_AVRO_TYPES = frozenset({"record", "error", "enum", "array", "map", "fixed"})


# --- JSON Schema --------------------------------------------------------------------------


def _json_schema(text: str, what: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise SchemaCompileError(f"{what} is not JSON: {exc}") from None


class _References(Mapping[str, Callable[[str], Any]]):
    """fastjsonschema's `handlers` (URL scheme -> fetch), answering for every scheme, so a `$ref`
    outside the schema resolves to a resolved reference or fails, never goes to the network."""

    def __init__(self, documents: dict[str, Any]) -> None:
        self._documents = documents

    def _fetch(self, uri: str) -> Any:
        try:
            return self._documents[uri]
        except KeyError:
            raise fastjsonschema.JsonSchemaDefinitionException(
                f"$ref {uri} is not among the schema's references (nothing is fetched)"
            ) from None

    def __getitem__(self, scheme: str) -> Callable[[str], Any]:
        return self._fetch

    def __contains__(self, scheme: object) -> bool:
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _normalized(uri: str) -> str:
    return urlsplit(uri).geturl()


class JsonSchema:
    """A JSON document valid against a JSON Schema (orjson, then fastjsonschema compiled once).

    The schema's regular expressions (`pattern`, `patternProperties`) are the registry's, so they
    run on RE2 (`kvproxy.policies.linear_regex`): one RE2 cannot compile makes the schema unusable.

    A resolved reference is found under its `name` (the `$ref` as written) and under that name
    resolved against the schema's `$id`, which is how a relative `$ref` reaches it."""

    __slots__ = ("_title", "_validate")

    def __init__(self, registered: RegisteredSchema) -> None:
        schema = _json_schema(registered.schema, "JSON schema")
        base = schema.get("$id", "") if isinstance(schema, dict) else ""
        base = base if isinstance(base, str) else ""
        documents: dict[str, Any] = {}
        for reference in registered.resolved_references:
            document = _json_schema(reference.schema, f"JSON schema reference {reference.name}")
            documents[_normalized(reference.name)] = document
            documents.setdefault(_normalized(urljoin(base, reference.name)), document)
        try:
            self._validate: Callable[[Any], Any] = compile_json_schema(
                schema, handlers=_References(documents), use_default=False
            )
        except (
            Exception
        ) as exc:  # JsonSchemaDefinitionException, a regex RE2 refuses, a bad type...
            raise SchemaCompileError(f"JSON schema does not compile: {exc}") from None
        title = schema.get("title") if isinstance(schema, dict) else None
        self._title: str | None = title if isinstance(title, str) and title else None

    def record_name(self, data: bytes, start: int) -> str:
        if self._title is None:
            raise ValueError("the JSON schema has no title")
        return self._title

    def mismatch(self, data: bytes, start: int) -> str | None:
        try:
            document = orjson.loads(data[start:])
        except orjson.JSONDecodeError as exc:
            return f"not JSON: {exc}"
        try:
            self._validate(document)
        except fastjsonschema.JsonSchemaValueException as exc:
            return str(exc.message)
        return None


# --- Protobuf -----------------------------------------------------------------------------

_WELL_KNOWN = {
    module.DESCRIPTOR.name: module.DESCRIPTOR.serialized_pb
    for module in (
        any_pb2,
        api_pb2,
        descriptor_pb2,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        source_context_pb2,
        struct_pb2,
        timestamp_pb2,
        type_pb2,
        wrappers_pb2,
    )
}
"""The google/protobuf/*.proto files a schema may import without registering them (the Confluent
serializers skip them as references)."""

_WIRE_TYPES = {0: "varint", 1: "64-bit", 2: "length-delimited", 3: "group start", 5: "32-bit"}
_FIELD_TYPES = {
    number: name.removeprefix("TYPE_").lower()
    for name, number in vars(FieldDescriptor).items()
    if name.startswith("TYPE_")
}


def _file_proto(text: str, what: str) -> descriptor_pb2.FileDescriptorProto:
    try:
        serialized = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise SchemaCompileError(PROTOBUF_TEXT_NOT_SUPPORTED) from None
    proto = descriptor_pb2.FileDescriptorProto()
    try:
        proto.ParseFromString(serialized)
    except DecodeError as exc:
        raise SchemaCompileError(f"{what} is not a serialized FileDescriptorProto: {exc}") from None
    return proto


def _message_paths(
    messages: Any, package: str, path: tuple[int, ...] = ()
) -> Iterator[tuple[tuple[int, ...], str]]:
    """(message indexes, full name) of every message, nested ones included."""
    for index, message in enumerate(messages):
        name = f"{package}.{message.name}" if package else message.name
        yield (*path, index), name
        yield from _message_paths(message.nested_type, name, (*path, index))


_MessageFields = tuple[tuple[str, str], ...]
"""A message type's fields that hold messages: (name, "one" | "repeated" | "map")."""


class ProtobufSchema:
    """One Protobuf message after Confluent's message indexes, parsed with the message class
    the indexes name.

    `registered.schema` must be the base64 serialized FileDescriptorProto the registry serves
    with `?format=serialized` (and that Confluent's serializers register); `.proto` text is
    refused (SchemaCompileError), since parsing it needs protoc. Well-known imports
    (google/protobuf/*.proto) that are not references come from the protobuf runtime.

    Fields the schema does not know are a mismatch: the parser keeps them silently, and a field
    sent with the wrong wire type is one of them. Whether there are any is one recursive discard
    in C (the encoded size shrinks); only then is the message walked to name the field.
    """

    __slots__ = ("_classes", "_message_fields")

    def __init__(self, registered: RegisteredSchema) -> None:
        main = _file_proto(registered.schema, "Protobuf schema")
        if not main.message_type:
            raise SchemaCompileError("Protobuf schema has no message types")
        if not main.name:
            main.name = f"schema-{registered.schema_id}.proto"
        references: dict[str, descriptor_pb2.FileDescriptorProto] = {}
        for reference in registered.resolved_references:
            proto = _file_proto(reference.schema, f"Protobuf reference {reference.name}")
            proto.name = reference.name
            references[reference.name] = proto
        pool = descriptor_pool.DescriptorPool()
        added: set[str] = set()

        def add(proto: descriptor_pb2.FileDescriptorProto, importers: tuple[str, ...]) -> None:
            for dependency in proto.dependency:
                if dependency in added:
                    continue
                if dependency in importers:
                    raise SchemaCompileError(f"Protobuf import cycle through {dependency}")
                if dependency in references:
                    add(references[dependency], (*importers, proto.name))
                elif dependency in _WELL_KNOWN:
                    pool.AddSerializedFile(_WELL_KNOWN[dependency])
                    added.add(dependency)
                else:
                    raise SchemaCompileError(
                        f"{proto.name} imports {dependency}, which is not among the references"
                    )
            try:
                pool.Add(proto)
            except Exception as exc:  # TypeError or ValueError, naming what does not link
                raise SchemaCompileError(
                    f"Protobuf file {proto.name} does not build: {exc}"
                ) from None
            added.add(proto.name)

        add(main, ())
        self._classes: dict[tuple[int, ...], type[Message]] = {
            path: message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
            for path, name in _message_paths(main.message_type, main.package)
        }
        self._message_fields: dict[str, _MessageFields] = {}

    def _message_class(self, data: bytes, start: int) -> tuple[type[Message], int]:
        indexes, offset = read_message_indexes(data, start)
        message_class = self._classes.get(indexes)
        if message_class is None:
            raise ValueError(f"message index {list(indexes)} is not in the schema")
        return message_class, offset

    def record_name(self, data: bytes, start: int) -> str:
        message_class, _ = self._message_class(data, start)
        return str(message_class.DESCRIPTOR.full_name)

    def mismatch(self, data: bytes, start: int) -> str | None:
        try:
            message_class, offset = self._message_class(data, start)
        except ValueError as exc:  # WireFormatError, or indexes naming no message
            return str(exc)
        payload = data[offset:]
        message = message_class()
        try:
            message.ParseFromString(payload)
        except DecodeError as exc:
            return str(exc)
        size = message.ByteSize()
        message.DiscardUnknownFields()  # recursive, in C: the cheap test that there are none
        if message.ByteSize() == size:
            return None
        named = self._unknown_field(message_class.FromString(payload))
        return named or f"{message_class.DESCRIPTOR.full_name} has fields the schema lacks"

    def _fields_holding_messages(self, descriptor: Descriptor) -> _MessageFields:
        known = self._message_fields.get(descriptor.full_name)
        if known is not None:
            return known
        fields = []
        for field in descriptor.fields:
            message_type = field.message_type
            if message_type is None:
                continue
            if message_type.GetOptions().map_entry:
                if message_type.fields_by_name["value"].message_type is not None:
                    fields.append((field.name, "map"))
            else:
                fields.append((field.name, "repeated" if field.is_repeated else "one"))
        found = tuple(fields)
        self._message_fields[descriptor.full_name] = found
        return found

    def _unknown_field(self, message: Message) -> str | None:
        """The first field of `message` (or of a message inside it) that the schema lacks."""
        descriptor = message.DESCRIPTOR
        for unknown in unknown_fields.UnknownFieldSet(message):
            number, wire_type = unknown.field_number, unknown.wire_type
            wire_name = _WIRE_TYPES.get(wire_type, str(wire_type))
            field = descriptor.fields_by_number.get(number)
            if field is None:
                return f"{descriptor.full_name} has no field {number} (wire type {wire_name})"
            field_type = _FIELD_TYPES.get(field.type, field.type)
            return (
                f"field {number} ({field.name}, {field_type}) of {descriptor.full_name} "
                f"has wire type {wire_name}"
            )
        for name, kind in self._fields_holding_messages(descriptor):
            if kind == "one":
                if not message.HasField(name):
                    continue
                inner = [getattr(message, name)]
            elif kind == "repeated":
                inner = list(getattr(message, name))
            else:
                inner = list(getattr(message, name).values())
            for value in inner:
                problem = self._unknown_field(value)
                if problem is not None:
                    return problem
        return None
