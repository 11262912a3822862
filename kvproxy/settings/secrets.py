"""Secrets in the file: `${NAME}` reads the value from the environment."""

from __future__ import annotations

import os
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, SecretStr

__all__ = ["Secret"]

_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _secret_from_env(value: Any) -> Any:
    """A secret written as `${NAME}` is read from environment variable NAME, so the file (and
    whatever copies it: config maps, repositories) need not hold it. Only the whole value is a
    reference; a missing variable is an error that names the variable."""
    if isinstance(value, str) and (match := _ENV_REFERENCE.fullmatch(value.strip())):
        name = match.group(1)
        if name not in os.environ:
            raise ValueError(f"environment variable {name} is not set")
        return os.environ[name]
    return value


Secret = Annotated[SecretStr, BeforeValidator(_secret_from_env)]
"""A password or other secret: `${NAME}` reads it from the environment, and it prints as
`**********` (repr, str, logs, error messages); `.get_secret_value()` is the only way to it."""
