"""Record-content policies: size, headers, key pattern, JSON, JSON Schema, Avro.

Each checks every record and rejects the partition with INVALID_RECORD (87) and one
`record_errors` entry per failing record, under LogValidator's batch message (see
`kvproxy.policies.api.record_errors_verdict`), except `max_record_bytes`, which answers
MESSAGE_TOO_LARGE (10).
"""

from __future__ import annotations

import abc
import io
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import fastjsonschema
import orjson
import simdjson

from kvproxy.policies.api import (
    ACCEPT,
    ProducedRecords,
    RecordError,
    RecordErrorList,
    Verdict,
    record_errors_verdict,
)
from kvproxy.policies.builtin.base import BuiltinPolicy
from kvproxy.policies.errors import short_repr
from kvproxy.policies.linear_regex import LinearRegexError, compile_json_schema, compile_linear
from kvproxy.protocol import error_codes
from kvproxy.protocol.records import Record

__all__ = [
    "AvroPolicy",
    "JsonPolicy",
    "JsonSchemaPolicy",
    "KeyPatternPolicy",
    "MaxRecordBytesPolicy",
    "RecordCheckPolicy",
    "RequiredHeadersPolicy",
]

_SHOWN_BYTES = 64


def _shown(data: bytes) -> str:
    """A short, printable rendering of key bytes for a message."""
    text = data[:_SHOWN_BYTES].decode("utf-8", "backslashreplace")
    return repr(text) + ("..." if len(data) > _SHOWN_BYTES else "")


class RecordCheckPolicy(BuiltinPolicy):
    """A policy that looks at each record on its own: subclasses implement `check`."""

    code = error_codes.INVALID_RECORD
    rejection: str | None = "invalid_record"

    @abc.abstractmethod
    def check(self, record: Record, tp: str) -> str | None:
        """The error message for this record, or None when it passes."""

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        tp = batch.topic_partition
        check = self.check
        errors: list[RecordError] = RecordErrorList()
        for record in batch.records():
            message = check(record, tp)
            if message is not None:
                errors.append(RecordError(record.index, message))
        if not errors:
            return ACCEPT
        return record_errors_verdict(errors, code=self.code, rejection=self.rejection)


class MaxRecordBytesPolicy(RecordCheckPolicy):
    """key + value + header keys (UTF-8) and values, per record, at most `limit` bytes.

    `batch_limit` (optional) caps each batch as sent, as max.message.bytes does, with the
    broker's RecordTooLargeException wording. Uncompressed batches no larger than `limit` are
    accepted without decoding their records.
    """

    name = "max_record_bytes"
    OPTIONS = {"limit": 1_048_576, "batch_limit": None}
    code = error_codes.MESSAGE_TOO_LARGE
    rejection = None

    def setup(self) -> None:
        self.limit = self._int_option("limit", minimum=0)
        self.batch_limit = (
            None
            if self.options["batch_limit"] is None
            else self._int_option("batch_limit", minimum=0)
        )

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        if self.batch_limit is not None:
            for b in batch.batches:
                if b.size > self.batch_limit:
                    return Verdict(
                        error_codes.MESSAGE_TOO_LARGE,
                        f"The record batch size in the append to {batch.topic_partition} is "
                        f"{b.size} bytes which exceeds the maximum configured value of "
                        f"{self.batch_limit}.",
                    )
        if all(b.size <= self.limit and b.codec == 0 for b in batch.batches):
            return ACCEPT
        return super().validate(topic, partition, batch)

    def check(self, record: Record, tp: str) -> str | None:
        size = (0 if record.key is None else len(record.key)) + (
            0 if record.value is None else len(record.value)
        )
        for key, value in record.headers:
            size += len(key.encode()) + (0 if value is None else len(value))
        if size <= self.limit:
            return None
        return (
            f"Record of {size} bytes (key, value and headers) exceeds the limit of "
            f"{self.limit} bytes in topic partition {tp}"
        )


class RequiredHeadersPolicy(RecordCheckPolicy):
    """Every record carries each header named in `names`."""

    name = "required_headers"
    OPTIONS = {"names": []}

    def setup(self) -> None:
        names = self._list_option("names")
        if not all(isinstance(n, str) for n in names):
            raise self._error("names must be a list of header names")
        self.names = tuple(names)

    def check(self, record: Record, tp: str) -> str | None:
        present = {key for key, _ in record.headers}
        missing = [name for name in self.names if name not in present]
        if not missing:
            return None
        return f"Record lacks the required header(s) {', '.join(missing)} in topic partition {tp}"


