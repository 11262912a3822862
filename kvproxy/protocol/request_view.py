"""One request's bytes, read once into the view every later step uses.

A relay needs only a request's prefix (api key, version, correlation id) to route it; a Produce
request is then read by several steps (counted when it may name many partitions, decoded by the
plain reader or by the codec, its header given to the refusal of a whole request). Each reads
through the view: the header once, when a step first needs it, and the decoded request kept, so
no step reads bytes an earlier one has read.
"""

from __future__ import annotations

from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.framing import Frame
from kvproxy.protocol.headers import RequestHeader, read_request_header, read_request_prefix
from kvproxy.protocol.messages import Request, decode_request
from kvproxy.protocol.produce_request import read_produce
from kvproxy.protocol.produce_shape import ProduceShape, scan_produce

__all__ = ["RequestView"]


class RequestView:
    """A request's frame (size prefix removed) and what has been read of it."""

    __slots__ = (
        "_header",
        "_prefix",
        "api_key",
        "api_version",
        "correlation_id",
        "frame",
        "request",
    )

    def __init__(self, frame: Frame) -> None:
        self.frame = frame
        self._prefix = read_request_prefix(frame)
        (self.api_key, self.api_version, self.correlation_id), _ = self._prefix
        self._header: tuple[RequestHeader, int] | None = None
        self.request: Request | None = None
        """The request decoded, once a step has decoded it."""

    @property
    def header(self) -> tuple[RequestHeader, int]:
        """The whole header and where the body starts (`UnsupportedVersion` for an api key and
        version Kafka does not have)."""
        if self._header is None:
            self._header = read_request_header(self.frame, prefix=self._prefix)
        return self._header

    def read_produce(self, stop_after: int) -> Request | None:
        """The Produce request read plainly (`read_produce`), when it names at most
        `stop_after` partitions and is plain enough; else None (the codec's, then)."""
        if self.request is not None:
            return self.request
        try:
            header = self.header
        except ProtocolError:
            return None  # the codec says what is wrong with it (`decode`)
        self.request = read_produce(self.frame, stop_after, header)
        return self.request

    def decode(self) -> Request:
        """The request decoded by the codec (`DecodeError` for bytes that are not one)."""
        if self.request is None:
            self.request = decode_request(self.frame, self.header)
        return self.request

    def shape(self, stop_after: int, *, indexes: bool = False) -> ProduceShape:
        """The Produce request counted, its body not decoded (`scan_produce`)."""
        return scan_produce(self.frame, stop_after, indexes=indexes, header=self.header)
