"""What every built-in policy shares: a name, declared options with defaults, strict configure."""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from policies.api import ProducedRecords, Verdict

if TYPE_CHECKING:
    from policies.producer_state import ProducerStateTracker

__all__ = [
    "BuiltinPolicy",
    "ConfigProblem",
    "KeyPath",
    "PolicyConfigError",
    "PolicyContext",
    "format_path",
]

KeyPath = tuple[str | int, ...]
"""Where a value is in the configuration: mapping keys and list indexes from the top."""


def format_path(path: KeyPath) -> str:
    """`("topics", 0, "policies", 1)` -> `topics[0].policies[1]`, as a reader would write it."""
    text = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


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
        return f"{format_path(self.path)}: {self.message}" if self.path else self.message


class PolicyConfigError(ValueError):
    """A policy configuration that cannot be used: one problem (a policy's `configure`), or every
    problem of the `defaults` and `topics` sections (`build_routing`), each with where it is."""

    def __init__(self, message: str = "", problems: Iterable[ConfigProblem] = ()) -> None:
        self.problems: tuple[ConfigProblem, ...] = tuple(problems) or (ConfigProblem((), message),)
        super().__init__(message or "; ".join(str(problem) for problem in self.problems))


@dataclass(slots=True)
class PolicyContext:
    """What `build_routing` hands every built-in policy before `configure`."""

    base_dir: Path = field(default_factory=Path.cwd)
    """Folder that relative file options (schemas) are resolved against: the config file's."""
    producer_state: ProducerStateTracker | None = None


class BuiltinPolicy(abc.ABC):
    """Base of the built-in policies.

    `OPTIONS` maps every accepted option to its default; `configure` refuses anything else and
    then calls `setup()`, where a subclass checks and compiles its options.
    """

    name: str = ""
    OPTIONS: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, context: PolicyContext | None = None) -> None:
        self.context = context or PolicyContext()
        self.options: dict[str, Any] = dict(self.OPTIONS)
        self.setup()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.options!r})"

    def configure(self, config: Mapping[str, Any]) -> None:
        if not isinstance(config, Mapping):
            raise PolicyConfigError(
                f"policy {self.name}: options must be a mapping, not {type(config).__name__}"
            )
        unknown = sorted(set(config) - set(self.OPTIONS))
        if unknown:
            known = ", ".join(sorted(self.OPTIONS)) or "none"
            raise PolicyConfigError(
                f"policy {self.name}: unknown option(s) {', '.join(map(str, unknown))} "
                f"(known: {known})"
            )
        self.options = {**self.OPTIONS, **config}
        self.setup()

    def setup(self) -> None:  # noqa: B027 - a hook: most built-ins need no setup
        """Check and compile `self.options`; raise PolicyConfigError on a bad value."""

    @abc.abstractmethod
    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        """The verdict on one partition's records (every built-in implements it)."""

    def close(self) -> None:  # noqa: B027 - a hook: built-ins hold nothing to close
        """Built-ins hold nothing that needs closing."""

    # helpers for setup()

    def _error(self, message: str) -> PolicyConfigError:
        return PolicyConfigError(f"policy {self.name}: {message}")

    def _int_option(self, key: str, *, minimum: int | None = None) -> int:
        value = self.options[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._error(f"option {key} must be an integer, not {value!r}")
        if minimum is not None and value < minimum:
            raise self._error(f"option {key} must be at least {minimum}, not {value}")
        return value

    def _bool_option(self, key: str) -> bool:
        value = self.options[key]
        if not isinstance(value, bool):
            raise self._error(f"option {key} must be true or false, not {value!r}")
        return value

    def _list_option(self, key: str) -> list[Any]:
        value = self.options[key]
        if not isinstance(value, list | tuple):
            raise self._error(f"option {key} must be a list, not {value!r}")
        return list(value)

    def _path_option(self, key: str) -> Path | None:
        value = self.options[key]
        if value is None:
            return None
        if not isinstance(value, str | Path):
            raise self._error(f"option {key} must be a file path, not {value!r}")
        path = Path(value)
        if not path.is_absolute():
            path = self.context.base_dir / path
        if not path.is_file():
            raise self._error(f"option {key}: no such file {path}")
        return path