class KeyPatternPolicy(RecordCheckPolicy):
    """The key, decoded as UTF-8, fully matches `regex` (RE2 syntax: no backreferences or
    lookaround); a null key fails unless `allow_null`."""

    name = "key_pattern"
    OPTIONS = {"regex": ".*", "allow_null": False}

    def setup(self) -> None:
        pattern = self.options["regex"]
        if not isinstance(pattern, str):
            raise self._error("regex must be a string")
        try:  # RE2: the key is the client's, and no pattern may backtrack on it
            self.regex = compile_linear(pattern)
        except LinearRegexError as exc:
            raise self._error(f"bad regex {short_repr(pattern)}: {exc}") from None
        self.allow_null = self._bool_option("allow_null")

    def check(self, record: Record, tp: str) -> str | None:
        key = record.key
        if key is None:
            if self.allow_null:
                return None
            return (
                f"Record has no key; keys must match {self.regex.pattern} in topic partition {tp}"
            )
        try:
            text = key.decode("utf-8")
        except UnicodeDecodeError:
            return f"Record key {_shown(key)} is not valid UTF-8 in topic partition {tp}"
        if self.regex.fullmatch(text) is None:
            return (
                f"Record key {_shown(key)} does not match {self.regex.pattern} "
                f"in topic partition {tp}"
            )
        return None


class JsonPolicy(RecordCheckPolicy):
    """The value parses as JSON (RFC 8259: no NaN, no lone surrogates); a null value passes
    unless `allow_null: false`.

    orjson is the judge: what it refuses, and its message, are the answer. A value is first
    read by simdjson, which builds no Python objects (about 4x orjson's rate on 1 KiB
    documents, which build the whole tree only to drop it); whatever simdjson refuses is asked
    of orjson (simdjson refuses integers beyond 64 bits and objects nested 1024 deep, which
    orjson accepts), and so is an accepted value that starts with a UTF-8 byte order mark,
    which simdjson skips and orjson refuses. tests/unit/test_json_validation.py holds the two
    to the same verdicts.

    Bounded by what one value may cost: a value over `max_value_bytes` is refused unread; one
    simdjson declines goes to orjson only up to `max_fallback_bytes` (orjson builds the whole
    tree, about 15x the text, holding the deciding thread); a thread's reused simdjson parser
    reads values up to `KEPT_PARSER_BYTES`, a larger one gets a parser dropped with it."""

    name = "json"
    OPTIONS = {"allow_null": True, "max_value_bytes": 8_388_608, "max_fallback_bytes": 1_048_576}

    def setup(self) -> None:
        self.allow_null = self._bool_option("allow_null")
        self.max_value_bytes = self._int_option("max_value_bytes", minimum=0)
        self.max_fallback_bytes = self._int_option("max_fallback_bytes", minimum=0)

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        # The valid case reads values straight from the batches; `Record`s word a rejection.
        allow_null = self.allow_null
        fast = self._fast_reads
        try:
            for b in batch.batches:
                for value in b.values():
                    if value is None:
                        if not allow_null:
                            raise ValueError
                        continue
                    if not fast(value):
                        raise ValueError
        except ValueError:
            return super().validate(topic, partition, batch)
        return ACCEPT

    def _fast_reads(self, value: bytes) -> bool:
        """Whether simdjson reads `value` as JSON that orjson accepts too; False also when it is
        over `max_value_bytes` (not read at all)."""
        size = len(value)
        if size > self.max_value_bytes:
            return False
        # the parser keeps a buffer as large as the largest value it read: a large value gets
        # one of its own, dropped with it
        parse = _thread_parse() if size <= KEPT_PARSER_BYTES else simdjson.Parser().parse
        try:  # the result is dropped at once: the parser is reused for the next
            parse(value)
        except Exception:  # ValueError, RuntimeError, UnicodeDecodeError: orjson judges
            return False
        return value[0] != _BOM_FIRST_BYTE

    def check(self, record: Record, tp: str) -> str | None:
        value = record.value
        if value is None:
            return None if self.allow_null else f"Record has no value in topic partition {tp}"
        size = len(value)
        if size > self.max_value_bytes:
            return (
                f"Record value of {size} bytes exceeds the {self.max_value_bytes}-byte limit "
                f"of the json check (max_value_bytes) in topic partition {tp}"
            )
        if self._fast_reads(value):
            return None
        if size > self.max_fallback_bytes:
            # what simdjson declines, orjson reads into a whole tree (about 15x the text): only
            # a value this small is given to it
            return (
                f"Record value of {size} bytes is not JSON the fast reader takes (invalid, or an "
                f"integer beyond 64 bits, or nesting beyond 1024 levels) and exceeds the "
                f"{self.max_fallback_bytes}-byte limit of the full reader (max_fallback_bytes) "
                f"in topic partition {tp}"
            )
        try:
            orjson.loads(value)
        except ValueError as exc:
            return f"Record value is not valid JSON ({_json_error(exc)}) in topic partition {tp}"
        return None


KEPT_PARSER_BYTES = 1_048_576
"""The largest value a thread's reused simdjson parser reads: what it keeps after a read."""
_BOM_FIRST_BYTE = 0xEF
"""The first byte of a UTF-8 byte order mark, and of no JSON text that orjson accepts."""
_parsers = threading.local()


