"""`schema`: every record carries a schema id the registry knows, registered under the subject
the topic's naming strategy gives, and (optionally) a payload that decodes with that schema.

What Confluent Server calls schema ID validation (`confluent.value.schema.validation`), on the
proxy. The records are read in Confluent's wire format (magic byte 0, a 4-byte schema id; for
Protobuf the message indexes follow). The registry's answers come in `ProducedRecords.schemas`:
the ids the check will read are gathered first (`schema_ids_wanted`, through
`kvproxy.policies.schemas.ids`) and looked up before the chain runs, so the check itself never
waits on the network. An id still missing then is answered as the registry unavailable.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable
from typing import Any, ClassVar

from kvproxy.policies.api import (
    ACCEPT,
    Need,
    ProducedRecords,
    RecordError,
    RecordErrorList,
    Verdict,
    record_errors_verdict,
)
from kvproxy.policies.builtin.base import BuiltinPolicy
from kvproxy.policies.errors import short_repr
from kvproxy.policies.schemas.ids import carried_schema_ids
from kvproxy.policies.schemas.model import (
    CompiledSchema,
    RegistryUnavailable,
    ResolvedSchema,
    SchemaCatalog,
    UnknownSchema,
)
from kvproxy.policies.schemas.wire import WireFormatError, read_schema_id
from kvproxy.protocol import error_codes

__all__ = ["SchemaPolicy"]

_SIDE_MODES = ("required", "optional", "off")
_STRATEGIES = ("topic_name", "record_name", "topic_record_name")
_HEADER = 5
"""Magic byte and schema id."""
_REASON_CHARS = 200
"""A decoder's reason is cut to this many characters (it goes into every answer and log line)."""
_unpack_id: Callable[[bytes], tuple[int]] = struct.Struct(">xI").unpack
_head: Callable[[Any], bytes] = operator.itemgetter(slice(0, _HEADER))
"""A value's first 5 bytes (TypeError for a null value)."""


