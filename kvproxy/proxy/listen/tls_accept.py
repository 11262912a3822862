"""Accepting TLS clients so that a failed handshake says why, and (SNI) choosing their node.

A TLS listener is a plain `create_server` whose factory returns an `Acceptance`: the event loop's
own TLS protocol (uvloop's or asyncio's, same constructor) around the app protocol, which knows
its peer, the server name the client sent, the node chosen for it and the first `SSLError` of
its handshake (`AlertingSSLObject` records it; it is often followed by the client's reset,
which is all the loop's waiter then says). With `create_server(ssl=...)` the loop ends a failed
handshake silently; here it is logged (rate-limited) and counted by reason.

On an SNI listener the route runs in OpenSSL's server name callback, during the handshake: a
`Refusal` answers the alert `unrecognized_name` (no connection to any broker), a node id (None:
the bootstrap) becomes the acceptance's `node_id`, read by the app protocol once connected.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from kvproxy.proxy.listen.tls_context import ListenerContext
from kvproxy.proxy.ops.log_limits import LineLimit
from kvproxy.proxy.ops.metrics import ProxyMetrics

log = logging.getLogger("kvproxy")
_route_failed = LineLimit("choosing a server name's node failed", log)


@dataclass(frozen=True, slots=True)
class Refusal:
    """A route's answer that no node serves this server name; `reason` is the metric label."""

    reason: str


Route: TypeAlias = Callable[[str | None], int | Refusal | None]
"""SNI listener: the server name (None: the client sent none) -> node id, None for the
bootstrap, or a Refusal (reason label, e.g. "no_matching_name", "unknown_node", "no_sni")."""

Gate: TypeAlias = Callable[
    [Callable[[float, Callable[[], None]], asyncio.BaseProtocol], tuple[str, int | None]],
    asyncio.BaseProtocol,
]
"""Admits a connection before its TLS protocol is made (`kvproxy.proxy.listen.tls_admission`):
(make the TLS protocol from a timeout and what ends the count, (listener, node)) -> a protocol."""

AppProtocol: TypeAlias = Callable[[int | None, "Acceptance"], asyncio.BaseProtocol]
"""Makes the app protocol of an accepted connection: (the listener's node, its acceptance)."""

REASONS: Final = frozenset({
    "no_client_certificate", "unknown_ca", "expired", "not_yet_valid", "bad_certificate",
    "no_matching_name", "unknown_node", "no_sni", "not_tls", "protocol_version",
    "no_shared_cipher", "timeout", "closed", "other",
})  # fmt: skip
"""The reason labels of `kvproxy_tls_handshake_failures_total` (a bounded set: a route's
refusal with another label counts as `other`)."""

LOG_INTERVAL_S: Final = 10.0
"""At most one log line per listener and reason in this time; the others are counted."""
SERVER_NAME_LOG_CHARS: Final = 255


