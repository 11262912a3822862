"""The `RecordsPolicy` API: verdicts, the per-partition view a policy checks, and its parser.

The Python shape of the `RecordsPolicy` interface proposed for Kafka in KAFKA-10732: a policy is
built once by `create(context, options)`, then asked to `validate` what one partition of one
Produce request carries, and answers with a `Verdict` value. A verdict is never an exception; a
policy may raise `PolicyViolation` instead, which the chain turns into POLICY_VIOLATION (44).
Everything a policy of another distribution needs is importable from here.

Verdicts carry Kafka's code and the broker's wording. Note for answer writers: the broker puts an
`error_message` on the wire only for record-level rejections (the ones with `record_errors`,
LogValidator's RecordValidationException) and for nothing else; for batch-level rejections
`message` is the text of the exception the broker raises (what it logs), kept here so the proxy
can log it and, if it chooses, send it.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from kvproxy.policies.errors import PolicyConfigError
from kvproxy.protocol import error_codes
from kvproxy.protocol.budget import Allowance
from kvproxy.protocol.errors import BatchFraming, BufferUnderflow, DecodeError
from kvproxy.protocol.records import Record, RecordBatch, read_batches
from kvproxy.protocol.records.readers import first_batch_incomplete

if TYPE_CHECKING:
    from kvproxy.policies.producer_state import ProducerStateTracker
    from kvproxy.policies.schemas.model import SchemaCatalog

__all__ = [
    "ACCEPT",
    "INVALID_RECORD_REJECTION",
    "MAX_RECORD_ERRORS",
    "MISSING_KEY",
    "PARSING",
    "UNKNOWN_TOPIC_CONFIG",
    "Need",
    "PolicyConfigError",
    "PolicyContext",
    "PolicyFactory",
    "PolicyViolation",
    "ProducedRecords",
    "RecordError",
    "RecordErrorList",
    "RecordsPolicy",
    "Stage",
    "TopicConfig",
    "Verdict",
    "parse_records",
    "record_errors_verdict",
]

MISSING_KEY = "missing_key"
"""`Verdict.rejection` of a null key on a compacted topic (the `kip` profile answers 45)."""
INVALID_RECORD_REJECTION = "invalid_record"
"""`Verdict.rejection` of any other record-level rejection (the `kip` profile answers 85)."""


@dataclass(frozen=True, slots=True)
class RecordError:
    """One entry of a ProduceResponse v8+ `record_errors`."""

    index: int
    """0-based index of the record in the partition's records (Kafka's `batch_index`)."""
    message: str
    policy: str | None = field(default=None, compare=False)
    """The check that found it, when a verdict merges several checks' errors (not on the wire)."""

    def java_repr(self) -> str:
        """How Kafka's `ProduceResponse.RecordError.toString()` prints it."""
        return f"RecordError(batchIndex={self.index}, message='{self.message}')"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a policy (or a chain) decided for one partition."""

    code: int = 0
    """Kafka error code; 0 = accepted."""
    message: str | None = None
    """Batch-level message in the broker's wording (Kafka's `error_message` for record errors)."""
    record_errors: tuple[RecordError, ...] = ()
    policy: str | None = None
    """Name of the policy that fired."""
    rejection: str | None = None
    """`"missing_key"`, `"invalid_record"` for record-level rejections the error profile may
    renumber (`kvproxy.protocol.error_codes.Rejection` values); None otherwise."""
    resend: bool = False
    """The refusal is about the proxy's circumstances, not the data (no memory to decompress,
    a schema registry out of reach): the code is retriable, the client sends the same batch
    again, so nothing of it is kept in the quarantine journal."""
    code_only: bool = False
    """The answer carries the code alone, no `error_message`: the broker's exception says only
    what its code says, and Kafka's ApiError leaves such a message out."""
    any_version: bool = False
    """The code is answered to every Produce version as it is, never replaced by the legacy code
    old clients are sent (a limit answered MESSAGE_TOO_LARGE, which no client retries)."""

    @property
    def ok(self) -> bool:
        return self.code == 0

    def with_policy(self, name: str) -> Verdict:
        """This verdict with `policy` set (when the policy did not set it itself)."""
        if self.policy is not None or self.code == 0:
            return self
        return dataclasses.replace(self, policy=name)


