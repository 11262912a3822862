"""A configuration file as YAML with the line of every key, and problems reported by line.

The proxy (`kvproxy serve`, `check`, reloads) and the audit (`kvproxy audit -c FILE`) read the
same file, so both report a problem the same way: `FILE:LINE: where: why`, every problem at once.

The file is read with bounds, because whoever can write it (or swap it, for a reload) should not
be able to stall the reader: at most `MAX_FILE_BYTES`, at most `MAX_VALUES` values added by
YAML aliases (nested aliases, the "billion laughs", expand exponentially), no alias
inside its own anchor, at most `MAX_DEPTH` levels of nesting, and no integer longer than
`MAX_INT_CHARS`. A file past a bound is refused before its data is built.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml

from kvproxy.policies.errors import MAX_PROBLEMS_SHOWN, ConfigProblem, KeyPath, cut

__all__ = [
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_INT_CHARS",
    "MAX_PROBLEMS_SHOWN",
    "MAX_VALUES",
    "ConfigFileError",
    "LocatedProblem",
    "line_of",
    "locate",
    "read_yaml_with_lines",
    "yaml_problem",
]

MAX_FILE_BYTES = 1024 * 1024
"""A policy configuration is a few KiB; 1 MiB holds thousands of topic rules. A larger file is
refused unread, so a reload cannot be made to parse for minutes."""
MAX_VALUES = 1_000_000
"""Values (keys, items, scalars) that aliases add, each alias counting what its anchor holds
once expanded. What is written out is bounded by the file's size (at most about one value a
byte); nine levels of nine aliases would add 387 million."""
MAX_DEPTH = 100
"""Levels of nested lists and mappings (PyYAML composes recursively: a deeper file would fail
with Python's recursion limit)."""
MAX_INT_CHARS = 100
"""Characters of one integer: Python takes quadratic time over long decimal and `1:2:3` ones."""


class ConfigFileError(ValueError):
    """The file cannot be read, is not YAML, or is not a mapping of sections."""


@dataclass(frozen=True, slots=True)
class LocatedProblem:
    """One problem as reported: where and why, and the line of the file it is on (1-based; None
    when the configuration did not come from a file)."""

    line: int | None
    text: str


def read_yaml_with_lines(
    path: Path, *, max_bytes: int = MAX_FILE_BYTES, max_values: int = MAX_VALUES
) -> tuple[Mapping[str, Any] | None, dict[KeyPath, int]]:
    """The file's data (None when empty), and the line of each key and list item in it."""
    text = _read_text(path, max_bytes)
    loader = _BoundedLoader(text, max_values)
    try:
        node = loader.get_single_node()  # what yaml.safe_load does, keeping the nodes' marks
        data = None if node is None else loader.construct_document(node)
        lines = _key_lines(loader, node)
    except yaml.YAMLError as exc:
        raise ConfigFileError(yaml_problem(path, exc)) from None
    finally:
        loader.dispose()
    if data is not None and not isinstance(data, Mapping):
        raise ConfigFileError(f"{path}: the top level must be a mapping of sections")
    return data, lines


_PROBLEMS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), plain)
    for pattern, plain in (
        (
            r"mapping values are not allowed here",
            "a ':' where no key can start: quote a value that holds ': ', or indent the key "
            "as the keys beside it",
        ),
        (r"found character '\\t' that cannot start any token", "a tab: YAML indents with spaces"),
        (
            r"found character '(.*)' that cannot start any token",
            "{0!r} cannot start a value: quote the value",
        ),
        (r"found unexpected end of stream", "the file ends before the closing quote"),
        (r"found undefined alias '(.*)'", "the alias *{0} names no anchor &{0} written before it"),
        (r"could not find expected ':'", "a key without ':' after it"),
        (r"expected ',' or '([]}])', but got (.*)", "expected ',' or '{0}', found {1}"),
        (
            r"expected <block end>, but found (.*)",
            "a line indented differently from the lines beside it: found {0}",
        ),
    )
)
"""PyYAML's common problems -> plain words (its own words for the others)."""
_TOKENS = {
    "'<stream end>'": "the end of the file",
    "'<block end>'": "the end of the indented block",
    "'<block mapping start>'": "a key indented more than the one before it",
    "'<block sequence start>'": "a list item",
    "'<scalar>'": "a value",
    "'?'": "a key",
    "'-'": "a list item",
}
_CONTEXTS = {
    "while parsing a flow mapping": "the {...} mapping",
    "while parsing a flow sequence": "the [...] list",
    "while parsing a block mapping": "the mapping",
    "while parsing a block collection": "the list",
    "while scanning a quoted scalar": "the quoted string",
    "while scanning a simple key": "the key",
}


