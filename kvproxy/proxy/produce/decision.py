"""What the proxy decided for one Produce request, as values: each partition's outcome, what goes
upstream, and the settings the answer is written under. `ProduceEngine` makes them
(`kvproxy.proxy.produce.engine`), `ProduceAnswers` answers from them (`answer.py`), the exchange,
the sink and the relay read them; none of them holds the engine."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from kvproxy.policies.api import ProducedRecords, Verdict
from kvproxy.policies.chain import PolicyChain
from kvproxy.protocol import error_codes
from kvproxy.protocol.error_codes import ErrorProfile
from kvproxy.protocol.framing import Frame

__all__ = ["PartitionOutcome", "ProduceDecision", "ProduceSettings"]


@dataclass(frozen=True, slots=True)
class ProduceSettings:
    profile: ErrorProfile = ErrorProfile.KAFKA
    legacy_below: int = 3
    legacy_code: int = error_codes.CORRUPT_MESSAGE
    reject_request: bool = False
    max_records_per_request: int | None = None
    """A request declaring more records is answered MESSAGE_TOO_LARGE before any is decoded."""
    inline_max_records: int = 10_000
    """An inline decision (`Allowance.inline`) of a request declaring more records stops with
    `InlineLimitReached`: checking them would hold the event loop for milliseconds."""
    inline_max_partitions: int = 100
    """As `inline_max_records`, for partitions named, empty ones too (about 30 us each)."""


@dataclass(slots=True, eq=False)
class PartitionOutcome:
    """What the proxy decided for one partition of one request.

    Read-only by contract, not frozen: built per partition per request, and a frozen
    dataclass's `__init__` costs several times as much (see `kvproxy.policies.api.ProducedRecords`).
    """

    topic: str
    index: int
    verdict: Verdict
    """ACCEPT, or what a policy answered (kept in warn mode too, for the log)."""
    enforced: bool
    """True when the verdict is a rejection the client receives."""
    produced: ProducedRecords | None = None
    raw: bytes | memoryview = b""
    """The partition's records as the client sent them (kept for the quarantine journal)."""

    @property
    def rejected(self) -> bool:
        return self.enforced and not self.verdict.ok


@dataclass(slots=True, eq=False)
class ProduceDecision:
    """What the proxy decided for one Produce request (read-only by contract, as above)."""

    api_version: int
    correlation_id: int
    acks: int
    topics: tuple[tuple[str, tuple[PartitionOutcome, ...]], ...]
    forward: Frame | None = None
    """What goes upstream: the original frame, a re-encoded one, or nothing."""
    observing: tuple[tuple[str, PolicyChain], ...] = ()
    """The topics whose chain shows the broker's answer to a policy (`PolicyChain.observers`),
    with that chain: usually none, and then the answer is not decoded for them."""
    topic_ids: tuple[uuid.UUID | None, ...] = ()
    """Produce v13: each topic's id, in the order of `topics` (what its answer names)."""
    unchecked: int = 0
    """Partitions refused without their records checked: decoding them would pass the decode
    budget (`kvproxy_decode_budget_refusals_total`)."""
    written: bytes | None = None
    """The answer, written where a request of many partitions answered locally was decided
    (off the event loop), so the loop only sends it."""
    outcomes: tuple[PartitionOutcome, ...] = field(init=False)
    rejected: tuple[PartitionOutcome, ...] = field(init=False)
    """The partitions whose rejection the client receives."""
    warned: tuple[PartitionOutcome, ...] = field(init=False)
    """Warn mode: the partitions that would have been rejected."""

    def __post_init__(self) -> None:
        topics = self.topics
        self.outcomes = (
            topics[0][1]
            if len(topics) == 1
            else tuple(o for _, partitions in topics for o in partitions)
        )
        rejected: list[PartitionOutcome] = []
        warned: list[PartitionOutcome] = []
        for outcome in self.outcomes:
            if not outcome.verdict.ok:
                (rejected if outcome.enforced else warned).append(outcome)
        self.rejected = tuple(rejected)
        self.warned = tuple(warned)

    @property
    def needs_merge(self) -> bool:
        return bool(self.rejected)