ACCEPT = Verdict()

MAX_RECORD_ERRORS = 1000
"""A verdict keeps the first this many record errors (the message still counts them all).

A broker lists every one, but one request of a million records with bad timestamps would then
be answered with 145 MB, more than any client accepts; a thousand say what is wrong as well."""


class RecordErrorList(list[RecordError]):
    """A list of record errors that keeps the first MAX_RECORD_ERRORS and counts the rest
    (`total`): a million bad records cost a counter, not a million kept errors."""

    total: int = 0

    def append(self, error: RecordError) -> None:
        self.total += 1
        if len(self) < MAX_RECORD_ERRORS:
            super().append(error)


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """The topic settings a broker applies on produce, by Kafka's topic config names.

    Learned from the cluster (DescribeConfigs) or set per topic in YAML; None means not known,
    and a check that needs the value then uses its own option or Kafka's default.
    """

    compacted: bool | None = None
    """`cleanup.policy` contains `compact`."""
    timestamp_type: str | None = None
    """`message.timestamp.type`: "CreateTime" or "LogAppendTime"."""
    timestamp_before_max_ms: int | None = None
    """`message.timestamp.before.max.ms` (or the older `message.timestamp.difference.max.ms`)."""
    timestamp_after_max_ms: int | None = None
    """`message.timestamp.after.max.ms`."""
    max_message_bytes: int | None = None
    """`max.message.bytes`: the largest batch (MESSAGE_TOO_LARGE beyond)."""
    segment_bytes: int | None = None
    """`segment.bytes`: the largest partition's records (RECORD_LIST_TOO_LARGE beyond)."""

    def over(self, base: TopicConfig) -> TopicConfig:
        """This config's known values, `base`'s where this one's are None (YAML over cluster)."""
        return TopicConfig(
            *(
                mine if mine is not None else theirs
                for mine, theirs in zip(_config_values(self), _config_values(base), strict=True)
            )
        )


def _config_values(config: TopicConfig) -> tuple[Any, ...]:
    return (
        config.compacted,
        config.timestamp_type,
        config.timestamp_before_max_ms,
        config.timestamp_after_max_ms,
        config.max_message_bytes,
        config.segment_bytes,
    )


UNKNOWN_TOPIC_CONFIG = TopicConfig()


RECORD_OBJECT_BYTES = 240
"""What one decoded `Record` costs in memory besides its key and value bytes (measured: the tuple,
its fields and the list slot), counted in the request's allowance before records are decoded."""


class PolicyViolation(Exception):
    """Raised by a custom policy to reject a partition: POLICY_VIOLATION (44) with str(message)."""


def record_errors_verdict(
    errors: list[RecordError] | tuple[RecordError, ...] | RecordErrorList,
    *,
    code: int = error_codes.INVALID_RECORD,
    rejection: str | None = "",
    policy: str | None = None,
) -> Verdict:
    """A record-level rejection with the message of Kafka's `LogValidator.processRecordErrors`.

    INVALID_TIMESTAMP gets "One or more records have been rejected due to invalid timestamp";
    everything else "One or more records have been rejected due to N record errors in total, and
    only showing the first three errors at most: [RecordError(batchIndex=i, message='m'), ...]"
    (Java's `List.toString` of the first three `ProduceResponse.RecordError`s).
    `rejection` defaults to "invalid_record" for INVALID_RECORD and None for other codes.
    """
    if rejection == "":
        rejection = INVALID_RECORD_REJECTION if code == error_codes.INVALID_RECORD else None
    total = errors.total if isinstance(errors, RecordErrorList) else len(errors)
    errors = tuple(errors[:MAX_RECORD_ERRORS])
    if code == error_codes.INVALID_TIMESTAMP:
        message = "One or more records have been rejected due to invalid timestamp"
    else:
        shown = ", ".join(error.java_repr() for error in errors[:3])
        message = (
            f"One or more records have been rejected due to {total} record errors in total, "
            f"and only showing the first three errors at most: [{shown}]"
        )
    return Verdict(code, message, errors, policy, rejection)


