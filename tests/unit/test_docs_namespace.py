"""The docs and examples name kvproxy's modules as they are installed: `kvproxy.<layer>`.

A reader copies `from kvproxy.producer import ResilientProducer`, `python -m kvproxy.cli` or a
`custom: {class: "module:Class"}` path from them; a bare `producer` or `proxy` there would import
nothing once kvproxy is installed (or another distribution's module of that name).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = {
    path.name
    for path in (ROOT / "kvproxy").iterdir()
    if path.is_dir() and (path / "__init__.py").exists()
}

IMPORT = re.compile(r"^\s*(?:from|import)\s+([\w.]+)", re.MULTILINE)
RUN_MODULE = re.compile(r"python3?\s+-m\s+([\w.]+)")
CLASS_PATH = re.compile(r"""class:\s*["']?([\w.]+):""")


def _documents() -> list[Path]:
    examples = [
        path
        for path in (ROOT / "examples").rglob("*")
        if path.suffix in {".md", ".py", ".yaml", ".yml", ".toml"}
    ]
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(examples)]


def _code(path: Path) -> str:
    """A Markdown file's fenced blocks (what a reader copies); any other file whole."""
    text = path.read_text()
    if path.suffix != ".md":
        return text
    return "\n".join(re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL))


def test_the_layers_are_known() -> None:
    assert {"protocol", "policies", "proxy", "producer", "commands", "journal"} <= LAYERS


def test_docs_and_examples_name_modules_by_the_namespace() -> None:
    offenders = []
    for path in _documents():
        code = _code(path)
        text = path.read_text()
        named = [
            *IMPORT.findall(code),
            *RUN_MODULE.findall(text),
            *CLASS_PATH.findall(text),
        ]
        offenders += [
            f"{path.relative_to(ROOT)}: {name}" for name in named if name.split(".")[0] in LAYERS
        ]
    assert offenders == []
