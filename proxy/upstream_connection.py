"""The broker side of a client connection: answers in, handed to the client side as frames."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.framing import FrameDecoder
from kvproxy.proxy.reasons import PauseReason

if TYPE_CHECKING:
    from kvproxy.proxy.connection import ClientConnection


class UpstreamConnection(asyncio.BufferedProtocol):
    """The broker side of one client connection: frames in, handed to the client side.

    A buffered protocol: the transport reads into the frame decoder's buffers, so a large answer
    (a Fetch) reaches the client without being copied in between.
    """

    def __init__(self, client: ClientConnection, max_frame_bytes: int) -> None:
        self._client = client
        self._bytes_in = client.metrics.bytes.labels("upstream_in")
        self._decoder = FrameDecoder(max_frame_bytes, client.buffer_pool)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self._bytes_in.inc(nbytes)
        self._decoder.buffer_updated(nbytes)
        client = self._client
        try:
            while (payload := self._decoder.next_frame()) is not None:
                client.on_upstream_frame(payload)
        except ProtocolError as exc:
            client.abort(f"upstream sent an undecodable frame: {exc}")
        client.flush()  # every answer this read completed, in one write

    def pause_writing(self) -> None:
        self._client.pause_reading(PauseReason.UPSTREAM_FULL)

    def resume_writing(self) -> None:
        self._client.resume_reading(PauseReason.UPSTREAM_FULL)

    def connection_lost(self, exc: Exception | None) -> None:
        client = self._client
        client.on_upstream_lost(exc)
        # Break the client <-> upstream cycle, so a closed pair (and the frame buffers its
        # pending answers hold) is freed at once rather than by the cycle collector.
        client.upstream = None
