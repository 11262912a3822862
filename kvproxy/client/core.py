"""The sans-IO core of kvproxy's own client: request frames out, answers in, no sockets.

A `Conversation` is one connection's requests and answers, one at a time: it numbers each request
(correlation id), frames it, and turns the answer's payload back into the decoded body, refusing
an answer to another request. `served_versions` and `shared_version` pick, from a broker's
ApiVersions answer, the highest version of an API that the broker, the codec and the caller
share. The drivers (`kvproxy.client.blocking`, `kvproxy.client.async_connections`) only move the
bytes, so both ask the same questions in the same words.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from kvproxy.protocol import admin
from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.messages import (
    API_VERSIONS,
    codec_for,
    decode_response,
    supported_versions,
)

__all__ = [
    "API_VERSIONS_VERSION",
    "Conversation",
    "CorrelationMismatch",
    "UpstreamError",
    "api_versions_request",
    "served_versions",
    "shared_version",
]

API_VERSIONS_VERSION: Final = 0
"""ApiVersions v0: every broker answers it, before authentication too, and it says all a client
needs (key, lowest and highest version)."""

_CORRELATION_IDS: Final = 2**31


class UpstreamError(Exception):
    """The broker answered a request of kvproxy's own with an error code."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what}: error {code}")
        self.code = code


class CorrelationMismatch(ProtocolError):
    """An answer that carries another request's correlation id."""

    def __init__(self, got: int, expected: int) -> None:
        super().__init__(f"answer to request {got}, not {expected}")
        self.got = got
        self.expected = expected


class Conversation:
    """One connection's requests and their answers, one request at a time."""

    __slots__ = ("_api_key", "_client_id", "_correlation_id", "_version")

    def __init__(self, client_id: str) -> None:
        self._client_id = client_id
        self._correlation_id = 0
        self._api_key = -1
        self._version = -1

    @property
    def correlation_id(self) -> int:
        """The id of the request last framed (0 before the first)."""
        return self._correlation_id

    def request(self, api_key: int, version: int, body: Any) -> bytes:
        """The whole frame of the next request; its answer is the one `answer` expects."""
        self._correlation_id = (self._correlation_id + 1) % _CORRELATION_IDS
        self._api_key, self._version = api_key, version
        return admin.request_frame(api_key, version, self._correlation_id, self._client_id, body)

    def answer(self, payload: bytes) -> Any:
        """The decoded body of the answer to the last request, from its frame's payload.

        Raises `ProtocolError` when it does not decode, `CorrelationMismatch` when it answers
        another request."""
        response = decode_response(payload, self._api_key, self._version)
        got = int(response.header.correlation_id)
        if got != self._correlation_id:
            raise CorrelationMismatch(got, self._correlation_id)
        return response.body


def api_versions_request() -> Any:
    """The body of an ApiVersions v0 request (it has no field)."""
    return codec_for(API_VERSIONS, API_VERSIONS_VERSION).request_type()


def served_versions(answer: Any) -> dict[int, tuple[int, int]]:
    """api key -> (lowest, highest) version the broker serves, from its ApiVersions answer."""
    return {
        int(api.api_key): (int(api.min_version), int(api.max_version)) for api in answer.api_keys
    }


def shared_version(
    served: Mapping[int, tuple[int, int]], api_key: int, wanted: tuple[int, int]
) -> int | None:
    """The highest version of `api_key` within `wanted` that the broker serves and the codec
    speaks; None when there is none."""
    if api_key not in served:
        return None
    low, high = served[api_key]
    usable = [
        v for v in supported_versions(api_key) if wanted[0] <= v <= wanted[1] and low <= v <= high
    ]
    return max(usable, default=None)
