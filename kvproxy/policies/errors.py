"""What is wrong with a configuration, said briefly: where (`ConfigProblem`), and values quoted
without letting a huge or self-containing one blow up the message (`short_repr`, `cut`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_PROBLEMS_SHOWN",
    "MAX_PROBLEM_CHARS",
    "MAX_VALUE_CHARS",
    "ConfigProblem",
    "KeyPath",
    "PolicyConfigError",
    "cut",
    "format_path",
    "kind_of",
    "short_repr",
]

KeyPath = tuple[str | int, ...]
"""Where a value is in the configuration: mapping keys and list indexes from the top."""

MAX_VALUE_CHARS = 200
"""A value quoted in an error message is cut after this many characters: a configuration value
can be a megabyte of text, or (through YAML aliases) far more once expanded."""
MAX_PROBLEM_CHARS = 1000
"""The longest one problem's text gets, whatever a policy or a library put into it."""
MAX_PROBLEMS_SHOWN = 100
"""Problems listed in one report; past it the report says how many more there are (and those
get no spelling suggestion, which costs a comparison with every known name)."""
_COUNT_BUDGET = 100_000
"""Pieces of a cut repr that are still measured to say how much was cut; beyond, "more than"."""


def format_path(path: KeyPath) -> str:
    """`("topics", 0, "policies", 1)` -> `topics[0].policies[1]`, as a reader would write it."""
    text = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            text += f"[{part}]"
        else:
            name = cut(str(part), MAX_VALUE_CHARS)
            text += f".{name}" if text else name
    return text


def cut(text: str, limit: int = MAX_PROBLEM_CHARS) -> str:
    """`text`, or its first `limit` characters and how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters)"


def short_repr(value: object, limit: int = MAX_VALUE_CHARS) -> str:
    """`repr(value)` for an error message: whole when short, else its first `limit` characters
    and how many more there were. The repr is built piece by piece and never whole, so a value
    that expands to gigabytes costs no more than a bounded walk."""
    shown: list[str] = []
    length = 0
    pieces = _repr_pieces(value)
    for piece in pieces:
        if length + len(piece) > limit:
            shown.append(piece[: limit - length])
            more = length + len(piece) - limit
            for counted, rest in enumerate(pieces):
                if counted >= _COUNT_BUDGET:
                    return f"{''.join(shown)}... (more than {more:,} more characters)"
                more += len(rest)
            return f"{''.join(shown)}... ({more:,} more characters)"
        shown.append(piece)
        length += len(piece)
    return "".join(shown)


def _repr_pieces(value: object) -> Iterator[str]:
    """repr(value) in pieces, for lists, tuples, sets and dicts of any depth (no recursion, so
    neither depth nor a structure that contains itself can break it); other values whole."""
    stack: list[Iterator[object] | str] = [iter((value,))]
    inside: list[int] = []  # ids of the containers being written, to spot a cycle
    while stack:
        top = stack[-1]
        if isinstance(top, str):  # a container's closing bracket
            stack.pop()
            inside.pop()
            yield top
            continue
        item = next(top, _END)
        if item is _END:
            stack.pop()
            continue
        if isinstance(item, _Separator):
            yield item.text
            continue
        brackets = _brackets(item)
        if brackets is not None:
            if id(item) in inside:
                yield "[...]" if isinstance(item, list) else "{...}"
                continue
            yield brackets[0]
            inside.append(id(item))
            stack.append(brackets[1])
            stack.append(_members(item))
            continue
        yield _scalar_repr(item)


def kind_of(value: object) -> str:
    """What a value is, in words ("a string"), for "must be a list, not a string". The value
    itself is not shown: in some sections it is a secret."""
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string" if value else "an empty string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"


class _Separator:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


_END = object()
_COMMA = _Separator(", ")
_COLON = _Separator(": ")


def _brackets(value: object) -> tuple[str, str] | None:
    """How a container's repr opens and closes; None for anything else (and empty sets, whose
    repr is a word)."""
    if isinstance(value, dict):
        return "{", "}"
    if isinstance(value, list):
        return "[", "]"
    if isinstance(value, tuple):
        return "(", ",)" if len(value) == 1 else ")"
    if isinstance(value, frozenset) and value:
        return "frozenset({", "})"
    if isinstance(value, set) and value:
        return "{", "}"
    return None


def _members(container: Any) -> Iterator[object]:
    """A container's members with the separators between them."""
    if isinstance(container, dict):
        for index, (key, member) in enumerate(container.items()):
            if index:
                yield _COMMA
            yield key
            yield _COLON
            yield member
        return
    for index, member in enumerate(container):
        if index:
            yield _COMMA
        yield member


def _scalar_repr(value: object) -> str:
    try:
        return repr(value)
    except ValueError:  # an int of more digits than Python prints in decimal
        bits = value.bit_length() if isinstance(value, int) else 0
        return f"<an integer of {bits} bits>"


@dataclass(frozen=True, slots=True)
class ConfigProblem:
    """One thing wrong with a configuration: where, and why."""

    path: KeyPath
    """The mapping or list item the message is about; () for the top level."""
    message: str
    at: KeyPath = ()
    """Keys below `path` that the message names (`mode` in "mode must be ..."), so that a file's
    report can point at their line; `path` alone when they are missing."""

    def __str__(self) -> str:
        text = f"{format_path(self.path)}: {self.message}" if self.path else self.message
        return cut(text)


class PolicyConfigError(ValueError):
    """A policy configuration that cannot be used: one problem (a policy's `create`), or every
    problem of the `defaults` and `topics` sections (`build_routing`), each with where it is."""

    def __init__(self, message: str = "", problems: Iterable[ConfigProblem] = ()) -> None:
        self.problems: tuple[ConfigProblem, ...] = tuple(problems) or (ConfigProblem((), message),)
        super().__init__(cut(message) if message else _joined(self.problems))


def _joined(problems: tuple[ConfigProblem, ...], shown: int = MAX_PROBLEMS_SHOWN) -> str:
    text = "; ".join(str(problem) for problem in problems[:shown])
    more = len(problems) - shown
    return f"{text}; ... and {more} more problem(s)" if more > 0 else text
