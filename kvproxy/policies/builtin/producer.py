"""`producer_state`: epoch regressions and sequence gaps, against what the broker acknowledged."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvproxy.policies.api import ACCEPT, Need, ProducedRecords, Stage, Verdict
from kvproxy.policies.builtin.base import BuiltinPolicy
from kvproxy.policies.builtin.broker import BROKER_CHECKS
from kvproxy.policies.producer_state import ProducerStateTracker, next_sequence
from kvproxy.protocol import error_codes

__all__ = ["ProducerStatePolicy"]


class ProducerStatePolicy(BuiltinPolicy):
    """ProducerStateManager's checks (`checkProducerEpoch`, `checkSequence`), Kafka's wording.

    The tracker is the routing's shared one, fed by `observe` with the batches the broker
    accepted; `max_producers` bounds it (the largest value any entry sets explicitly; 100,000
    when none does).
    """

    name = "producer_state"
    OPTIONS = {"max_producers": 100_000}
    needs = frozenset({Need.PRODUCER_STATE, Need.BROKER_ANSWER})
    group = BROKER_CHECKS
    stages = (Stage(100),)

    def setup(self) -> None:
        self.max_producers = self._int_option("max_producers", minimum=1)

    @property
    def tracker(self) -> ProducerStateTracker:
        tracker = self.context.producer_state
        if tracker is None:
            tracker = self.context.producer_state = ProducerStateTracker(self.max_producers)
        return tracker

    def configure(self, config: Mapping[str, Any]) -> None:
        super().configure(config)
        tracker = self.tracker
        if "max_producers" in config:
            # the largest explicit value of any entry bounds the shared tracker
            if tracker.bound_set:
                tracker.max_producers = max(tracker.max_producers, self.max_producers)
            else:
                tracker.max_producers = self.max_producers
            tracker.bound_set = True

    def wants_answer(self, produced: ProducedRecords) -> bool:
        """Only an idempotent producer's batches change the tracker: a plain producer's
        answers are not decoded for it."""
        return any(b.producer_id >= 0 for b in produced.batches)

    def observe(
        self, topic: str, partition: int, produced: ProducedRecords, error_code: int
    ) -> None:
        """Learn the idempotent batches of a partition the broker accepted."""
        if error_code:
            return
        tracker = self.tracker
        for batch in produced.batches:
            tracker.record_batch_success(topic, partition, batch)

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        for b in batch.batches:
            if b.magic < 2 or b.producer_id < 0:
                continue
            entry = self.tracker.get(topic, partition, b.producer_id)
            if entry is None:
                continue
            tp = batch.topic_partition
            first = b.base_sequence
            if b.producer_epoch < entry.epoch:
                return Verdict(
                    error_codes.INVALID_PRODUCER_EPOCH,
                    f"Epoch of producer {b.producer_id} at offset {b.base_offset} in {tp} is "
                    f"{b.producer_epoch}, which is smaller than the last seen epoch {entry.epoch}",
                )
            if b.producer_epoch > entry.epoch:
                if first != 0:
                    # sic: Kafka's message has no space before "at offset"
                    return Verdict(
                        error_codes.OUT_OF_ORDER_SEQUENCE_NUMBER,
                        f"Invalid sequence number for new epoch of producer {b.producer_id}"
                        f"at offset {b.base_offset} in partition {tp}: {b.producer_epoch} "
                        f"(request epoch), {first} (seq. number), {entry.epoch} "
                        "(current producer epoch)",
                    )
                continue
            last = (first + b.last_offset_delta) % 2**31
            if (first, last) in entry.batches:
                continue  # a retry of an acknowledged batch: the broker answers it as duplicate
            if first != next_sequence(entry.last_sequence):
                return Verdict(
                    error_codes.OUT_OF_ORDER_SEQUENCE_NUMBER,
                    f"Out of order sequence number for producer {b.producer_id} at offset "
                    f"{b.base_offset} in partition {tp}: {first} (incoming seq. number), "
                    f"{entry.last_sequence} (current end sequence number)",
                )
        return ACCEPT
