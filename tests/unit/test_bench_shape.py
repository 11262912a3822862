"""The shape of bench/, read from its source (nothing is run): a package whose scripts run as
`python -m bench.<name>` from the repository root and import the project only as `kvproxy.*`.

No `main()` longer than 60 lines (argument parsing, setup, a round and the report are functions
of their own), no file longer than 500 lines, no `sys.path` manipulation (the repository root is
on the path with `-m`), and no import of a layer of the project by its bare name (`import
proxy`, `from protocol.records import ...`): the layers are the folders under kvproxy/. The code
a script hands to `python -c` is held to the same imports.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
MAX_MAIN_LINES = 60
MAX_FILE_LINES = 500
SCRIPTS = sorted(BENCH.glob("*.py"))
LAYERS = frozenset(
    path.name for path in (ROOT / "kvproxy").iterdir() if (path / "__init__.py").is_file()
)
"""The project's layers (kvproxy/protocol, kvproxy/proxy, ...), by folder name."""
BENCH_MODULES = frozenset(path.stem for path in SCRIPTS) - {"__init__"}


def _ids(paths: list[Path]) -> list[str]:
    return [path.name for path in paths]


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _imported(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, module) of every absolute import in `tree`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def _child_code(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, source) of the code given to `python -c`: the item after "-c" in a list or tuple,
    a string or a module-level name bound to one."""
    strings = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.List | ast.Tuple):
            continue
        for flag, code in zip(node.elts, node.elts[1:], strict=False):
            if not (isinstance(flag, ast.Constant) and flag.value == "-c"):
                continue
            if isinstance(code, ast.Constant) and isinstance(code.value, str):
                yield code.lineno, code.value
            elif isinstance(code, ast.Name) and code.id in strings:
                yield code.lineno, strings[code.id]


def _sys_path_uses(tree: ast.AST) -> list[str]:
    return [
        f"line {node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    ]


def _bare_imports(tree: ast.AST) -> list[str]:
    return [
        f"line {line}: {module}"
        for line, module in _imported(tree)
        if module.split(".")[0] in LAYERS | BENCH_MODULES
    ]


def test_the_layers_and_the_scripts_are_found() -> None:
    assert {"protocol", "policies", "proxy", "settings"} <= LAYERS
    assert {"_brokers", "latency", "run_all", "compare_commits"} <= BENCH_MODULES
    assert (BENCH / "__init__.py").is_file()


@pytest.mark.parametrize("path", SCRIPTS, ids=_ids(SCRIPTS))
def test_no_main_is_longer_than_60_lines(path: Path) -> None:
    long = [
        f"line {node.lineno}: {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name == "main"
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_MAIN_LINES
    ]
    assert not long, f"{path.name}: main() over {MAX_MAIN_LINES} lines: {long}"


@pytest.mark.parametrize("path", SCRIPTS, ids=_ids(SCRIPTS))
def test_no_file_is_longer_than_500_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_FILE_LINES, f"{path.name}: {lines} lines"


@pytest.mark.parametrize("path", SCRIPTS, ids=_ids(SCRIPTS))
def test_nothing_changes_sys_path(path: Path) -> None:
    touched = _sys_path_uses(_tree(path))
    assert not touched, f"{path.name} uses sys.path: {touched}"


@pytest.mark.parametrize("path", SCRIPTS, ids=_ids(SCRIPTS))
def test_the_project_is_imported_as_kvproxy_and_bench_as_bench(path: Path) -> None:
    tree = _tree(path)
    bare = _bare_imports(tree)
    for line, code in _child_code(tree):
        bare += [f"python -c at line {line}, {found}" for found in _bare_imports(ast.parse(code))]
    assert not bare, f"{path.name} imports by bare name (not kvproxy.* / bench.*): {bare}"


def test_the_checks_catch_what_they_are_for() -> None:
    """The readers above on a made-up script with each fault."""
    script = ast.parse(
        "import sys\n"
        "import proxy.server\n"
        "from protocol.records import build_batch\n"
        "from _brokers import upstream\n"
        "from kvproxy.protocol.records import build_batch\n"
        "from bench._results import ROOT\n"
        "CHILD = 'from policies.api import PolicyContext'\n"
        "sys.path.insert(0, '.')\n"
        "run([sys.executable, '-c', CHILD])\n"
        "run([sys.executable, '-c', 'import settings'])\n"
    )
    assert _bare_imports(script) == [
        "line 2: proxy.server",
        "line 3: protocol.records",
        "line 4: _brokers",
    ]
    assert _sys_path_uses(script) == ["line 8"]
    assert [code for _, code in _child_code(script)] == [
        "from policies.api import PolicyContext",
        "import settings",
    ]
