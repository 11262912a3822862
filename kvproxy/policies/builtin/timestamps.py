"""`timestamps`: LogValidator's timestamp checks, against the topic's settings or the options."""

from __future__ import annotations

from kvproxy.policies.accept_form import ANY_PARTITION, AcceptForm
from kvproxy.policies.api import (
    ACCEPT,
    Need,
    ProducedRecords,
    RecordError,
    RecordErrorList,
    Stage,
    TopicConfig,
    Verdict,
    record_errors_verdict,
)
from kvproxy.policies.builtin.base import BuiltinPolicy
from kvproxy.policies.builtin.broker import (
    _CREATE_TIME,
    _LOG_APPEND_TIME,
    BROKER_CHECKS,
    LONG_MAX,
    _iter_with_offsets,
    java_record,
)
from kvproxy.policies.errors import short_repr
from kvproxy.protocol import error_codes

__all__ = ["TimestampsPolicy"]


class TimestampsPolicy(BuiltinPolicy):
    """LogValidator.validateTimestamp: CreateTime records within [now - before, now + after].

    As in Kafka: records without a timestamp (-1, magic 0) are not range-checked; on a
    CreateTime topic a LogAppendTime batch is range-checked like any other (its records read
    the batch's time); on a LogAppendTime topic no range applies but a producer-set
    LogAppendTime batch is refused.

    The topic's own settings (`ProducedRecords.topic_config`: message.timestamp.type,
    message.timestamp.before.max.ms, message.timestamp.after.max.ms, learned from the cluster
    or set in YAML) apply where this policy's options are not set explicitly; the options'
    defaults are Kafka's.

    Every record is read (`RecordBatch.scan`): the batch header's max timestamp is the producer's
    claim, and a check that trusted it could be bypassed by a client that lies in it.
    """

    name = "timestamps"
    needs = frozenset({Need.TOPIC_CONFIG})
    topic_settings = frozenset(
        {"timestamp_type", "timestamp_before_max_ms", "timestamp_after_max_ms"}
    )
    setting_options = {
        "type": "timestamp_type",
        "before_max_ms": "timestamp_before_max_ms",
        "after_max_ms": "timestamp_after_max_ms",
    }
    """Options that, set in the YAML, stand for the topic's setting (which is then not read)."""
    group = BROKER_CHECKS
    stages = (Stage(80, "record_errors", error_codes.INVALID_TIMESTAMP),)
    OPTIONS = {"before_max_ms": LONG_MAX, "after_max_ms": 3_600_000, "type": _CREATE_TIME}

    def setup(self) -> None:
        self.before_max_ms = self._int_option("before_max_ms", minimum=0)
        self.after_max_ms = self._int_option("after_max_ms", minimum=0)
        kind = self.options["type"]
        if kind not in (_CREATE_TIME, _LOG_APPEND_TIME):
            raise self._error(
                f"option type must be CreateTime or LogAppendTime, not {short_repr(kind)}"
            )
        self.create_time = kind == _CREATE_TIME

    def settings(self, batch: ProducedRecords) -> tuple[bool, int, int]:
        """(CreateTime?, before max ms, after max ms) in force for `batch`'s topic."""
        return self.settings_of(batch.topic_config)

    def settings_of(self, config: TopicConfig) -> tuple[bool, int, int]:
        """(CreateTime?, before max ms, after max ms) on a topic with these settings."""
        explicit = self.explicit
        create_time = self.create_time
        if "type" not in explicit and config.timestamp_type is not None:
            create_time = config.timestamp_type != _LOG_APPEND_TIME
        before = self.before_max_ms
        if "before_max_ms" not in explicit and config.timestamp_before_max_ms is not None:
            before = config.timestamp_before_max_ms
        after = self.after_max_ms
        if "after_max_ms" not in explicit and config.timestamp_after_max_ms is not None:
            after = config.timestamp_after_max_ms
        return create_time, before, after

    def accept_form(self, config: TopicConfig) -> AcceptForm | None:
        """CreateTime: every record within the window; LogAppendTime: nothing more (the fast
        accept takes CreateTime batches only)."""
        create_time, before, after = self.settings_of(config)
        if not create_time:
            return ANY_PARTITION
        if before < 0 or after < 0:
            return None
        return AcceptForm(timestamp_window=(before, after))

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        errors = self.record_errors(batch)
        if not errors:
            return ACCEPT
        return record_errors_verdict(errors, code=error_codes.INVALID_TIMESTAMP)

    def record_errors(self, batch: ProducedRecords) -> RecordErrorList | None:
        """The records with a timestamp the topic refuses (INVALID_TIMESTAMP); None if none."""
        create_time, before_max_ms, after_max_ms = self.settings(batch)
        now = batch.now_ms
        low = now - before_max_ms
        high = now + after_max_ms
        # Fast path (the common, valid case): each batch's timestamp range from one scan of its
        # records; `Record`s are decoded only to word a rejection. A range that reaches outside
        # [low, high] may still be valid (-1 is not range-checked): the exact pass decides.
        if all(b.timestamp_type == 0 for b in batch.batches):
            if not create_time:
                return None  # LogAppendTime topic, no producer-set LogAppendTime
            in_range = True
            for b in batch.batches:
                scan = b.scan()
                if scan.record_count and (scan.min_timestamp < low or scan.max_timestamp > high):
                    in_range = False
                    break
            if in_range:
                return None
        errors = RecordErrorList()
        if create_time and all(b.magic == 2 and b.timestamp_type == 0 for b in batch.batches):
            # the common rejection, worded without building a `Record` per record
            start = 0
            for b in batch.batches:
                for index, (delta, ts) in enumerate(b.stamps()):
                    if ts != -1 and (now - ts > before_max_ms or ts - now > after_max_ms):
                        errors.append(
                            RecordError(
                                start + index,
                                f"Timestamp {ts} of message with offset {b.base_offset + delta} "
                                f"is out of range. The timestamp should be within [{low}, {high}]",
                            )
                        )
                start += max(b.record_count, 0)
            return errors or None
        for b, record, offset in _iter_with_offsets(batch):
            ts = record.timestamp
            if create_time and ts != -1:
                if now - ts > before_max_ms or ts - now > after_max_ms:
                    errors.append(
                        RecordError(
                            record.index,
                            f"Timestamp {ts} of message with offset {offset} is out of range. "
                            f"The timestamp should be within [{low}, {high}]",
                        )
                    )
            elif b.timestamp_type == 1:
                errors.append(
                    RecordError(
                        record.index,
                        f"Invalid timestamp type in message {java_record(b, record, offset)}. "
                        "Producer should not set timestamp type to LogAppendTime.",
                    )
                )
        return errors or None