def _thread_parse() -> Callable[[bytes], object]:
    """This thread's simdjson `Parser.parse`: a parser is not thread-safe, and the proxy decides
    on the event loop and on a decoding thread. Its buffer grows to the largest value seen."""
    try:
        parse: Callable[[bytes], object] = _parsers.parse
    except AttributeError:
        parse = _parsers.parse = simdjson.Parser().parse
    return parse


def _too_large(size: int, limit: int, check: str, tp: str) -> str:
    return (
        f"Record value of {size} bytes exceeds the {limit}-byte limit of the {check} check "
        f"(max_value_bytes) in topic partition {tp}"
    )


def _json_error(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg}: line {exc.lineno} column {exc.colno}"
    return str(exc)


class JsonSchemaPolicy(RecordCheckPolicy):
    """The value is JSON valid against the schema file `value` (compiled once, fastjsonschema;
    its `pattern`s run on RE2, `kvproxy.policies.linear_regex`), when it is at most
    `max_value_bytes` (the tree orjson builds is about 15x the text).

    The message names the failing path as fastjsonschema does (`data.items[0].price must be ...`).
    """

    name = "json_schema"
    OPTIONS = {"value": None, "allow_null": False, "max_value_bytes": 1_048_576}

    def setup(self) -> None:
        self.allow_null = self._bool_option("allow_null")
        self.max_value_bytes = self._int_option("max_value_bytes", minimum=0)
        path = self._path_option("value")
        self.schema_file = path
        self._validate: Any = None
        if path is None:
            return  # the defaults before configure(); configure without `value` fails below
        try:
            schema = json.loads(path.read_text(encoding="utf-8"))
            self._validate = compile_json_schema(schema)
        except (ValueError, fastjsonschema.JsonSchemaDefinitionException) as exc:
            raise self._error(f"schema {path} does not compile: {exc}") from None

    def configure(self, config: Any) -> None:
        super().configure(config)
        if self._validate is None:
            raise self._error("option value (the JSON Schema file) is required")

    def check(self, record: Record, tp: str) -> str | None:
        value = record.value
        if value is None:
            return None if self.allow_null else f"Record has no value in topic partition {tp}"
        if len(value) > self.max_value_bytes:
            return _too_large(len(value), self.max_value_bytes, self.name, tp)
        try:
            data = orjson.loads(value)
        except ValueError as exc:
            return f"Record value is not valid JSON ({_json_error(exc)}) in topic partition {tp}"
        try:
            self._validate(data)
        except fastjsonschema.JsonSchemaValueException as exc:
            name = Path(str(self.schema_file)).name
            return f"Record value does not match {name}: {exc.message} in topic partition {tp}"
        return None


class AvroPolicy(RecordCheckPolicy):
    """The value is one complete Avro datum of the schema file `value` (fastavro, schemaless).

    Trailing bytes after the datum are an error. No Confluent wire-format prefix is expected.
    A value over `max_value_bytes` is refused unread (fastavro builds Python objects of about
    35x the bytes, and holds the deciding thread while it does).
    """

    name = "avro"
    OPTIONS = {"value": None, "allow_null": False, "max_value_bytes": 1_048_576}

    def setup(self) -> None:
        self.allow_null = self._bool_option("allow_null")
        self.max_value_bytes = self._int_option("max_value_bytes", minimum=0)
        path = self._path_option("value")
        self.schema_file = path
        self._schema: Any = None
        if path is None:
            return
        try:
            self._schema = fastavro.parse_schema(json.loads(path.read_text(encoding="utf-8")))
        except Exception as exc:  # fastavro raises SchemaParseException, ValueError, KeyError...
            raise self._error(f"schema {path} does not parse: {exc}") from None

    def configure(self, config: Any) -> None:
        super().configure(config)
        if self._schema is None:
            raise self._error("option value (the Avro schema file) is required")

    def check(self, record: Record, tp: str) -> str | None:
        value = record.value
        if value is None:
            return None if self.allow_null else f"Record has no value in topic partition {tp}"
        if len(value) > self.max_value_bytes:
            return _too_large(len(value), self.max_value_bytes, self.name, tp)
        name = Path(str(self.schema_file)).name
        stream = io.BytesIO(value)
        try:
            fastavro.schemaless_reader(stream, self._schema)
        except Exception as exc:  # EOFError, ValueError, UnicodeDecodeError, IndexError...
            return (
                f"Record value is not a valid Avro datum of {name} ({type(exc).__name__}: "
                f"{exc}) in topic partition {tp}"
            )
        extra = len(value) - stream.tell()
        if extra:
            return (
                f"Record value has {extra} bytes after the Avro datum of {name} "
                f"in topic partition {tp}"
            )
        return None
