"""How a refusal is worded and counted is said by its verdict (`Verdict.code_only`,
`Verdict.any_version`, `ProduceDecision.unchecked`), never by the name of the policy that gave
it: a plug-in may be called `topic_id` or `decode_budget` and its refusals are answered and
counted as any other policy's, and the proxy's own refusals keep their wording whatever their
name."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from kvproxy.policies import plugins
from kvproxy.policies.api import PolicyContext, ProducedRecords, Verdict
from kvproxy.policies.config import build_routing
from kvproxy.protocol import error_codes
from kvproxy.protocol.budget import Allowance
from kvproxy.protocol.compression import Codec
from kvproxy.protocol.messages import PRODUCE, decode_request, decode_response
from kvproxy.protocol.records import build_batch
from kvproxy.proxy.produce.decision import ProduceDecision, ProduceSettings
from kvproxy.proxy.produce.engine import ProduceEngine
from tests.harness.engine import TOPIC, answer_of, batch, decide, judged_by
from tests.harness.fuzz import produce_request

HERE = "tests.unit.test_verdict_wording"
NAMES_THE_PROXY_USES = (
    "topic_id",
    "transactional_id",
    "decode_budget",
    "max_records_per_request",
    "max_partitions_per_request",
    "required_acks",
)


class Refuses:
    """A third-party policy refusing every batch with the verdict its options describe."""

    OPTIONS: Mapping[str, Any] = {"code_only": False, "any_version": False}

    def __init__(self, options: Mapping[str, Any]) -> None:
        flags = {flag: True for flag in ("code_only", "any_version") if options.get(flag)}
        self.verdict = Verdict(error_codes.POLICY_VIOLATION, "refused by a plug-in", **flags)

    @classmethod
    def create(cls, context: PolicyContext, options: Mapping[str, Any]) -> Refuses:
        return cls(options)

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        return self.verdict

    def close(self) -> None:
        pass


TARGETS = {
    **plugins.entry_point_targets(),
    "refuses": f"{HERE}:Refuses",
    **{name: f"{HERE}:Refuses" for name in NAMES_THE_PROXY_USES},
}


def engine(*policies: Any, **settings: Any) -> ProduceEngine:
    routing = build_routing(
        None,
        [{"match": TOPIC, "default_policies": "drop", "policies": list(policies)}],
        Path("."),
        policy_targets=TARGETS,
    )
    return ProduceEngine(routing, ProduceSettings(**settings), lambda _: False)


def only_answer(decision: ProduceDecision) -> Any:
    body = decode_response(answer_of(decision, None), PRODUCE, decision.api_version).body
    [partition] = [p for t in body.responses for p in t.partition_responses]
    return partition


@pytest.mark.parametrize("name", NAMES_THE_PROXY_USES)
def test_a_plugin_named_as_a_refusal_of_the_proxy_is_answered_as_any_policy(name: str) -> None:
    """v9: the plug-in's message is sent; v2: the legacy code stands for its code."""
    chosen = engine(name)
    decision = decide(chosen, 9, [(TOPIC, 0, batch(b"v"))])
    assert decision.rejected[0].verdict.policy == name
    answer = only_answer(decision)
    assert int(answer.error_code) == error_codes.POLICY_VIOLATION
    assert answer.error_message == "refused by a plug-in"
    old = only_answer(decide(chosen, 2, [(TOPIC, 0, batch(b"v"))]))
    assert int(old.error_code) == error_codes.CORRUPT_MESSAGE


def test_a_verdict_that_says_code_only_is_answered_without_its_message() -> None:
    decision = decide(engine({"refuses": {"code_only": True}}), 9, [(TOPIC, 0, batch(b"v"))])
    answer = only_answer(decision)
    assert int(answer.error_code) == error_codes.POLICY_VIOLATION
    assert answer.error_message is None
    assert decision.rejected[0].verdict.message == "refused by a plug-in", "kept for the log"


def test_a_verdict_that_says_any_version_keeps_its_code_for_old_clients() -> None:
    decision = decide(engine({"refuses": {"any_version": True}}), 2, [(TOPIC, 0, batch(b"v"))])
    assert int(only_answer(decision).error_code) == error_codes.POLICY_VIOLATION


def test_the_proxys_own_refusals_say_how_they_are_answered() -> None:
    """Transactional records without an id and unknown topic ids: the code alone; the records
    limit: MESSAGE_TOO_LARGE on every version; invalid acks: named apart from the `acks`
    policy, which a topic may also run."""
    transactional = batch(b"v", producer_id=5, producer_epoch=0, is_transactional=True)
    refused = decide(engine("crc"), 9, [(TOPIC, 0, transactional)]).rejected[0].verdict
    assert refused.code_only and refused.policy == "transactional_id"
    limited = decide(engine("crc", max_records_per_request=0), 2, [(TOPIC, 0, batch(b"v"))])
    assert limited.rejected[0].verdict.any_version
    assert int(only_answer(limited).error_code) == error_codes.MESSAGE_TOO_LARGE
    acks = decide(engine("acks"), 9, [(TOPIC, 0, batch(b"v"))], acks=2).rejected[0].verdict
    assert acks.code == error_codes.INVALID_REQUIRED_ACKS
    assert acks.policy == "required_acks"


def test_partitions_not_checked_for_the_decode_budget_are_counted_on_the_decision() -> None:
    """Two partitions whose records would pass the allowance decoded, one that fits: two
    unchecked (the `kvproxy_decode_budget_refusals_total` increment), each MESSAGE_TOO_LARGE on
    every version; a plug-in called `decode_budget` is not counted."""
    big = build_batch([(b"k", b"[" + b"1," * 40_000 + b"1]", None, None)], codec=Codec.ZSTD)
    parts = [(TOPIC, 0, big), (TOPIC, 1, batch(b"[1]")), (TOPIC, 2, big)]
    frame = produce_request(2, 9, parts)
    chosen = engine("json")
    decided = chosen.decide(frame, decode_request(frame), allowance=Allowance(4096))
    decision = judged_by(decided, chosen)
    assert decision.unchecked == 2
    assert [o.index for o in decision.rejected] == [0, 2]
    body = decode_response(answer_of(decision, None), PRODUCE, 2).body
    codes = [int(p.error_code) for t in body.responses for p in t.partition_responses]
    assert (codes[0], codes[2]) == (error_codes.MESSAGE_TOO_LARGE,) * 2
    named = decide(engine("decode_budget"), 9, [(TOPIC, 0, batch(b"v"))])
    assert named.rejected and named.unchecked == 0
