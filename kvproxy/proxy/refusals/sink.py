"""Where a Produce decision's refusals go: the log, the metrics, the journal, the dead letters.

`RejectionSink.record` is the one entry point, called once per decided request. None of what
it does ever changes the client's answer: a journal that cannot be written, a dead letter that
cannot be sent or a rejection listener that fails is logged and counted, and the answer stands.
"""

from __future__ import annotations

import collections
import functools
import logging
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from kvproxy.journal import WORKER_DIR_PREFIX, Journal, QuarantineEntry
from kvproxy.journal.bounds import MAX_TOPIC_CHARS, clip
from kvproxy.journal.repeats import RecentRefusals, Refusal, refusal_key
from kvproxy.policies.topic_patterns import any_of
from kvproxy.protocol.budget import MemoryBudget
from kvproxy.proxy.config.proxy_config import ProxyConfig, QuarantineConfig
from kvproxy.proxy.ops.logs import RejectionEvent, RejectionLogger
from kvproxy.proxy.ops.metrics import ProxyMetrics
from kvproxy.proxy.produce.decision import PartitionOutcome, ProduceDecision
from kvproxy.proxy.refusals.dead_letter import dead_letter_records
from kvproxy.proxy.refusals.dead_letter_sender import DeadLetterSender

log = logging.getLogger("kvproxy")

MAX_REJECTION_KEYS = 1_000
"""(topic, policy, code) keys `RejectionSink.rejections` keeps (the oldest is dropped first)."""


def make_journal(
    settings: QuarantineConfig, base_dir: Path, worker_index: int | None
) -> Journal | None:
    """The quarantine journal `settings` ask for (a worker's own under `worker-<index>`)."""
    if settings.dir is None:
        return None
    directory = settings.dir if settings.dir.is_absolute() else base_dir / settings.dir
    if worker_index is not None:
        directory = directory / f"{WORKER_DIR_PREFIX}{worker_index}"
    return Journal(
        directory,
        segment_bytes=settings.segment_bytes,
        retention_bytes=settings.retention_bytes,
        retention_ms=settings.retention_ms,
        flush_interval_ms=settings.flush_interval_ms,
        queue_bytes=settings.queue_bytes,
        report_interval_s=settings.drop_report_interval_ms / 1000,
        on_error=lambda why: log.error(
            "%s (journal %s; clients are still answered)",
            why,
            directory,
        ),
    )


