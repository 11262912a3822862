"""Broker answers naming brokers, framed as a broker sends them, and the proxy addresses they are
rewritten to: shared by the rewrite tests."""

from __future__ import annotations

import datetime
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i32Timedelta, i64

from kvproxy.protocol.messages import encode_response, make_response
from kvproxy.proxy.cluster.rewrite import proxy_addresses

PROXY_HOST = "proxy.example"
ZERO = i32Timedelta.parse(datetime.timedelta(0))


def port_for(node_id: int) -> int:
    return 20_000 + node_id


ADDRESSES = proxy_addresses(PROXY_HOST, port_for)


def frame_of(api_key: int, version: int, body: Any, correlation_id: int = 42) -> bytes:
    return encode_response(api_key, version, make_response(api_key, version, correlation_id, body))


def produce_v10_answer(endpoints: tuple[Any, ...]) -> Any:
    from kio.schema.produce.v10.response import (
        PartitionProduceResponse,
        ProduceResponse,
        TopicProduceResponse,
    )

    return ProduceResponse(
        responses=(
            TopicProduceResponse(
                name="orders",
                partition_responses=(
                    PartitionProduceResponse(
                        index=i32(0),
                        error_code=ErrorCode(6),  # NOT_LEADER_OR_FOLLOWER: the new leader is named
                        base_offset=i64(-1),
                        record_errors=(),
                    ),
                ),
            ),
        ),
        throttle_time=ZERO,
        node_endpoints=endpoints,
    )


def fetch_v16_answer(endpoints: tuple[Any, ...]) -> Any:
    import uuid

    from kio.schema.fetch.v16.response import (
        FetchableTopicResponse,
        FetchResponse,
        PartitionData,
    )

    return FetchResponse(
        throttle_time=ZERO,
        error_code=ErrorCode(0),
        responses=(
            FetchableTopicResponse(
                topic_id=uuid.UUID(int=9),
                partitions=(
                    PartitionData(
                        partition_index=i32(0),
                        error_code=ErrorCode(0),
                        high_watermark=i64(5),
                        aborted_transactions=None,
                        records=b"",
                    ),
                ),
            ),
        ),
        node_endpoints=endpoints,
    )
