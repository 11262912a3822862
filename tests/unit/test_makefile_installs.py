"""What `make demo` and `make test` install: only what the project uses (no apt recommends), and
every package of it named in the README's Quick start."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAKEFILE = (REPO / "Makefile").read_text(encoding="utf-8")
APT_INSTALL = re.compile(r"apt-get install ((?:-\S+ )*)([^;&|}]+)")


def _apt_installs() -> list[tuple[list[str], list[str]]]:
    """Each `apt-get install` of the Makefile: (its options, its packages)."""
    joined = MAKEFILE.replace("\\\n", " ")
    return [
        (options.split(), packages.split()) for options, packages in APT_INSTALL.findall(joined)
    ]


def _quick_start() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    return readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]


def test_every_apt_install_leaves_out_recommends() -> None:
    installs = _apt_installs()
    assert any("chromium" in packages for _, packages in installs), installs
    for options, packages in installs:
        assert "--no-install-recommends" in options, packages


def test_quick_start_names_every_package_the_makefile_installs() -> None:
    text = _quick_start()
    for _, packages in _apt_installs():
        for package in packages:
            assert f"`{package}`" in text, package
    extras = re.search(r"pip install --quiet -e '\.\[([^\]]+)\]'", MAKEFILE)
    assert extras is not None
    for extra in extras.group(1).split(","):
        assert f"`{extra}`" in text, extra
    assert "--no-install-recommends" in text
