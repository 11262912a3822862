"""Each side of a connection does its own job: the upstream side alone writes to, pauses and
closes the broker's transport; the client side and a Produce request's exchange ask it to."""

from __future__ import annotations

import ast
from pathlib import Path

PROXY = Path(__file__).resolve().parents[2] / "proxy"
ASKING_SIDES = ("connection.py", "produce_exchange.py", "client_reading.py")


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
    found = [use for name in ASKING_SIDES for use in _upstream_transport_uses(PROXY / name)]
    assert found == []
