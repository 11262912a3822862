"""Produce requests through the policies: decide per partition, and what goes upstream.

Everything here is synchronous and free of I/O. A client connection hands each Produce request
to `ProduceDecider` (`kvproxy.proxy.produce.decider`), which gathers what the chains need and
calls
`ProduceEngine.decide` on the event loop or the decoding thread; the connection sends the
decision's `forward` upstream and answers the client with `ProduceDecision.answer`
(`kvproxy.proxy.produce.answer`) once the broker has answered. All-valid requests go upstream as
their original bytes. With rejections, `reject: partition` forwards a re-encoded request holding
only the valid partitions, whose answer is merged with the local errors in request order;
`reject: request` answers everything locally.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvproxy.policies.api import (
    ACCEPT,
    UNKNOWN_TOPIC_CONFIG,
    ProducedRecords,
    TopicConfig,
    Verdict,
    parse_records,
)
from kvproxy.policies.chain import Mode, PolicyChain
from kvproxy.policies.config import TopicRouting, TopicRule
from kvproxy.policies.schemas.model import SchemaCatalog
from kvproxy.protocol import error_codes
from kvproxy.protocol.budget import Allowance, BudgetExhausted, InlineLimitReached, RetryLater
from kvproxy.protocol.error_codes import ErrorProfile
from kvproxy.protocol.errors import DecodeError
from kvproxy.protocol.framing import Frame
from kvproxy.protocol.messages import Request, encode_request
from kvproxy.protocol.produce_topics import (
    FIRST_WITH_TOPIC_IDS,
    as_sent,
    is_unknown_id,
    topic_ids_of,
    topic_name,
)
from kvproxy.proxy.produce.answer import UNKNOWN_TOPIC_ID_POLICY, ProduceAnswers
from kvproxy.proxy.produce.request_scan import (
    DECODE_BUDGET,
    NO_TRANSACTIONAL_ID,
    declared_records,
    has_transactional_records,
    refuse_every_partition,
    too_many_records,
)

_VALID_ACKS = frozenset({-1, 0, 1})
_VIEWS_KEPT = 10_000
"""Topics whose chain and settings an engine keeps (as many as the routing keeps rules of)."""
_NO_TRANSACTIONAL_ID_VERDICT = Verdict(
    code=error_codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    message="Transactional Id authorization failed.",
    policy=NO_TRANSACTIONAL_ID,
)


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


@dataclass(frozen=True, slots=True)
class TopicView:
    """A topic's chain and settings, read on the event loop for a decision made elsewhere
    (the routing's caches belong to the loop's thread, and a reload may replace it meanwhile)."""

    chain: PolicyChain
    config: TopicConfig
    """The YAML's settings over those learned from the cluster."""

    @property
    def compacted(self) -> bool | None:
        return self.config.compacted


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


_UNKNOWN_TOPIC_ID_VERDICT = Verdict(
    code=error_codes.UNKNOWN_TOPIC_ID,
    message="This server does not host this topic ID.",
    policy=UNKNOWN_TOPIC_ID_POLICY,
)


def _unknown_topic_id(
    topic_data: Any,
) -> list[tuple[int, bytes | memoryview, ProducedRecords | Verdict]]:
    """Every partition of a topic named by an unknown id: UNKNOWN_TOPIC_ID, as Kafka answers."""
    verdict: ProducedRecords | Verdict = _UNKNOWN_TOPIC_ID_VERDICT
    return [
        (int(d.index), d.records if d.records is not None else b"", verdict)
        for d in topic_data.partition_data
    ]


def _verdicts(
    name: str, partitions: list[tuple[int, bytes | memoryview, ProducedRecords | Verdict]]
) -> tuple[PartitionOutcome, ...]:
    return tuple(
        PartitionOutcome(name, index, p, enforced=True, raw=raw)
        for index, raw, p in partitions
        if isinstance(p, Verdict)
    )


def _bad_acks(acks: int) -> Verdict:
    """Every partition's verdict when the request's acks is none Kafka takes."""
    return Verdict(
        code=error_codes.INVALID_REQUIRED_ACKS,
        message=f"Invalid required acks {acks}: only -1, 0 and 1 are allowed",
        policy="acks",
    )


def _yaml_over_cluster(override: TopicConfig, learned: TopicConfig) -> TopicConfig:
    """The settings a topic's checks read: the YAML's (`override`) over the cluster's."""
    if override is UNKNOWN_TOPIC_CONFIG:
        return learned
    if learned is UNKNOWN_TOPIC_CONFIG:
        return override
    return override.over(learned)


