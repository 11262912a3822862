"""TLS contexts of the two sides: clients connecting to the proxy, the proxy to the brokers.

Shared by the relay and every command that talks to the cluster itself (`kvproxy topics`,
`kvproxy quarantine replay`, the connection check), so all of them trust the same brokers.
"""

from __future__ import annotations

import ssl
from typing import Protocol

from kvproxy.proxy.config.listen_config import ListenerTls
from kvproxy.proxy.config.proxy_config import ProxyConfig


class HandshakeRecord(Protocol):
    """Where a session records its handshake's failure when it happens (an `Acceptance` of
    `kvproxy.proxy.listen.tls_accept`)."""

    def recorded(self, failure: ssl.SSLError) -> None: ...


def client_side_ssl(config: ProxyConfig) -> ListenerContext | None:
    """The context of the proxy's port-per-broker listeners (`listen.tls`); None for plain TCP."""
    tls = config.listen.tls
    return None if tls is None else listener_context(tls)


def listener_context(tls: ListenerTls) -> ListenerContext:
    """A listener's context: its certificate chain and, for mutual TLS, the clients' CA."""
    context = ListenerContext(ssl.PROTOCOL_TLS_SERVER)  # as create_default_context(CLIENT_AUTH)
    password = tls.key_password.get_secret_value() if tls.key_password is not None else None
    context.load_cert_chain(str(tls.cert_file), str(tls.key_file), password)
    if tls.client_ca_file is not None:
        context.load_verify_locations(cafile=str(tls.client_ca_file))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class AlertingSSLObject(ssl.SSLObject):
    """A server-side TLS session that sends its alert before a failed handshake ends.

    The event loop's TLS layer (uvloop's, like asyncio's) closes the socket as soon as
    ``do_handshake()`` raises, and the alert OpenSSL has written (certificate required, unknown
    CA, ...) is never sent. A refused client then sees the connection end without a reason: the
    Java client logs "terminated during authentication" and reconnects until ``max.block.ms``,
    librdkafka says "SSL connection closed by peer". A Kafka broker sends the alert, and both
    fail at once. So a failure with an alert to send is reported once as "want read", which
    makes the loop send what is pending (the alert), and raised at the next call (the client's
    next bytes); a client that closes on the alert ends the connection itself, and one that
    does neither is closed by the loop's handshake timeout (60 s), as a client that never
    finishes its handshake always was. A failure with nothing to send (bytes that are not TLS at
    all) is raised at once, as before. Either way the failure is recorded on the connection's
    acceptance (`kvproxy.proxy.listen.tls_accept`) when it happens, so that it can be logged."""

    outgoing: ssl.MemoryBIO | None = None
    acceptance: HandshakeRecord | None = None
    _failure: ssl.SSLError | None = None

    def do_handshake(self) -> None:
        if self._failure is not None:
            raise self._failure
        try:
            super().do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise
        except ssl.SSLError as exc:
            if self.acceptance is not None:
                self.acceptance.recorded(exc)
            if self.outgoing is None or not self.outgoing.pending:
                raise
            self._failure = exc
            raise ssl.SSLWantReadError("the handshake failed; its alert is sent first") from exc


class ListenerContext(ssl.SSLContext):
    """The listeners' context: its sessions know their outgoing buffer (see
    :class:`AlertingSSLObject`) and the acceptance they serve: the one set in `accepting`
    while the loop's TLS protocol makes its SSL object."""

    sslobject_class = AlertingSSLObject
    accepting: HandshakeRecord | None = None

    def wrap_bio(  # type: ignore[override]
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        tls = super().wrap_bio(incoming, outgoing, server_side, server_hostname, session)
        if isinstance(tls, AlertingSSLObject):
            tls.outgoing = outgoing
            tls.acceptance = self.accepting
        return tls


def upstream_side_ssl(config: ProxyConfig) -> ssl.SSLContext | None:
    """The context of connections to the brokers (`upstream.tls`); None for plain TCP."""
    tls = config.upstream.tls
    if tls is None:
        return None
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH, cafile=str(tls.ca_file) if tls.ca_file else None
    )
    context.check_hostname = tls.check_hostname  # verify_mode stays CERT_REQUIRED either way
    if tls.cert_file is not None:
        password = tls.key_password.get_secret_value() if tls.key_password is not None else None
        context.load_cert_chain(
            str(tls.cert_file), str(tls.key_file) if tls.key_file else None, password
        )
    return context
