"""kvproxy.protocol.admin: the requests the proxy and the audit make of a cluster, built and read
sans-IO.

The builders' frames decode with kio to what was asked, at every version a caller may pick; the
proxy's fixed versions encode byte for byte as the requests it built by hand before; the parsers
read answers kio encoded.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8, i32, i32Timedelta, i64

from kvproxy.protocol import admin
from kvproxy.protocol.errors import UnsupportedVersion
from kvproxy.protocol.messages import (
    DESCRIBE_CONFIGS,
    FETCH,
    LIST_OFFSETS,
    METADATA,
    codec_for,
    decode_request,
    decode_response,
    encode_response,
    make_response,
    supported_versions,
)


def decoded(api_key: int, version: int, body: Any) -> Any:
    """The body kio reads back from the frame the builder's body makes."""
    frame = admin.request_frame(api_key, version, 7, "kvproxy-test", body)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    request = decode_request(frame[4:])
    header = request.header
    assert (header.api_key, header.api_version, header.correlation_id) == (api_key, version, 7)
    assert header.client_id == "kvproxy-test"
    return request.body


def answered(api_key: int, version: int, body: Any) -> Any:
    """`body` as a broker's answer: encoded by kio and decoded again."""
    payload = encode_response(api_key, version, make_response(api_key, version, 7, body))
    return decode_response(payload, api_key, version).body


def versions(api_key: int, low: int, high: int) -> list[int]:
    return [v for v in supported_versions(api_key) if low <= v <= high]


# ---- builders: what kio reads back ----


def test_metadata_asks_for_the_topics_without_creating_them() -> None:
    for version in versions(METADATA, 1, 12):
        body = decoded(METADATA, version, admin.metadata_request(version, ["orders", "pay"]))
        assert [str(t.name) for t in body.topics] == ["orders", "pay"]
        if version >= 4:
            assert body.allow_auto_topic_creation is False
        assert decoded(METADATA, version, admin.metadata_request(version, None)).topics is None
        assert decoded(METADATA, version, admin.metadata_request(version, ())).topics == ()


def test_describe_configs_asks_every_key_of_each_topic() -> None:
    for version in versions(DESCRIBE_CONFIGS, 1, 4):
        body = decoded(
            DESCRIBE_CONFIGS, version, admin.describe_configs_request(version, ["a", "b"])
        )
        assert [(int(r.resource_type), r.resource_name) for r in body.resources] == [
            (admin.TOPIC_RESOURCE, "a"),
            (admin.TOPIC_RESOURCE, "b"),
        ]
        assert all(r.configuration_keys is None for r in body.resources)
        assert body.include_synonyms is False


def test_list_offsets_asks_each_partition_at_its_time() -> None:
    times = {0: admin.EARLIEST, 3: admin.LATEST, 5: 1_700_000_000_000}
    for version in versions(LIST_OFFSETS, 1, 11):
        body = decoded(
            LIST_OFFSETS, version, admin.list_offsets_request(version, "t", times, timeout_s=2)
        )
        assert int(body.replica_id) == -1
        [topic] = body.topics
        assert str(topic.name) == "t"
        assert {int(p.partition_index): int(p.timestamp) for p in topic.partitions} == times


def test_fetch_asks_each_partition_from_its_offset() -> None:
    offsets = {0: 0, 2: 41, 7: 2**40}
    for version in versions(FETCH, 4, 12):
        body = decoded(
            FETCH,
            version,
            admin.fetch_request(
                version, "t", offsets, max_bytes=1000, min_bytes=0, max_wait_ms=100
            ),
        )
        assert (int(body.min_bytes), int(body.max_bytes)) == (0, 1000)
        assert body.max_wait == datetime.timedelta(milliseconds=100)
        assert int(body.isolation_level) == admin.READ_UNCOMMITTED
        [topic] = body.topics
        assert str(topic.topic) == "t"
        assert {int(p.partition): int(p.fetch_offset) for p in topic.partitions} == offsets
        assert {int(p.partition_max_bytes) for p in topic.partitions} == {1000}
        if version >= 7:
            assert (int(body.session_id), int(body.session_epoch)) == (0, -1)


@given(
    topic=st.text(alphabet="abcxyz._-0123456789", min_size=1, max_size=249),
    offsets=st.dictionaries(
        st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1), min_size=1, max_size=20
    ),
    version=st.sampled_from(versions(FETCH, 4, 12)),
)
def test_fetch_round_trips(topic: str, offsets: dict[int, int], version: int) -> None:
    body = decoded(
        FETCH, version, admin.fetch_request(version, topic, offsets, max_bytes=1, max_wait_ms=1)
    )
    [asked] = body.topics
    assert str(asked.topic) == topic
    assert {int(p.partition): int(p.fetch_offset) for p in asked.partitions} == offsets


# ---- the proxy's fixed versions: the same bytes as its hand-built requests ----


def same_frame(api_key: int, version: int, built: Any, by_hand: Any) -> None:
    assert admin.request_frame(api_key, version, 1, "kvproxy", built) == admin.request_frame(
        api_key, version, 1, "kvproxy", by_hand
    )


def test_the_proxy_requests_are_unchanged_on_the_wire() -> None:
    from kio.schema.describe_configs.v1.request import (
        DescribeConfigsRequest,
        DescribeConfigsResource,
    )
    from kio.schema.fetch.v4.request import FetchPartition, FetchRequest, FetchTopic
    from kio.schema.list_offsets.v1.request import (
        ListOffsetsPartition,
        ListOffsetsRequest,
        ListOffsetsTopic,
    )
    from kio.schema.metadata.v1.request import MetadataRequest
    from kio.schema.metadata.v4.request import MetadataRequest as MetadataRequestV4
    from kio.schema.metadata.v4.request import MetadataRequestTopic
    from kio.schema.types import BrokerId, TopicName

    same_frame(METADATA, 1, admin.metadata_request(1, ()), MetadataRequest(topics=()))
    same_frame(METADATA, 1, admin.metadata_request(1, None), MetadataRequest(topics=None))
    same_frame(
        METADATA,
        4,
        admin.metadata_request(4, ["a", "b"]),
        MetadataRequestV4(
            topics=(
                MetadataRequestTopic(name=TopicName("a")),
                MetadataRequestTopic(name=TopicName("b")),
            ),
            allow_auto_topic_creation=False,
        ),
    )
    same_frame(
        DESCRIBE_CONFIGS,
        1,
        admin.describe_configs_request(1, ["a"]),
        DescribeConfigsRequest(
            resources=(
                DescribeConfigsResource(
                    resource_type=i8(2), resource_name="a", configuration_keys=None
                ),
            ),
            include_synonyms=False,
        ),
    )
    same_frame(
        LIST_OFFSETS,
        1,
        admin.list_offsets_request(1, "a", {3: 1234}, timeout_s=10),
        ListOffsetsRequest(
            replica_id=BrokerId(-1),
            topics=(
                ListOffsetsTopic(
                    name=TopicName("a"),
                    partitions=(ListOffsetsPartition(partition_index=i32(3), timestamp=i64(1234)),),
                ),
            ),
        ),
    )
    same_frame(
        FETCH,
        4,
        admin.fetch_request(4, "a", {3: 99}, max_bytes=5000, min_bytes=0, max_wait_ms=100),
        FetchRequest(
            max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=100)),
            min_bytes=i32(0),
            max_bytes=i32(5000),
            isolation_level=i8(0),
            topics=(
                FetchTopic(
                    topic=TopicName("a"),
                    partitions=(
                        FetchPartition(
                            partition=i32(3), fetch_offset=i64(99), partition_max_bytes=i32(5000)
                        ),
                    ),
                ),
            ),
        ),
    )


# ---- parsers: answers as kio encodes them ----


def test_brokers_are_read_from_a_metadata_answer() -> None:
    from kio.schema.metadata.v4.response import MetadataResponse, MetadataResponseBroker
    from kio.schema.types import BrokerId

    answer = MetadataResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        brokers=(
            MetadataResponseBroker(node_id=BrokerId(1), host="b1", port=i32(9092), rack=None),
            MetadataResponseBroker(node_id=BrokerId(7), host="::1", port=i32(9093), rack=None),
        ),
        cluster_id=None,
        controller_id=BrokerId(1),
        topics=(),
    )
    assert admin.brokers_of(answered(METADATA, 4, answer)) == {1: ("b1", 9092), 7: ("::1", 9093)}


