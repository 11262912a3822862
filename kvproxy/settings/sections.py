"""The sections of the file that the proxy validates as models and the audit reads too."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kvproxy.settings.loading import Section

__all__ = ["ErrorsConfig"]


class ErrorsConfig(Section):
    """How rejections are answered (docs/configuration.md, `errors`)."""

    profile: Literal["kafka", "kip"] = "kafka"
    legacy_below: int = Field(default=3, ge=0, le=13)
    legacy_code: int = Field(default=2, ge=-1)