class ProduceEngine:
    """Applies the topic routing to Produce requests and builds the answers."""

    def __init__(
        self,
        routing: TopicRouting,
        settings: ProduceSettings,
        compacted: Callable[[str], bool | None],
        learned: Callable[[str], TopicConfig] | None = None,
    ) -> None:
        self.routing = routing
        self.settings = settings
        self.answers = ProduceAnswers(settings)
        """Builds the answers of the requests decided here."""
        self._compacted = compacted
        self._learned = learned
        """The cluster's settings of a topic; None: its compaction alone (`compacted`)."""
        self._views: dict[str, tuple[TopicRule, TopicConfig, TopicView]] = {}

    def config_for(self, topic: str) -> TopicConfig:
        """The settings a topic's checks read: the YAML's over the cluster's."""
        return self.view(topic).config

    def view(self, topic: str) -> TopicView:
        """A topic's chain and settings now. Kept per topic while its rule and the cluster's
        settings are the ones it was made of (at most `_VIEWS_KEPT` names: clients choose them),
        so a request costs two lookups per topic, not a new view."""
        rule = self.routing.rule_for(topic)
        if self._learned is not None:
            learned = self._learned(topic)
        else:
            compacted = self._compacted(topic)
            learned = UNKNOWN_TOPIC_CONFIG if compacted is None else TopicConfig(compacted)
        kept = self._views.get(topic)
        if kept is not None and kept[0] is rule and kept[1] is learned:
            return kept[2]
        view = TopicView(rule.chain, _yaml_over_cluster(rule.config, learned))
        if kept is None and len(self._views) >= _VIEWS_KEPT:
            del self._views[next(iter(self._views))]  # the oldest name
        self._views[topic] = (rule, learned, view)
        return view

    def decide(
        self,
        frame: Frame,
        request: Request,
        now_ms: int | None = None,
        allowance: Allowance | None = None,
        topics: Mapping[str, TopicView] | None = None,
        *,
        schemas: SchemaCatalog | None = None,
    ) -> ProduceDecision:
        """Every partition's outcome and what goes upstream.

        Decoding memory is counted in `allowance` and given back partition by partition, so a
        request holds at most one partition's decoded records at a time. A partition that would
        need more than the allowance has is answered MESSAGE_TOO_LARGE; an inline allowance that
        runs out raises `InlineLimitReached` (nothing is decided: the caller decides again with
        a larger allowance, off the event loop). `topics` (from `topic_view`) replaces every
        lookup of a topic's chain and settings: a decision made off the loop needs it. `schemas`
        is what the registry said about the ids the checks read, looked up before
        (`kvproxy.proxy.lookups.schema_ids`).
        """
        header, body = request.header, request.body
        version = header.api_version
        if version >= FIRST_WITH_TOPIC_IDS and topic_ids_of(request):
            raise DecodeError(f"Produce v{version} decided before its topic ids were named")
        if allowance is not None and allowance.inline:
            named = sum(len(topic_data.partition_data) for topic_data in body.topic_data)
            if named > self.settings.inline_max_partitions:
                raise InlineLimitReached(f"the request names {named} partitions")
        now = int(time.time() * 1000) if now_ms is None else now_ms
        acks = int(body.acks)
        transactional_id = getattr(body, "transactional_id", None)
        bad_acks = None if acks in _VALID_ACKS else _bad_acks(acks)
        # First every partition's batch headers (no record decoded), then the record limit,
        # then the policies, which decode records only when one of them needs to.
        parsed = []
        views: dict[str, TopicView] = {}  # each topic's chain and settings, looked up once
        for topic_data in body.topic_data:
            name = topic_name(topic_data)
            if is_unknown_id(topic_data):  # v13: an id the cluster does not know
                parsed.append((name, _unknown_topic_id(topic_data)))
                continue
            view = views.get(name)
            if view is None:
                view = views[name] = self._view(name, topics)
            config = view.config
            partitions: list[tuple[int, bytes | memoryview, ProducedRecords | Verdict]] = []
            for data in topic_data.partition_data:
                index = int(data.index)
                if bad_acks is not None:
                    partitions.append((index, b"", bad_acks))
                    continue
                raw = data.records if data.records is not None else b""
                produced = parse_records(
                    name,
                    index,
                    raw,
                    produce_version=version,
                    acks=acks,
                    transactional_id=transactional_id,
                    compacted=config.compacted,
                    now_ms=now,
                    allowance=allowance,
                    topic_config=config,
                    schemas=schemas,
                    parsed_by=view.chain.parsed_by,
                )
                partitions.append((index, raw, produced))
            parsed.append((name, partitions))
        if transactional_id is None and has_transactional_records(body, parsed):
            parsed = refuse_every_partition(body, _NO_TRANSACTIONAL_ID_VERDICT)
        declared = declared_records(parsed)
        if (
            allowance is not None
            and allowance.inline
            and declared > self.settings.inline_max_records
        ):
            raise InlineLimitReached(f"the request declares {declared} records")
        limit = self.settings.max_records_per_request
        too_many = None if limit is None or declared <= limit else too_many_records(declared, limit)
        topics_out: list[tuple[str, tuple[PartitionOutcome, ...]]] = []
        if too_many is not None:
            for name, partitions in parsed:
                topics_out.append(
                    (
                        name,
                        tuple(
                            PartitionOutcome(
                                name,
                                index,
                                p if isinstance(p, Verdict) else too_many,
                                enforced=True,
                                raw=raw,
                            )
                            for index, raw, p in partitions
                        ),
                    )
                )
        observing: list[tuple[str, PolicyChain]] = []
        if too_many is None:
            for name, partitions in parsed:
                if name not in views:  # an unknown topic id: answered without a chain
                    topics_out.append((name, _verdicts(name, partitions)))
                    continue
                chain = views[name].chain
                if chain.observers:
                    observing.append((name, chain))
                topics_out.append(
                    (
                        name,
                        tuple(
                            [
                                self._judge(chain, name, index, raw, p)
                                for index, raw, p in partitions
                            ]
                        ),
                    )
                )
        decision = ProduceDecision(version, header.correlation_id, acks, tuple(topics_out))
        if version >= FIRST_WITH_TOPIC_IDS:
            decision.topic_ids = tuple(t.topic_id for t in body.topic_data)
        decision.forward = self._forward(frame, request, decision)
        decision.observing = tuple(observing)
        many = len(decision.outcomes) > self.settings.inline_max_partitions  # decided off loop
        if many and decision.forward is None and acks != 0:
            decision.written = self.answers.answer(decision, None)
        return decision

    def topic_view(self, request: Request) -> dict[str, TopicView]:
        """Each topic's chain and settings now, for `decide(topics=...)`."""
        return {
            topic_name(topic): self.view(topic_name(topic))
            for topic in request.body.topic_data
            if not is_unknown_id(topic)
        }

    def _view(self, topic: str, topics: Mapping[str, TopicView] | None) -> TopicView:
        return self.view(topic) if topics is None else topics[topic]

    def _judge(
        self,
        chain: PolicyChain,
        topic: str,
        index: int,
        raw: bytes | memoryview,
        parsed: ProducedRecords | Verdict,
    ) -> PartitionOutcome:
        """The partition's outcome: its chain's verdict on the batch views read."""
        if isinstance(parsed, Verdict):  # malformed or bad acks: never forwarded, whatever the mode
            return PartitionOutcome(topic, index, parsed, enforced=True, raw=raw)
        if chain.mode is Mode.OFF:
            return PartitionOutcome(topic, index, ACCEPT, enforced=True, produced=parsed, raw=raw)
        try:
            verdict = chain.check(parsed)
        except BudgetExhausted as exc:  # MESSAGE_TOO_LARGE; RetryLater: NOT_ENOUGH_REPLICAS
            verdict = Verdict(
                code=exc.error_code,
                message=f"Records in topic partition {parsed.topic_partition} not checked: {exc}",
                policy=DECODE_BUDGET,
                resend=isinstance(exc, RetryLater),
            )
            return PartitionOutcome(topic, index, verdict, enforced=True, produced=parsed, raw=raw)
        finally:
            parsed.release()  # what decoding held goes back before the next partition
        enforced = chain.mode is Mode.ENFORCE
        return PartitionOutcome(topic, index, verdict, enforced, produced=parsed, raw=raw)

    def _forward(self, frame: Frame, request: Request, decision: ProduceDecision) -> Frame | None:
        rejected = decision.rejected
        if not rejected:
            return frame
        if self.settings.reject_request:
            return None
        refused = {(o.topic, o.index) for o in rejected}
        kept_topics = []
        for topic_data in request.body.topic_data:
            name = topic_name(topic_data)
            kept = tuple(
                data for data in topic_data.partition_data if (name, int(data.index)) not in refused
            )
            if kept:
                kept_topics.append(dataclasses.replace(topic_data, partition_data=kept))
        if not kept_topics:
            return None
        body = dataclasses.replace(request.body, topic_data=tuple(kept_topics))
        return encode_request(as_sent(Request(request.header, body)))
