"""Each side of a connection does its own job: the upstream side alone writes to, pauses and
closes the broker's transport; the client side and a Produce request's exchange ask it to."""

from __future__ import annotations

import ast
from pathlib import Path

PROXY = Path(__file__).resolve().parents[2] / "kvproxy" / "proxy"
UPSTREAM_SIDE = "upstream_connection.py"


def _upstream_transport_uses(path: Path) -> list[str]:
    """Lines where `path` reaches an upstream connection's transport (`<...>.upstream.transport`
    or `upstream.transport`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Attribute) and node.attr == "transport"):
            continue
        owner = node.value
        name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        if name == "upstream":
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_only_the_upstream_side_touches_the_broker_transport() -> None:
    """Every module of the relay but the upstream side itself: the connection, the Produce
    exchange, the reading bookkeeping, the dialer that opens the upstream connection."""
    modules = sorted(p for p in PROXY.rglob("*.py") if p.name != UPSTREAM_SIDE)
    assert {"client_connection.py", "exchange.py", "upstream_dialer.py"} <= {
        p.name for p in modules
    }
    found = [use for path in modules for use in _upstream_transport_uses(path)]
    assert found == []
