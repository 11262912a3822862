"""docs/architecture.md names each hop of a Produce request as `file.py:Class.method`: every
such name is a function that exists where the page says, so the drawing cannot drift from the
code unnoticed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "architecture.md"
HOP = re.compile(r"\b([a-z_/]+\.py):([A-Za-z_][A-Za-z_.]*[A-Za-z_])")
WHERE = (REPO, REPO / "kvproxy", REPO / "kvproxy" / "proxy", REPO / "kvproxy" / "proxy" / "produce")


def defined(tree: ast.Module, dotted: str) -> bool:
    """Whether `dotted` (`f`, `Class.method`) is defined at the top of `tree`."""
    scope: list[ast.stmt] = tree.body
    for part in dotted.split("."):
        found = [
            node
            for node in scope
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and node.name == part
        ]
        if not found:
            return False
        scope = found[0].body
    return True


def hops() -> list[tuple[str, str]]:
    return sorted(set(HOP.findall(PAGE.read_text())))


def test_the_page_names_the_hops_of_a_produce_request() -> None:
    named = {f"{path}:{name}" for path, name in hops()}
    assert "produce/engine.py:ProduceEngine.decide" in named
    assert len(named) >= 15


def test_every_hop_named_is_a_function_where_the_page_says() -> None:
    missing = []
    for path, name in hops():
        files = [base / path for base in WHERE if (base / path).is_file()]
        if not files or not any(defined(ast.parse(f.read_text()), name) for f in files):
            missing.append(f"{path}:{name}")
    assert missing == []
