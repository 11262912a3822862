"""`DeadLetterSender`: builds and sends dead letters in the background, within a byte bound.

Every refused partition of a topic with a dead-letter topic becomes a task holding a copy of
its records until the copy is written: a flood of refusals must not grow them without end, so
the bytes pending are bounded (`quarantine.dead_letter_pending_bytes`); beyond, a dead letter is
not sent, counted (`kvproxy_dead_letters_total{result="dropped"}`) and said once per interval.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable

from kvproxy.journal.bounds import MAX_TOPIC_CHARS, clip
from kvproxy.protocol.budget import Allowance, MemoryBudget
from kvproxy.proxy.ops.log_limits import LineLimit
from kvproxy.proxy.ops.metrics import ProxyMetrics
from kvproxy.proxy.refusals.dead_letter import send_dead_letter

log = logging.getLogger("kvproxy")
_not_written = LineLimit("dead letter not written", log)


class DeadLetterSender:
    """Dead letters being built or sent (`background`), at most `pending_bytes` of records."""

    def __init__(
        self,
        metrics: ProxyMetrics,
        *,
        bootstrap: tuple[tuple[str, int], ...],
        upstream_ssl: ssl.SSLContext | None,
        connect_timeout: float,
        decode_bytes: int,
        decode_memory: MemoryBudget,
        off_loop: Callable[[Callable[[], bytes]], Awaitable[bytes]],
        pending_bytes: int,
        report_interval_s: float,
    ) -> None:
        self._metrics = metrics
        self._bootstrap = bootstrap
        self._upstream_ssl = upstream_ssl
        self._connect_timeout = connect_timeout
        self._decode_bytes = decode_bytes
        self._decode_memory = decode_memory
        self._off_loop = off_loop
        self.pending_bytes = pending_bytes
        self.report_interval_s = report_interval_s
        self.pending = 0
        """Bytes of records held by dead letters not yet written or failed."""
        self._unsaid = 0
        self._said_at: float | None = None
        self.background: set[asyncio.Task[None]] = set()

    def submit(self, topic: str, partition: int, make: Callable[..., bytes], size: int) -> None:
        """Build (`make(allowance=...)`) and send a dead letter of `size` bytes of records to
        `topic`-`partition` in the background, or count it dropped when too much is pending."""
        if self.pending + size > self.pending_bytes:
            self._dropped(topic)
            return
        self.pending += size
        task = asyncio.get_running_loop().create_task(self._send(topic, partition, make, size))
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def _dropped(self, topic: str) -> None:
        """Count a dead letter not sent (too many bytes pending); say so once per interval."""
        self._metrics.dead_letters.labels("dropped").inc()
        self._unsaid += 1
        now = time.monotonic()
        said = self._said_at
        if said is not None and now - said < self.report_interval_s:
            return
        self._said_at = now
        count, self._unsaid = self._unsaid, 0
        log.warning(
            "%d dead letters not sent since the last report (latest for %s): more than %d bytes "
            "of dead letters pending (quarantine.dead_letter_pending_bytes); the journal keeps "
            "what it has room for",
            count,
            clip(topic, MAX_TOPIC_CHARS),
            self.pending_bytes,
        )

    async def _send(
        self, topic: str, partition: int, make: Callable[..., bytes], size: int
    ) -> None:
        try:
            await self._build_and_send(topic, partition, make)
        finally:
            self.pending -= size

    async def _build_and_send(self, topic: str, partition: int, make: Callable[..., bytes]) -> None:
        """Build the dead letter on the decoding thread (decoding the refused records costs what
        checking them did, with the same budget), then send it."""
        allowance = Allowance(self._decode_bytes, self._decode_memory)

        def build() -> bytes:
            try:
                return make(allowance=allowance)
            finally:
                allowance.release()

        try:
            batch = await self._off_loop(build)
        except Exception as exc:  # e.g. no memory to compress the copy: counted, never raised
            self._metrics.dead_letters.labels("failed").inc()
            _not_written.log(
                logging.WARNING, "dead letter for %s-%d not built: %r", topic, partition, exc
            )
            return
        try:
            await send_dead_letter(
                list(self._bootstrap),
                self._upstream_ssl,
                self._connect_timeout,
                topic=topic,
                partition=partition,
                batch=batch,
            )
        except ConnectionError as exc:
            self._metrics.dead_letters.labels("failed").inc()
            _not_written.log(logging.WARNING, "dead letter not written: %s", exc)
        else:
            self._metrics.dead_letters.labels("written").inc()
