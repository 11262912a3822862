"""examples/policy-plugin installed into the running venv, as a user would install a policy.

Offline (no index, no build isolation: the venv's own setuptools builds it) and idempotent:
a copy whose files and entry points match the example is left as it is. A file lock in the
venv makes test processes running side by side (pytest-xdist) install it once.
"""

from __future__ import annotations

import fcntl
import importlib
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "policy-plugin"
DISTRIBUTION = "kvproxy-forbidden-word"
PACKAGE = "kvproxy_forbidden_word"
POLICY = "forbidden_word"


def install_example_plugin() -> None:
    """Install the example distribution unless the venv already holds this very copy."""
    lock = Path(sys.prefix) / f".{DISTRIBUTION}.lock"
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not _installed_matches():
            with tempfile.TemporaryDirectory() as folder:
                source = Path(folder) / "policy-plugin"  # builds leave files in the source
                shutil.copytree(
                    EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info")
                )
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "pip",
                        "install",
                        "--quiet",
                        "--no-deps",
                        "--no-index",
                        "--no-build-isolation",
                        "--force-reinstall",
                        str(source),
                    ],
                    check=True,
                    capture_output=True,
                )
            assert _installed_matches(), "the example policy did not install"
    importlib.invalidate_caches()


def _installed_matches() -> bool:
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return False
    points = {entry.name: entry.value for entry in dist.entry_points}
    if points != {POLICY: f"{PACKAGE}:ForbiddenWordPolicy"}:
        return False
    for source in (EXAMPLE / PACKAGE).glob("*.py"):
        installed = Path(str(dist.locate_file(f"{PACKAGE}/{source.name}")))
        if not installed.is_file() or installed.read_bytes() != source.read_bytes():
            return False
    return True
