"""A configuration file as YAML with the line of every key, and problems reported by line.

The proxy (`kvproxy serve`, `check`, reloads) and the audit (`kvproxy audit -c FILE`) read the
same file, so both report a problem the same way: `FILE:LINE: where: why`, every problem at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from policies.builtin.base import ConfigProblem, KeyPath

__all__ = ["ConfigFileError", "LocatedProblem", "line_of", "locate", "read_yaml_with_lines"]


class ConfigFileError(ValueError):
    """The file cannot be read, is not YAML, or is not a mapping of sections."""


@dataclass(frozen=True, slots=True)
class LocatedProblem:
    """One problem as reported: where and why, and the line of the file it is on (1-based; None
    when the configuration did not come from a file)."""

    line: int | None
    text: str


def read_yaml_with_lines(path: Path) -> tuple[Mapping[str, Any] | None, dict[KeyPath, int]]:
    """The file's data (None when empty), and the line of each key and list item in it."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read: {exc.strerror}") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()  # what yaml.safe_load does, keeping the nodes' marks
        data = None if node is None else loader.construct_document(node)
        lines = _key_lines(loader, node)
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"{path}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()
    if data is not None and not isinstance(data, Mapping):
        raise ConfigFileError(f"{path}: the top level must be a mapping of sections")
    return data, lines


def _key_lines(loader: yaml.SafeLoader, root: yaml.Node | None) -> dict[KeyPath, int]:
    """Path -> 1-based line of every mapping key and list item (of the key for a mapping's
    value); () is where the document starts. Keys merged in with `<<:` have the line where they
    are written, unless the mapping sets them itself."""
    lines: dict[KeyPath, int] = {(): 1 if root is None else root.start_mark.line + 1}
    pending: list[tuple[yaml.Node, KeyPath]] = []
    if root is not None:
        pending.append((root, ()))
    walked: set[int] = set()
    while pending:
        node, path = pending.pop()
        if id(node) in walked:  # an alias: its keys are on the lines of the anchor's, and a
            continue  # file of nested aliases cannot make this walk (or the map) grow beyond it
        walked.add(id(node))
        if isinstance(node, yaml.MappingNode):
            # after construction the node's pairs are flattened: merged keys first, own keys last
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = loader.construct_object(key_node)
                lines[(*path, key)] = key_node.start_mark.line + 1
                pending.append((value_node, (*path, key)))
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                lines[(*path, index)] = item.start_mark.line + 1
                pending.append((item, (*path, index)))
    return lines


def line_of(problem: ConfigProblem, lines: Mapping[KeyPath, int]) -> int | None:
    """The line of the key the problem names, else of the nearest mapping or list around it."""
    path = (*problem.path, *problem.at)
    for end in range(len(path), -1, -1):
        line = lines.get(path[:end])
        if line is not None:
            return line
    return None


def locate(
    source: str, problems: Sequence[ConfigProblem], lines: Mapping[KeyPath, int]
) -> tuple[str, list[LocatedProblem]]:
    """Every problem by line, and the report: `source: N problem(s)`, then one line each,
    `source:line: where: why` (no line when the data did not come from a file)."""
    found = [LocatedProblem(line_of(problem, lines), str(problem)) for problem in problems]
    found.sort(key=lambda problem: problem.line or 0)
    text = [f"{source}: {len(found)} problem(s)"]
    for problem in found:
        where = f"{source}:{problem.line}: " if problem.line is not None else ""
        text.append(f"  {where}{problem.text}")
    return "\n".join(text), found