class RejectionSink:
    """Logs, counts, keeps and copies to dead-letter topics what the policies refused."""

    def __init__(
        self,
        config: ProxyConfig,
        metrics: ProxyMetrics,
        *,
        journal: Journal | None,
        bootstrap: tuple[tuple[str, int], ...],
        upstream_ssl: ssl.SSLContext | None,
        decode_memory: MemoryBudget,
        off_loop: Callable[[Callable[[], bytes]], Awaitable[bytes]],
    ) -> None:
        self.metrics = metrics
        self.journal = journal
        self._dead_letter_suffix = config.quarantine.dead_letter_suffix
        self._dead_letter_for = any_of(config.quarantine.dead_letter_topics)
        self.recent_refusals = RecentRefusals(
            window_ms=config.quarantine.repeat_window_ms,
            capacity=config.quarantine.repeat_batches,
            on_forget=self._write_attempts,
        )
        """Refused batches kept lately: one sent again is kept (journal, dead letter, log) once."""
        self.dead_letters = DeadLetterSender(
            metrics,
            bootstrap=bootstrap,
            upstream_ssl=upstream_ssl,
            connect_timeout=config.upstream.connect_timeout_ms / 1000,
            decode_bytes=config.limits.decode_bytes_per_request,
            decode_memory=decode_memory,
            off_loop=off_loop,
            pending_bytes=config.quarantine.dead_letter_pending_bytes,
            report_interval_s=config.quarantine.drop_report_interval_ms / 1000,
        )
        self.background = self.dead_letters.background
        """Dead letters being built or sent (the server waits for them when it stops)."""
        self.rejection_log = RejectionLogger(
            rate=config.logs.rejections_per_window,
            window_s=config.logs.rejection_window_ms / 1000,
            total_rate=config.logs.rejection_lines_per_window,
        )
        self.rejection_listeners: list[Callable[[RejectionEvent], None]] = []
        """Told of every rejection as it happens, unthrottled (`kvproxy demo` prints them)."""
        self.rejections: collections.Counter[tuple[str, str, int]] = collections.Counter()
        """(topic, policy, code) -> partitions rejected (warn mode: would have been), for the
        latest `MAX_REJECTION_KEYS` keys (clients choose topic names)."""

    def record(self, decision: ProduceDecision, client_id: str | None, peer: str) -> None:
        """Everything that follows from one decided request, before it is answered."""
        self._report(decision, client_id, peer)
        self._count_produced(decision)

    def _report(self, decision: ProduceDecision, client_id: str | None, peer: str) -> None:
        """Log and count every rejection (and, in warn mode, every would-be rejection)."""
        for outcome in [*decision.rejected, *decision.warned]:
            verdict = outcome.verdict
            policy = verdict.policy or "?"
            key = (clip(outcome.topic, MAX_TOPIC_CHARS), policy, verdict.code)
            if key not in self.rejections and len(self.rejections) >= MAX_REJECTION_KEYS:
                del self.rejections[next(iter(self.rejections))]
            self.rejections[key] += 1
            self.metrics.topic_labels.count(
                self.metrics.rejections, outcome.topic, (policy, str(verdict.code))
            )
            repeated = self._quarantine(outcome, decision.api_version, client_id, peer)
            event = RejectionEvent(
                topic=outcome.topic,
                partition=outcome.index,
                policy=policy,
                code=verdict.code,
                message=verdict.message,
                client_id=client_id,
                client_address=peer,
                enforced=outcome.enforced,
            )
            if not repeated:  # a repeat is counted in kvproxy_quarantine_repeated_batches
                self.rejection_log.rejected(event)
            for listener in list(self.rejection_listeners):
                try:
                    listener(event)
                except Exception:  # a listener never changes an answer: it is dropped
                    log.exception("rejection listener %r failed: no longer told", listener)
                    self.rejection_listeners.remove(listener)

    def _quarantine(
        self, outcome: PartitionOutcome, version: int, client_id: str | None, peer: str
    ) -> bool:
        """Keep what was refused (or, in warn mode, would have been) and copy it to the
        dead-letter topic when configured. Neither ever changes the client's answer.

        A refusal its client answers by sending the same batch again (`Verdict.resend`: no
        memory to decompress, a registry out of reach) is neither: a kept copy would be a
        second one once it does. A batch refused again with the same bytes within
        `quarantine.repeat_window_ms` (a client retrying) is kept once: True for such a repeat,
        whose attempts are counted and later written down in a "repeated" mark."""
        verdict = outcome.verdict
        if verdict.resend or (self.journal is None and not self._dead_letter_suffix):
            return False  # nothing to keep: no digest to take (the log lines are rate-limited)
        entry_id = uuid.uuid4().hex
        now_ms = int(time.time() * 1000)
        key = refusal_key(
            outcome.raw,
            topic=outcome.topic,
            partition=outcome.index,
            client_id=client_id,
            policy=verdict.policy,
            code=verdict.code,
        )
        earlier = self.recent_refusals.seen(
            key, now_ms, lambda: Refusal(entry_id, now_ms, outcome.topic, outcome.index)
        )
        if earlier is not None:
            self.metrics.repeated_refusals.inc()
            return True
        records = bytes(outcome.raw)  # one copy, shared by the journal and the dead letter
        if self.journal is not None:
            self.journal.append(
                QuarantineEntry(
                    id=entry_id,
                    time_ms=now_ms,
                    kind="rejected" if outcome.enforced else "warned",
                    topic=outcome.topic,
                    partition=outcome.index,
                    client_id=client_id,
                    client_address=peer,
                    produce_version=version,
                    policy=verdict.policy,
                    code=verdict.code,
                    message=verdict.message,
                    record_indexes=tuple(e.index for e in verdict.record_errors),
                    records=records,
                )
            )
        suffix = self._dead_letter_suffix
        if suffix and outcome.enforced and self._dead_letter_for(outcome.topic):
            if outcome.topic.endswith(suffix):
                return False  # never a dead letter of a dead letter
            make = functools.partial(
                dead_letter_records,
                records,
                policy=verdict.policy or "?",
                code=verdict.code,
                message=verdict.message,
                partition=outcome.index,
                client_id=client_id,
            )
            self.dead_letters.submit(outcome.topic + suffix, outcome.index, make, len(records))
        return False

    def _write_attempts(self, refusal: Refusal) -> None:
        """Write down how often a kept refused batch was sent: a "repeated" mark (no records)
        naming its entry (`repeat_of`) with `attempts`; readers that list refusals skip it."""
        if self.journal is None:
            return
        self.journal.append(
            QuarantineEntry(
                id=uuid.uuid4().hex,
                time_ms=int(time.time() * 1000),
                kind="repeated",
                topic=refusal.topic,
                partition=refusal.partition,
            ),
            extra={"repeat_of": refusal.entry_id, "attempts": refusal.attempts},
        )

    def close(self) -> None:
        """The proxy stops: write down the attempts of the refusals still remembered."""
        self.recent_refusals.forget_all()

    def _count_produced(self, decision: ProduceDecision) -> None:
        """Batches and records by topic and verdict."""
        metrics = self.metrics
        for outcome in decision.outcomes:
            if outcome.produced is None:
                continue
            if outcome.rejected:
                verdict = "rejected"
            elif not outcome.verdict.ok:
                verdict = "warned"
            else:
                verdict = "accepted"
            labels = metrics.topic_labels
            batches = outcome.produced.batches
            labels.count(metrics.batches, outcome.topic, (verdict,), len(batches))
            labels.count(
                metrics.records,
                outcome.topic,
                (verdict,),
                max(0, sum(b.counted_records for b in batches)),
            )
