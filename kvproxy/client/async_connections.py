"""The asyncio driver of kvproxy's client: connections around `kvproxy.client.core`, either kept
for the proxy's own requests to the cluster (DescribeConfigs for the topic settings, Metadata for
the brokers and the metrics' topic label) or opened for one request (`ask_once`).

A connection per request cost a TCP (and TLS) handshake per name a client invented: 5,000 names
that are no topic opened 10,000 connections to the cluster. Here each broker address has one
connection, opened at the first request and kept; requests on it go one at a time (the answers
are short and the names batched, see `kvproxy.proxy.lookups.topic_configs`). A connection that
fails or
times out is closed and the next request opens a new one; a request that fails on a connection kept
from before (the broker closed it while idle) is sent once more on a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable
from typing import Any

from kvproxy.client.core import Conversation
from kvproxy.protocol.admin import check_node_count, metadata_broker_count
from kvproxy.protocol.framing import FrameDecoder
from kvproxy.protocol.messages import METADATA

__all__ = ["CLIENT_ID", "AdminConnections", "ask_once"]

DECODE_INLINE_BYTES = 256 * 1024
"""Answers larger than this (a Metadata answer naming a million brokers is 12 MB) are decoded on
a worker thread, not on the event loop."""

CLIENT_ID = "kvproxy"
"""The client id of the proxy's and the offline commands' own requests."""


class _Link:
    """One address's connection, and the lock that keeps its requests one at a time."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.decoder = FrameDecoder()
        self.conversation = Conversation(CLIENT_ID)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None
        self.decoder = FrameDecoder()

    async def exchange(
        self,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        timeout: float,
        *,
        api_key: int,
        version: int,
        body: object,
        opened: Callable[[], None] | None = None,
    ) -> Any:
        """The decoded answer's body to one request (`opened` is called when a connection is
        opened for it); on any failure the connection is closed (a late answer must not be read
        as the next request's)."""
        try:
            if self.writer is None:
                self.reader, self.writer = await asyncio.wait_for(
                    asyncio.open_connection(
                        host, port, ssl=ssl_context, server_hostname=host if ssl_context else None
                    ),
                    timeout,
                )
                if opened is not None:
                    opened()
            reader, writer = self.reader, self.writer
            assert reader is not None and writer is not None
            writer.write(self.conversation.request(api_key, version, body))
            await asyncio.wait_for(writer.drain(), timeout)
            while (payload := self.decoder.next_frame()) is None:
                chunk = await asyncio.wait_for(reader.read(65536), timeout)
                if not chunk:
                    raise ConnectionError(f"{host}:{port} closed the connection")
                self.decoder.receive_data(chunk)
            if api_key == METADATA:  # too many brokers: refused before decoding
                check_node_count(metadata_broker_count(payload, version))
            if len(payload) > DECODE_INLINE_BYTES:  # a hostile answer holds no one else
                return await asyncio.to_thread(self.conversation.answer, bytes(payload))
            return self.conversation.answer(bytes(payload))
        except BaseException:
            self.close()
            raise


async def ask_once(
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    timeout: float,
    *,
    api_key: int,
    version: int,
    body: object,
) -> Any:
    """The decoded answer's body to one request on a connection opened for it alone."""
    link = _Link()
    try:
        return await link.exchange(
            host, port, ssl_context, timeout, api_key=api_key, version=version, body=body
        )
    finally:
        link.close()


class AdminConnections:
    """One kept connection per (host, port) for the proxy's own requests."""

    def __init__(self, ssl_context: ssl.SSLContext | None) -> None:
        self._ssl = ssl_context
        self._links: dict[tuple[str, int], _Link] = {}
        self.opened = 0
        """Connections opened so far (a reused one is not counted again)."""

    async def ask(
        self, host: str, port: int, timeout: float, *, api_key: int, version: int, body: object
    ) -> Any:
        """The decoded answer's body to one request; raises as a fresh connection would."""
        link = self._links.setdefault((host, port), _Link())
        async with link.lock:
            while True:
                kept = link.writer is not None
                try:
                    return await link.exchange(
                        host, port, self._ssl, timeout, api_key=api_key, version=version,
                        body=body, opened=self._count_opened,
                    )  # fmt: skip
                except (OSError, EOFError) as exc:
                    if not kept or isinstance(exc, TimeoutError):
                        raise
                # the kept connection was closed meanwhile (an idle broker connection): once
                # more, on a new one (`exchange` closed the old; a failure there is not retried)

    def _count_opened(self) -> None:
        self.opened += 1

    def local_addresses(self) -> set[tuple[str, int]]:
        """The proxy's own ends of the connections kept open (their peers see these)."""
        found = set()
        for link in list(self._links.values()):
            writer = link.writer
            if writer is not None and (address := writer.get_extra_info("sockname")):
                found.add((str(address[0]), int(address[1])))
        return found

    def close(self) -> None:
        for link in self._links.values():
            with contextlib.suppress(Exception):
                link.close()
        self._links.clear()
