"""`ResilientProducer`: an AIOKafkaProducer whose failures say what they are, and that resends the
good records of a batch the broker (or kvproxy) refused because of others (KIP-467's client side).

```python
async with ResilientProducer(bootstrap_servers="kvproxy:9192", idempotence="requested") as p:
    futures = [await p.send("orders", value, key=key) for key, value in rows]
    for future in futures:
        try:
            metadata = await future
        except ProduceFailedError as failure:
            if failure.failure_type is FailureType.MESSAGE_REJECTED:
                park(failure.message)   # this record was refused; the others were written
            else:
                raise
```
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from aiokafka import AIOKafkaProducer
from aiokafka.structs import RecordMetadata, TopicPartition

from kvproxy.producer._record_errors import BatchRejected, install
from kvproxy.producer.compat import enable_transactions
from kvproxy.producer.errors import (
    FailureType,
    IdempotenceUnavailableError,
    ProduceFailedError,
    error_code,
    failure_type,
)
from kvproxy.protocol.error_codes import UNSUPPORTED_FOR_MESSAGE_FORMAT, ErrorProfile

__all__ = ["Idempotence", "ResilientProducer"]

log = logging.getLogger("kvproxy.producer")

Idempotence = Literal["off", "requested", "required"]
Header = tuple[str, bytes]


@dataclass(frozen=True, slots=True)
class _Resend:
    """A record to send again (and, when set, why idempotence must go first)."""

    record: _Record
    outcome: asyncio.Future[RecordMetadata]
    resends: int
    without_idempotence: str | None = None


@dataclass(frozen=True, slots=True)
class _Record:
    """What `send` was given, kept to send it again."""

    topic: str
    value: bytes | None
    key: bytes | None
    partition: int | None
    timestamp_ms: int | None
    headers: Sequence[Header] | None


def _mode(idempotence: Idempotence | bool) -> Idempotence:
    if idempotence is True:
        return "required"
    if idempotence is False:
        return "off"
    if idempotence not in ("off", "requested", "required"):
        raise ValueError(
            'idempotence must be "off", "requested", "required", True or False, '
            f"not {idempotence!r}"
        )
    return idempotence


def _refused_with_batch(
    exc: BatchRejected, sent: asyncio.Future[RecordMetadata], *, transactional: bool
) -> ProduceFailedError | None:
    """How a record of a refused batch fails for good: refused itself (its own record error),
    or fallen with its transaction; None when it may be sent again."""
    index = exc.positions.get(id(sent))
    if index is not None and index in exc.record_errors:
        return ProduceFailedError(exc, FailureType.MESSAGE_REJECTED, exc.record_errors[index])
    if exc.record_errors and transactional:
        # The transaction must abort (producer.transactions does it): resending the other
        # records into it would only be undone.
        return ProduceFailedError(
            exc,
            FailureType.TRANSACTION_FAILED,
            "not written: another record of its batch was refused, so the transaction must be "
            "aborted",
        )
    return None


class ResilientProducer:
    """An AIOKafkaProducer (same constructor arguments) with per-record outcomes.

    - `send()` returns one future per record: its `RecordMetadata`, or `ProduceFailedError` whose
      `failure_type` says whether the record was refused (MESSAGE_REJECTED), could not be
      delivered (DELIVERY_FAILED) or fell with its transaction (TRANSACTION_FAILED).
    - When a partition is refused with per-record errors (Produce v8+ `record_errors`, as the
      broker and kvproxy send them), only the named records fail, each with its own message; the
      other records of that batch are sent again in a new batch, in their original order, to the
      partition they were bound for. Each record is resent at most `max_resends` times.
      A refusal without record errors fails the whole batch. Retriable errors are retried by
      aiokafka as usual (`retry_backoff_ms`, `request_timeout_ms`).
    - `idempotence`: "off" (or False), "requested" (idempotent when the broker and topic can do
      it; when InitProducerId fails at start, or a topic answers UNSUPPORTED_FOR_MESSAGE_FORMAT,
      produce without it from then on and log why), "required" (or True: raise
      `IdempotenceUnavailableError` at `start()`, or fail the send that finds out with it).
    - `error_profile`: which numbers mean a refused record (`kip`: 45 and 85 as well as 87).
    - With `transactional_id`, the records of a refused batch are not resent (the transaction
      has to abort: use `kvproxy.producer.transactions.run_transaction`); they fail with
      TRANSACTION_FAILED, the refused ones with MESSAGE_REJECTED.
    """

    def __init__(
        self,
        *,
        idempotence: Idempotence | bool = "off",
        max_resends: int = 3,
        error_profile: ErrorProfile | str = ErrorProfile.KAFKA,
        **producer_args: Any,
    ) -> None:
        if "enable_idempotence" in producer_args:
            raise TypeError(
                "use idempotence='off' | 'requested' | 'required', not enable_idempotence"
            )
        if max_resends < 0:
            raise ValueError("max_resends must be >= 0")
        self.idempotence = _mode(idempotence)
        self.max_resends = max_resends
        self.error_profile = ErrorProfile(error_profile)
        self._args = producer_args
        self._idempotent = self.idempotence != "off"
        self._producer = self._new_producer()
        self._resend_queue: asyncio.Queue[_Resend]
        self._resender: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Future[RecordMetadata]] = set()
        self._retired: set[asyncio.Task[None]] = set()

    def _new_producer(self) -> AIOKafkaProducer:
        producer = AIOKafkaProducer(enable_idempotence=self._idempotent, **self._args)
        install(producer)
        if self.transactional:
            enable_transactions(producer)  # InitProducerId v3: what Tansu and KIP-360 need
        return producer

    @property
    def transactional(self) -> bool:
        return self._args.get("transactional_id") is not None

    @property
    def producer(self) -> AIOKafkaProducer:
        """The AIOKafkaProducer underneath (for what this class does not wrap)."""
        return self._producer

    @property
    def idempotent(self) -> bool:
        """Whether records are being sent with idempotence (known once started)."""
        return self._idempotent

    async def start(self) -> None:
        try:
            await self._producer.start()
        except Exception as exc:
            if not self._idempotent:
                raise
            await self._give_up_idempotence(exc)
        self._resend_queue = asyncio.Queue()
        self._resender = asyncio.get_running_loop().create_task(self._resend_loop())

    async def _give_up_idempotence(self, exc: BaseException) -> None:
        """`requested`: carry on without idempotence; `required`: say why it cannot be had."""
        reason = f"{type(exc).__name__}: {exc}"
        await self._producer.stop()
        if self.idempotence == "required":
            raise IdempotenceUnavailableError(
                "idempotence is required but the cluster did not grant it "
                f"(InitProducerId failed with {reason})"
            ) from exc
        log.warning(
            "idempotence was requested but the cluster cannot provide it (%s): "
            "producing without idempotence",
            reason,
        )
        self._idempotent = False
        self._producer = self._new_producer()
        await self._producer.start()

    async def stop(self) -> None:
        """Wait for the records in flight (and their resends), then close."""
        await self.flush()
        if self._resender is not None:
            self._resender.cancel()
            self._resender = None
        if self._retired:
            await asyncio.wait(set(self._retired))
        await self._producer.stop()

    async def flush(self) -> None:
        """Wait until every record sent so far has its outcome."""
        while self._pending:
            await self._producer.flush()
            await asyncio.wait(set(self._pending))

    async def __aenter__(self) -> ResilientProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def send(  # noqa: PLR0917  (AIOKafkaProducer.send's signature)
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Sequence[Header] | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue one record; the future resolves to its metadata or raises ProduceFailedError."""
        record = _Record(topic, value, key, partition, timestamp_ms, headers)
        outcome: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        self._pending.add(outcome)
        outcome.add_done_callback(self._pending.discard)
        await self._submit(record, outcome, 0)
        return outcome

    async def send_and_wait(  # noqa: PLR0917  (AIOKafkaProducer's signature)
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Sequence[Header] | None = None,
    ) -> RecordMetadata:
        future = await self.send(topic, value, key, partition, timestamp_ms, headers)
        return await future

    async def _submit(
        self, record: _Record, outcome: asyncio.Future[RecordMetadata], resends: int
    ) -> None:
        try:
            sent = await self._producer.send(
                record.topic,
                record.value,
                record.key,
                partition=record.partition,
                timestamp_ms=record.timestamp_ms,
                headers=list(record.headers) if record.headers is not None else None,
            )
        except Exception as exc:
            outcome.set_exception(self._failure(exc))
            return
        sent.add_done_callback(lambda done: self._settle(done, record, outcome, resends))

    def _failure(self, exc: BaseException, message: str | None = None) -> ProduceFailedError:
        kind = failure_type(exc, profile=self.error_profile)
        return ProduceFailedError(exc, kind, message if message is not None else str(exc) or None)

    def _settle(
        self,
        done: asyncio.Future[RecordMetadata],
        record: _Record,
        outcome: asyncio.Future[RecordMetadata],
        resends: int,
    ) -> None:
        if outcome.done():
            return
        if done.cancelled():
            outcome.cancel()
            return
        exc = done.exception()
        if exc is None:
            outcome.set_result(done.result())
            return
        if isinstance(exc, BatchRejected):
            failure = _refused_with_batch(exc, done, transactional=self.transactional)
            if failure is not None:
                outcome.set_exception(failure)
                return
            if exc.record_errors and resends < self.max_resends:
                # pinned to the partition it was first sent to, so its order holds there
                bound = replace(record, partition=exc.tp.partition)
                self._resend_queue.put_nowait(_Resend(bound, outcome, resends + 1))
                return
        if error_code(exc) == UNSUPPORTED_FOR_MESSAGE_FORMAT and self._idempotent:
            # The topic's message format cannot carry producer ids (magic < 2).
            reason = f"topic {record.topic} cannot store producer ids ({exc})"
            if self.idempotence == "required":
                cause = IdempotenceUnavailableError(f"idempotence is required but {reason}")
                outcome.set_exception(ProduceFailedError(cause, FailureType.DELIVERY_FAILED))
                return
            if resends < self.max_resends:
                self._resend_queue.put_nowait(_Resend(record, outcome, resends + 1, reason))
                return
        outcome.set_exception(self._failure(exc))

    async def _resend_loop(self) -> None:
        """Resend in the order records failed (their batch order), one at a time."""
        while True:
            item = await self._resend_queue.get()
            if item.without_idempotence is not None and self._idempotent:
                await self._drop_idempotence(item.without_idempotence)
            await self._submit(item.record, item.outcome, item.resends)

    async def _drop_idempotence(self, reason: str) -> None:
        """`requested`: go on with a producer without idempotence; the old one finishes what it
        has in flight and closes."""
        log.warning(
            "idempotence was requested but %s: producing without idempotence from now on", reason
        )
        old = self._producer
        self._idempotent = False
        self._producer = self._new_producer()
        await self._producer.start()
        task = asyncio.get_running_loop().create_task(old.stop())
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)

    # transactions: the AIOKafkaProducer methods, for producer.transactions' helper

    async def begin_transaction(self) -> None:
        await self._producer.begin_transaction()

    async def commit_transaction(self) -> None:
        await self.flush()
        await self._producer.commit_transaction()

    async def abort_transaction(self) -> None:
        await self._producer.abort_transaction()

    async def send_offsets_to_transaction(
        self, offsets: dict[TopicPartition, int], group_id: str
    ) -> None:
        await self._producer.send_offsets_to_transaction(offsets, group_id)
