"""The transaction template: begin, send, send offsets, then commit or abort.

`run_transaction(producer, body)` runs one transaction and sorts every error into one of two
outcomes, so the caller has exactly two cases to handle:

- `CommitFailedError` (its `cause` is the error): the transaction hit an abortable error (a
  refused record, a send the producer gave up on, a failed offset commit, ...) and WAS ABORTED.
  The producer is fine: run the transaction again (with the refused records fixed or left out).
- anything else: either the body's own exception (the transaction was aborted and the exception
  is raised as it was; the producer is fine), or a fatal error (fenced, not authorized,
  unsupported version, the producer's state is broken): the transaction could not even be
  aborted and the producer must be closed.

```python
producer = AIOKafkaProducer(bootstrap_servers="kvproxy:9192", transactional_id="orders-1")
enable_transactions(producer)  # producer.compat: InitProducerId v3 (Tansu), exact error codes
await producer.start()

async def copy_batch(txn: Transaction) -> int:
    for message in messages:
        await txn.send("orders-clean", message.value, key=message.key)
    txn.send_offsets({TopicPartition("orders", 0): messages[-1].offset + 1}, "cleaner")
    return len(messages)

try:
    copied = await run_transaction(producer, copy_batch)
except CommitFailedError as failure:
    log.warning("transaction aborted: %s", failure.cause)  # fix the input, then run it again
except Exception:
    await producer.stop()  # fatal: this producer cannot go on
    raise
```

Works with a plain `AIOKafkaProducer(transactional_id=...)` and with anything offering the same
transaction methods (`ResilientProducer`). aiokafka does not fail the transaction itself when a
batch is refused: committing would commit the records that did get through. Here every send
made through the `Transaction` is awaited before the commit, and one failed send aborts.

After an abort caused by a failed send, the producer's epoch is renewed
(`kvproxy.producer.compat.renew_epoch`): aiokafka had numbered the refused batch, the broker never
stored it, and without a new epoch every later batch on that partition would be refused as
OUT_OF_ORDER_SEQUENCE_NUMBER.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NoReturn, Protocol, TypeVar

from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata, RecordMetadata, TopicPartition

from kvproxy.producer.compat import aiokafka_producer, fatal_error, renew_epoch
from kvproxy.producer.errors import (
    Classification,
    CommitFailedError,
    ProduceFailedError,
    classify,
    error_code,
)

__all__ = ["Transaction", "TransactionOver", "TransactionalProducer", "run_transaction"]

T = TypeVar("T")
Header = tuple[str, bytes]


class TransactionalProducer(Protocol):
    """What `run_transaction` needs: AIOKafkaProducer's transaction methods and `send`."""

    async def begin_transaction(self) -> None: ...

    async def commit_transaction(self) -> None: ...

    async def abort_transaction(self) -> None: ...

    async def send_offsets_to_transaction(self, offsets: Any, group_id: str) -> None: ...

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        *,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Sequence[Header] | None = None,
    ) -> asyncio.Future[RecordMetadata]: ...


class TransactionOver(RuntimeError):
    """`Transaction.send` or `send_offsets` after `run_transaction` finished with it."""


class Transaction:
    """What the body of `run_transaction` gets: sends that count, offsets to commit."""

    def __init__(self, producer: TransactionalProducer) -> None:
        self._producer = producer
        self._futures: list[asyncio.Future[RecordMetadata]] = []
        self._offsets: dict[TopicPartition, int | OffsetAndMetadata] = {}
        self._group_id: str | None = None
        self._over = False

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        *,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Sequence[Header] | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """`producer.send`; the record's future is also awaited before the commit.

        The body may await the future itself (and catch its error): a failed send aborts the
        transaction all the same.
        """
        if self._over:
            raise TransactionOver("this transaction is over; send in a new one")
        future = await self._producer.send(
            topic,
            value,
            key,
            partition=partition,
            timestamp_ms=timestamp_ms,
            headers=list(headers) if headers is not None else None,
        )
        self._futures.append(future)
        return future

    def send_offsets(
        self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata], group_id: str
    ) -> None:
        """Commit these consumer offsets with the transaction (sent once every send succeeded).

        An offset is the next one to consume (last processed + 1), as in a consumer commit.
        Calls add up; a later offset for a partition replaces an earlier one. One consumer
        group per transaction (aiokafka adds only the first group to a transaction).
        """
        if self._over:
            raise TransactionOver("this transaction is over; send offsets in a new one")
        if self._group_id is not None and group_id != self._group_id:
            raise ValueError(
                f"one consumer group per transaction: {self._group_id!r} already, "
                f"not {group_id!r} too"
            )
        self._group_id = group_id
        self._offsets.update(offsets)

    @property
    def sends(self) -> int:
        """How many records were sent in this transaction so far."""
        return len(self._futures)

    async def _failed_sends(self) -> list[BaseException]:
        """Wait for every send; the errors of those that failed, in send order."""
        if self._futures:
            await asyncio.wait(self._futures)
        return self._failures_so_far()

    def _failures_so_far(self) -> list[BaseException]:
        """The errors of the sends that failed already, in send order."""
        return [error for future in self._futures if (error := _error_of(future)) is not None]

    def _sent_error(self, error: BaseException) -> bool:
        """Whether `error` is the very error one of the sends failed with."""
        return any(_error_of(future) is error for future in self._futures)


