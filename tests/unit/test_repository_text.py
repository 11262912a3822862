"""Docs, docstrings and comments point only at files the repository holds: a reader of a fresh
clone has nothing else (no design notes beside it, no shared folder next to it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Built from pieces so that this file does not name them itself.
OUTSIDE_REFERENCES = ("DESIGN" + ".md", ".." + "/shared")


def _tracked_text_files() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    files = []
    for name in names:
        path = ROOT / name.decode()
        if name and path.is_file() and b"\0" not in path.read_bytes()[:8192]:
            files.append(path)
    return files


def test_no_tracked_text_points_outside_the_repository() -> None:
    files = _tracked_text_files()
    assert len(files) > 100, "git ls-files found too little to be this repository"
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if any(reference in line for reference in OUTSIDE_REFERENCES)
    ]
    assert found == [], "\n".join(found)
