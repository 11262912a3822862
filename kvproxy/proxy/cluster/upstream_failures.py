"""Why a request to the cluster failed, in the words an operator acts on (the proxy's connect
timeout, its own shortage of file descriptors, TLS, an answer that is not Kafka's)."""

from __future__ import annotations

import ssl

from kvproxy.protocol.errors import ProtocolError
from kvproxy.proxy.ops.fds import describe as describe_fd_shortage
from kvproxy.proxy.ops.fds import out_of_fds

__all__ = ["describe_failure"]


def describe_failure(exc: BaseException, timeout_s: float) -> str:
    """Why a request to the cluster failed, in words: never empty (a timeout's own text is)."""
    if isinstance(exc, TimeoutError):
        return (
            f"no answer within upstream.connect_timeout_ms ({timeout_s * 1000:.0f} ms): the "
            "address accepts nothing, or the peer does not answer Kafka requests"
        )
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens on that port)"
    if out_of_fds(exc):  # the proxy's own shortage, not the broker's
        return describe_fd_shortage(exc)
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed: {exc.reason or exc}"
    text = str(exc) or type(exc).__name__
    if isinstance(exc, UnicodeError):  # a name the IDNA codec refuses ("..", a 64-byte label)
        return f"not a host name a resolver can be asked for: {text}"
    if isinstance(exc, ProtocolError):
        return f"the answer is not Kafka's: {text}"
    return text