class Acceptance:
    """One accepted TLS connection during its handshake: what went on, for the app protocol (the
    node chosen) and for the log line if it fails. Instances are of `acceptance_class(loop)`,
    this class mixed into the loop's own TLS protocol."""

    listener: str
    node_id: int | None
    """The listener's node (None: the bootstrap); on an SNI listener, the route's choice."""
    peer: str
    server_name: str | None
    failure: ssl.SSLError | None
    """The handshake's first SSLError, recorded when OpenSSL raised it."""
    refusal: Refusal | None

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        app_protocol: AppProtocol,
        context: ListenerContext,
        *,
        listener: str,
        node_id: int | None,
        route: Route | None,
        failures: HandshakeFailures,
        handshake_timeout_s: float,
        end: Callable[[], None] | None = None,
    ) -> None:
        self.listener = listener
        self.end_handshake = end
        """Ends its count among the handshakes in progress (`tls_admission`); None: not counted."""
        self.node_id = node_id
        self.peer = "unknown"
        self.server_name = None
        self.failure = None
        self.refusal = None
        self._route = route
        self._failures = failures
        self._context = context
        waiter = loop.create_future()
        waiter.add_done_callback(self._handshake_ended)
        protocol = app_protocol(node_id, self)
        context.accepting = self  # asyncio's TLS protocol makes its SSL object here
        try:
            super().__init__(  # type: ignore[call-arg]
                loop,
                protocol,
                context,
                waiter,
                server_side=True,
                ssl_handshake_timeout=handshake_timeout_s,
            )
        finally:
            context.accepting = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.peer = _address(transport.get_extra_info("peername"))
        self._context.accepting = self  # uvloop's makes its SSL object here
        try:
            super().connection_made(transport)  # type: ignore[misc]
        finally:
            self._context.accepting = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.handshake_ended()
        super().connection_lost(exc)  # type: ignore[misc]

    def handshake_ended(self) -> None:
        """The handshake is over (done, failed or closed): it no longer counts as in progress."""
        end, self.end_handshake = self.end_handshake, None
        if end is not None:
            end()

    def recorded(self, failure: ssl.SSLError) -> None:
        """The SSL object's handshake raised `failure` (kept if it is the first)."""
        if self.failure is None:
            self.failure = failure

    def server_name_seen(self, server_name: str | None) -> int | None:
        """OpenSSL's server name callback: record the name, route it; an alert to refuse."""
        self.server_name = server_name
        if self._route is None:
            return None
        try:
            choice = self._route(server_name)
        except Exception:
            _route_failed.log(
                logging.ERROR,
                "choosing the node of server name %r failed",
                server_name,
                exc_info=True,
            )
            self.refusal = Refusal("other")
            return ssl.ALERT_DESCRIPTION_INTERNAL_ERROR
        if isinstance(choice, Refusal):
            self.refusal = choice
            return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
        self.node_id = choice
        return None

    def _handshake_ended(self, waiter: asyncio.Future[None]) -> None:
        self.handshake_ended()
        ended = None if waiter.cancelled() else waiter.exception()
        if ended is None and self.failure is None and self.refusal is None:
            return
        reason, words = failure_reason(self.refusal, self.failure, ended)
        self._failures.failed(
            HandshakeFailure(
                listener=self.listener,
                node_id=self.node_id,
                peer=self.peer,
                server_name=self.server_name,
                reason=reason,
                words=words,
            )
        )


_ACCEPTANCE_CLASSES: dict[type, type[Acceptance]] = {}


def acceptance_class(loop: asyncio.AbstractEventLoop) -> type[Acceptance]:
    """`Acceptance` on the TLS protocol of `loop`: uvloop's on a uvloop loop, else asyncio's."""
    base: type = asyncio.sslproto.SSLProtocol
    try:
        import uvloop  # noqa: PLC0415 - optional (not on Windows)
        import uvloop.loop  # noqa: PLC0415
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        pass
    else:
        if isinstance(loop, uvloop.Loop):
            base = uvloop.loop.SSLProtocol  # type: ignore[attr-defined]
    found = _ACCEPTANCE_CLASSES.get(base)
    if found is None:
        found = _ACCEPTANCE_CLASSES[base] = type("Acceptance", (Acceptance, base), {})
    return found


def handshake_done(transport: asyncio.BaseTransport | None) -> None:
    """The app protocol of `transport` is connected: its handshake (if TLS) is over."""
    if transport is None:
        return
    acceptance = getattr(transport.get_extra_info("ssl_object"), "acceptance", None)
    if isinstance(acceptance, Acceptance):
        acceptance.handshake_ended()


def on_server_name(tls: ssl.SSLObject, server_name: str | None, _: ssl.SSLContext) -> int | None:
    """The listener contexts' `sni_callback`: hands the name to the connection's acceptance."""
    acceptance: Acceptance | None = getattr(tls, "acceptance", None)
    if acceptance is None:
        return None
    return acceptance.server_name_seen(server_name)