@dataclass(slots=True, eq=False)
class ProducedRecords:
    """What one partition of one Produce request carries, plus the request context a check needs.

    Read-only by contract, not frozen: one is built for every partition of every request, and a
    frozen dataclass's `__init__` costs five times as much (2.4 against 0.5 µs here, an eighth
    of the whole budget of a 16 KiB batch at 2 GB/s). It also caches the decoded records.
    """

    topic: str
    partition: int
    raw: bytes | memoryview = field(repr=False)
    """The partition's records bytes as sent."""
    batches: tuple[RecordBatch, ...]
    """Parsed batch views (`kvproxy.protocol.records`)."""
    produce_version: int
    acks: int
    transactional_id: str | None
    compacted: bool | None
    """None = unknown."""
    now_ms: int
    stored: bool = False
    """True when the records come from a log (the audit) rather than a Produce request: offsets
    were assigned by the broker, the log cleaner may have removed records (gaps in offset deltas,
    empty batches), so the checks of what only a producer's batch must satisfy are relaxed."""
    topic_config: TopicConfig = UNKNOWN_TOPIC_CONFIG
    """The topic's settings as far as they are known (`compacted` above is its compaction)."""
    schemas: SchemaCatalog | None = field(default=None, repr=False)
    """What the schema registry said about the ids the records carry (`Need.SCHEMAS`)."""
    _records: tuple[Record, ...] | None = field(default=None, repr=False)
    allowance: Allowance | None = field(default=None, repr=False)
    """Where decoding memory is counted (the proxy's per-request budget); None: not counted."""
    _records_charge: int = field(default=0, repr=False)

    def release(self) -> None:
        """Drop what decoding kept (records, decompressed batches) and give its memory back;
        the batch headers stay readable, and decoding again is possible."""
        self._records = None
        if self.allowance is not None and self._records_charge:
            self.allowance.give_back(self._records_charge)
        self._records_charge = 0
        for batch in self.batches:
            batch.release()

    @property
    def topic_partition(self) -> str:
        """Kafka's `TopicPartition.toString()`: "topic-partition"."""
        return f"{self.topic}-{self.partition}"

    def records(self) -> Iterator[Record]:
        """Every record of every batch, `index` renumbered 0.. across the partition.

        Decoded once and cached, so several record-level policies share one decode. Bad bytes
        raise `kvproxy.protocol.errors.CorruptRecords` (the chain answers CORRUPT_MESSAGE).
        """
        return iter(self.record_tuple())

    def record_tuple(self) -> tuple[Record, ...]:
        """`records()` as a tuple (decoded once, cached)."""
        if self._records is not None:
            return self._records
        out: list[Record] = []
        for batch in self.batches:
            if self.allowance is not None:
                count = max(batch.record_count, 0)
                # keys and values are copied out of the plain batch: count its size too
                charge = count * RECORD_OBJECT_BYTES + batch.plain_size()
                what = f"decoding {count} records of {self.topic_partition}"
                self.allowance.take(charge, what)
                self._records_charge += charge
            start = len(out)
            if start == 0:
                out.extend(batch.records())
            else:
                out.extend(r._replace(index=start + r.index) for r in batch.records())
        self._records = tuple(out)
        return self._records

    def batch_records(self) -> Iterator[tuple[RecordBatch, Record]]:
        """(batch, record) pairs with the partition-wide record index."""
        records = self.record_tuple()
        pos = 0
        for batch in self.batches:
            count = batch.record_count
            for record in records[pos : pos + count]:
                yield batch, record
            pos += count


