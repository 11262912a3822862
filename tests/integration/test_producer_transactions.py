"""kvproxy.producer.transactions.run_transaction (and producer.compat) through kvproxy in front of
Tansu
and of Apache Kafka 4.4.

On Kafka every transaction works as documented: aiokafka's own InitProducerId v0 starts a
transactional producer, the epoch bump is granted, a stale epoch is PRODUCER_FENCED, the abort
marker is written to every partition of the transaction (the refused one included), and a
read_committed consumer does not see aborted records. The Tansu variants pin where Tansu differs.

What Tansu 0.6 does with an aiokafka 0.14 transactional producer (aiokafka's request versions):

- InitProducerId v0, the only version aiokafka sends, is answered UNKNOWN_SERVER_ERROR (-1): the
  producer cannot start (pinned below). InitProducerId v3 with producer id / epoch -1 / -1 works
  and is also how a fresh epoch is obtained for the same transactional id; v3 with the current id
  and epoch (Kafka's KIP-360 epoch bump) is answered -1 (pinned below).
- FindCoordinator v1 (transaction and group keys), AddPartitionsToTxn v0, Produce v7 with
  transactional batches, AddOffsetsToTxn v0, TxnOffsetCommit v0 and EndTxn v0 (commit and abort)
  work: COMMIT / ABORT markers are stored, committed offsets can be read back.
- A read_committed consumer also gets the records of aborted transactions (Tansu's Fetch does
  not hide them). So aborts are checked in the stored log (an ABORT control batch after the
  producer's records), and read_committed consumers only read topics that hold no aborted record.
- A producer whose epoch is stale (fenced) gets UNKNOWN_SERVER_ERROR (-1) to AddPartitionsToTxn
  instead of INVALID_PRODUCER_EPOCH / PRODUCER_FENCED; aiokafka's sender dies on it (pinned
  below).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.client import CoordinationType
from aiokafka.errors import OutOfOrderSequenceNumber, ProducerFenced, UnknownError
from aiokafka.producer.transaction_manager import TransactionState
from aiokafka.structs import TopicPartition

from kvproxy.producer.compat import (
    BrokerError,
    InitProducerIdRequest,
    enable_transactions,
    fatal_error,
)
from kvproxy.producer.errors import Classification, CommitFailedError, classify
from kvproxy.producer.transactions import Transaction, TransactionOver, run_transaction
from kvproxy.protocol.error_codes import INVALID_RECORD
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.transactions import ABORT, COMMIT, log_of
from tests.harness.upstream import Upstream

TIMEOUT = 30

pytestmark = pytest.mark.upstreams("tansu", "kafka")


@pytest.fixture
def kvproxy(upstream: Upstream) -> Iterator[RunningProxy]:
    """kvproxy with its default policies (compaction is discovered with DescribeConfigs)."""
    with run_proxy(upstream.bootstrap) as proxy:
        yield proxy


def transactional_id() -> str:
    return f"txn-{uuid.uuid4().hex[:12]}"


async def started_producer(bootstrap: str, txn_id: str | None = None) -> AIOKafkaProducer:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=txn_id or transactional_id()
    )
    enable_transactions(producer)
    async with asyncio.timeout(TIMEOUT):
        await producer.start()
    return producer


async def read_committed(
    bootstrap: str, topic: str, partitions: int, expected: int
) -> list[tuple[int, bytes | None, bytes | None]]:
    """(partition, key, value) of every record a read_committed consumer gets, by assign()."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        records: list[tuple[int, bytes | None, bytes | None]] = []
        async with asyncio.timeout(TIMEOUT):
            while len(records) < expected:
                batches = await consumer.getmany(timeout_ms=500)
                records += [(m.partition, m.key, m.value) for ms in batches.values() for m in ms]
        batches = await consumer.getmany(timeout_ms=500)  # and nothing after them
        records += [(m.partition, m.key, m.value) for ms in batches.values() for m in ms]
        return records
    finally:
        await consumer.stop()


async def committed_offset(bootstrap: str, group_id: str, tp: TopicPartition) -> int | None:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group_id, enable_auto_commit=False
    )
    await consumer.start()
    try:
        offset: int | None = await consumer.committed(tp)
        return offset
    finally:
        await consumer.stop()


# -- the helper ------------------------------------------------------------------------------


