"""The floor of a Python asyncio proxy: a TCP relay on uvloop that copies bytes and reads none.

kvproxy runs on uvloop too. HAProxy (the floor the goals are measured against) says what any
proxy pays; this relay says what a proxy written in Python on the same event loop pays before it
looks at a single byte: one accepted connection and one upstream connection per client, every
chunk received on one side written to the other, flow control by pausing the side that reads
when the other's send buffer is full. Measured beside HAProxy and kvproxy in the same run
(bench/request_rate.py, bench/latency.py), it separates the cost of the event loop and the
syscalls from kvproxy's own per-request work.

    .venv/bin/python -m bench.uvloop_relay --port P --upstream host:port

It listens on 127.0.0.1 only and stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import uvloop

HOST = "127.0.0.1"


class Side(asyncio.Protocol):
    """One end of a relayed connection: what it receives is written to its peer; when either
    end closes, the other is closed after what is queued for it has been sent."""

    def __init__(self, peer: Side | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer = peer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        assert self.peer is not None and self.peer.transport is not None
        self.peer.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    def pause_writing(self) -> None:
        """This side's send buffer is full: stop reading what the peer sends."""
        self._peer_reading(False)

    def resume_writing(self) -> None:
        self._peer_reading(True)

    def _peer_reading(self, reading: bool) -> None:
        peer = self.peer.transport if self.peer is not None else None
        if peer is None or peer.is_closing():
            return
        if reading:
            peer.resume_reading()
        else:
            peer.pause_reading()


class ClientSide(Side):
    """The client's end: reading waits until the upstream connection is made (uvloop may still
    deliver the read under way when reading is paused: that is kept and sent first)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__()
        self.upstream = upstream
        self.dialing: asyncio.Task[None] | None = None
        self.early: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            self.early.append(data)
        else:
            super().data_received(data)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        transport.pause_reading()  # type: ignore[attr-defined]
        self.dialing = asyncio.get_running_loop().create_task(self._dial())

    async def _dial(self) -> None:
        assert self.transport is not None
        try:
            _, upstream = await asyncio.get_running_loop().create_connection(
                lambda: Side(peer=self), *self.upstream
            )
        except OSError:
            self.transport.close()
            return
        if self.transport.is_closing():
            assert upstream.transport is not None
            upstream.transport.close()
            return
        self.peer = upstream
        assert upstream.transport is not None
        upstream.transport.writelines(self.early)
        self.early.clear()
        self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.dialing is not None and not self.dialing.done():
            self.dialing.cancel()
        super().connection_lost(exc)


async def relay(port: int, upstream: tuple[str, int]) -> None:
    """Serve on HOST:`port`, relaying every connection to `upstream`, until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    server = await loop.create_server(lambda: ClientSide(upstream), HOST, port)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="where clients connect")
    parser.add_argument("--upstream", required=True, help="host:port relayed to")
    args = parser.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    uvloop.run(relay(args.port, (host, int(port))))


if __name__ == "__main__":
    main()
