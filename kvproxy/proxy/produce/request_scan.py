"""What a Produce request holds, read from its batch headers before any policy runs (whether it
carries transactional records, how many records it declares), and the proxy's own verdicts on
it: named by the framework's names below, worded as Kafka words them."""

from __future__ import annotations

from typing import Any

from kvproxy.policies.api import ProducedRecords, Verdict
from kvproxy.protocol import error_codes
from kvproxy.protocol.budget import BudgetExhausted, RetryLater
from kvproxy.protocol.compression import Codec
from kvproxy.protocol.errors import DecodeError
from kvproxy.protocol.produce_topics import topic_name
from kvproxy.protocol.records import read_batch

__all__ = [
    "ANSWERED_AS_THEY_ARE",
    "DECODE_BUDGET",
    "INVALID_ACKS",
    "NO_TRANSACTIONAL_ID",
    "NO_TRANSACTIONAL_ID_VERDICT",
    "RECORDS_LIMIT",
    "UNKNOWN_TOPIC_ID_POLICY",
    "UNKNOWN_TOPIC_ID_VERDICT",
    "Parsed",
    "declared_records",
    "has_transactional_records",
    "invalid_acks",
    "refuse_every_partition",
    "too_many_records",
    "unchecked",
    "unknown_topic_id",
]

ANSWERED_AS_THEY_ARE = frozenset(
    {
        error_codes.UNSUPPORTED_FOR_MESSAGE_FORMAT,
        error_codes.INVALID_REQUIRED_ACKS,
        error_codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        error_codes.MESSAGE_TOO_LARGE,  # max.message.bytes: not retried by any client
        error_codes.RECORD_LIST_TOO_LARGE,  # segment.bytes
    }
)
"""Codes a broker sends to Produce v0-v2 clients too: never replaced by the legacy code."""

RECORDS_LIMIT = "max_records_per_request"
"""`Verdict.policy` of a request refused for declaring too many records (`limits`)."""
DECODE_BUDGET = "decode_budget"
"""`Verdict.policy` of a partition whose decoding would hold more memory than allowed."""
INVALID_ACKS = "required_acks"
"""`Verdict.policy` of every partition of a request whose acks Kafka does not take (-1, 0, 1)."""
UNKNOWN_TOPIC_ID_POLICY = "topic_id"
"""`Verdict.policy` of a partition whose topic id the cluster does not know (Produce v13)."""
NO_TRANSACTIONAL_ID = "transactional_id"
"""`Verdict.policy` of every partition of a request that carries transactional records without
a transactional id: Kafka refuses the whole request before any other check."""

Parsed = list[tuple[str, list[tuple[int, bytes | memoryview, ProducedRecords | Verdict]]]]
"""Per topic, each partition's index, records as sent, and batch views or the verdict."""


def has_transactional_records(body: Any, parsed: Parsed) -> bool:
    """Whether the first batch of some partition is transactional, the test of Kafka's
    `RequestUtils.hasTransactionalRecords` (only batch headers are read). `parsed` is what was
    read of `body`'s partitions, in its order: a partition whose batches were read is not read
    again."""
    for topic_data, (_, partitions) in zip(body.topic_data, parsed, strict=True):
        for data, (_, _, produced) in zip(topic_data.partition_data, partitions, strict=True):
            if not data.records:
                continue
            if isinstance(produced, ProducedRecords) and produced.batches:
                first = produced.batches[0]
            else:
                try:
                    first, _ = read_batch(data.records)
                except DecodeError:
                    continue  # no batch to read: the partition's own checks answer it
            if first.is_transactional:
                return True
    return False


def refuse_every_partition(body: Any, verdict: Verdict) -> Parsed:
    """`verdict` for every partition of the request, with its records as sent (for the journal)."""
    return [
        (
            topic_name(topic_data),
            [
                (int(data.index), data.records if data.records is not None else b"", verdict)
                for data in topic_data.partition_data
            ],
        )
        for topic_data in body.topic_data
    ]


def declared_records(parsed: Parsed) -> int:
    """The records a request declares over all its batches.

    Magic 2 batches declare their count in the header (a negative count adds nothing; the
    integrity check rejects it). A magic 0/1 message is one record, except a compressed wrapper
    (Produce v0-v2 only), which has no count but its inner messages: those are counted from their
    length fields (one wrapper decompressed at a time), and one that does not decode, or would
    need more memory than the request may hold, counts as one (its partition is rejected anyway).
    """
    declared = 0
    for _, partitions in parsed:
        for _, _, produced in partitions:
            if isinstance(produced, Verdict):
                continue
            for batch in produced.batches:
                if batch.magic == 2 or batch.codec is Codec.NONE:
                    declared += max(batch.record_count, 0)
                else:
                    try:
                        declared += batch.record_count
                    except (DecodeError, BudgetExhausted):
                        declared += 1
                    finally:
                        batch.release()  # one wrapper's messages held at a time
    return declared


def too_many_records(declared: int, limit: int) -> Verdict:
    """The verdict for every partition of a request declaring more than `limit` records."""
    return Verdict(
        code=error_codes.MESSAGE_TOO_LARGE,
        message=(
            f"The request declares {declared} records, more than the proxy accepts in one "
            f"request ({limit}, limits.max_records_per_request)"
        ),
        policy=RECORDS_LIMIT,
        any_version=True,
    )


NO_TRANSACTIONAL_ID_VERDICT = Verdict(
    code=error_codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    message="Transactional Id authorization failed.",
    policy=NO_TRANSACTIONAL_ID,
    code_only=True,
)
"""Every partition's verdict when a request has transactional records but no transactional id."""


UNKNOWN_TOPIC_ID_VERDICT = Verdict(
    code=error_codes.UNKNOWN_TOPIC_ID,
    message="This server does not host this topic ID.",
    policy=UNKNOWN_TOPIC_ID_POLICY,
    code_only=True,
)


def unknown_topic_id(
    topic_data: Any,
) -> list[tuple[int, bytes | memoryview, ProducedRecords | Verdict]]:
    """Every partition of a topic named by an unknown id: UNKNOWN_TOPIC_ID, as Kafka answers."""
    verdict: ProducedRecords | Verdict = UNKNOWN_TOPIC_ID_VERDICT
    return [
        (int(d.index), d.records if d.records is not None else b"", verdict)
        for d in topic_data.partition_data
    ]


def invalid_acks(acks: int) -> Verdict:
    """Every partition's verdict when the request's acks is none Kafka takes."""
    return Verdict(
        code=error_codes.INVALID_REQUIRED_ACKS,
        message=f"Invalid required acks {acks}: only -1, 0 and 1 are allowed",
        policy=INVALID_ACKS,
    )


def unchecked(topic: str, index: int, exc: BudgetExhausted) -> Verdict:
    """The verdict of a partition whose records were not checked: decoding them would pass the
    allowance (MESSAGE_TOO_LARGE; `RetryLater`: NOT_ENOUGH_REPLICAS, retried)."""
    return Verdict(
        code=exc.error_code,
        message=f"Records in topic partition {topic}-{index} not checked: {exc}",
        policy=DECODE_BUDGET,
        resend=isinstance(exc, RetryLater),
        any_version=True,
    )
