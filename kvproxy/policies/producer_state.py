"""Producer epochs and sequences per partition, learned only from the broker's successful answers.

The `producer_state` policy observes the broker's answers and calls `record_batch_success` for
every partition the broker accepted (from the batch the proxy forwarded: producer id, epoch,
first and last sequence). It then refuses
what the broker would refuse for the same producer (UnifiedLog / ProducerStateManager):
an epoch older than the last one acknowledged -> INVALID_PRODUCER_EPOCH (47), a first sequence
that does not follow the last acknowledged one -> OUT_OF_ORDER_SEQUENCE_NUMBER (45). A retry of
one of the last 5 acknowledged batches passes and changes nothing (the broker answers it as a
duplicate, with success), and so does anything
for a (partition, producer) the tracker knows nothing about. Memory is bounded: an LRU of
`max_producers` (topic, partition, producer id) entries, of topic names no longer than a Kafka
topic's (a broker that accepted a longer name is not tracked for it).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from kvproxy.protocol.records import RecordBatch
from kvproxy.protocol.topics import MAX_TOPIC_NAME_CHARS

__all__ = ["ProducerEntry", "ProducerStateTracker"]

_INT32_MAX = 2**31 - 1


NUM_BATCHES_TO_RETAIN = 5
"""Kafka's ProducerStateEntry keeps the last 5 batches' metadata to recognise retries."""


@dataclass(frozen=True, slots=True)
class ProducerEntry:
    epoch: int
    batches: tuple[tuple[int, int], ...]
    """(first, last) sequence of up to the last 5 acknowledged batches of `epoch`, oldest first."""

    @property
    def last_sequence(self) -> int:
        return self.batches[-1][1]


def next_sequence(sequence: int) -> int:
    """Kafka's sequences wrap from Int.MAX_VALUE to 0."""
    return 0 if sequence == _INT32_MAX else sequence + 1


class ProducerStateTracker:
    """(topic, partition, producer id) -> the last acknowledged (epoch, first, last sequence)."""

    def __init__(self, max_producers: int = 100_000) -> None:
        if max_producers < 1:
            raise ValueError("max_producers must be at least 1")
        self.max_producers = max_producers
        self.bound_set = False
        """Whether a config entry set `max_producers` explicitly (see ProducerStatePolicy)."""
        self._entries: OrderedDict[tuple[str, int, int], ProducerEntry] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def record_success(  # noqa: PLR0917 - one argument per field it keeps
        self,
        topic: str,
        partition: int,
        producer_id: int,
        epoch: int,
        base_sequence: int,
        last_sequence: int,
    ) -> None:
        """The broker accepted this batch; remember it (a producer id < 0 is ignored)."""
        if producer_id < 0 or base_sequence < 0 or len(topic) > MAX_TOPIC_NAME_CHARS:
            return
        key = (topic, partition, producer_id)
        with self._lock:
            current = self._entries.get(key)
            if current is not None and epoch < current.epoch:
                return  # an answer overtaken by a newer epoch's: keep the newer
            if current is not None and epoch == current.epoch:
                pair = (base_sequence, last_sequence)
                if pair in current.batches:
                    # a retry the broker answered as a duplicate: its state stays as it was
                    # (UnifiedLogTest.testDuplicateAppends), the last batch stays the last
                    self._entries.move_to_end(key)
                    return
                batches = (*current.batches, pair)[-NUM_BATCHES_TO_RETAIN:]
            else:
                batches = ((base_sequence, last_sequence),)
            self._entries[key] = ProducerEntry(epoch, batches)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_producers:
                self._entries.popitem(last=False)

    def record_batch_success(self, topic: str, partition: int, batch: RecordBatch) -> None:
        """`record_success` for a forwarded magic 2 batch the broker accepted."""
        if batch.magic < 2 or batch.producer_id < 0:
            return
        last = (batch.base_sequence + batch.last_offset_delta) % (_INT32_MAX + 1)
        self.record_success(
            topic, partition, batch.producer_id, batch.producer_epoch, batch.base_sequence, last
        )

    def get(self, topic: str, partition: int, producer_id: int) -> ProducerEntry | None:
        key = (topic, partition, producer_id)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry
