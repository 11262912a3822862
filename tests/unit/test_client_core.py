"""The sans-IO core of kvproxy's client: correlation of answers, the version both sides share,
reading a partition up to its high watermark."""

from __future__ import annotations

import datetime

import pytest
from kio.schema.api_versions.v0.response import ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v4.response import FetchableTopicResponse, FetchResponse, PartitionData
from kio.schema.types import TopicName
from kio.static.primitive import Records, i32, i64

from kvproxy.client.core import (
    Conversation,
    CorrelationMismatch,
    UpstreamError,
    api_versions_request,
    shared_version,
)
from kvproxy.client.partition_read import PartitionRead
from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.messages import (
    API_VERSIONS,
    FETCH,
    METADATA,
    encode_response,
    make_response,
    read_request,
    supported_versions,
)
from kvproxy.protocol.records import build_batch


def _answer_to(frame: bytes, correlation_id: int | None = None) -> bytes:
    """The payload of an ApiVersions v0 answer to the request framed in `frame`."""
    request = read_request(frame[4:])[0]
    cid = int(request.header.correlation_id) if correlation_id is None else correlation_id
    body = ApiVersionsResponse(error_code=ErrorCode.none, api_keys=())
    return encode_response(API_VERSIONS, 0, make_response(API_VERSIONS, 0, cid, body))


def test_each_request_gets_the_next_correlation_id_and_its_answer_decodes() -> None:
    talk = Conversation("kvproxy-test")
    first = talk.request(API_VERSIONS, 0, api_versions_request())
    assert read_request(first[4:])[0].header.correlation_id == 1
    assert int(talk.answer(_answer_to(first)).error_code) == 0
    second = talk.request(API_VERSIONS, 0, api_versions_request())
    assert read_request(second[4:])[0].header.correlation_id == talk.correlation_id == 2
    assert read_request(second[4:])[0].header.client_id == "kvproxy-test"


def test_an_answer_to_another_request_is_refused() -> None:
    talk = Conversation("kvproxy-test")
    sent = talk.request(API_VERSIONS, 0, api_versions_request())
    with pytest.raises(CorrelationMismatch, match="answer to request 9, not 1") as caught:
        talk.answer(_answer_to(sent, correlation_id=9))
    assert (caught.value.got, caught.value.expected) == (9, 1)
    assert isinstance(caught.value, ProtocolError)


def test_shared_version_is_the_highest_all_three_allow() -> None:
    served = {METADATA: (0, 12), FETCH: (0, 3)}
    assert shared_version(served, METADATA, (4, 12)) == min(12, max(supported_versions(METADATA)))
    assert shared_version(served, METADATA, (4, 6)) == 6
    assert shared_version(served, FETCH, (4, 12)) is None  # the broker stops below the floor
    assert shared_version(served, API_VERSIONS, (0, 3)) is None  # not served at all


def _fetched(batches: bytes, high_watermark: int, error_code: int = 0) -> FetchResponse:
    """A Fetch v4 answer holding `batches` of partition 0 of "t"."""
    return FetchResponse(
        throttle_time=datetime.timedelta(0),
        responses=(
            FetchableTopicResponse(
                topic=TopicName("t"),
                partitions=(
                    PartitionData(
                        partition_index=i32(0),
                        error_code=ErrorCode(error_code),
                        high_watermark=i64(high_watermark),
                        last_stable_offset=i64(high_watermark),
                        aborted_transactions=(),
                        records=Records(batches),
                    ),
                ),
            ),
        ),
    )


def _batch(base_offset: int, count: int) -> bytes:
    """The same bytes on every call: a fixed timestamp (the clock's would change the CRC)."""
    return build_batch([(b"k", b"v", None, 1_700_000_000_000)] * count, base_offset=base_offset)


def test_a_partition_read_fetches_from_where_the_last_whole_batch_ended_to_the_watermark() -> None:
    read = PartitionRead("t", 0, first=3, max_bytes=1 << 20)
    asked = read.next_request()
    assert asked is not None and asked.topics[0].partitions[0].fetch_offset == 3
    partial_tail = _batch(5, 1)[:10]
    read.receive(_fetched(_batch(3, 2) + partial_tail, high_watermark=6))
    asked = read.next_request()
    assert asked is not None and asked.topics[0].partitions[0].fetch_offset == 5
    read.receive(_fetched(_batch(5, 1), high_watermark=9))  # the first watermark counts
    assert read.next_request() is None
    assert read.complete and read.records == _batch(3, 2) + _batch(5, 1)


def test_a_partition_read_stops_at_its_byte_limit_or_at_a_batch_larger_than_what_is_left() -> None:
    one = _batch(0, 1)
    read = PartitionRead("t", 0, first=0, max_bytes=len(one))
    assert read.next_request() is not None
    read.receive(_fetched(one, high_watermark=5))
    assert read.next_request() is None and not read.complete and read.records == one
    stuck = PartitionRead("t", 0, first=0, max_bytes=4)
    assert stuck.next_request() is not None
    stuck.receive(_fetched(one[:4], high_watermark=5))
    assert stuck.next_request() is None and not stuck.complete and stuck.records == b""


def test_a_partition_read_raises_on_an_error_code_or_a_missing_partition() -> None:
    read = PartitionRead("t", 0, first=0, max_bytes=100)
    with pytest.raises(UpstreamError, match="Fetch t-0: error 6") as caught:
        read.receive(_fetched(b"", high_watermark=0, error_code=6))
    assert caught.value.code == 6
    with pytest.raises(ConnectionError, match="answered no partition"):
        PartitionRead("u", 0, first=0, max_bytes=100).receive(_fetched(b"", high_watermark=0))