def _error_of(future: asyncio.Future[Any]) -> BaseException | None:
    if not future.done() or future.cancelled():
        return None
    return future.exception()


def _is_kafka_error(error: BaseException) -> bool:
    return isinstance(error, KafkaError | ProduceFailedError) or error_code(error) is not None


def _broken(producer: TransactionalProducer) -> BaseException | None:
    """What broke the producer underneath (a dead aiokafka sender, a fatal state), else None."""
    inner = aiokafka_producer(producer)
    return fatal_error(inner) if inner is not None else None


def _first_fatal(errors: Sequence[BaseException]) -> BaseException | None:
    return next((e for e in errors if classify(e) is Classification.FATAL), None)


async def _abort(producer: TransactionalProducer, txn: Transaction) -> None:
    """Abort (when the producer can); renew the epoch when a send had failed.

    Raises what broke the producer, or what the abort or the renewal raised (all fatal).
    """
    broken = _broken(producer)
    if broken is not None:
        raise broken
    await producer.abort_transaction()
    if await txn._failed_sends():
        inner = aiokafka_producer(producer)
        if inner is not None:
            await renew_epoch(inner)


async def _give_up(producer: TransactionalProducer, txn: Transaction, error: Exception) -> NoReturn:
    """Raise `error` if it is fatal; else abort and raise CommitFailedError."""
    fatal = _first_fatal([error, *txn._failures_so_far()])
    if fatal is not None:
        raise fatal
    await _abort(producer, txn)
    failed = await txn._failed_sends()  # after the abort, every send is done
    fatal = _first_fatal(failed)
    if fatal is not None:
        raise fatal
    cause = failed[0] if failed else error
    raise CommitFailedError(cause) from cause


async def run_transaction(
    producer: TransactionalProducer, body: Callable[[Transaction], Awaitable[T]]
) -> T:
    """Run `body` in one transaction of `producer` and commit it; returns what `body` returned.

    1. `producer.begin_transaction()`; errors here are raised as they are.
    2. `await body(txn)`: the body sends with `txn.send` and may call `txn.send_offsets`.
    3. Every send is awaited; then the offsets are sent (`send_offsets_to_transaction`) and the
       transaction is committed.

    Outcomes:

    - an abortable error in steps 2-3 (`classify` says ABORTABLE, or RETRIABLE: the producer
      gave up retrying it): the transaction is aborted and `CommitFailedError(cause)` raised.
      `cause` is the first failed send's error when a send failed, else the error met.
    - a fatal error (`classify` says FATAL, or the producer underneath is broken): raised as it
      is, without an abort (none is possible). Close the producer.
    - the body raises an exception of its own (neither a Kafka error nor a failed send's error),
      or the call is cancelled before the commit was asked for: the transaction is aborted and
      the exception raised unchanged.
    - the abort itself fails, or the producer underneath turns out broken when it is time to
      abort: that error is raised (the first one is its `__context__`); it is fatal.

    aiokafka retries a transactional batch's retriable errors without a time limit, and the
    commit waits for them: bound the call with `asyncio.timeout` if that matters. Once the
    commit was asked for, a cancellation is raised as it is and aiokafka finishes the commit (it
    shields it).
    """
    await producer.begin_transaction()
    txn = Transaction(producer)
    try:
        result = await body(txn)
    except BaseException as error:
        txn._over = True
        if isinstance(error, Exception) and (_is_kafka_error(error) or txn._sent_error(error)):
            await _give_up(producer, txn, error)
        await _abort(producer, txn)
        raise
    txn._over = True
    committing = False
    try:
        failed = await txn._failed_sends()
        if failed:
            raise failed[0]
        if txn._offsets:
            assert txn._group_id is not None
            await producer.send_offsets_to_transaction(dict(txn._offsets), txn._group_id)
        committing = True
        await producer.commit_transaction()
    except Exception as error:
        await _give_up(producer, txn, error)
    except BaseException:  # cancelled
        if not committing:
            await _abort(producer, txn)
        raise
    return result
