"""The tests' own layout: a test module imports shared helpers from `tests/harness/`, never from
another test module, so each module can move, split or run alone without dragging others along."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
EMBEDDED_IMPORT = re.compile(r"^\s*(?:from|import)\s+([\w.]+)", re.MULTILINE)
"""An import inside a string: the script a test runs in a child process."""


def is_test_module(module: str) -> bool:
    return module.rsplit(".", 1)[-1].startswith("test_")


def imported_test_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a `test_*` module in `path`, embedded scripts included."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            modules = [module] if node.module else [f"{module}{a.name}" for a in node.names]
            found.extend((node.lineno, m) for m in modules if is_test_module(m))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names if is_test_module(a.name))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for match in EMBEDDED_IMPORT.finditer(node.value):
                if match.group(1).startswith("tests.") and is_test_module(match.group(1)):
                    found.append((node.lineno, match.group(1)))
    return found


def test_no_module_under_tests_imports_a_test_module() -> None:
    offenders = [
        f"{path.relative_to(TESTS.parent)}:{line}: imports {module}"
        for path in sorted(TESTS.rglob("*.py"))
        if path != Path(__file__).resolve()  # its samples below are imports in strings
        for line, module in imported_test_modules(path)
    ]
    assert offenders == [], "move the shared helpers into tests/harness/:\n" + "\n".join(offenders)


def test_the_check_sees_every_form_of_import(tmp_path: Path) -> None:
    """The forms the check must catch, and a harness import it must let through."""
    source = tmp_path / "test_sample.py"
    source.write_text(
        "from tests.integration.test_metrics import scrape\n"
        "import tests.unit.test_config as config\n"
        "from . import test_records\n"
        "from .test_dump import segments\n"
        "from tests.harness.metrics import scrape\n"
        "def child():\n"
        "    return '''\n"
        "    from tests.unit.test_quarantine_journal import entry\n"
        "    from tests.harness.journal_entries import entry\n"
        "    '''\n",
        encoding="utf-8",
    )
    assert imported_test_modules(source) == [
        (1, "tests.integration.test_metrics"),
        (2, "tests.unit.test_config"),
        (3, ".test_records"),
        (4, ".test_dump"),
        (7, "tests.unit.test_quarantine_journal"),
    ]