async def test_a_good_transaction_commits_its_records_and_offsets_once(
    upstream: Upstream, kvproxy: RunningProxy, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(2)
    source = make_topic(1, prefix="src")
    group = f"g-{uuid.uuid4().hex[:8]}"
    producer = await started_producer(kvproxy.bootstrap)
    try:

        async def body(txn: Transaction) -> int:
            for i in range(4):
                await txn.send(topic, b"v%d" % i, key=b"k%d" % i, partition=i % 2)
            txn.send_offsets({TopicPartition(source, 0): 42}, group)
            return txn.sends

        async with asyncio.timeout(TIMEOUT):
            assert await run_transaction(producer, body) == 4
        assert producer._txn_manager.state is TransactionState.READY
        pid, epoch = producer._txn_manager.producer_id, producer._txn_manager.producer_epoch
    finally:
        await producer.stop()

    records = await read_committed(kvproxy.bootstrap, topic, 2, expected=4)
    assert sorted(records) == [
        (0, b"k0", b"v0"),
        (0, b"k2", b"v2"),
        (1, b"k1", b"v1"),
        (1, b"k3", b"v3"),
    ]
    assert log_of(upstream, topic, 0) == [(pid, epoch, [b"v0", b"v2"]), (pid, epoch, COMMIT)]
    assert log_of(upstream, topic, 1) == [(pid, epoch, [b"v1", b"v3"]), (pid, epoch, COMMIT)]
    assert await committed_offset(kvproxy.bootstrap, group, TopicPartition(source, 0)) == 42


async def test_an_abortable_failure_becomes_commit_failed_and_the_producer_goes_on(
    upstream: Upstream, kvproxy: RunningProxy, make_topic: Callable[..., str]
) -> None:
    compacted = make_topic(1, config={"cleanup.policy": "compact"}, prefix="compact")
    plain = make_topic(1, prefix="plain")
    producer = await started_producer(kvproxy.bootstrap)
    try:
        txn_manager = producer._txn_manager
        pid, first_epoch = txn_manager.producer_id, txn_manager.producer_epoch

        async def bad(txn: Transaction) -> None:
            await txn.send(plain, b"written-then-aborted", key=b"p")
            await txn.send(compacted, b"no key")  # kvproxy refuses it: INVALID_RECORD (87)

        async with asyncio.timeout(TIMEOUT):
            with pytest.raises(CommitFailedError) as raised:
                await run_transaction(producer, bad)
        failure = raised.value
        assert failure.code == INVALID_RECORD
        assert isinstance(failure.cause, BrokerError)
        assert failure.cause.errno == INVALID_RECORD
        assert failure.cause.message == "INVALID_RECORD"
        assert failure.cause.tp == TopicPartition(compacted, 0)
        assert str(failure.cause) == f"[Error 87] INVALID_RECORD: partition {compacted}-0"
        assert classify(failure.cause) is Classification.ABORTABLE
        assert failure.__cause__ is failure.cause
        # aborted, and a fresh epoch so that the refused batch's sequence numbers do not count
        assert txn_manager.state is TransactionState.READY
        assert txn_manager.producer_id == pid
        assert txn_manager.producer_epoch == first_epoch + 1

        async def good(txn: Transaction) -> str:
            await txn.send(compacted, b"c1", key=b"a")
            await txn.send(compacted, b"c2", key=b"b")
            await txn.send(plain, b"committed", key=b"p")
            return "done"

        async with asyncio.timeout(TIMEOUT):
            assert await run_transaction(producer, good) == "done"
        second_epoch = txn_manager.producer_epoch
    finally:
        await producer.stop()

    assert second_epoch == first_epoch + 1
    # the refused record never reached the broker; only the second transaction's records did
    # (Kafka marks every partition of the transaction aborted, Tansu only those with data)
    aborted = [(pid, first_epoch, ABORT)] if upstream.is_kafka else []
    assert log_of(upstream, compacted) == [
        *aborted,
        (pid, second_epoch, [b"c1", b"c2"]),
        (pid, second_epoch, COMMIT),
    ]
    assert await read_committed(kvproxy.bootstrap, compacted, 1, expected=2) == [
        (0, b"a", b"c1"),
        (0, b"b", b"c2"),
    ]
    # the record that did get through in the failed transaction was aborted
    assert log_of(upstream, plain) == [
        (pid, first_epoch, [b"written-then-aborted"]),
        (pid, first_epoch, ABORT),
        (pid, second_epoch, [b"committed"]),
        (pid, second_epoch, COMMIT),
    ]
    if upstream.is_kafka:  # Kafka's read_committed hides the aborted record (Tansu's does not)
        assert await read_committed(kvproxy.bootstrap, plain, 1, expected=1) == [
            (0, b"p", b"committed")
        ]


async def test_a_failed_send_aborts_even_when_the_body_swallowed_its_error(
    upstream: Upstream, kvproxy: RunningProxy, make_topic: Callable[..., str]
) -> None:
    compacted = make_topic(1, config={"cleanup.policy": "compact"}, prefix="compact")
    plain = make_topic(1, prefix="plain")
    producer = await started_producer(kvproxy.bootstrap)
    try:
        pid, epoch = producer._txn_manager.producer_id, producer._txn_manager.producer_epoch
        seen: list[BaseException] = []

        async def swallowing(txn: Transaction) -> str:
            await txn.send(plain, b"aborted", key=b"p")
            refused = await txn.send(compacted, b"no key")
            try:
                await refused
            except BrokerError as error:
                seen.append(error)
            return "looks fine"

        async with asyncio.timeout(TIMEOUT):
            with pytest.raises(CommitFailedError) as raised:
                await run_transaction(producer, swallowing)
        assert raised.value.cause is seen[0]
        assert raised.value.code == INVALID_RECORD

        async def raising_its_error(txn: Transaction) -> None:
            refused = await txn.send(compacted, b"no key again")
            await refused  # the body lets the send's error out

        async with asyncio.timeout(TIMEOUT):
            with pytest.raises(CommitFailedError) as raised:
                await run_transaction(producer, raising_its_error)
        assert raised.value.code == INVALID_RECORD
        assert producer._txn_manager.state is TransactionState.READY
    finally:
        await producer.stop()
    assert log_of(upstream, plain) == [(pid, epoch, [b"aborted"]), (pid, epoch, ABORT)]
    # both transactions aborted (the epoch renewed after each): Kafka marks the refused partition
    aborts = [(pid, epoch, ABORT), (pid, epoch + 1, ABORT)] if upstream.is_kafka else []
    assert log_of(upstream, compacted) == aborts


async def test_the_bodys_own_exception_aborts_and_is_raised_unchanged(
    upstream: Upstream, kvproxy: RunningProxy, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(1)
    producer = await started_producer(kvproxy.bootstrap)
    kept: list[Transaction] = []
    try:
        pid, epoch = producer._txn_manager.producer_id, producer._txn_manager.producer_epoch

        async def broken(txn: Transaction) -> None:
            kept.append(txn)
            await (await txn.send(topic, b"delivered, then aborted", key=b"k"))
            raise ValueError("the body's own bug")

        async with asyncio.timeout(TIMEOUT):
            with pytest.raises(ValueError, match="the body's own bug"):
                await run_transaction(producer, broken)
        assert producer._txn_manager.state is TransactionState.READY
        assert producer._txn_manager.producer_epoch == epoch  # no send failed: same epoch
        with pytest.raises(TransactionOver):
            await kept[0].send(topic, b"too late", key=b"k")

        async def good(txn: Transaction) -> None:
            await txn.send(topic, b"kept", key=b"k")

        async with asyncio.timeout(TIMEOUT):
            await run_transaction(producer, good)
    finally:
        await producer.stop()
    assert log_of(upstream, topic) == [
        (pid, epoch, [b"delivered, then aborted"]),
        (pid, epoch, ABORT),
        (pid, epoch, [b"kept"]),
        (pid, epoch, COMMIT),
    ]


async def test_a_cancelled_body_aborts(
    upstream: Upstream, kvproxy: RunningProxy, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(1)
    producer = await started_producer(kvproxy.bootstrap)
    try:
        pid, epoch = producer._txn_manager.producer_id, producer._txn_manager.producer_epoch
        sent = asyncio.Event()

        async def stuck(txn: Transaction) -> None:
            await (await txn.send(topic, b"sent before the cancel", key=b"k"))
            sent.set()
            await asyncio.Event().wait()

        task = asyncio.create_task(run_transaction(producer, stuck))
        async with asyncio.timeout(TIMEOUT):
            await sent.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert producer._txn_manager.state is TransactionState.READY
    finally:
        await producer.stop()
    assert log_of(upstream, topic) == [
        (pid, epoch, [b"sent before the cancel"]),
        (pid, epoch, ABORT),
    ]


async def test_a_fenced_producer_gets_a_fatal_error_not_commit_failed(
    upstream: Upstream, kvproxy: RunningProxy, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(1)
    txn_id = transactional_id()
    zombie = await started_producer(kvproxy.bootstrap, txn_id)
    successor = await started_producer(kvproxy.bootstrap, txn_id)  # bumps the epoch
    try:
        assert successor._txn_manager.producer_epoch == zombie._txn_manager.producer_epoch + 1

        async def body(txn: Transaction) -> None:
            await txn.send(topic, b"from the zombie", key=b"k")

        async with asyncio.timeout(TIMEOUT):
            with pytest.raises(Exception) as raised:
                await run_transaction(zombie, body)
        assert not isinstance(raised.value, CommitFailedError)
        if upstream.is_kafka:
            # Kafka answers the stale epoch PRODUCER_FENCED: aiokafka raises ProducerFenced
            assert type(raised.value) is ProducerFenced
            assert classify(raised.value) is Classification.FATAL
            assert type(fatal_error(zombie)) is ProducerFenced
        else:
            # Tansu answers the stale epoch's AddPartitionsToTxn with UNKNOWN_SERVER_ERROR;
            # aiokafka's sender dies on it, and that is what is raised.
            assert raised.value is fatal_error(zombie)
            assert isinstance(raised.value.__cause__, UnknownError)

        async def successor_body(txn: Transaction) -> None:
            await txn.send(topic, b"from the successor", key=b"k")

        async with asyncio.timeout(TIMEOUT):
            await run_transaction(successor, successor_body)
    finally:
        await zombie.stop()
        await successor.stop()
    assert await read_committed(kvproxy.bootstrap, topic, 1, expected=1) == [
        (0, b"k", b"from the successor")
    ]


# -- what producer.compat works around ---------------------------------------------------------


async def test_aiokafka_needs_init_producer_id_v3_on_tansu_not_on_kafka(
    upstream: Upstream, kvproxy: RunningProxy, make_topic: Callable[..., str]
) -> None:
    plain = AIOKafkaProducer(
        bootstrap_servers=kvproxy.bootstrap, transactional_id=transactional_id()
    )
    try:
        async with asyncio.timeout(TIMEOUT):
            if upstream.is_kafka:  # Kafka takes InitProducerId v0: aiokafka alone commits
                topic = make_topic(1)
                await plain.start()
                async with plain.transaction():
                    await plain.send_and_wait(topic, b"plain aiokafka", key=b"k")
            else:
                with pytest.raises(UnknownError):  # InitProducerId v0: UNKNOWN_SERVER_ERROR (-1)
                    await plain.start()
    finally:
        await plain.stop()
    if upstream.is_kafka:
        assert await read_committed(kvproxy.bootstrap, topic, 1, expected=1) == [
            (0, b"k", b"plain aiokafka")
        ]

    producer = await started_producer(kvproxy.bootstrap)
    try:
        txn_manager = producer._txn_manager
        assert txn_manager.state is TransactionState.READY
        assert txn_manager.producer_id >= 0
        # Kafka's epoch bump (InitProducerId v3 with the current id and epoch): Tansu refuses it
        node_id = await producer._sender._find_coordinator(
            CoordinationType.TRANSACTION, txn_manager.transactional_id
        )
        bump = InitProducerIdRequest(
            txn_manager.transactional_id,
            txn_manager.transaction_timeout_ms,
            txn_manager.producer_id,
            txn_manager.producer_epoch,
        )
        answer = await producer.client.send(node_id, bump)
        assert answer.API_VERSION == 3
        if upstream.is_kafka:
            assert (answer.error_code, answer.producer_id, answer.producer_epoch) == (
                0,
                txn_manager.producer_id,
                txn_manager.producer_epoch + 1,
            )
        else:
            assert (answer.error_code, answer.producer_id) == (-1, -1)
    finally:
        await producer.stop()


async def test_an_idempotent_producer_starts_too(
    kvproxy: RunningProxy, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(1)
    producer = AIOKafkaProducer(bootstrap_servers=kvproxy.bootstrap, enable_idempotence=True)
    enable_transactions(producer)
    try:
        async with asyncio.timeout(TIMEOUT):
            await producer.start()
            assert producer._txn_manager.producer_id >= 0
            metadata = await (await producer.send(topic, b"v", key=b"k"))
        assert metadata.offset == 0
    finally:
        await producer.stop()


async def test_without_a_new_epoch_the_refused_batch_breaks_the_partition(
    kvproxy: RunningProxy, make_topic: Callable[..., str]
) -> None:
    """Why run_transaction renews the epoch after a failed send: aiokafka alone cannot go on."""
    compacted = make_topic(1, config={"cleanup.policy": "compact"}, prefix="compact")
    producer = await started_producer(kvproxy.bootstrap)
    try:
        async with asyncio.timeout(TIMEOUT):
            await producer.begin_transaction()
            refused = await producer.send(compacted, b"no key")
            with pytest.raises(BrokerError):
                await refused
            await producer.abort_transaction()
            await producer.begin_transaction()
            next_one = await producer.send(compacted, b"keyed", key=b"k")
            with pytest.raises(OutOfOrderSequenceNumber):  # sequence 1 where 0 was expected
                await next_one
            await producer.abort_transaction()
    finally:
        await producer.stop()
