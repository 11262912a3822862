"""YAML "billion laughs" for the tests of the configuration reader's limits."""

from __future__ import annotations


def bomb_lines(levels: int, use: str) -> str:
    """A "billion laughs": nine strings, then `levels - 1` lists of nine aliases of the one
    before; `use` names the last one (TOP) in a top-level section."""
    lines = ["anchors:"]
    lines.append('  a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]')
    for level in range(1, levels):
        lines.append(f"  a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]")
    lines.append(use.replace("TOP", f"*a{levels - 1}"))
    return "\n".join(lines) + "\n"
