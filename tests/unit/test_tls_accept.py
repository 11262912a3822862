"""Failed TLS handshakes, as real clients cause them (Python's ssl, in-process, on uvloop and on
asyncio): each is logged with the peer, the server name (escaped) and a reason, and counted in
kvproxy_tls_handshake_failures_total by listener and reason; a burst makes one line and a count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass

import pytest
import uvloop

from kvproxy.proxy.listen.tls_accept import (
    Acceptance,
    HandshakeFailure,
    HandshakeFailures,
    Refusal,
    Route,
    escape_server_name,
    failure_reason,
    serve_tls,
)
from kvproxy.proxy.listen.tls_context import ListenerContext
from kvproxy.proxy.ops.metrics import ProxyMetrics
from kvproxy.proxy.serve.server import ProxyServer
from tests.harness.proxy import proxy_config
from tests.harness.tansu import free_port
from tests.harness.tls import TlsFiles, make_tls_files
from tests.harness.tls_clients import ClientCerts, write_client_certs

FAILURES = "kvproxy_tls_handshake_failures_total"
KAFKA_API_VERSIONS = b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\x00\x00"


@dataclass(frozen=True)
class Material:
    server: TlsFiles
    clients: ClientCerts

    def listener_context(self, *, mutual: bool = True) -> ListenerContext:
        context = ListenerContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.server.server_cert, self.server.server_key)
        if mutual:
            context.load_verify_locations(cafile=self.clients.ca)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_context(self, client: str | None = None) -> ssl.SSLContext:
        """Trusts the proxy; presents the certificate of `client` (a ClientCerts field)."""
        context = ssl.create_default_context(cafile=str(self.server.ca))
        if client is not None:
            getattr(self.clients, client).load_into(context)
        return context


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Material]:
    with make_tls_files(hostnames=("*.kafka.localhost",)) as server:
        yield Material(server, write_client_certs(tmp_path_factory.mktemp("clients")))


@pytest.fixture(params=["uvloop", "asyncio"])
def run(request: pytest.FixtureRequest) -> Callable[[Awaitable[None]], None]:
    """Runs a test's coroutine on a fresh loop of the kind named in the test's id."""

    def on_loop(main: Awaitable[None]) -> None:
        async def wrapped() -> None:
            await main

        if request.param == "uvloop":
            uvloop.run(wrapped())
        else:
            asyncio.run(wrapped())

    return on_loop


class Echo(asyncio.Protocol):
    """The app protocol: echoes in upper case, remembers the node its acceptance chose."""

    connected: list[int | None] = []

    def __init__(self, node_id: int | None, acceptance: Acceptance) -> None:
        self.acceptance = acceptance

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        Echo.connected.append(self.acceptance.node_id)

    def data_received(self, data: bytes) -> None:
        self.transport.write(data.upper())  # type: ignore[attr-defined]


@dataclass
class Listener:
    port: int
    metrics: ProxyMetrics
    failures: HandshakeFailures

    def count(self, reason: str, listener: str = "broker") -> float:
        value = self.metrics.registry.get_sample_value(
            FAILURES, {"listener": listener, "reason": reason}
        )
        return value or 0.0

    async def counted(self, reason: str, n: int = 1, listener: str = "broker") -> None:
        """Wait (up to 10 s) until `n` failures with `reason` are counted."""
        deadline = time.monotonic() + 10
        while self.count(reason, listener) < n:
            assert time.monotonic() < deadline, f"{reason} not counted: {self.failed()}"
            await asyncio.sleep(0.01)

    def failed(self) -> dict[str, float]:
        return {
            sample.labels["reason"]: sample.value
            for family in self.metrics.registry.collect()
            if family.name == FAILURES.removesuffix("_total")
            for sample in family.samples
            if sample.name == FAILURES
        }


@contextlib.asynccontextmanager
async def listening(
    context: ListenerContext,
    *,
    listener: str = "broker",
    node_id: int | None = 3,
    route: Route | None = None,
    interval_s: float = 3600,
    handshake_timeout_s: float = 60.0,
) -> AsyncIterator[Listener]:
    metrics = ProxyMetrics()
    failures = HandshakeFailures(metrics, interval_s=interval_s)
    server = await serve_tls(
        asyncio.get_running_loop(),
        Echo,
        host="127.0.0.1",
        port=0,
        context=context,
        listener=listener,
        node_id=node_id,
        route=route,
        failures=failures,
        reuse_port=False,
        handshake_timeout_s=handshake_timeout_s,
    )
    try:
        yield Listener(server.sockets[0].getsockname()[1], metrics, failures)
    finally:
        server.close()
        failures.close()


async def attempt(
    port: int,
    context: ssl.SSLContext | None,
    server_name: str = "broker-3.kafka.localhost",
    payload: bytes = KAFKA_API_VERSIONS,
) -> tuple[str, bytes]:
    """Connect, send `payload`, read until the listener ends it: (the client's address as the
    proxy names it, what came back; b"" when the handshake or the read failed)."""
    raw = socket.create_connection(("127.0.0.1", port))
    raw.setblocking(False)
    host, client_port = raw.getsockname()[:2]
    address = f"{host}:{client_port}"
    got = b""
    try:
        reader, writer = await asyncio.open_connection(
            sock=raw, ssl=context, server_hostname=server_name if context else None
        )
        try:
            writer.write(payload)
            await writer.drain()
            got = await reader.read(100)
        finally:
            writer.close()
    except (ssl.SSLError, ConnectionError, OSError):
        raw.close()
    return address, got


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "TLS handshake failed" in r.getMessage()]


@pytest.fixture(autouse=True)
def warnings_captured(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    with caplog.at_level(logging.WARNING, logger="kvproxy"):
        yield


REFUSED_CERTIFICATES = [
    (None, "no_client_certificate", "peer did not return a certificate"),
    ("other_ca", "unknown_ca", "certificate verify failed: unable to get local issuer certificate"),
    ("expired", "expired", "certificate verify failed: certificate has expired"),
    ("not_yet_valid", "not_yet_valid", "certificate verify failed: certificate is not yet valid"),
]


@pytest.mark.parametrize(("client", "reason", "words"), REFUSED_CERTIFICATES)
def test_a_refused_client_certificate_is_logged_and_counted_by_reason(  # noqa: PLR0917
    run: Callable[[Awaitable[None]], None],
    caplog: pytest.LogCaptureFixture,
    material: Material,
    client: str | None,
    reason: str,
    words: str,
) -> None:
    async def main() -> None:
        async with listening(material.listener_context()) as listener:
            peer, got = await attempt(listener.port, material.client_context(client))
            assert got == b""
            await listener.counted(reason)
            assert listener.failed() == {reason: 1}

        assert lines(caplog) == [
            f"TLS handshake failed on the broker listener (node 3) from {peer}, server name "
            f"'broker-3.kafka.localhost': {reason} ({words})"
        ]

    run(main())


def test_a_trusted_client_certificate_connects_and_nothing_is_counted(
    run: Callable[[Awaitable[None]], None], caplog: pytest.LogCaptureFixture, material: Material
) -> None:
    async def main() -> None:
        async with listening(
            material.listener_context(), listener="bootstrap", node_id=None
        ) as listener:
            Echo.connected.clear()
            _, got = await attempt(listener.port, material.client_context("trusted"))
            assert got == KAFKA_API_VERSIONS.upper()
            assert Echo.connected == [None]
            assert listener.failed() == {}
        assert lines(caplog) == []

    run(main())


def test_bytes_that_are_not_tls(
    run: Callable[[Awaitable[None]], None], caplog: pytest.LogCaptureFixture, material: Material
) -> None:
    async def main() -> None:
        async with listening(
            material.listener_context(), listener="bootstrap", node_id=None
        ) as listener:
            peer, got = await attempt(listener.port, None)
            assert got == b""
            await listener.counted("not_tls", listener="bootstrap")
        assert lines(caplog) == [
            f"TLS handshake failed on the bootstrap listener from {peer}, server name none: "
            "not_tls (wrong version number)"
        ]

    run(main())


def test_a_client_that_does_not_trust_the_proxy_closes(
    run: Callable[[Awaitable[None]], None], caplog: pytest.LogCaptureFixture, material: Material
) -> None:
    async def main() -> None:
        async with listening(material.listener_context(mutual=False)) as listener:
            peer, _ = await attempt(listener.port, ssl.create_default_context())
            await listener.counted("closed")
        [line] = lines(caplog)
        assert line.startswith(
            f"TLS handshake failed on the broker listener (node 3) from {peer}, server name "
            "'broker-3.kafka.localhost': closed ("
        )

    run(main())


def test_a_client_that_never_finishes_its_handshake_times_out(
    run: Callable[[Awaitable[None]], None], caplog: pytest.LogCaptureFixture, material: Material
) -> None:
    async def main() -> None:
        context = material.listener_context(mutual=False)
        async with listening(context, handshake_timeout_s=0.1) as listener:
            with socket.create_connection(("127.0.0.1", listener.port)) as raw:
                await listener.counted("timeout")
                host, port = raw.getsockname()[:2]
                peer = f"{host}:{port}"
        assert lines(caplog) == [
            f"TLS handshake failed on the broker listener (node 3) from {peer}, server name "
            "none: timeout (the handshake did not finish in time)"
        ]

    run(main())


def route(server_name: str | None) -> int | Refusal | None:
    if server_name is None:
        return Refusal("no_sni")
    if server_name == "bootstrap.kafka.localhost":
        return None
    if server_name == "broker-7.kafka.localhost":
        return 7
    return Refusal("no_matching_name")


def test_the_route_chooses_the_node_during_the_handshake(
    run: Callable[[Awaitable[None]], None], material: Material
) -> None:
    async def main() -> None:
        context = material.listener_context(mutual=False)
        async with listening(context, listener="sni", node_id=None, route=route) as listener:
            Echo.connected.clear()
            for name in ("broker-7.kafka.localhost", "bootstrap.kafka.localhost"):
                _, got = await attempt(listener.port, material.client_context(), name)
                assert got == KAFKA_API_VERSIONS.upper()
            assert Echo.connected == [7, None]
            assert listener.failed() == {}

    run(main())


def test_a_refusal_of_the_route_is_an_alert_a_line_and_a_count(
    run: Callable[[Awaitable[None]], None], caplog: pytest.LogCaptureFixture, material: Material
) -> None:
    hostile = "evil\x01\x7f\\name." + "\x01" * 60 + ".kafka.localhost"

    async def main() -> None:
        context = material.listener_context(mutual=False)
        async with listening(context, listener="sni", node_id=None, route=route) as listener:
            Echo.connected.clear()
            client = material.client_context()
            client.check_hostname = False
            peer, got = await attempt(listener.port, client, hostile)
            no_name, _ = await attempt(listener.port, client, "")
            await listener.counted("no_matching_name", listener="sni")
            await listener.counted("no_sni", listener="sni")
            assert got == b""
            assert Echo.connected == []
        escaped = escape_server_name(hostile)
        assert escaped.startswith("evil\\x01\\x7f\\x5cname.\\x01\\x01")
        assert len(escaped) <= 255
        assert escaped.endswith("\\x01...")
        assert sorted(lines(caplog)) == sorted(
            [
                f"TLS handshake failed on the sni listener from {peer}, server name "
                f"'{escaped}': no_matching_name (refused by the server name's route)",
                f"TLS handshake failed on the sni listener from {no_name}, server name none: "
                "no_sni (refused by the server name's route)",
            ]
        )

    run(main())


def test_a_client_refused_by_the_route_gets_the_unrecognized_name_alert(
    run: Callable[[Awaitable[None]], None], material: Material
) -> None:
    async def main() -> None:
        context = material.listener_context(mutual=False)
        async with listening(context, listener="sni", node_id=None, route=route) as listener:
            raw = socket.create_connection(("127.0.0.1", listener.port))
            raw.setblocking(False)
            with pytest.raises(ssl.SSLError, match="UNRECOGNIZED_NAME"):
                await asyncio.open_connection(
                    sock=raw,
                    ssl=material.client_context(),
                    server_hostname="broker-8.kafka.localhost",
                )
            raw.close()

    run(main())


def test_server_names_are_escaped_byte_by_byte() -> None:
    assert escape_server_name("broker-1.kafka.example.com") == "broker-1.kafka.example.com"
    assert escape_server_name("caf\u00e9\n") == "caf\\xc3\\xa9\\x0a"
    assert escape_server_name("a\\b") == "a\\x5cb"
    assert escape_server_name("\udcff") == "\\xff"  # an undecodable byte, as surrogateescape
    cut = escape_server_name("a" * 250 + "\x01" * 10)
    assert cut == "a" * 250 + "..."


def test_reasons_are_a_bounded_set() -> None:
    assert failure_reason(Refusal("unknown_node"), None, None) == (
        "unknown_node",
        "refused by the server name's route",
    )
    assert failure_reason(Refusal("made up"), None, None) == (
        "other",
        "refused by the server name's route (made up)",
    )
    assert failure_reason(None, None, RuntimeError("odd")) == ("other", "odd")


def test_a_burst_of_failures_makes_one_line_then_a_count(
    run: Callable[[Awaitable[None]], None], caplog: pytest.LogCaptureFixture, material: Material
) -> None:
    async def main() -> None:
        async with listening(
            material.listener_context(), listener="bootstrap", node_id=None
        ) as listener:
            peers = [(await attempt(listener.port, None))[0] for _ in range(6)]
            await listener.counted("not_tls", 6, listener="bootstrap")
            assert lines(caplog) == [
                f"TLS handshake failed on the bootstrap listener from {peers[0]}, server name "
                "none: not_tls (wrong version number)"
            ]
            listener.failures.close()  # the listeners close: the count not logged is
        assert lines(caplog)[1:] == [
            "TLS handshake failed 5 more times on the bootstrap listener with reason not_tls, "
            "not logged one by one; the last on the bootstrap listener from "
            f"{peers[-1]}, server name none: not_tls (wrong version number)"
        ]

    run(main())


def test_the_count_not_logged_is_logged_when_the_interval_ends(
    run: Callable[[Awaitable[None]], None], caplog: pytest.LogCaptureFixture
) -> None:
    def failure(peer: str, reason: str = "unknown_ca") -> HandshakeFailure:
        return HandshakeFailure("broker", 2, peer, None, reason, "words")

    async def main() -> None:
        failures = HandshakeFailures(ProxyMetrics(), interval_s=0.05)
        for n in range(4):  # in one go: the interval cannot end between them
            failures.failed(failure(f"10.0.0.{n}:1"))
        failures.failed(failure("10.0.0.9:1", "expired"))  # another reason, its own line
        deadline = time.monotonic() + 10
        while len(lines(caplog)) < 3:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        failures.close()

    run(main())
    assert lines(caplog)[:3] == [
        "TLS handshake failed on the broker listener (node 2) from 10.0.0.0:1, server name none: "
        "unknown_ca (words)",
        "TLS handshake failed on the broker listener (node 2) from 10.0.0.9:1, server name none: "
        "expired (words)",
        "TLS handshake failed 3 more times on the broker listener with reason unknown_ca, not "
        "logged one by one; the last on the broker listener (node 2) from 10.0.0.3:1, server "
        "name none: unknown_ca (words)",
    ]
    assert len(lines(caplog)) == 3
    first, _, summary = (r.__dict__ for r in caplog.records if r.getMessage() in lines(caplog))
    assert {key: first[key] for key in ("event", "listener", "node", "peer", "reason")} == {
        "event": "tls_handshake_failed",
        "listener": "broker",
        "node": 2,
        "peer": "10.0.0.0:1",
        "reason": "unknown_ca",
    }
    assert (summary["event"], summary["times"]) == ("tls_handshake_failures_not_logged", 3)


def test_the_proxy_s_tls_listener_counts_failures_and_stop_closes_it(
    run: Callable[[Awaitable[None]], None], caplog: pytest.LogCaptureFixture, material: Material
) -> None:
    """`Listeners` wiring: the bootstrap listener of a TLS proxy accepts through serve_tls, and
    `ProxyServer.stop` closes it (nothing listens at the cluster's address: no broker needed)."""
    tls = {
        "cert_file": str(material.server.server_cert),
        "key_file": str(material.server.server_key),
        "client_ca_file": str(material.clients.ca),
    }
    config = proxy_config(
        f"127.0.0.1:{free_port()}", listen={"tls": tls}, metrics={"enabled": False}
    )

    async def main() -> None:
        server = ProxyServer(config)
        await server.start()
        try:
            port = server.listeners.bootstrap_port
            peer, _ = await attempt(port, material.client_context(), "localhost")
            deadline = time.monotonic() + 10
            labels = {"listener": "bootstrap", "reason": "no_client_certificate"}
            while not server.metrics.registry.get_sample_value(FAILURES, labels):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
        finally:
            await server.stop(drain_timeout=0.1)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port)).close()
        assert lines(caplog) == [
            f"TLS handshake failed on the bootstrap listener from {peer}, server name "
            "'localhost': no_client_certificate (peer did not return a certificate)"
        ]

    run(main())
