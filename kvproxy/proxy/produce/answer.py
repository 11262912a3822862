"""The client's answer to a decided Produce request: the local refusals merged with the broker's
answer in request order, each refusal in the code its Produce version knows; and the broker's
answer shown to the policies that observe it."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, cast

from kvproxy.policies.api import Verdict
from kvproxy.protocol import error_codes
from kvproxy.protocol.framing import Frame
from kvproxy.protocol.messages import (
    PRODUCE,
    Response,
    decode_response,
    encode_response,
    make_response,
)
from kvproxy.protocol.produce import partition_answer, produce_answer, produce_response_types
from kvproxy.proxy.produce.decision import PartitionOutcome, ProduceDecision, ProduceSettings
from kvproxy.proxy.produce.request_scan import ANSWERED_AS_THEY_ARE
from kvproxy.settings.errors import profile_code


def _topic_keys(decision: ProduceDecision) -> tuple[str | uuid.UUID | None, ...]:
    """What the answer names each of the decision's topics by: its name, or (v13) its id."""
    if decision.topic_ids:
        return decision.topic_ids
    return tuple(name for name, _ in decision.topics)


def _answer_key(topic: Any) -> str | uuid.UUID | None:
    """What a topic of the broker's answer is named by: its id from v13, else its name."""
    if hasattr(topic, "topic_id"):
        return cast("uuid.UUID | None", topic.topic_id)
    return str(topic.name)


__all__ = ["ANOTHER_PARTITION", "ProduceAnswers"]

ANOTHER_PARTITION = (
    "Invalid record in another topic-partition caused the whole request to be rejected"
)


class ProduceAnswers:
    """Builds the answers of the requests one `ProduceEngine` decided, under its settings."""

    def __init__(self, settings: ProduceSettings) -> None:
        self.settings = settings

    def observe(self, decision: ProduceDecision, upstream: Frame) -> None:
        """Show each observing chain the broker's answer to the partitions it let through."""
        if not decision.observing:  # the answer is decoded only when some policy observes it
            return
        chains = dict(decision.observing)
        keys = _topic_keys(decision)
        passed = [
            (outcome, chains[name], key)
            for (name, outcomes), key in zip(decision.topics, keys, strict=True)
            if name in chains
            for outcome in outcomes
            if not outcome.rejected
            and outcome.produced is not None
            and chains[name].wants_answer(outcome.produced)
        ]
        if not passed:
            return
        body = decode_response(upstream, PRODUCE, decision.api_version).body
        codes = {
            (_answer_key(topic), int(partition.index)): int(partition.error_code)
            for topic in body.responses
            for partition in topic.partition_responses
        }
        for outcome, chain, key in passed:
            code = codes.get((key, outcome.index))
            if code is not None and outcome.produced is not None:
                chain.observe(outcome.produced, code)

    def answer(self, decision: ProduceDecision, upstream: Frame | None) -> bytes:
        """The client's answer: local errors merged with the broker's answer, in request order
        (written already when the request was decided off the loop and answered locally)."""
        if upstream is None and decision.written is not None:
            return decision.written
        version = decision.api_version
        types = produce_response_types(version)
        ids = decision.topic_ids
        by_id = bool(ids)  # v13: the answer names topics by id
        broker_partitions: dict[tuple[str | uuid.UUID | None, int], Any] = {}
        upstream_body = None
        if upstream is not None:
            upstream_body = decode_response(upstream, PRODUCE, version).body
            for topic in upstream_body.responses:
                key = topic.topic_id if by_id else str(topic.name)
                for partition in topic.partition_responses:
                    broker_partitions[(key, int(partition.index))] = partition
        any_rejected = bool(decision.rejected)
        topics: list[tuple[str | uuid.UUID | None, list[Any]]] = []
        for position, (name, outcomes) in enumerate(decision.topics):
            key = ids[position] if by_id else name
            answers = []
            for outcome in outcomes:
                if outcome.rejected:
                    answers.append(self._local(types, outcome, version))
                elif self.settings.reject_request and any_rejected:
                    answers.append(
                        self._local(
                            types,
                            dataclasses.replace(
                                outcome,
                                verdict=Verdict(
                                    code=error_codes.INVALID_RECORD, message=ANOTHER_PARTITION
                                ),
                            ),
                            version,
                        )
                    )
                else:
                    broker = broker_partitions.get((key, outcome.index))
                    if broker is None:
                        broker = partition_answer(
                            types, outcome.index, error_codes.UNKNOWN_SERVER_ERROR
                        )
                    answers.append(broker)
            topics.append((key, answers))
        local_body = produce_answer(types, topics)
        if upstream_body is not None:
            local_body = dataclasses.replace(upstream_body, responses=local_body.responses)
        response: Response = make_response(PRODUCE, version, decision.correlation_id, local_body)
        return encode_response(PRODUCE, version, response)

    def _local(self, types: Any, outcome: PartitionOutcome, version: int) -> Any:
        verdict = outcome.verdict
        code = self.code(verdict, version)
        record_errors = tuple((e.index, e.message) for e in verdict.record_errors)
        message = None if verdict.code_only else verdict.message
        return partition_answer(
            types, outcome.index, code, message=message, record_errors=record_errors
        )

    def code(self, verdict: Verdict, version: int) -> int:
        """The code a client of this Produce version receives for `verdict` (`errors` in
        docs/configuration.md)."""
        code = profile_code(self.settings.profile, verdict)
        if (
            version < self.settings.legacy_below
            and code not in ANSWERED_AS_THEY_ARE
            and not verdict.any_version
        ):
            code = self.settings.legacy_code
        return code