async def serve_tls(
    loop: asyncio.AbstractEventLoop,
    app_protocol: AppProtocol,
    *,
    host: str,
    port: int,
    context: ListenerContext,
    listener: str,
    node_id: int | None,
    route: Route | None,
    failures: HandshakeFailures,
    reuse_port: bool,
    handshake_timeout_s: float = 60.0,
    gate: Gate | None = None,
) -> asyncio.Server:
    """A TLS listener whose failed handshakes are logged and counted (see the module's text);
    with a `gate`, each connection is admitted by it first
    (`kvproxy.proxy.listen.tls_admission`)."""
    context.sni_callback = on_server_name
    accepting = acceptance_class(loop)

    def make(timeout_s: float, end: Callable[[], None] | None) -> asyncio.BaseProtocol:
        return accepting(  # type: ignore[return-value]
            loop,
            app_protocol,
            context,
            listener=listener,
            node_id=node_id,
            route=route,
            failures=failures,
            handshake_timeout_s=timeout_s,
            end=end,
        )

    def accept() -> asyncio.BaseProtocol:
        if gate is None:
            return make(handshake_timeout_s, None)
        return gate(make, (listener, node_id))

    return await loop.create_server(
        accept, host=host, port=port, reuse_address=True, reuse_port=reuse_port
    )


_VERIFY_REASONS: Final = {
    10: "expired",  # X509_V_ERR_CERT_HAS_EXPIRED
    9: "not_yet_valid",  # X509_V_ERR_CERT_NOT_YET_VALID
    2: "unknown_ca",  # unable to get issuer certificate
    18: "unknown_ca",  # self-signed certificate
    19: "unknown_ca",  # self-signed certificate in chain
    20: "unknown_ca",  # unable to get local issuer certificate
    21: "unknown_ca",  # unable to verify the first certificate
}
_OPENSSL_REASONS: Final = {
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "no_client_certificate",
    "WRONG_VERSION_NUMBER": "not_tls",
    "HTTP_REQUEST": "not_tls",
    "HTTPS_PROXY_REQUEST": "not_tls",
    "UNKNOWN_PROTOCOL": "not_tls",
    "PACKET_LENGTH_TOO_LONG": "not_tls",
    "RECORD_LAYER_FAILURE": "not_tls",
    "UNSUPPORTED_PROTOCOL": "protocol_version",
    "TLSV1_ALERT_PROTOCOL_VERSION": "protocol_version",
    "NO_SHARED_CIPHER": "no_shared_cipher",
}


def failure_reason(
    refusal: Refusal | None, failure: ssl.SSLError | None, ended: BaseException | None
) -> tuple[str, str]:
    """(reason label, OpenSSL's words or what happened) of a failed handshake: what the route
    refused, else the handshake's first SSLError, else how the connection ended."""
    if refusal is not None:
        if refusal.reason in REASONS:
            return refusal.reason, "refused by the server name's route"
        return "other", f"refused by the server name's route ({refusal.reason})"
    if failure is None and isinstance(ended, ssl.SSLError):
        failure = ended
    if failure is not None:
        return _ssl_reason(failure), _openssl_words(failure)
    if isinstance(ended, ConnectionAbortedError | TimeoutError):
        return "timeout", "the handshake did not finish in time"
    if ended is None or isinstance(ended, ConnectionError | EOFError):
        return "closed", "the client closed the connection during the handshake"
    return "other", str(ended) or type(ended).__name__


def _ssl_reason(failure: ssl.SSLError) -> str:
    code = failure.reason or ""
    if isinstance(failure, ssl.SSLCertVerificationError) or code == "CERTIFICATE_VERIFY_FAILED":
        return _VERIFY_REASONS.get(getattr(failure, "verify_code", -1), "bad_certificate")
    found = _OPENSSL_REASONS.get(code)
    if found is not None:
        return found
    if code.startswith(("TLSV1_ALERT_", "SSLV3_ALERT_", "TLSV13_ALERT_")):
        return "closed"  # the client's own alert: it refused the proxy (its certificate, ...)
    return "other"


def _openssl_words(failure: ssl.SSLError) -> str:
    """What OpenSSL said ("certificate verify failed: certificate has expired"), without the
    bracketed code and CPython's source line around it."""
    words = getattr(failure, "verify_message", None)
    if words:
        return f"certificate verify failed: {words}"
    text = str(failure.args[1]) if len(failure.args) > 1 else str(failure)
    if text.startswith("["):
        text = text.split("] ", 1)[-1]
    return text.split(" (_ssl.c:", 1)[0]