@dataclass(slots=True)
class PolicyContext:
    """What every policy's `create(context, options)` is handed besides its options."""

    base_dir: Path = field(default_factory=Path.cwd)
    """Folder that relative file options (schemas) are resolved against: the config file's."""
    producer_state: ProducerStateTracker | None = None
    """The routing's tracker, for a policy that declares `Need.PRODUCER_STATE` (else None)."""


@dataclass(frozen=True, slots=True)
class Stage:
    """One check of a policy that runs inside its `group` (`kvproxy.policies.groups`): the
    group's stages of all its policies run in `order`, whatever order the YAML lists them in."""

    order: int
    """Where the check runs among the group's stages, lowest first."""
    method: str = "validate"
    """The policy's method: `validate`, or one taking the `ProducedRecords` alone and returning
    a `Verdict` (a record stage: a `RecordErrorList`, or None when there is nothing to say)."""
    record_code: int | None = None
    """Set for a record stage: the code of its errors, which are merged with the other record
    stages' into one verdict (each record keeps its first error, as Kafka's LogValidator)."""
    rejection: str | None = None
    """A record stage's `Verdict.rejection` (`MISSING_KEY`, `INVALID_RECORD_REJECTION`)."""


@runtime_checkable
class RecordsPolicy(Protocol):
    """The Python shape of KAFKA-10732's RecordsPolicy, and the one way a policy is made.

    Every policy is built by `create(context, options)` (`PolicyFactory`), whether the YAML names
    it by an entry point of the group `kvproxy.policies` (kvproxy's built-ins and other
    distributions' alike) or by `custom: {class: "module:Class", config: {...}}`: the object
    named (a class with a classmethod, or a module with a function) returns the configured
    policy, once per YAML entry, at start and on every reload. `options` is the entry's mapping
    (`config` for `custom`; empty for a bare name), `context` a `PolicyContext`. A bad option
    raises `PolicyConfigError`, reported with where the entry is; any other exception is
    reported as "create failed". An `OPTIONS` mapping on the named object lists the options it
    accepts: any other is reported, with a spelling hint, before `create` is called. A policy
    without a `name` gets the YAML's (the class's name for `custom`).

    What a policy may declare on itself, read by the framework when the configuration is
    loaded (the framework knows no policy by name):
    - `needs`: the `Need`s the proxy serves it; `observe(topic, partition, produced,
      error_code)` for `Need.BROKER_ANSWER`, and optionally `wants_answer(produced)`.
    - `topic_settings`: the `TopicConfig` fields it reads (implies `Need.TOPIC_CONFIG`), and
      `setting_options`: option -> `TopicConfig` field, for options that, set in the YAML,
      stand for that setting (which is then not asked of the cluster).
    - `group` and `stages`: the policy runs inside the named group, first in the chain, its
      checks at the places its `Stage`s give, rather than where the YAML lists it.
    - `judges_parsing`: bytes that do not parse as record batches are refused in its name.
    - `schema_ids_wanted(topic, produced)`, for `Need.SCHEMAS`: the ids it will ask about.
    - `accept_form(config)`: the conditions under which its check surely passes on a topic with
      these settings (`kvproxy.policies.accept_form.AcceptForm`, None: none the compiled fast
      accept can prove), so that requests to a chain whose every policy has one are accepted in
      one compiled pass; a refusal is always the Python path's.
    `kvproxy.policies.declaration` reads these once, when the chain is built.
    """

    name: str

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict: ...

    def close(self) -> None: ...


class PolicyFactory(Protocol):
    """What an entry point or a `custom: {class: ...}` names (see `RecordsPolicy`)."""

    def create(self, context: PolicyContext, options: Mapping[str, Any]) -> RecordsPolicy: ...


