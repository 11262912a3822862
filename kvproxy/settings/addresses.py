"""`host:port` addresses, read one way wherever the configuration or a command line gives one."""

from __future__ import annotations

from kvproxy.policies.errors import short_repr

__all__ = ["join_host_port", "parse_host_port"]


def parse_host_port(server: str) -> tuple[str, int]:
    """(host, port) of `HOST:PORT`; an IPv6 host may be written in brackets (`[::1]:9092`).
    ValueError when the text is not an address with a port in 1-65535."""
    host, sep, port = server.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"{short_repr(server)} is not HOST:PORT")
    return host.strip("[]"), int(port)


def join_host_port(host: str, port: int) -> str:
    """The address `parse_host_port` reads back: an IPv6 host goes in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
