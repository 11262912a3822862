"""The built-in policies. The YAML finds them by name through the entry points of the
`kvproxy.policies` group (pyproject.toml, `kvproxy.policies.plugins`), as it finds anyone else's."""

from __future__ import annotations

from kvproxy.policies.builtin.base import BuiltinPolicy

__all__ = ["BuiltinPolicy"]
