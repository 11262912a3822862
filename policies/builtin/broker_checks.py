"""The broker's own checks run together, in Kafka's order, whatever order the YAML lists them in."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvproxy.policies.api import (
    ACCEPT,
    INVALID_RECORD_REJECTION,
    MISSING_KEY,
    ProducedRecords,
    RecordError,
    RecordErrorList,
    RecordsPolicy,
    Verdict,
    record_errors_verdict,
)
from kvproxy.policies.builtin.broker import BatchIntegrityPolicy, CompactedKeyPolicy
from kvproxy.policies.builtin.timestamps import TimestampsPolicy
from kvproxy.protocol import error_codes
from kvproxy.protocol.budget import ResourceLimit

__all__ = ["BROKER_CHECKS", "BrokerChecks", "PolicyFailed", "merge_record_errors"]


BROKER_CHECKS = frozenset(
    {"batch_integrity", "crc", "message_format", "compacted_key", "timestamps", "producer_state"}
)
"""The built-in policies a chain runs together, in Kafka's order (`BrokerChecks`)."""


class PolicyFailed(Exception):
    """A check inside `BrokerChecks` raised: the chain answers it as that policy's failure."""

    def __init__(self, policy: str, error: Exception) -> None:
        super().__init__(f"policy {policy} failed: {error!r}")
        self.policy = policy
        self.error = error


_RecordCheck = tuple[str, int, str | None, Callable[[ProducedRecords], RecordErrorList | None]]


class BrokerChecks:
    """The broker's own checks of one partition, run in Kafka's order whatever order the
    configuration lists them in, with the record errors of the record checks merged.

    Kafka's order: the request's rules, the base offset and max.message.bytes
    (`batch_integrity`), the CRC (`crc`, before any field of the batch is trusted), the batch
    fields (`batch_integrity`), magic 2 for idempotent and transactional batches
    (`message_format`), the records against the declared count (`batch_integrity`); then every
    record, each with its first error in LogValidator's order (inner magic and compression,
    key on a compacted topic, timestamp), all of them reported together: INVALID_TIMESTAMP
    when any is a timestamp error, else INVALID_RECORD; then segment.bytes and the producer's
    epoch and sequence (`producer_state`). The first failing stage is the verdict, named after
    the policy whose check it is.
    """

    name = "broker_checks"

    def __init__(self, policies: Mapping[str, RecordsPolicy]) -> None:
        self.policies = dict(policies)
        integrity = policies.get("batch_integrity")
        steps: list[tuple[str, Callable[[ProducedRecords], Verdict]]] = []
        records: list[_RecordCheck] = []
        after: list[tuple[str, Callable[[ProducedRecords], Verdict]]] = []

        def whole(policy: RecordsPolicy) -> Callable[[ProducedRecords], Verdict]:
            return lambda produced: policy.validate(produced.topic, produced.partition, produced)

        if isinstance(integrity, BatchIntegrityPolicy):
            steps.append(("batch_integrity", integrity.check_request))
        if "crc" in policies:
            steps.append(("crc", whole(policies["crc"])))
        if isinstance(integrity, BatchIntegrityPolicy):
            steps.append(("batch_integrity", integrity.check_batches))
        if "message_format" in policies:
            steps.append(("message_format", whole(policies["message_format"])))
        if isinstance(integrity, BatchIntegrityPolicy):
            steps.append(("batch_integrity", integrity.check_count))
            records.append(
                (
                    "batch_integrity",
                    error_codes.INVALID_RECORD,
                    INVALID_RECORD_REJECTION,
                    integrity.record_errors,
                )
            )
        key = policies.get("compacted_key")
        if isinstance(key, CompactedKeyPolicy):
            records.append(
                ("compacted_key", error_codes.INVALID_RECORD, MISSING_KEY, key.record_errors)
            )
        timestamps = policies.get("timestamps")
        if isinstance(timestamps, TimestampsPolicy):
            records.append(
                ("timestamps", error_codes.INVALID_TIMESTAMP, None, timestamps.record_errors)
            )
        if isinstance(integrity, BatchIntegrityPolicy):
            after.append(("batch_integrity", integrity.check_append))
        if "producer_state" in policies:
            after.append(("producer_state", whole(policies["producer_state"])))
        self._steps = tuple(steps)
        self._records = tuple(records)
        self._after = tuple(after)

    def configure(self, config: Mapping[str, Any]) -> None:
        """The grouped policies were configured one by one."""

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        name = ""  # the stage running: an exception leaves as `PolicyFailed` naming its policy
        try:
            for name, step in self._steps:
                verdict = step(batch)
                if verdict.code:
                    return verdict.with_policy(name)
            found: list[tuple[str, int, str | None, RecordErrorList]] = []
            for name, code, rejection, check in self._records:
                errors = check(batch)
                if errors:
                    found.append((name, code, rejection, errors))
            if found:
                return merge_record_errors(found)
            for name, step in self._after:
                verdict = step(batch)
                if verdict.code:
                    return verdict.with_policy(name)
        except ResourceLimit:
            raise  # not the policy's failure: the chain's caller answers it
        except Exception as exc:
            raise PolicyFailed(name, exc) from exc
        return ACCEPT

    def close(self) -> None:
        """The chain closes the grouped policies themselves."""


def merge_record_errors(found: Sequence[tuple[str, int, str | None, RecordErrorList]]) -> Verdict:
    """One verdict from the record errors of several checks (given in Kafka's precedence).

    Each record keeps its first error, as LogValidator.validateRecord stops at a record's first
    failing check; the errors are listed by record index. Any timestamp error makes the code
    INVALID_TIMESTAMP (LogValidator.processRecordErrors), else INVALID_RECORD. Past
    MAX_RECORD_ERRORS kept errors per check, the total counted is the largest check's.
    """
    if len(found) == 1:
        name, code, rejection, errors = found[0]
        return record_errors_verdict(errors, code=code, rejection=rejection, policy=name)
    first: dict[int, tuple[RecordError, str, int, str | None]] = {}
    for name, code, rejection, errors in found:
        for error in errors:
            if error.index not in first:
                named = RecordError(error.index, error.message, name)
                first[error.index] = (named, name, code, rejection)
    entries = [first[index] for index in sorted(first)]
    merged = RecordErrorList()
    for error, _, _, _ in entries:
        merged.append(error)
    merged.total = max(len(first), *(errors.total for _, _, _, errors in found))
    timestamp = next((e for e in entries if e[2] == error_codes.INVALID_TIMESTAMP), None)
    if timestamp is not None:
        return record_errors_verdict(
            merged, code=error_codes.INVALID_TIMESTAMP, rejection=None, policy=timestamp[1]
        )
    rejections = {entry[3] for entry in entries}
    rejection = MISSING_KEY if rejections == {MISSING_KEY} else INVALID_RECORD_REJECTION
    return record_errors_verdict(
        merged, code=error_codes.INVALID_RECORD, rejection=rejection, policy=entries[0][1]
    )
