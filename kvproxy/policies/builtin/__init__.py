"""The built-in policies. The YAML finds them by name through the entry points of the
`kvproxy.policies` group (pyproject.toml, `kvproxy.policies.plugins`), as it finds anyone else's."""

from __future__ import annotations

from kvproxy.policies.builtin.base import BuiltinPolicy

__all__ = ["DEFAULT_POLICIES", "BuiltinPolicy"]

DEFAULT_POLICIES: tuple[str, ...] = ("batch_integrity", "crc", "timestamps", "compacted_key")
"""The chain of a config that names no policies: the broker's own checks a client meets anyway.
Found through the entry point `policies` of the group `kvproxy.defaults` (pyproject.toml)."""
