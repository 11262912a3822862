"""kvproxy.proxy.cluster.rewrite for share groups (KIP-932): ShareFetch and ShareAcknowledge
answers name
the current leaders of partitions answered NOT_LEADER_OR_FOLLOWER (`node_endpoints`), which a
share consumer connects to; they must be proxy addresses, as Fetch v16+'s are."""

from __future__ import annotations

import datetime
import importlib
import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i32Timedelta, i64

from kvproxy.protocol.messages import (
    SHARE_ACKNOWLEDGE,
    SHARE_FETCH,
    decode_response,
    encode_response,
    make_response,
)
from kvproxy.proxy.cluster.rewrite import proxy_addresses, rewrite_response, sni_addresses

ZERO = i32Timedelta.parse(datetime.timedelta(0))
NOT_LEADER = ErrorCode(6)
ADDRESSES = proxy_addresses("proxy.example", lambda node_id: 30_000 + node_id)


def _module(api: str, version: int) -> Any:
    return importlib.import_module(f"kio.schema.{api}.v{version}.response")


def _share_fetch(version: int, endpoints: tuple[tuple[int, str, int], ...]) -> Any:
    m = _module("share_fetch", version)
    partition = m.PartitionData(
        partition_index=i32(1),
        error_code=NOT_LEADER,
        acknowledge_error_code=i16(0),
        current_leader=m.LeaderIdAndEpoch(leader_id=i32(2), leader_epoch=i32(7)),
        records=b"",
        acquired_records=(
            m.AcquiredRecords(first_offset=i64(0), last_offset=i64(4), delivery_count=i16(1)),
        ),
    )
    return m.ShareFetchResponse(
        throttle_time=ZERO,
        error_code=ErrorCode(0),
        acquisition_lock_timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        responses=(
            m.ShareFetchableTopicResponse(topic_id=uuid.UUID(int=5), partitions=(partition,)),
        ),
        node_endpoints=tuple(
            m.NodeEndpoint(node_id=i32(n), host=h, port=i32(p), rack=None) for n, h, p in endpoints
        ),
    )


def _share_acknowledge(version: int, endpoints: tuple[tuple[int, str, int], ...]) -> Any:
    m = _module("share_acknowledge", version)
    partition = m.PartitionData(
        partition_index=i32(0),
        error_code=NOT_LEADER,
        current_leader=m.LeaderIdAndEpoch(leader_id=i32(3), leader_epoch=i32(1)),
    )
    extra = {}
    if "acquisition_lock_timeout" in m.ShareAcknowledgeResponse.__dataclass_fields__:  # v2
        extra["acquisition_lock_timeout"] = i32Timedelta.parse(datetime.timedelta(seconds=30))
    return m.ShareAcknowledgeResponse(
        **extra,
        throttle_time=ZERO,
        error_code=ErrorCode(0),
        responses=(
            m.ShareAcknowledgeTopicResponse(topic_id=uuid.UUID(int=5), partitions=(partition,)),
        ),
        node_endpoints=tuple(
            m.NodeEndpoint(node_id=i32(n), host=h, port=i32(p), rack="r1") for n, h, p in endpoints
        ),
    )


def _fields(body: Any) -> dict[str, Any]:
    return {
        name: getattr(body, name) for name in body.__dataclass_fields__ if name != "node_endpoints"
    }


BUILDERS = [
    pytest.param(SHARE_FETCH, _share_fetch, 1, id="ShareFetch-v1"),
    pytest.param(SHARE_FETCH, _share_fetch, 2, id="ShareFetch-v2"),
    pytest.param(SHARE_ACKNOWLEDGE, _share_acknowledge, 1, id="ShareAcknowledge-v1"),
    pytest.param(SHARE_ACKNOWLEDGE, _share_acknowledge, 2, id="ShareAcknowledge-v2"),
]


@pytest.mark.parametrize(("api_key", "build", "version"), BUILDERS)
def test_share_answers_name_the_leaders_by_proxy_address(
    api_key: int, build: Any, version: int
) -> None:
    body = build(version, ((2, "kafka-2.internal", 9092), (3, "kafka-3.internal", 9092)))
    frame = encode_response(api_key, version, make_response(api_key, version, 11, body))
    out, learned = rewrite_response(frame, api_key, version, ADDRESSES)
    decoded = decode_response(out, api_key, version)
    assert decoded.header.correlation_id == 11
    assert [(e.node_id, e.host, e.port) for e in decoded.body.node_endpoints] == [
        (2, "proxy.example", 30_002),
        (3, "proxy.example", 30_003),
    ]
    assert _fields(decoded.body) == _fields(body)  # records, acquired ranges and errors as sent
    assert learned == {2: ("kafka-2.internal", 9092), 3: ("kafka-3.internal", 9092)}


@pytest.mark.parametrize(("api_key", "build", "version"), BUILDERS)
def test_share_answers_through_the_sni_listener_name_each_broker_by_its_server_name(
    api_key: int, build: Any, version: int
) -> None:
    addresses = sni_addresses(lambda node_id: f"broker-{node_id}.kafka.example", lambda: 9443)
    body = build(version, ((2, "10.0.0.2", 9092),))
    frame = encode_response(api_key, version, make_response(api_key, version, 12, body))
    out, _ = rewrite_response(frame, api_key, version, addresses)
    endpoints = decode_response(out, api_key, version).body.node_endpoints
    assert [(e.host, e.port) for e in endpoints] == [("broker-2.kafka.example", 9443)]


@pytest.mark.parametrize(("api_key", "build", "version"), BUILDERS)
def test_share_answers_naming_no_leader_are_the_same_bytes(
    api_key: int, build: Any, version: int
) -> None:
    frame = encode_response(
        api_key, version, make_response(api_key, version, 13, build(version, ()))
    )
    out, learned = rewrite_response(frame, api_key, version, ADDRESSES)
    assert out is frame
    assert learned == {}
