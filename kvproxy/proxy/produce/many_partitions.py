"""Produce requests naming many partitions: read and decided off the event loop, and refused as
a whole past `limits.max_partitions_per_request`.

Every partition costs work to decode, check and answer, even one with no records (about 30 us
each: a million of them held the loop for 47 s). So a request naming more partitions than the
loop decides (`ProduceSettings.inline_max_partitions`) is decoded and decided on the decoding
thread; on the loop only its first partitions are read (`read_unless_many`: a request of fewer
is decoded in that same reading). A request naming more
than the limit is never decoded: every partition is answered MESSAGE_TOO_LARGE (10), the answer
written straight to bytes (`kvproxy.protocol.produce_shape`), as the records limit answers.
"""

from __future__ import annotations

import sys

from kvproxy.policies.api import Verdict
from kvproxy.protocol import error_codes
from kvproxy.protocol.errors import DecodeError, ProtocolError
from kvproxy.protocol.messages import Request
from kvproxy.protocol.produce_shape import ProduceShape, refusal_answer
from kvproxy.protocol.request_view import RequestView
from kvproxy.proxy.produce.decision import PartitionOutcome, ProduceDecision
from kvproxy.proxy.produce.engine import ProduceEngine

__all__ = [
    "PARTITIONS_LIMIT",
    "WholeRequestRefusal",
    "read_many",
    "read_unless_many",
]

PARTITIONS_LIMIT = "max_partitions_per_request"
"""`Verdict.policy` of a request refused for naming too many partitions (`limits`)."""
_MAX_PARTITION_ANSWER_BYTES = 36
"""The most one partition's entry of a refusal answer takes (Produce v8: index, code, three
offsets and times, no record errors, no message)."""
_MIN_PARTITION_BYTES = 6
"""The fewest bytes one partition takes in a request (flexible versions: index, null records,
no tagged fields): a request of fewer bytes than this many per partition needs no count."""


class AnswerTooLarge(DecodeError):
    """A request whose refusal answer would not fit in a frame: the connection is closed."""


class WholeRequestRefusal(ProduceDecision):
    """A request refused before it was decoded: one outcome stands for all its partitions (one
    rejection logged and counted, nothing kept: no record was read and the client was told none
    was written); its answer, naming every partition, is `written` beforehand (acks=0: none,
    the connection is closed)."""

    __slots__ = ()


def read_unless_many(view: RequestView, inline_max_partitions: int) -> Request | None:
    """The request decoded when it names at most `inline_max_partitions` partitions (the most
    decided on the loop); None when it names more. Read once (`RequestView.read_produce`); a
    request that reader leaves to the codec is counted first, then decoded (malformed:
    `DecodeError`)."""
    request = view.read_produce(inline_max_partitions)
    if request is not None or names_many_partitions(view, inline_max_partitions):
        return request
    return view.decode()


def names_many_partitions(view: RequestView, inline_max_partitions: int) -> bool:
    """Whether the request names more partitions than are decided on the loop. Reads at most
    that many partitions' fields; bytes that are not a Produce request v0-v12 answer False
    (the codec reads them and answers as it always has)."""
    if len(view.frame) <= inline_max_partitions * _MIN_PARTITION_BYTES:
        return False
    try:
        return not view.shape(inline_max_partitions).complete
    except ProtocolError:
        return False


def read_many(
    view: RequestView, engine: ProduceEngine, limit: int, max_answer: int
) -> WholeRequestRefusal | Request:
    """A request `read_unless_many` found naming many partitions, read on the decoding thread:
    its partitions counted, then refused as a whole past `limit`, or else decoded (and then
    decided as any other). A `ProtocolError` for bytes that are not a request, as the codec
    raises."""
    try:
        counted = view.shape(limit)
    except ProtocolError:
        return view.decode()  # the codec says what is wrong with it
    if counted.complete:
        return view.decode()
    return refuse(engine, view, counted, limit, max_answer)


def refuse(
    engine: ProduceEngine, view: RequestView, counted: ProduceShape, limit: int, max_answer: int
) -> WholeRequestRefusal:
    """The refusal of a request naming more than `limit` partitions (`counted` stopped past it):
    MESSAGE_TOO_LARGE for every partition, on every Produce version (as the records limit);
    the message, naming the count and the setting, goes with the first partition only.

    An answer that would be larger than `limits.max_frame_bytes` (about 2.9 million partitions
    with the default) is not written: `AnswerTooLarge`, the connection is closed as for a frame over
    that limit."""
    message = (
        f"The request names {counted.partitions} or more partitions, more than the proxy "
        f"accepts in one request ({limit}, limits.{PARTITIONS_LIMIT})"
    )
    verdict = Verdict(
        code=error_codes.MESSAGE_TOO_LARGE,
        message=message,
        policy=PARTITIONS_LIMIT,
        resend=True,
        any_version=True,
    )
    written = b""
    first_topic, first_index = counted.first_topic, -1
    if counted.acks != 0:  # acks=0: nothing is answered, the connection is closed
        if counted.partitions * _MAX_PARTITION_ANSWER_BYTES > max_answer:
            raise AnswerTooLarge(
                f"the request names {counted.partitions} or more partitions: the answer would "
                f"be larger than limits.max_frame_bytes ({max_answer})"
            )
        shape = view.shape(sys.maxsize, indexes=True)
        written = refusal_answer(shape, error_codes.MESSAGE_TOO_LARGE, message)
        if shape.topics and shape.topics[0][1]:
            first_topic, first_index = shape.topics[0][0], shape.topics[0][1][0]
    outcome = PartitionOutcome(first_topic, first_index, verdict, enforced=True)
    refusal = WholeRequestRefusal(
        counted.api_version,
        counted.correlation_id,
        counted.acks,
        ((first_topic, (outcome,)),),
    )
    refusal.written = written
    return refusal