class Need(enum.Enum):
    """What a policy needs from the proxy besides the records, declared in its `needs`.

    The proxy gets these before the chain runs (the chain itself stays pure and synchronous),
    or, for `BROKER_ANSWER`, after the broker has answered; a chain's needs are the union of
    its policies' (`PolicyChain.needs`), worked out once when the configuration is loaded.
    """

    TOPIC_CONFIG = "topic_config"
    """The topic's settings (`ProducedRecords.topic_config`, `compacted`): the proxy asks the
    cluster for those the YAML leaves unknown before the chain runs. Which ones: the policy's
    `topic_settings` (`TopicConfig` field names), else every one."""
    PRODUCER_STATE = "producer_state"
    """The routing's `ProducerStateTracker`, kept across reloads: `create` finds it in
    `PolicyContext.producer_state` (None for a policy that does not declare this)."""
    BROKER_ANSWER = "broker_answer"
    """The broker's answer to each partition the chain let through: the proxy calls the policy's
    `observe(topic, partition, produced, error_code)` once the broker has answered."""
    SCHEMAS = "schemas"
    """What the schema registry says about the schema ids the records carry
    (`ProducedRecords.schemas`): the ids are gathered before the chain runs
    (`kvproxy.policies.schemas.ids.schema_ids_wanted`: the policy's own
    `schema_ids_wanted(topic, produced)` says which, else every id the keys and values carry)
    and looked up, then the chain runs once."""


PARSING = "record_parsing"
"""`Verdict.policy` of bytes that do not parse as record batches when no policy of the chain
declares `judges_parsing` (`PolicyChain.parsed_by`)."""


def _corrupt(topic: str, partition: int, exc: DecodeError, parsed_by: str) -> Verdict:
    """CORRUPT_MESSAGE for records that do not parse, in Kafka's words where it has them."""
    if isinstance(exc, BatchFraming):
        message = exc.kafka_message
    else:
        message = f"Record batch in topic partition {topic}-{partition} is corrupt: {exc}"
    return Verdict(code=error_codes.CORRUPT_MESSAGE, message=message, policy=parsed_by)


def parse_records(
    topic: str,
    partition: int,
    raw: bytes | bytearray | memoryview | None,
    *,
    produce_version: int,
    acks: int,
    transactional_id: str | None,
    compacted: bool | None,
    now_ms: int,
    stored: bool = False,
    allowance: Allowance | None = None,
    topic_config: TopicConfig | None = None,
    schemas: SchemaCatalog | None = None,
    parsed_by: str = PARSING,
) -> ProducedRecords | Verdict:
    """Parse a partition's records into batch views, or CORRUPT_MESSAGE when they do not parse,
    a refusal in the name `parsed_by` (the chain's `PolicyChain.parsed_by`).

    `raw` None or empty gives a `ProducedRecords` without batches; the policy that checks the
    batches' structure rejects it on Produce v3+ as `ProduceRequest.validateRecords` does
    ("must have at least one record batch per partition"); v0-v2 brokers append nothing and
    answer success.
    """
    if raw is None:
        raw = b""
    elif isinstance(raw, bytearray):
        raw = bytes(raw)
    try:
        batches = read_batches(raw, allowance)
    except BufferUnderflow as exc:
        if produce_version >= 3 and first_batch_incomplete(raw):
            # Kafka's batch iterator stops quietly at an incomplete batch: with none complete
            # before it, ProduceRequest.validateRecords finds no batch at all
            return Verdict(
                code=error_codes.INVALID_RECORD,
                message=f"Produce requests with version {produce_version} must have at least "
                "one record batch per partition",
                policy=parsed_by,
            )
        return _corrupt(topic, partition, exc, parsed_by)
    except DecodeError as exc:
        return _corrupt(topic, partition, exc, parsed_by)
    return ProducedRecords(
        topic=topic,
        partition=partition,
        raw=raw,
        batches=batches,
        produce_version=produce_version,
        acks=acks,
        transactional_id=transactional_id,
        compacted=compacted,
        now_ms=now_ms,
        stored=stored,
        topic_config=UNKNOWN_TOPIC_CONFIG if topic_config is None else topic_config,
        schemas=schemas,
        allowance=allowance,
    )
