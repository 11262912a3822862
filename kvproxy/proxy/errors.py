"""The relay's own error, raised by the listeners, the node directory and the server alike."""

from __future__ import annotations


class ProxyError(Exception):
    """The proxy cannot do what the configuration asks (e.g. a node id outside the port range)."""
