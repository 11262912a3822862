"""Transactions as the broker keeps them, on Tansu or Kafka: a producer id asked for by hand
(InitProducerId v3), and a partition's log as (producer id, epoch, COMMIT / ABORT or the values)."""

from __future__ import annotations

import struct
import time
from typing import Any

from kvproxy.protocol.records import RecordBatch
from tests.harness.produce import CLIENT_ID, stored_batches
from tests.harness.raw_client import RawKafkaClient
from tests.harness.upstream import Upstream

COMMIT, ABORT = "COMMIT", "ABORT"
COORDINATOR_NOT_READY = {14, 15, 16}  # load in progress, not available, not the coordinator


def init_producer_id(
    upstream: Upstream, transactional_id: str, timeout: float = 30
) -> tuple[int, int]:
    """InitProducerId v3 straight to the broker (each call for the same id bumps the epoch)."""
    client_id, tid = CLIENT_ID.encode(), transactional_id.encode()
    request = (
        struct.pack(">hhih", 22, 3, 5, len(client_id))
        + client_id
        + b"\x00"  # header tagged fields
        + bytes([len(tid) + 1])
        + tid
        + struct.pack(">iqh", 60_000, -1, -1)
        + b"\x00"
    )
    # FindCoordinator first, as clients do: it makes Kafka create and load __transaction_state
    find = struct.pack(">hhih", 10, 1, 6, len(client_id)) + client_id
    find += struct.pack(">h", len(tid)) + tid + b"\x01"  # key type 1: transaction
    deadline = time.monotonic() + timeout
    while True:  # asked again until the coordinator has loaded
        with RawKafkaClient(upstream.host, upstream.port) as client:
            client.request(find)
            answer = client.request(request)
        _throttle, error, producer_id, epoch = struct.unpack_from(">ihqh", answer, 5)
        if error not in COORDINATOR_NOT_READY or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert error == 0, error
    return producer_id, epoch


def marker(batch: RecordBatch) -> str:
    """COMMIT or ABORT: a control record's key is (version int16, type int16)."""
    (record,) = list(batch.records())
    assert record.key is not None
    _, kind = struct.unpack(">hh", bytes(record.key))
    return {0: ABORT, 1: COMMIT}[kind]


def log_of(
    upstream: Upstream, topic: str, partition: int = 0, timeout: float = 30
) -> list[tuple[Any, ...]]:
    """The stored log as (producer id, epoch, marker or the records' values), every batch
    transactional. Kafka writes the markers after EndTxn has been answered: there, asked until
    the log ends with one."""
    deadline = time.monotonic() + timeout
    while True:
        entries = _log_of(upstream, topic, partition)
        ended = bool(entries) and entries[-1][2] in (COMMIT, ABORT)
        if upstream.is_tansu or ended or time.monotonic() > deadline:
            return entries
        time.sleep(0.05)


def _log_of(upstream: Upstream, topic: str, partition: int) -> list[tuple[Any, ...]]:
    entries: list[tuple[Any, ...]] = []
    for batch in stored_batches(upstream, topic, partition):
        assert batch.is_transactional
        if batch.is_control:
            entries.append((batch.producer_id, batch.producer_epoch, marker(batch)))
        else:
            values = [bytes(r.value) if r.value is not None else None for r in batch.records()]
            entries.append((batch.producer_id, batch.producer_epoch, values))
    return entries