def yaml_problem(path: Path | str, exc: yaml.YAMLError) -> str:
    """`FILE: not valid YAML: line L, column C: what`, in plain words, and where the mapping,
    list or string it happened in starts. The file's text is not quoted: it may hold a secret."""
    mark = getattr(exc, "problem_mark", None)
    problem = str(getattr(exc, "problem", None) or "")
    if mark is None or not problem:
        return f"{path}: not valid YAML: {cut(str(exc).replace(chr(10), ' '))}"
    text = cut(_plain(problem))
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    context = getattr(exc, "context", None)
    context_mark = getattr(exc, "context_mark", None)
    inside = _CONTEXTS.get(str(context))
    if inside is not None and context_mark is not None:
        opened = "opened" if "{" in inside or "[" in inside else "starting"
        text += f" (in {inside} {opened} on line {context_mark.line + 1}, column "
        text += f"{context_mark.column + 1})"
    return f"{path}: not valid YAML: {where}: {text}"


def _plain(problem: str) -> str:
    for pattern, plain in _PROBLEMS:
        found = pattern.fullmatch(problem)
        if found is not None:
            return plain.format(*(_TOKENS.get(group, group) for group in found.groups()))
    return problem


def _read_text(path: Path, max_bytes: int) -> str:
    """The file as text, read no further than `max_bytes` (a FIFO or /dev/zero included)."""
    try:
        with path.open("rb") as file:
            raw = file.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read: {exc.strerror}") from None
    if len(raw) > max_bytes:
        try:
            size = path.stat().st_size
        except OSError:
            size = 0
        what = f"{size:,} bytes" if size > max_bytes else f"more than {max_bytes:,} bytes"
        raise ConfigFileError(
            f"{path}: too large: {what}, the limit is {max_bytes:,} bytes (a policy "
            "configuration is a few KiB; JSON and Avro schemas go in files of their own)"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigFileError(
            f"{path}: not UTF-8 text: byte 0x{raw[exc.start]:02x} on line {line}"
        ) from None


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that counts, while it composes, how many values the document's
    aliases add once expanded, and refuses it past `max_values`, before anything is built from
    it. An alias costs the expanded size of its anchor, known once that anchor is composed."""

    def __init__(self, text: str, max_values: int) -> None:
        super().__init__(text)
        self._max_values = max_values
        self._values = 0  # composed so far, aliases expanded
        self._aliased = 0  # of which aliases added
        self._sizes: dict[int, int] = {}  # id of an anchored node -> its expanded size
        self._open_anchors: set[str] = set()
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open_anchors:
                raise _refusal(
                    f"the alias *{cut(str(event.anchor), 100)} is inside its own anchor "
                    "(a structure that contains itself)",
                    event,
                )
            node = super().compose_node(parent, index)
            size = self._sizes.get(id(node), 1)
            self._values += size
            self._aliased += size
            if self._aliased > self._max_values:
                raise _refusal(
                    f"its aliases expand to more than {self._max_values:,} values (nested "
                    "aliases multiply: write the values out, or use fewer levels of aliases)",
                    event,
                )
            return node
        anchor: str | None = getattr(event, "anchor", None)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _refusal(f"nested deeper than {MAX_DEPTH} levels", event)
        if anchor is not None:
            self._open_anchors.add(anchor)
        before = self._values
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if anchor is not None:
                self._open_anchors.discard(anchor)
        self._values += 1
        if anchor is not None:
            self._sizes[id(node)] = self._values - before
        return node

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        if len(node.value) > MAX_INT_CHARS:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"an integer of {len(node.value):,} characters (at most {MAX_INT_CHARS})",
                cast(Any, node.start_mark),
            )
        return int(super().construct_yaml_int(node))


def _refusal(problem: str, event: Any) -> yaml.YAMLError:
    """A YAML error at the event's position, worded like PyYAML's own."""
    return yaml.composer.ComposerError(None, None, problem, event.start_mark)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


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
    """Every problem by line, and the report: `source: N problem(s)`, then one line each (for
    the first `MAX_PROBLEMS_SHOWN`), `source:line: where: why` (no line when the data did not
    come from a file)."""
    found = [LocatedProblem(line_of(problem, lines), str(problem)) for problem in problems]
    found.sort(key=lambda problem: problem.line or 0)
    text = [f"{source}: {len(found)} problem(s)"]
    for problem in found[:MAX_PROBLEMS_SHOWN]:
        where = f"{source}:{problem.line}: " if problem.line is not None else ""
        text.append(f"  {where}{problem.text}")
    if len(found) > MAX_PROBLEMS_SHOWN:
        text.append(f"  ... and {len(found) - MAX_PROBLEMS_SHOWN} more problem(s)")
    return "\n".join(text), found