class SchemaPolicy(BuiltinPolicy):
    """Keys and values in Confluent's wire format, with ids the registry knows for the subject.

    Per side (`value`, `key`): `required` (every record's bytes carry a valid id; a null value
    passes only on a compacted topic, as a tombstone), `optional` (bytes that start with the
    magic byte must carry a valid id; others pass) or `off`. `strategy` names the subject as
    Confluent's serializers do: `topic_name` (`<topic>-value`), `record_name` (the record type's
    full name), `topic_record_name` (`<topic>-<record type>`). `validate_payload` decodes the
    bytes after the header with the schema (Avro, JSON Schema, Protobuf), when it is at most
    `max_payload_bytes` (a larger one is refused undecoded: decoders build several times what
    they read, and hold the thread that decides while they do).
    """

    name = "schema"
    OPTIONS: ClassVar[dict[str, Any]] = {
        "value": "required",
        "key": "off",
        "strategy": "topic_name",
        "validate_payload": False,
        "max_payload_bytes": 1_048_576,
    }
    needs = frozenset({Need.SCHEMAS})

    def setup(self) -> None:
        self.value_mode = self._choice("value", _SIDE_MODES)
        self.key_mode = self._choice("key", _SIDE_MODES)
        self.strategy = self._choice("strategy", _STRATEGIES)
        self.validate_payload = self._bool_option("validate_payload")
        self.max_payload_bytes = self._int_option("max_payload_bytes", minimum=0)
        self.sides: tuple[tuple[str, bool], ...] = tuple(
            (side, mode == "required")
            for side, mode in (("value", self.value_mode), ("key", self.key_mode))
            if mode != "off"
        )
        # Tombstones pass on compacted topics only: the check reads the topic's compaction.
        self.topic_settings: tuple[str, ...] | None = (
            ("compacted",) if self.value_mode == "required" else None
        )

    def _choice(self, key: str, allowed: tuple[str, ...]) -> str:
        value = self.options[key]
        if value not in allowed:
            raise self._error(
                f"option {key} must be one of {', '.join(allowed)}, not {short_repr(value)}"
            )
        return str(value)

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        catalog = batch.schemas
        if catalog is None:
            raise RuntimeError("no schema registry answers were given (schema_registry section)")
        check = _PartitionCheck(self, topic, batch, catalog, gathering=False)
        self._read(check, batch)
        if check.unavailable is not None:
            return Verdict(
                error_codes.REQUEST_TIMED_OUT,
                f"schema registry unavailable: {check.unavailable}",
                policy=self.name,
                resend=True,
            )
        if not check.errors:
            return ACCEPT
        return record_errors_verdict(check.errors)

    def schema_ids_wanted(self, topic: str, batch: ProducedRecords) -> set[int]:
        """The ids `validate` will ask `batch.schemas` about that it cannot answer yet: not
        held, or held without a subject a record names and older than `recheck_ms` (registered
        under it since?). With no catalog (the audit's id pass), every id the checked sides
        carry. Read as `validate` reads, payloads left out."""
        if batch.schemas is None:
            return carried_schema_ids(
                batch, values=self.value_mode != "off", keys=self.key_mode != "off"
            )
        check = _PartitionCheck(self, topic, batch, batch.schemas, gathering=True)
        self._read(check, batch)
        return check.missing

    def _read(self, check: _PartitionCheck, batch: ProducedRecords) -> None:
        if self.key_mode == "off" and self.value_mode != "off":
            self._check_values(check, batch)
            return
        for record in batch.records():
            for side, required in self.sides:
                data = record.value if side == "value" else record.key
                message = check.record(side, required, data)
                if message is not None:
                    check.errors.append(RecordError(record.index, message))

    def _check_values(self, check: _PartitionCheck, batch: ProducedRecords) -> None:
        """The values (the only side checked), read without building `Record`s: each distinct
        header is worked out once by `check.record`.

        The common case runs at the rate of reading the values: under `topic_name` the subject
        does not depend on the record, so without payload checks the header (magic byte and
        id) decides, and a batch whose distinct headers all pass is accepted without a step
        per record. Otherwise a header that passed once passes again without a call (its
        payload still decoded when asked); every other value goes through `check.record`, as
        with the key side on, in record order."""
        required = self.value_mode == "required"
        memo_headers = self.strategy == "topic_name"
        validate_payload = check.payloads
        passed: set[bytes] = set()  # headers whose every record passes (no payload check)
        decoders: dict[bytes, CompiledSchema] = {}  # headers whose payloads must decode
        per_id = check.per_id
        errors = check.errors
        index = 0
        for part in batch.batches:
            values = list(part.values())
            if memo_headers and not validate_payload and _heads_pass(check, values, passed):
                index += len(values)
                continue
            for value in values:
                if value is not None:
                    head = value[:_HEADER]
                    if head in passed:
                        index += 1
                        continue
                    compiled = decoders.get(head)
                    if (
                        compiled is not None
                        and len(value) <= self.max_payload_bytes
                        and compiled.mismatch(value, _HEADER) is None
                    ):
                        index += 1
                        continue
                message = check.record("value", required, value)
                if message is not None:
                    errors.append(RecordError(index, message))
                elif memo_headers and value is not None and len(head) == _HEADER and not head[0]:
                    schema = per_id.get(_unpack_id(head)[0])
                    if isinstance(schema, ResolvedSchema):
                        if not validate_payload:
                            passed.add(head)
                        elif schema.compiled is not None:
                            decoders[head] = schema.compiled
                index += 1


def _heads_pass(check: _PartitionCheck, values: list[bytes | None], passed: set[bytes]) -> bool:
    """True when every value carries a header that passes (ids only, `topic_name`: a value of
    5 bytes or more fares as its first 5 bytes do); `passed` gains the headers found to pass.
    The distinct headers are checked in the order they first appear, and `check.record` may be
    asked again about each (it keeps what it learnt), so a False leaves the record-by-record
    check with nothing to redo differently."""
    try:
        heads = dict.fromkeys(map(_head, values))
    except TypeError:  # a null value
        return False
    required = check.policy.value_mode == "required"
    for head in heads:
        if head in passed:
            continue
        if len(head) != _HEADER or head[0]:
            return False
        if check.record("value", required, head) is not None:
            return False
        if not isinstance(check.per_id.get(_unpack_id(head)[0]), ResolvedSchema):
            return False
        passed.add(head)
    return True


