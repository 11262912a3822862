"""Long-lived connections for the proxy's own requests to the cluster (DescribeConfigs for the
topic settings, Metadata for the brokers and the metrics' topic label).

A connection per request cost a TCP (and TLS) handshake per name a client invented: 5,000 names
that are no topic opened 10,000 connections to the cluster. Here each broker address has one
connection, opened at the first request and kept; requests on it go one at a time (the answers
are short and the names batched, see `kvproxy.proxy.topic_configs`). A connection that fails or
times
out is closed and the next request opens a new one; a request that fails on a connection kept
from before (the broker closed it while idle) is sent once more on a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable
from typing import Any

from kvproxy.protocol import admin
from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.framing import FrameDecoder
from kvproxy.protocol.messages import decode_response

_CLIENT_ID = "kvproxy"


class _Link:
    """One address's connection, and the lock that keeps its requests one at a time."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.decoder = FrameDecoder()
        self.correlation_id = 0

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None
        self.decoder = FrameDecoder()


class AdminConnections:
    """One kept connection per (host, port) for the proxy's own requests."""

    def __init__(
        self, ssl_context: ssl.SSLContext | None, on_open: Callable[[str], None] | None = None
    ) -> None:
        self._ssl = ssl_context
        self._on_open = on_open
        self._links: dict[tuple[str, int], _Link] = {}
        self.opened = 0
        """Connections opened so far (a reused one is not counted again)."""

    async def ask(
        self, host: str, port: int, timeout: float, *, api_key: int, version: int, body: object
    ) -> Any:
        """The decoded answer's body to one request; raises as a fresh connection would."""
        link = self._links.setdefault((host, port), _Link())
        async with link.lock:
            kept = link.writer is not None
            try:
                return await self._exchange(
                    link, host, port, timeout, api_key=api_key, version=version, body=body
                )
            except (OSError, EOFError) as exc:
                if not kept or isinstance(exc, TimeoutError):
                    raise
            # the kept connection was closed meanwhile (an idle broker connection): once more
            return await self._exchange(
                link, host, port, timeout, api_key=api_key, version=version, body=body
            )

    async def _exchange(
        self,
        link: _Link,
        host: str,
        port: int,
        timeout: float,
        *,
        api_key: int,
        version: int,
        body: object,
    ) -> Any:
        try:
            if link.writer is None:
                link.reader, link.writer = await asyncio.wait_for(
                    asyncio.open_connection(
                        host, port, ssl=self._ssl, server_hostname=host if self._ssl else None
                    ),
                    timeout,
                )
                self.opened += 1
                if self._on_open is not None:
                    self._on_open(f"{host}:{port}")
            reader, writer = link.reader, link.writer
            assert reader is not None and writer is not None
            link.correlation_id = (link.correlation_id + 1) % 2**31
            cid = link.correlation_id
            writer.write(admin.request_frame(api_key, version, cid, _CLIENT_ID, body))
            await asyncio.wait_for(writer.drain(), timeout)
            while (payload := link.decoder.next_frame()) is None:
                chunk = await asyncio.wait_for(reader.read(65536), timeout)
                if not chunk:
                    raise ConnectionError(f"{host}:{port} closed the connection")
                link.decoder.receive_data(chunk)
            answer = decode_response(bytes(payload), api_key, version)
            if int(answer.header.correlation_id) != cid:
                raise ProtocolError(f"answer to request {answer.header.correlation_id}, not {cid}")
            return answer.body
        except BaseException:
            link.close()  # a late answer must not be read as the next request's
            raise

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
