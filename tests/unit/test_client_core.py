"""The sans-IO core of kvproxy's client: correlation of answers, the version both sides share."""

from __future__ import annotations

import pytest
from kio.schema.api_versions.v0.response import ApiVersionsResponse
from kio.schema.errors import ErrorCode

from kvproxy.client.core import (
    Conversation,
    CorrelationMismatch,
    api_versions_request,
    shared_version,
)
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