def test_described_configs_keep_the_asked_topics_without_errors() -> None:
    from kio.schema.describe_configs.v1.response import (
        DescribeConfigsResourceResult,
        DescribeConfigsResponse,
        DescribeConfigsResult,
    )

    def result(name: str, code: int, configs: tuple[Any, ...] = (), kind: int = 2) -> Any:
        return DescribeConfigsResult(
            error_code=ErrorCode(code),
            error_message=None,
            resource_type=i8(kind),
            resource_name=name,
            configs=configs,
        )

    entry = DescribeConfigsResourceResult(
        name="cleanup.policy",
        value="compact",
        read_only=False,
        config_source=i8(1),
        is_sensitive=False,
        synonyms=(),
    )
    answer = DescribeConfigsResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        results=(
            result("kept", 0, (entry,)),
            result("failed", 3),
            result("broker-named-so", 0, (entry,), kind=4),
            result("not-asked", 0, (entry,)),
        ),
    )
    described = admin.described_configs(
        answered(DESCRIBE_CONFIGS, 1, answer), ["kept", "failed", "broker-named-so", "silent"]
    )
    assert described == {
        "kept": (admin.DescribedConfig("cleanup.policy", "compact", 1),),
        "failed": None,
        "broker-named-so": None,
        "silent": None,
    }


def test_listed_offsets_are_read_by_partition_for_the_topic() -> None:
    from kio.schema.list_offsets.v1.response import (
        ListOffsetsPartitionResponse,
        ListOffsetsResponse,
        ListOffsetsTopicResponse,
    )
    from kio.schema.types import TopicName

    def partitions(*rows: tuple[int, int, int]) -> tuple[Any, ...]:
        return tuple(
            ListOffsetsPartitionResponse(
                partition_index=i32(p), error_code=ErrorCode(code), timestamp=i64(-1),
                offset=i64(offset),
            )
            for p, code, offset in rows
        )  # fmt: skip

    answer = ListOffsetsResponse(
        topics=(
            ListOffsetsTopicResponse(name=TopicName("t"),
                                     partitions=partitions((0, 0, 5), (1, 6, -1))),
            ListOffsetsTopicResponse(name=TopicName("u"), partitions=partitions((0, 0, 9))),
        )
    )  # fmt: skip
    assert admin.listed_offsets(answered(LIST_OFFSETS, 1, answer), "t") == {0: (0, 5), 1: (6, -1)}


def test_fetched_partitions_carry_records_and_watermarks() -> None:
    from kio.schema.fetch.v4.response import FetchableTopicResponse, FetchResponse, PartitionData
    from kio.schema.types import TopicName
    from kio.static.primitive import Records

    def data(p: int, code: int, records: bytes | None, high: int) -> Any:
        return PartitionData(
            partition_index=i32(p),
            error_code=ErrorCode(code),
            high_watermark=i64(high),
            last_stable_offset=i64(high),
            aborted_transactions=None,
            records=None if records is None else Records(records),
        )

    answer = FetchResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        responses=(
            FetchableTopicResponse(
                topic=TopicName("t"),
                partitions=(data(0, 0, b"\x01\x02", 10), data(1, 1, None, -1)),
            ),
            FetchableTopicResponse(topic=TopicName("u"), partitions=(data(0, 0, b"x", 1),)),
        ),
    )
    assert admin.fetched_partitions(answered(FETCH, 4, answer), "t") == {
        0: admin.FetchedPartition(0, b"\x01\x02", 10, -1),
        1: admin.FetchedPartition(1, b"", -1, -1),
    }


def test_every_builder_names_a_version_the_codec_has() -> None:
    """A version the codec lacks is refused before anything is built."""
    with pytest.raises(UnsupportedVersion):
        admin.metadata_request(99, None)
    assert type(admin.metadata_request(1, None)) is codec_for(METADATA, 1).request_type
