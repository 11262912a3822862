"""Reading one partition up to its high watermark, sans-IO: the next Fetch to send and what each
answer adds, so a driver only carries the requests (`kvproxy.client.async_requests`)."""

from __future__ import annotations

from typing import Any, Final

from kvproxy.client.core import UpstreamError
from kvproxy.protocol import admin
from kvproxy.protocol.records import iter_batches

__all__ = ["FETCH_VERSION", "PartitionRead"]

FETCH_VERSION: Final = 4
"""Magic-2 records by topic name: every broker since 0.11."""
_MAX_WAIT_MS: Final = 100  # not 0: Tansu answers a Fetch that may not wait with no partition at all


class PartitionRead:
    """The whole batches of `topic`-`partition` from `first` up to the high watermark the first
    Fetch answer names, at most `max_bytes` of them (a batch is only ever taken whole)."""

    version: Final = FETCH_VERSION

    def __init__(self, topic: str, partition: int, first: int, max_bytes: int) -> None:
        self.topic = topic
        self.partition = partition
        self._offset = first
        self._max_bytes = max_bytes
        self._high_watermark: int | None = None
        self._records = bytearray()
        self._done = False
        self.complete = False
        """Whether the high watermark was reached (meaningful once `next_request` says None)."""

    @property
    def records(self) -> bytes:
        """The batches read so far, as the broker sent them."""
        return bytes(self._records)

    def next_request(self) -> Any | None:
        """The body of the next Fetch (version `version`); None when the read is over."""
        if self._done:
            return None
        if self._high_watermark is not None and self._offset >= self._high_watermark:
            self._done = self.complete = True
            return None
        if len(self._records) >= self._max_bytes:
            self._done = True
            return None
        return admin.fetch_request(
            self.version,
            self.topic,
            {self.partition: self._offset},
            max_bytes=self._max_bytes - len(self._records),
            min_bytes=0,
            max_wait_ms=_MAX_WAIT_MS,
        )

    def receive(self, answer: Any) -> None:
        """Take the answer to the last Fetch. Raises `ConnectionError` when it leaves the
        partition out and `UpstreamError` when it carries an error code."""
        where = f"{self.topic}-{self.partition}"
        fetched = admin.fetched_partitions(answer, self.topic).get(self.partition)
        if fetched is None:
            raise ConnectionError(f"Fetch {where}: the broker answered no partition")
        if fetched.error_code != 0:
            raise UpstreamError(f"Fetch {where}", fetched.error_code)
        if self._high_watermark is None:
            self._high_watermark = fetched.high_watermark
        next_offset = self._offset
        for batch in iter_batches(fetched.records, allow_partial_tail=True):
            next_offset = max(next_offset, batch.base_offset + batch.last_offset_delta + 1)
            self._records += batch.buffer
        if next_offset == self._offset:
            # nothing whole came back: the next batch is larger than what is left to read
            self._done = True
            self.complete = self._offset >= self._high_watermark
            return
        self._offset = next_offset
