"""A configuration file read into a pydantic model, every problem reported by line at once.

Every key has a default and unknown keys are errors, so a typo is reported instead of ignored.
The same words are used wherever the file is read: a key is unknown (with a spelling hint), a
key is missing, or a section has the wrong type ("listen must be a mapping, not a number").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, ValidationError

from kvproxy.policies.config import spelling_hint
from kvproxy.policies.errors import MAX_PROBLEMS_SHOWN, ConfigProblem, KeyPath, kind_of
from kvproxy.settings.yaml_file import ConfigFileError, LocatedProblem, locate, read_yaml_with_lines

__all__ = [
    "ConfigError",
    "Section",
    "read_document",
    "report",
    "validate",
]

Model = TypeVar("Model", bound=BaseModel)


class ConfigError(ValueError):
    """The configuration file cannot be used; the message says where and why.

    `problems` lists everything wrong with a file that was read, by line; it is empty when the
    file could not be read or parsed (the message alone says why)."""

    def __init__(self, message: str, problems: Sequence[LocatedProblem] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems)


class Section(BaseModel):
    """A section of the file: unknown keys are errors, and the values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def read_document(path: Path) -> tuple[Mapping[str, Any] | None, dict[KeyPath, int]]:
    """The file's data, and the line of each key and list item in it."""
    try:
        return read_yaml_with_lines(path)
    except ConfigFileError as exc:
        raise ConfigError(str(exc)) from None


def validate(
    model: type[Model], data: Mapping[str, Any] | None
) -> tuple[Model | None, list[ConfigProblem]]:
    """The data as `model`, or every problem pydantic finds (not only the first)."""
    try:
        return model.model_validate(dict(data or {})), []
    except ValidationError as exc:
        errors = exc.errors()
        # a spelling hint compares with every known key: only for problems a report can list
        return None, [
            _schema_problem(model, e, hint=i < MAX_PROBLEMS_SHOWN) for i, e in enumerate(errors)
        ]


_EXPECTED = {
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "dict_type": "a mapping",
    "tuple_type": "a list",
    "list_type": "a list",
    "path_type": "a path",
}
"""pydantic's error types for a section (or a list, or a path) of the wrong type -> what it must
be. A scalar of the wrong type keeps pydantic's words ("Input should be a valid integer")."""


def _schema_problem(model: type[BaseModel], error: Any, *, hint: bool = True) -> ConfigProblem:
    """A pydantic error in the words of the file: a key is unknown, missing, or a section of the
    wrong type ("listen must be a mapping, not a number"); other errors keep pydantic's message."""
    loc: KeyPath = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden" and loc:
        known = _known_keys(model, loc[:-1])
        why = f" ({spelling_hint(loc[-1], known)})" if known and hint else ""
        return ConfigProblem(loc, f"unknown key{why}")
    if kind == "missing" and loc:
        return ConfigProblem(loc[:-1], f"{loc[-1]} is missing", loc[-1:])
    expected = _EXPECTED.get(kind)
    if expected is not None and loc:
        wrong = f"must be {expected}, not {kind_of(error.get('input'))}"
        if isinstance(loc[-1], str):
            return ConfigProblem(loc[:-1], f"{loc[-1]} {wrong}", loc[-1:])
        return ConfigProblem(loc, wrong)
    return ConfigProblem(loc, error["msg"])


def _known_keys(model: type[BaseModel], path: KeyPath) -> frozenset[str]:
    """The keys of the section at `path`; empty when `path` is not a section."""
    for part in path:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return frozenset()
        candidates = (field.annotation, *get_args(field.annotation))
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not nested:
            return frozenset()
        model = nested[0]
    return frozenset(model.model_fields)


def report(
    source: str, problems: Sequence[ConfigProblem], lines: Mapping[KeyPath, int]
) -> ConfigError:
    """One error for every problem, by line: `source:line: where: why` (no line without a file)."""
    text, found = locate(source, problems, lines)
    return ConfigError(text, found)
