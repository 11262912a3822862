"""aiokafka, taught to read Produce v8's `record_errors` (KIP-467), for one producer at a time.

aiokafka 0.14 defines ProduceRequest/Response v8 but negotiates at most v7, and its response
handler drops `record_errors` and `error_message`. Here one producer's sender is given a request
class that may go up to v8 and a handler that turns a partition refused with record errors into
`BatchRejected` (which records failed, with their messages, and every record's position in the
batch) and puts the broker's `error_message` on any other non-retriable failure. Nothing is
patched globally: other AIOKafkaProducers in the process are untouched. These are aiokafka
internals; `pyproject.toml` pins the aiokafka versions this is tested with.
"""

from __future__ import annotations

import types
from typing import Any

import aiokafka.errors as aiokafka_errors
from aiokafka import AIOKafkaProducer
from aiokafka.protocol.produce import ProduceRequest, ProduceRequest_v8
from aiokafka.structs import TopicPartition

from kvproxy.producer.compat import KeepCodesHandler, use_produce_handler

__all__ = ["BatchRejected", "install"]

_V8 = 8
_FENCING = (aiokafka_errors.InvalidProducerEpoch, aiokafka_errors.TopicAuthorizationFailedError)


class BatchRejected(Exception):
    """A partition's batch refused for good (non-retriable), with the broker's code and message
    and, when it named them, the records at fault (Produce v8+ `record_errors`)."""

    def __init__(
        self,
        code: int,
        message: str | None,
        record_errors: dict[int, str],
        tp: TopicPartition,
        positions: dict[int, int],
    ) -> None:
        super().__init__(message or f"batch rejected with error code {code}")
        self.code = code
        self.errno = code  # read like aiokafka's broker errors
        self.message = message
        self.record_errors = record_errors
        """batch index -> the broker's message for that record; empty: the whole batch failed."""
        self.tp = tp
        self.positions = positions
        """id(record future) -> its index in the batch."""

    def __reduce__(self) -> tuple[Any, ...]:
        # aiokafka hands every record of a failed batch its own copy.copy of the exception
        return (
            type(self),
            (self.code, self.message, self.record_errors, self.tp, self.positions),
        )


class _ProduceRequestUpToV8(ProduceRequest):  # type: ignore[misc]
    """aiokafka's ProduceRequest, allowed to negotiate v8."""


_ProduceRequestUpToV8._CLASSES = (*ProduceRequest._CLASSES, ProduceRequest_v8)


class _RecordErrorsHandler(KeepCodesHandler):
    """compat's handler (codes aiokafka does not know keep their number), plus v8's record
    errors and messages."""

    def create_request(self) -> Any:
        request = super().create_request()
        return _ProduceRequestUpToV8(
            transactional_id=request._transactional_id,
            required_acks=request.required_acks,
            timeout=request._timeout,
            topics=request._topics,
        )

    def handle_response(self, response: Any) -> None:
        if response.API_VERSION < _V8:
            super().handle_response(response)
            return
        remaining = []
        for topic, partitions in response.topics:
            kept = []
            for info in partitions:
                if not self._handled(topic, info):
                    kept.append(info)
            remaining.append((topic, kept))
        super().handle_response(
            types.SimpleNamespace(API_VERSION=response.API_VERSION, topics=remaining)
        )

    def _handled(self, topic: str, info: Any) -> bool:
        """Fail the batch here when the answer says more than aiokafka would keep."""
        partition, code, _, _, _, record_errors, message = info
        if code == 0:
            return False
        error = aiokafka_errors.for_code(code)
        if error.retriable or error in _FENCING:
            return False  # aiokafka's retries and fencing stay as they are
        batch = self._batches.get(TopicPartition(topic, partition))
        if batch is None:
            return False
        # aiokafka does not know every code (87 reads as UnknownError -1): keep the real one.
        positions = {id(future): meta.offset for future, meta in batch._msg_futures}
        errors = {int(index): str(text) for index, text in record_errors or ()}
        batch.failure(
            exception=BatchRejected(
                code, message, errors, TopicPartition(topic, partition), positions
            )
        )
        return True


def install(producer: AIOKafkaProducer) -> None:
    """Make this (not yet started) producer read record errors."""
    use_produce_handler(producer._sender, _RecordErrorsHandler)