def _address(peername: Any) -> str:
    if isinstance(peername, tuple) and len(peername) >= 2:
        host, port = peername[0], peername[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(peername) if peername else "unknown"


def escape_server_name(name: str) -> str:
    """A client's server name for a log line: every byte outside printable ASCII (and the
    backslash) as `\\xNN`; cut (between escapes, marked "...") to 255 characters."""
    pieces = [
        chr(byte) if 0x20 <= byte < 0x7F and byte != 0x5C else f"\\x{byte:02x}"
        for byte in name.encode("utf-8", "surrogateescape")
    ]
    escaped = "".join(pieces)
    if len(escaped) <= SERVER_NAME_LOG_CHARS:
        return escaped
    kept, length = [], 0
    for piece in pieces:
        length += len(piece)
        if length > SERVER_NAME_LOG_CHARS - len("..."):
            break
        kept.append(piece)
    return "".join(kept) + "..."


@dataclass(frozen=True, slots=True)
class HandshakeFailure:
    listener: str
    node_id: int | None
    peer: str
    server_name: str | None
    reason: str
    words: str

    def fields(self) -> dict[str, object]:
        """The line's structured fields (`--log-format json`)."""
        return {
            "listener": self.listener,
            "node": self.node_id,
            "peer": self.peer,
            "server_name": None
            if self.server_name is None
            else escape_server_name(self.server_name),
            "reason": self.reason,
            "detail": self.words,
        }

    def describe(self) -> str:
        node = "" if self.node_id is None else f" (node {self.node_id})"
        name = "none" if self.server_name is None else f"'{escape_server_name(self.server_name)}'"
        return (
            f"on the {self.listener} listener{node} from {self.peer}, server name {name}: "
            f"{self.reason} ({self.words})"
        )


@dataclass(slots=True)
class _Window:
    """A listener's reason logged once: the failures since, not logged one by one."""

    timer: asyncio.TimerHandle
    unlogged: int = 0
    last: HandshakeFailure | None = None


class HandshakeFailures:
    """Failed handshakes: logged (rate-limited: at most one line per reason per 10 s per
    listener, with the count of those not logged; peer, server name escaped and cut to 255
    characters, reason, OpenSSL's words) and counted in
    kvproxy_tls_handshake_failures_total{listener, reason}."""

    def __init__(self, metrics: ProxyMetrics, *, interval_s: float = LOG_INTERVAL_S) -> None:
        self._counter = metrics.tls_handshake_failures
        self._interval_s = interval_s
        self._windows: dict[tuple[str, str], _Window] = {}

    def failed(self, failure: HandshakeFailure) -> None:
        self._counter.labels(failure.listener, failure.reason).inc()
        key = (failure.listener, failure.reason)
        window = self._windows.get(key)
        if window is not None:
            window.unlogged += 1
            window.last = failure
            return
        log.warning(
            "TLS handshake failed %s",
            failure.describe(),
            extra={"event": "tls_handshake_failed", **failure.fields()},
        )
        self._open_window(key)

    def close(self) -> None:
        """Log the counts not logged yet and stop the timers (the listeners are closing)."""
        for key in list(self._windows):
            self._window_ended(key, reopen=False)

    def _open_window(self, key: tuple[str, str]) -> None:
        timer = asyncio.get_running_loop().call_later(self._interval_s, self._window_ended, key)
        self._windows[key] = _Window(timer)

    def _window_ended(self, key: tuple[str, str], reopen: bool = True) -> None:
        window = self._windows.pop(key)
        window.timer.cancel()
        if window.last is None:
            return
        log.warning(
            "TLS handshake failed %d more times on the %s listener with reason %s, not logged "
            "one by one; the last %s",
            window.unlogged,
            key[0],
            key[1],
            window.last.describe(),
            extra={
                "event": "tls_handshake_failures_not_logged",
                "times": window.unlogged,
                **window.last.fields(),
            },
        )
        if reopen:
            self._open_window(key)
