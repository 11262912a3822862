"""Which numbers a rejection is answered with (`errors` in docs/configuration.md).

The proxy answers clients with these codes and the audit reports them, so both turn a verdict
into a code here. No pydantic: the audit's executors import this module (the section's model is
`kvproxy.settings.sections.ErrorsConfig`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvproxy.policies.api import Verdict
from kvproxy.policies.errors import ConfigProblem, short_repr
from kvproxy.protocol.error_codes import ErrorProfile, Rejection, rejection_code

__all__ = ["PROFILES", "profile_code", "read_profile"]

PROFILES = tuple(profile.value for profile in ErrorProfile)
"""The values of `errors.profile`: kafka, kip."""


def profile_code(profile: ErrorProfile, verdict: Verdict) -> int:
    """The code `verdict` is answered with under `profile`: a record rejection gets the
    profile's number for its kind, any other verdict its own code."""
    rejection = getattr(verdict, "rejection", None)
    if profile is ErrorProfile.KIP and rejection is not None:
        return rejection_code(ErrorProfile.KIP, Rejection(rejection))
    return verdict.code


def read_profile(document: Mapping[str, Any]) -> tuple[str, list[ConfigProblem]]:
    """`errors.profile` of a whole file, for a reader that needs only it (the audit): the
    profile (kafka when it is wrong) and the problem with it, if any. The rest of `errors` is
    the proxy's."""
    errors = document.get("errors") or {}
    profile = errors.get("profile", "kafka") if isinstance(errors, Mapping) else "kafka"
    if profile in PROFILES:
        return profile, []
    problem = ConfigProblem(
        ("errors", "profile"), f"must be kafka or kip, not {short_repr(profile)}"
    )
    return "kafka", [problem]