class _PartitionCheck:
    """One partition's records against the catalog, each id's outcome worked out once."""

    __slots__ = (
        "batch",
        "catalog",
        "errors",
        "gathering",
        "missing",
        "payloads",
        "per_id",
        "per_subject",
        "policy",
        "topic",
        "unavailable",
    )

    def __init__(
        self,
        policy: SchemaPolicy,
        topic: str,
        batch: ProducedRecords,
        catalog: SchemaCatalog,
        *,
        gathering: bool,
    ) -> None:
        self.policy = policy
        self.topic = topic
        self.batch = batch
        self.catalog = catalog
        self.errors: RecordErrorList = RecordErrorList()
        self.gathering = gathering
        """True: only the ids the catalog cannot answer are wanted (`missing`); nothing is
        counted as a cache hit and no payload is decoded."""
        self.payloads = policy.validate_payload and not gathering
        self.missing: set[int] = set()
        self.unavailable: str | None = None
        self.per_id: dict[int, ResolvedSchema | str | None] = {}
        """id -> the schema, or the error every record with it gets, or None (skip: missing
        while gathering, or unavailable under on_error accept)."""
        self.per_subject: dict[tuple[int, str], str | None] = {}

    def record(self, side: str, required: bool, data: bytes | None) -> str | None:
        """The error of one side of one record, or None."""
        prefix = "" if side == "value" else "key: "
        if data is None:
            if not required or (side == "value" and self.batch.compacted):
                return None
            return f"{prefix}no schema id: the {side} is null"
        if not required and (not data or data[0] != 0):
            return None  # optional: bytes without the magic byte are not framed
        try:
            schema_id = read_schema_id(data)
        except WireFormatError as exc:
            return f"{prefix}no schema id: {exc}"
        schema = self.per_id.get(schema_id, _UNSEEN)
        if schema is _UNSEEN:
            schema = self.per_id[schema_id] = self._schema(schema_id)
        if schema is None:
            return None
        if isinstance(schema, str):
            return prefix + schema
        assert isinstance(schema, ResolvedSchema)
        subject_error = self._subject_error(schema, side, data)
        if subject_error is not None:
            return prefix + subject_error
        if self.payloads:
            limit = self.policy.max_payload_bytes
            if len(data) > limit:  # a decoder builds several times the bytes it is given
                return (
                    f"{prefix}{len(data)} bytes exceed max_payload_bytes ({limit}): the payload "
                    f"is not decoded against schema {schema_id}"
                )
            mismatch = _mismatch(schema, data)
            if mismatch is not None:
                return f"{prefix}does not match schema {schema_id}: {mismatch[:_REASON_CHARS]}"
        return None

    def _schema(self, schema_id: int) -> ResolvedSchema | str | None:
        if self.gathering:
            entry = self.catalog.peek(schema_id)
            if entry is None:
                self.missing.add(schema_id)
                return None
        else:
            entry = self.catalog.entry(schema_id)
            if entry is None:  # gathered, yet gone: no answer came in time
                entry = RegistryUnavailable(schema_id, "not looked up")
        if isinstance(entry, UnknownSchema):
            return f"unknown schema id {schema_id}"
        if isinstance(entry, RegistryUnavailable):
            if not self.catalog.accept_unavailable and self.unavailable is None:
                self.unavailable = f"schema id {schema_id}: {entry.reason}"
            return None
        if entry.compiled is None and (
            self.policy.validate_payload or self.policy.strategy != "topic_name"
        ):
            return f"schema {schema_id} cannot be used: {entry.problem}"
        return entry

    def _subject_error(self, schema: ResolvedSchema, side: str, data: bytes) -> str | None:
        strategy = self.policy.strategy
        if strategy == "topic_name":
            subject = f"{self.topic}-{side}"
        else:
            assert schema.compiled is not None
            try:
                record_name = schema.compiled.record_name(data, _HEADER)
            except ValueError as exc:
                return f"schema {schema.schema_id} names no record type: {exc}"
            subject = record_name if strategy == "record_name" else f"{self.topic}-{record_name}"
        key = (schema.schema_id, subject)
        if key in self.per_subject:
            return self.per_subject[key]
        error: str | None = None
        if subject not in schema.subjects:
            stale = self.batch.now_ms - schema.fetched_ms > self.catalog.recheck_ms
            if self.gathering and stale:
                self.missing.add(schema.schema_id)  # registered since? ask again
            error = f"schema {schema.schema_id} is not registered under {subject}"
        self.per_subject[key] = error
        return error


def _mismatch(schema: ResolvedSchema, data: bytes) -> str | None:
    assert schema.compiled is not None
    return schema.compiled.mismatch(data, _HEADER)


_UNSEEN: Any = object()
