"""Dead-letter topics: rejected records copied to `<topic><suffix>` with why they were refused.

A copy is best effort: a failure is logged and counted and never changes the client's answer.
"""

from __future__ import annotations

import ssl
from typing import Final

from kvproxy.client.async_requests import partition_leader, produce_batch
from kvproxy.policies.api import RECORD_OBJECT_BYTES
from kvproxy.protocol.budget import Allowance
from kvproxy.protocol.compression import Codec
from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.records import build_batch, read_batches

HEADER_POLICY: Final = "kvproxy.policy"
HEADER_CODE: Final = "kvproxy.code"
HEADER_MESSAGE: Final = "kvproxy.message"
HEADER_PARTITION: Final = "kvproxy.original.partition"
HEADER_CLIENT: Final = "kvproxy.client.id"
HEADER_UNREADABLE: Final = "kvproxy.unreadable"


def dead_letter_records(
    records: bytes,
    *,
    policy: str,
    code: int,
    message: str | None,
    partition: int,
    client_id: str | None,
    allowance: Allowance | None = None,
) -> bytes:
    """One magic-2 batch holding the refused records, each with the kvproxy.* headers added,
    written as kvproxy's own plain producer's and compressed with the client's codec.

    The client's producer id, epoch, sequence and transaction belong to its own session: a
    broker would fence such a copy, refuse its sequence, drop it as a duplicate or abort it with
    the transaction, so the copy is always a new batch with producer id, epoch and sequence -1,
    outside any transaction. The codec is kept so that the copy is about as large as what the
    client sent, not its decompressed size (which the dead-letter topic's `max.message.bytes`
    may not allow).

    Records that cannot be decoded, or whose decoding would need more memory than `allowance`
    has, travel as one record whose value is the raw bytes as the client sent them (header
    `kvproxy.unreadable`), uncompressed.
    """
    why: list[tuple[str, bytes | None]] = [
        (HEADER_POLICY, policy.encode()),
        (HEADER_CODE, str(code).encode()),
        (HEADER_MESSAGE, (message or "").encode()),
        (HEADER_PARTITION, str(partition).encode()),
        (HEADER_CLIENT, client_id.encode() if client_id is not None else None),
    ]
    codec = Codec.NONE
    try:
        rows = []
        for batch in read_batches(records, allowance):
            if codec is Codec.NONE:
                codec = batch.codec
            if allowance is not None:
                count = max(batch.record_count, 0)
                cost = count * RECORD_OBJECT_BYTES + batch.plain_size()
                allowance.take(cost, f"a dead letter of {count} records")
            rows += [
                (r.key, r.value, (*r.headers, *why), r.timestamp if r.timestamp >= 0 else None)
                for r in batch.records()
            ]
    except ProtocolError:  # a ResourceLimit too
        rows = [(None, bytes(records), (*why, (HEADER_UNREADABLE, b"1")), None)]
        codec = Codec.NONE
    if not rows:
        rows = [(None, b"", tuple(why), None)]
    return build_batch(rows, codec=codec)


async def send_dead_letter(
    bootstrap: list[tuple[str, int]],
    ssl_context: ssl.SSLContext | None,
    timeout: float,
    *,
    topic: str,
    partition: int,
    batch: bytes,
) -> None:
    """Produce `batch` to `topic`-`partition`; raises ConnectionError with the reason on failure."""
    try:
        leader = await partition_leader(bootstrap, ssl_context, timeout, topic, partition)
        if leader is None:
            raise ConnectionError(f"no leader for {topic}-{partition} (does the topic exist?)")
        code = await produce_batch(
            leader, ssl_context, timeout, topic=topic, partition=partition, records=batch
        )
    except (OSError, TimeoutError, ProtocolError) as exc:
        raise ConnectionError(f"{topic}-{partition}: {exc}") from exc
    if code != 0:
        raise ConnectionError(f"{topic}-{partition}: the broker answered error {code}")
