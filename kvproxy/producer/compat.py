"""aiokafka 0.14, made able to run transactions on brokers that only take InitProducerId v3+.

aiokafka asks for a producer id with InitProducerId v0 only. Tansu (the broker the project tests
against) answers v0 with UNKNOWN_SERVER_ERROR (-1) and handles v3+, so an aiokafka transactional
or idempotent producer cannot even start there. `enable_transactions(producer)` changes ONE
producer, before `start()`:

- its producer id comes from InitProducerId v3 when the broker offers v3 (v0 otherwise). v3 is a
  flexible version (compact string, tagged fields) and carries `producer_id` / `producer_epoch`,
  sent as -1 / -1: "give this transactional id a new epoch".
- a Produce answer with an error code aiokafka has no class for (INVALID_RECORD 87, and any other
  code newer than aiokafka's table) fails the batch with `BrokerError`, which keeps the code,
  its name and Kafka's retriable flag (aiokafka would raise a bare `UnknownError` (-1)). Codes
  Kafka marks retriable are retried like aiokafka's own retriable errors. A sender whose class
  already has its own Produce handling (as `ResilientProducer`'s does) keeps it.

`renew_epoch(producer)` gets a fresh epoch for the producer's transactional id (what a restarted
producer with the same id would get) and restarts its sequence numbers at 0. It is needed after a
transaction was aborted because a batch failed: aiokafka numbered that batch already, the broker
never stored it, and the broker (or kvproxy) would refuse every later batch on that partition with
OUT_OF_ORDER_SEQUENCE_NUMBER (45). Kafka's own client bumps the epoch with InitProducerId v3 and
its current producer id and epoch (KIP-360); Tansu answers that form with UNKNOWN_SERVER_ERROR,
while the form used here (-1 / -1) works on Tansu and on Kafka alike.

Nothing is patched globally: other AIOKafkaProducers in the process are untouched. This relies on
aiokafka internals (the sender, its handlers and the transaction manager); `pyproject.toml` pins
the aiokafka versions it is tested with.

```python
producer = AIOKafkaProducer(bootstrap_servers="kvproxy:9192", transactional_id="orders-1")
enable_transactions(producer)
await producer.start()
```
"""

from __future__ import annotations

import types
from typing import Any

import aiokafka.errors as aiokafka_errors
from aiokafka import AIOKafkaProducer
from aiokafka.client import CoordinationType
from aiokafka.errors import IllegalOperation
from aiokafka.producer.sender import InitPIDHandler, Sender, SendProduceReqHandler
from aiokafka.producer.transaction_manager import PidAndEpoch, TransactionState
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.transaction import InitProducerIdRequest_v0
from aiokafka.protocol.types import CompactString, Int16, Int32, Int64, Schema, TaggedFields
from aiokafka.structs import TopicPartition

from kvproxy.protocol.error_codes import ERRORS, UNKNOWN_SERVER_ERROR

__all__ = [
    "BrokerError",
    "InitProducerIdRequest",
    "aiokafka_producer",
    "enable_transactions",
    "fatal_error",
    "renew_epoch",
]

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1


# -- InitProducerId v3 -----------------------------------------------------------------------


class InitProducerIdResponseV3(Response):  # type: ignore[misc]
    API_KEY = 22
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("tags", TaggedFields),
    )


class InitProducerIdRequestV3(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 22
    API_VERSION = 3
    RESPONSE_TYPE = InitProducerIdResponseV3
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("transaction_timeout_ms", Int32),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("tags", TaggedFields),
    )


class InitProducerIdRequest(Request[InitProducerIdRequest_v0 | InitProducerIdRequestV3]):  # type: ignore[misc]
    """InitProducerId, v0 or v3: the highest of the two the broker offers."""

    API_KEY = 22

    def __init__(
        self,
        transactional_id: str | None,
        transaction_timeout_ms: int,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
    ) -> None:
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch

    def build(self, request_struct_class: type[Any]) -> Any:
        if request_struct_class.API_VERSION == 0:
            if self.producer_id != NO_PRODUCER_ID:
                raise aiokafka_errors.IncompatibleBrokerVersion(
                    "InitProducerId v0 cannot carry a producer id and epoch"
                )
            return request_struct_class(self.transactional_id, self.transaction_timeout_ms)
        return request_struct_class(
            self.transactional_id,
            self.transaction_timeout_ms,
            self.producer_id,
            self.producer_epoch,
            {},
        )


class _InitProducerIdHandler(InitPIDHandler):  # type: ignore[misc]
    """aiokafka's handler for the producer id asked at start, sending `InitProducerIdRequest`."""

    def create_request(self) -> InitProducerIdRequest:
        txn_manager = self._sender._txn_manager
        return InitProducerIdRequest(
            txn_manager.transactional_id, txn_manager.transaction_timeout_ms
        )


class _RenewEpochHandler(_InitProducerIdHandler):
    """The same request once the producer has an id: the answer replaces id and epoch."""

    def handle_response(self, resp: Any) -> float | None:
        if resp.error_code != 0:
            result: float | None = super().handle_response(resp)
            return result
        txn_manager = self._sender._txn_manager
        txn_manager._pid_and_epoch = PidAndEpoch(resp.producer_id, resp.producer_epoch)
        txn_manager._sequence_numbers.clear()
        return None


# -- Produce errors aiokafka has no class for ------------------------------------------------


