"""Produce requests through the policies: decide per partition, and what goes upstream.

Everything here is synchronous and free of I/O. A client connection hands each Produce request
to `ProduceDecider` (`kvproxy.proxy.produce.decider`), which gathers what the chains need and
calls
`ProduceEngine.decide` on the event loop or the decoding thread; the connection sends the
decision's `forward` upstream and answers the client with `ProduceAnswers.answer`
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
from typing import Any

from kvproxy.policies.api import (
    ACCEPT,
    ProducedRecords,
    TopicConfig,
    Verdict,
    parse_records,
)
from kvproxy.policies.chain import Mode, PolicyChain
from kvproxy.policies.config import TopicRouting
from kvproxy.policies.schemas.model import SchemaCatalog
from kvproxy.protocol.budget import Allowance, BudgetExhausted, InlineLimitReached
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
from kvproxy.proxy.produce.answer import ProduceAnswers
from kvproxy.proxy.produce.compiled_accept import CompiledAccept
from kvproxy.proxy.produce.decision import PartitionOutcome, ProduceDecision, ProduceSettings
from kvproxy.proxy.produce.request_scan import (
    NO_TRANSACTIONAL_ID_VERDICT,
    UNKNOWN_TOPIC_ID_VERDICT,
    Parsed,
    declared_records,
    has_transactional_records,
    invalid_acks,
    refuse_every_partition,
    too_many_records,
    unchecked,
    unknown_topic_id,
)
from kvproxy.proxy.produce.topic_views import TopicView, TopicViews

_VALID_ACKS = frozenset({-1, 0, 1})


def _refused(
    name: str,
    partitions: list[tuple[int, bytes | memoryview, ProducedRecords | Verdict]],
    verdict: Verdict,
) -> tuple[str, tuple[PartitionOutcome, ...]]:
    """A topic refused whole: each partition its own verdict (unreadable, bad acks, an unknown
    topic id), or `verdict`."""
    return (
        name,
        tuple(
            PartitionOutcome(
                name, index, p if isinstance(p, Verdict) else verdict, enforced=True, raw=raw
            )
            for index, raw, p in partitions
        ),
    )


def _decision(
    request: Request, topics: tuple[tuple[str, tuple[PartitionOutcome, ...]], ...]
) -> ProduceDecision:
    header = request.header
    return ProduceDecision(
        header.api_version, header.correlation_id, int(request.body.acks), topics
    )


class ProduceEngine:
    """Applies the topic routing to Produce requests and builds the answers."""

    def __init__(
        self,
        routing: TopicRouting,
        settings: ProduceSettings,
        compacted: Callable[[str], bool | None],
        learned: Callable[[str], TopicConfig] | None = None,
        topic_named: Callable[[uuid.UUID], str | None] | None = None,
    ) -> None:
        self.routing = routing
        self.settings = settings
        self.answers = ProduceAnswers(settings)
        """Builds the answers of the requests decided here."""
        self.views = TopicViews(routing, compacted, learned)
        """Each topic's chain and settings now (read on the event loop)."""
        self.compiled = CompiledAccept(self.views, settings, topic_named)
        self.accept_compiled = self.compiled.accept
        """The compiled fast accept (`kvproxy.proxy.produce.compiled_accept`): the counts of a
        request every partition of which passes, or None when it is not sure (then `decide`)."""

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
        a larger allowance, off the event loop). `topics` (from `views.of_request`) replaces every
        lookup of a topic's chain and settings: a decision made off the loop needs it. `schemas`
        is what the registry said about the ids the checks read, looked up before
        (`kvproxy.proxy.lookups.schema_ids`).
        """
        version, body = request.header.api_version, request.body
        if version >= FIRST_WITH_TOPIC_IDS and topic_ids_of(request):  # the caller's error
            raise DecodeError(f"Produce v{version} decided before its topic ids were named")
        if allowance is not None and allowance.inline:
            named = sum(len(topic_data.partition_data) for topic_data in body.topic_data)
            if named > self.settings.inline_max_partitions:
                raise InlineLimitReached(f"the request names {named} partitions")
        now = int(time.time() * 1000) if now_ms is None else now_ms
        transactional_id = getattr(body, "transactional_id", None)
        # First every partition's batch headers (no record decoded), then the request's limits,
        # then the policies, which decode records only when one of them needs to.
        parsed, views = self._read(
            request, transactional_id, now, allowance, topics, schemas=schemas
        )
        parsed, refusal = self._whole_request(body, transactional_id, parsed, allowance)
        if refusal is None:
            decision = self._judge_topics(request, parsed, views)
        else:
            decision = _decision(request, tuple(_refused(n, p, refusal) for n, p in parsed))
        return self._routed(frame, request, decision)

    def _read(
        self,
        request: Request,
        transactional_id: str | None,
        now: int,
        allowance: Allowance | None,
        topics: Mapping[str, TopicView] | None,
        *,
        schemas: SchemaCatalog | None,
    ) -> tuple[Parsed, dict[str, TopicView]]:
        """Each partition's batch views (or the verdict that it is unreadable or its acks
        invalid), and each topic's chain and settings, looked up once."""
        body, version = request.body, request.header.api_version
        acks = int(body.acks)
        bad_acks = None if acks in _VALID_ACKS else invalid_acks(acks)
        parsed: Parsed = []
        views: dict[str, TopicView] = {}
        for topic_data in body.topic_data:
            name = topic_name(topic_data)
            if is_unknown_id(topic_data):  # v13: an id the cluster does not know
                parsed.append((name, unknown_topic_id(topic_data)))
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
        return parsed, views

    def _whole_request(
        self, body: Any, transactional_id: str | None, parsed: Parsed, allowance: Allowance | None
    ) -> tuple[Parsed, Verdict | None]:
        """The checks of the request as a whole, before any policy: transactional records
        without a transactional id (every partition refused in their place), then the number
        of records it declares (the verdict every partition gets, or None)."""
        if transactional_id is None and has_transactional_records(body, parsed):
            parsed = refuse_every_partition(body, NO_TRANSACTIONAL_ID_VERDICT)
        declared = declared_records(parsed)
        if (
            allowance is not None
            and allowance.inline
            and declared > self.settings.inline_max_records
        ):
            raise InlineLimitReached(f"the request declares {declared} records")
        limit = self.settings.max_records_per_request
        if limit is None or declared <= limit:
            return parsed, None
        return parsed, too_many_records(declared, limit)

    def _judge_topics(
        self, request: Request, parsed: Parsed, views: Mapping[str, TopicView]
    ) -> ProduceDecision:
        """Each partition through its topic's chain; a partition whose decoding would pass the
        allowance is answered without its records checked, and counted (`unchecked`)."""
        topics: list[tuple[str, tuple[PartitionOutcome, ...]]] = []
        observing: list[tuple[str, PolicyChain]] = []
        not_checked = 0
        for name, partitions in parsed:
            if name not in views:  # an unknown topic id: answered without a chain
                topics.append(_refused(name, partitions, UNKNOWN_TOPIC_ID_VERDICT))
                continue
            chain = views[name].chain
            if chain.observers:
                observing.append((name, chain))
            outcomes = []
            for index, raw, p in partitions:
                try:
                    outcomes.append(self._judge(chain, name, index, raw, p))
                except BudgetExhausted as exc:
                    not_checked += 1
                    produced = p if isinstance(p, ProducedRecords) else None
                    verdict = unchecked(name, index, exc)
                    outcomes.append(
                        PartitionOutcome(name, index, verdict, True, produced=produced, raw=raw)
                    )
            topics.append((name, tuple(outcomes)))
        header = request.header  # built here, not by `_decision`: one call less per request
        decision = ProduceDecision(
            header.api_version, header.correlation_id, int(request.body.acks), tuple(topics)
        )
        if observing:
            decision.observing = tuple(observing)
        decision.unchecked = not_checked
        return decision

    def _routed(self, frame: Frame, request: Request, decision: ProduceDecision) -> ProduceDecision:
        """`decision` with what goes upstream, and the answer written at once when the request
        was decided off the loop and nothing of it goes upstream."""
        version, acks = decision.api_version, decision.acks
        if version >= FIRST_WITH_TOPIC_IDS:
            decision.topic_ids = tuple(t.topic_id for t in request.body.topic_data)
        decision.forward = self._forward(frame, request, decision)
        many = len(decision.outcomes) > self.settings.inline_max_partitions  # decided off loop
        if many and decision.forward is None and acks != 0:
            decision.written = self.answers.answer(decision, None)
        return decision

    def _view(self, topic: str, topics: Mapping[str, TopicView] | None) -> TopicView:
        return self.views.view(topic) if topics is None else topics[topic]

    def _judge(
        self,
        chain: PolicyChain,
        topic: str,
        index: int,
        raw: bytes | memoryview,
        parsed: ProducedRecords | Verdict,
    ) -> PartitionOutcome:
        """The partition's outcome: its chain's verdict on the batch views read (raises
        `BudgetExhausted` when decoding its records would pass the allowance)."""
        if isinstance(parsed, Verdict):  # malformed or bad acks: never forwarded, whatever the mode
            return PartitionOutcome(topic, index, parsed, enforced=True, raw=raw)
        if chain.mode is Mode.OFF:
            return PartitionOutcome(topic, index, ACCEPT, enforced=True, produced=parsed, raw=raw)
        try:
            verdict = chain.check(parsed)
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
