"""docs/configuration.md names the sections the proxy reads: exactly those of `ProxyConfig`, so a
reader is never told that a section they wrote is ignored (or that one is read when it is not)."""

from __future__ import annotations

import re
from pathlib import Path

from kvproxy.proxy.config.proxy_config import ProxyConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_introduction_lists_every_section_read() -> None:
    introduction = DOC.read_text().split("\n## ", 1)[0]
    paragraph = next(
        p for p in introduction.split("\n\n") if "`kvproxy/proxy/config/proxy_config.py`" in p
    )
    named = set(re.findall(r"`([a-z_]+)`", paragraph))
    assert named == set(ProxyConfig.model_fields), paragraph


def test_every_section_has_a_heading() -> None:
    headings = " ".join(re.findall(r"^## (.*)$", DOC.read_text(), flags=re.MULTILINE))
    documented = set(re.findall(r"`([a-z_]+)`", headings))
    assert set(ProxyConfig.model_fields) <= documented, headings