class BrokerError(aiokafka_errors.BrokerResponseError):  # type: ignore[misc]
    """A broker error code aiokafka has no class for, e.g. INVALID_RECORD (87).

    `errno` is the code, `message` Kafka's name for it, `retriable` Kafka's flag; `tp` the
    partition whose batch failed, when there is one.
    """

    errno = UNKNOWN_SERVER_ERROR
    message = "UNKNOWN_SERVER_ERROR"

    def __init__(self, code: int, tp: TopicPartition | None = None) -> None:
        super().__init__(*([f"partition {tp.topic}-{tp.partition}"] if tp is not None else []))
        row = ERRORS.get(code)
        self.errno = code
        self.message = row.name if row is not None else f"UNKNOWN_CODE_{code}"
        self.retriable = row.retriable if row is not None else False
        self.tp = tp

    def __reduce__(self) -> tuple[Any, ...]:
        # aiokafka gives each record of a failed batch its own copy.copy of the error
        return (type(self), (self.errno, self.tp), self.__dict__)

    def __str__(self) -> str:
        where = f": {self.args[0]}" if self.args else ""
        return f"[Error {self.errno}] {self.message}{where}"


def _unknown_to_aiokafka(code: int) -> bool:
    return code != UNKNOWN_SERVER_ERROR and aiokafka_errors.for_code(code) is (
        aiokafka_errors.UnknownError
    )


class KeepCodesHandler(SendProduceReqHandler):  # type: ignore[misc]
    """aiokafka's Produce handler, except for codes aiokafka would turn into UnknownError."""

    def handle_response(self, response: Any) -> None:
        remaining = []
        for topic, partitions in response.topics:
            kept = []
            for info in partitions:
                partition, code = info[0], info[1]
                batch = self._batches.get(TopicPartition(topic, partition))
                if batch is None or not _unknown_to_aiokafka(code):
                    kept.append(info)
                    continue
                error = BrokerError(code, TopicPartition(topic, partition))
                if self._can_retry(error, batch):
                    self._to_reenqueue.append(batch)
                else:
                    batch.failure(exception=error)
            remaining.append((topic, kept))
        super().handle_response(
            types.SimpleNamespace(API_VERSION=response.API_VERSION, topics=remaining)
        )


def use_produce_handler(sender: Sender, handler: type[SendProduceReqHandler]) -> None:
    """Make this one sender answer Produce responses with `handler` (its own method, as
    Sender._send_produce_req, with only the handler class changed)."""

    async def send_produce_req(self: Any, node_id: int, batches: Any) -> None:
        await handler(self, batches).do(node_id)
        self._in_flight.remove(node_id)
        for tp in batches:
            self._muted_partitions.remove(tp)

    sender._send_produce_req = types.MethodType(send_produce_req, sender)


async def _do_init_pid(self: Any, node_id: int) -> bool:
    """Sender._do_init_pid with `_InitProducerIdHandler`."""
    done: bool = await _InitProducerIdHandler(self).do(node_id)
    return done


# -- the public functions --------------------------------------------------------------------


def enable_transactions(producer: AIOKafkaProducer) -> AIOKafkaProducer:
    """Give this (not yet started) producer InitProducerId v3 and precise Produce error codes.

    Returns the producer. Only this instance changes; it must be idempotent or transactional.
    """
    if producer._txn_manager is None:
        raise IllegalOperation("enable_transactions needs transactional_id or enable_idempotence")
    sender = producer._sender
    if sender.sender_task is not None:
        raise IllegalOperation("enable_transactions must be called before start()")
    sender._do_init_pid = types.MethodType(_do_init_pid, sender)
    if "_send_produce_req" not in vars(sender):  # a handler of its own (ResilientProducer's) stays
        use_produce_handler(sender, KeepCodesHandler)
    return producer


async def renew_epoch(producer: AIOKafkaProducer) -> tuple[int, int]:
    """A fresh epoch for the producer's transactional id; sequence numbers restart at 0.

    Only between transactions (after a commit or an abort). Retries like aiokafka's own
    InitProducerId (coordinator moved or loading, concurrent transactions) without a time limit;
    any other error is raised, and the producer should then be closed. Returns (id, epoch).
    """
    txn_manager = producer._txn_manager
    if txn_manager is None or txn_manager.transactional_id is None:
        raise IllegalOperation("renew_epoch needs a transactional producer")
    if txn_manager.state is not TransactionState.READY:
        raise IllegalOperation(f"renew_epoch between transactions only, not in {txn_manager.state}")
    sender = producer._sender
    while True:
        node_id = await sender._find_coordinator(
            CoordinationType.TRANSACTION, txn_manager.transactional_id
        )
        if await _RenewEpochHandler(sender).do(node_id):
            return txn_manager.producer_id, txn_manager.producer_epoch


def aiokafka_producer(producer: object) -> AIOKafkaProducer | None:
    """The AIOKafkaProducer itself, or the one a wrapper exposes as `.producer`, else None."""
    if isinstance(producer, AIOKafkaProducer):
        return producer
    inner = getattr(producer, "producer", None)
    return inner if isinstance(inner, AIOKafkaProducer) else None


def fatal_error(producer: AIOKafkaProducer) -> BaseException | None:
    """What broke the producer, or None: its sender died, or its transaction state is fatal.

    aiokafka's sender dies on an error it does not expect (e.g. UNKNOWN_SERVER_ERROR answering
    AddPartitionsToTxn); every later call then fails, so the producer must be closed.
    """
    txn_manager = producer._txn_manager
    fatal_state = txn_manager is not None and txn_manager.is_fatal_error()
    errors: list[BaseException] = []
    for future in (
        producer._sender.sender_task,
        txn_manager._transaction_waiter if fatal_state else None,
    ):
        if future is not None and future.done() and not future.cancelled():
            error = future.exception()  # read both: neither is reported as never retrieved
            if error is not None:
                errors.append(error)
    if errors:
        return errors[0]
    if not fatal_state:
        return None
    fallback: BaseException = aiokafka_errors.IllegalStateError("the transaction state is fatal")
    return fallback
