"""What every built-in policy shares: a name, declared options with defaults, strict options."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Self

from kvproxy.policies.api import Need, PolicyContext, ProducedRecords, Verdict
from kvproxy.policies.errors import MAX_VALUE_CHARS, PolicyConfigError, cut, short_repr

__all__ = ["BuiltinPolicy"]


class BuiltinPolicy(abc.ABC):
    """Base of the built-in policies.

    `create(context, options)` (the contract of every policy, `kvproxy.policies.api.RecordsPolicy`)
    builds one and hands the options to `configure`, the built-ins' own step: `OPTIONS` maps
    every accepted option to its default; `configure` refuses anything else and then calls
    `setup()`, where a subclass checks and compiles its options. What a built-in reads and where
    it runs it declares as class attributes (`needs`, `topic_settings`, `group`, `stages`).
    """

    name: str = ""
    OPTIONS: ClassVar[Mapping[str, Any]] = {}
    needs: ClassVar[frozenset[Need]] = frozenset()
    """What the policy needs from the proxy (`Need`)."""

    @classmethod
    def create(cls, context: PolicyContext, options: Mapping[str, Any]) -> Self:
        """The policy configured with `options`: what `kvproxy.policies.plugins` calls by name."""
        policy = cls(context)
        policy.configure(options)
        return policy

    def __init__(self, context: PolicyContext | None = None) -> None:
        self.context = context or PolicyContext()
        self.options: dict[str, Any] = dict(self.OPTIONS)
        self.explicit: frozenset[str] = frozenset()
        """The options the configuration set (the others hold their defaults)."""
        self.setup()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({short_repr(self.options)})"

    def configure(self, config: Mapping[str, Any]) -> None:
        if not isinstance(config, Mapping):
            raise PolicyConfigError(
                f"policy {self.name}: options must be a mapping, not {type(config).__name__}"
            )
        unknown = sorted(set(config) - set(self.OPTIONS))
        if unknown:
            known = ", ".join(sorted(self.OPTIONS)) or "none"
            raise PolicyConfigError(
                f"policy {self.name}: unknown option(s) "
                f"{cut(', '.join(map(str, unknown)), MAX_VALUE_CHARS)} "
                f"(known: {known})"
            )
        self.options = {**self.OPTIONS, **config}
        self.explicit = frozenset(config)
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
            raise self._error(f"option {key} must be an integer, not {short_repr(value)}")
        if minimum is not None and value < minimum:
            raise self._error(f"option {key} must be at least {minimum}, not {short_repr(value)}")
        return value

    def _bool_option(self, key: str) -> bool:
        value = self.options[key]
        if not isinstance(value, bool):
            raise self._error(f"option {key} must be true or false, not {short_repr(value)}")
        return value

    def _list_option(self, key: str) -> list[Any]:
        value = self.options[key]
        if not isinstance(value, list | tuple):
            raise self._error(f"option {key} must be a list, not {short_repr(value)}")
        return list(value)

    def _path_option(self, key: str) -> Path | None:
        value = self.options[key]
        if value is None:
            return None
        if not isinstance(value, str | Path):
            raise self._error(f"option {key} must be a file path, not {short_repr(value)}")
        path = Path(value)
        if not path.is_absolute():
            path = self.context.base_dir / path
        if not path.is_file():
            raise self._error(f"option {key}: no such file {path}")
        return path
