"""The fast accept's invariant, asked of one request: when the compiled pass accepts it, the
Python path accepts every partition and forwards the request unchanged, with the same counts."""

from __future__ import annotations

from kvproxy.protocol.fast_accept import Accepted
from kvproxy.protocol.messages import decode_request
from kvproxy.protocol.produce_topics import FIRST_WITH_TOPIC_IDS, name_topics
from kvproxy.proxy.produce.decision import ProduceDecision
from kvproxy.proxy.produce.engine import ProduceEngine

__all__ = ["counts_of", "holds_invariant"]


def counts_of(decision: ProduceDecision) -> tuple[tuple[str, int, int], ...]:
    """Each topic's (name, batches, records) as the Python path counts them."""
    return tuple(
        (
            name,
            sum(len(o.produced.batches) for o in outcomes if o.produced is not None),
            sum(
                sum(b.counted_records for b in o.produced.batches)
                for o in outcomes
                if o.produced is not None
            ),
        )
        for name, outcomes in decision.topics
    )


def holds_invariant(
    engine: ProduceEngine, frame: bytes, now_ms: int, *, named: dict[object, str] | None = None
) -> Accepted | None:
    """The compiled answer for `frame`; when it accepts, the Python decision at the same clock
    must accept it whole, forward it as it is, and count what the compiled pass counted.
    `named`: the names of v13 topic ids (as the engine's `topic_named` knows them)."""
    accepted = engine.accept_compiled(frame, now_ms=now_ms)
    if accepted is None:
        return None
    request = decode_request(frame)
    if request.header.api_version >= FIRST_WITH_TOPIC_IDS:
        request = name_topics(request, (named or {}).get)
    decision = engine.decide(frame, request, now_ms=now_ms)
    assert not decision.rejected, [o.verdict for o in decision.rejected]
    assert not decision.warned, [o.verdict for o in decision.warned]
    assert decision.forward is frame
    assert (decision.api_version, decision.correlation_id, decision.acks) == accepted[:3]
    assert counts_of(decision) == accepted[3]
    return accepted
