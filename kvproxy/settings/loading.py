"""A configuration file read into a pydantic model, every problem reported by line at once.

Every key has a default and unknown keys are errors, so a typo is reported instead of ignored.
The same words are used wherever the file is read: a key is unknown (with a spelling hint), a
key is missing, a section has the wrong type ("listen must be a mapping, not a number"), or a
value ("listen.port: must be a whole number, not 'abc'"; a secret's value is never quoted).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError

from kvproxy.policies.config import spelling_hint
from kvproxy.policies.errors import (
    MAX_PROBLEMS_SHOWN,
    ConfigProblem,
    KeyPath,
    kind_of,
    short_repr,
)
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
be. The value is not quoted (a section may hold secrets): only what it is."""
_SCALARS = {
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
}
"""pydantic's error types for a value of the wrong type -> what it must be; the value is quoted
after it, unless the key is a secret."""
_BOUNDS = {
    "greater_than_equal": ("ge", "at least"),
    "greater_than": ("gt", "more than"),
    "less_than_equal": ("le", "at most"),
    "less_than": ("lt", "less than"),
}
"""pydantic's error types for a number out of range -> its bound in the context, in words."""


def _schema_problem(model: type[BaseModel], error: Any, *, hint: bool = True) -> ConfigProblem:
    """A pydantic error in the words of the file: a key is unknown or missing, a section or value
    of the wrong type ("listen must be a mapping, not a number", "listen.port: must be a whole
    number, not 'abc'"), a number out of range ("must be at least 1024, not 5"), a value not among
    those allowed, or what kvproxy's own validator says; rarer errors keep pydantic's message."""
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
    expected = _value_must_be(kind, error.get("ctx") or {})
    if expected is not None:
        value = error.get("input")
        shown = kind_of(value) if _is_secret(model, loc) else short_repr(value)
        return ConfigProblem(loc, f"must be {expected}, not {shown}")
    if kind == "value_error":  # kvproxy's own validators: their message, without pydantic's prefix
        return ConfigProblem(loc, str(error["msg"]).removeprefix("Value error, "))
    return ConfigProblem(loc, error["msg"])


def _value_must_be(kind: str, context: Mapping[str, Any]) -> str | None:
    """What a value must be, by pydantic's error type; None for the types kept in its words."""
    expected = _SCALARS.get(kind)
    if expected is not None:
        return expected
    if kind in ("literal_error", "enum") and "expected" in context:
        return str(context["expected"]).replace("'", "")
    if kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        return f"{words} {context.get(key)}"
    return None


def _is_secret(model: type[BaseModel], path: KeyPath) -> bool:
    """Whether the key at `path` holds a secret (`kvproxy.settings.secrets.Secret`), which an
    error message must not quote."""
    annotation: Any = model
    for part in path:
        if isinstance(part, int):
            continue
        fields = _model_in(annotation)
        field = fields.model_fields.get(part) if fields is not None else None
        if field is None:
            return False
        annotation = field.annotation
    return any(arg is SecretStr for arg in _flattened(annotation))


def _model_in(annotation: Any) -> type[BaseModel] | None:
    for candidate in _flattened(annotation):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _flattened(annotation: Any) -> list[Any]:
    """The annotation and every type inside it (`Secret | None`, `list[Section]`)."""
    found = [annotation]
    for arg in get_args(annotation):
        found.extend(_flattened(arg))
    return found


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
