"""Produce helpers: what the relay must know before deciding, and answers built by the proxy."""

from __future__ import annotations

import dataclasses
import datetime
import typing
import uuid
from dataclasses import dataclass
from functools import cache
from typing import Any, cast

from kio.schema.errors import ErrorCode
from kio.schema.types import TopicName
from kio.static.primitive import i32, i32Timedelta, i64

from kvproxy.protocol.messages import PRODUCE, codec_for
from kvproxy.protocol.schema_reader import UnknownErrorCode


@dataclass(frozen=True, slots=True)
class ProduceResponseTypes:
    """The schema classes of one Produce response version (kio's, or the legacy ones)."""

    response: type
    topic: type
    partition: type
    record_error: type | None  # v8+: BatchIndexAndErrorMessage
    by_id: bool = False
    """v13+: topics are named by id."""


@cache
def produce_response_types(api_version: int) -> ProduceResponseTypes:
    response = codec_for(PRODUCE, api_version).response_type
    fields = {f.name: f for f in dataclasses.fields(response)}
    topic = _element_type(fields["responses"].type)
    partition_fields = {f.name: f for f in dataclasses.fields(topic)}
    partition = _element_type(partition_fields["partition_responses"].type)
    record_error = None
    own = {f.name: f for f in dataclasses.fields(partition)}
    if "record_errors" in own:
        record_error = _element_type(own["record_errors"].type)
    return ProduceResponseTypes(
        response, topic, partition, record_error, "topic_id" in partition_fields
    )


def _element_type(annotation: Any) -> type:
    """`tuple[X, ...]` -> X."""
    (element, _ellipsis) = typing.get_args(annotation)
    return cast(type, element)


def partition_answer(
    types: ProduceResponseTypes,
    index: int,
    error_code: int,
    *,
    message: str | None = None,
    record_errors: tuple[tuple[int, str | None], ...] = (),
) -> Any:
    """A partition's answer in the given version: v8+ carry the message and record errors."""
    values: dict[str, Any] = {
        "index": i32(index),
        "error_code": _error_code(error_code),
        "base_offset": i64(-1),
    }
    own = {f.name for f in dataclasses.fields(types.partition)}
    if types.record_error is not None:
        values["record_errors"] = tuple(
            types.record_error(batch_index=i32(i), batch_index_error_message=text)
            for i, text in record_errors
        )
        values["error_message"] = message
    return types.partition(**{k: v for k, v in values.items() if k in own})


def produce_answer(
    types: ProduceResponseTypes, topics: list[tuple[str | uuid.UUID | None, list[Any]]]
) -> Any:
    """A whole Produce response body from (topic, [partition answers]) in request order; a
    topic is its name, or from v13 its id."""
    by_id = types.by_id
    responses = tuple(
        types.topic(topic_id=topic, partition_responses=tuple(partitions))
        if by_id
        else types.topic(name=TopicName(str(topic)), partition_responses=tuple(partitions))
        for topic, partitions in topics
    )
    own = {f.name for f in dataclasses.fields(types.response)}
    values: dict[str, Any] = {"responses": responses}
    if "throttle_time" in own:
        values["throttle_time"] = i32Timedelta.parse(datetime.timedelta(0))
    return types.response(**values)


def _error_code(code: int) -> Any:
    try:
        return ErrorCode(code)
    except ValueError:
        return UnknownErrorCode(code)
