"""What the package says about itself: `kvproxy --version`, the license in pyproject.toml (an
SPDX expression, which setuptools >= 77 wants instead of a table), mypy's per-module sections
(each must name a module mypy sees, or mypy warns "unused section(s)"), and a wheel that installs
the one top-level package `kvproxy` and nothing else."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
DISTRIBUTION = PYPROJECT["project"]["name"]


def test_version_flag_prints_the_installed_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvproxy.cli", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done
    assert done.stdout == f"kvproxy {importlib.metadata.version(DISTRIBUTION)}\n", done


def test_license_is_an_spdx_expression() -> None:
    license_value = PYPROJECT["project"]["license"]
    assert isinstance(license_value, str), f"a table is deprecated by setuptools: {license_value}"
    assert license_value == "Apache-2.0"
    requires = PYPROJECT["build-system"]["requires"]
    setuptools_pin = next(r for r in requires if r.startswith("setuptools"))
    minimum = re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", setuptools_pin)
    assert minimum and int(minimum.group(1)) >= 77, f"SPDX license strings need 77: {requires}"
    assert not any(c.startswith("License ::") for c in PYPROJECT["project"].get("classifiers", []))


PACKAGE = ROOT / "kvproxy"
"""The one package: every layer is a folder in it (kvproxy/proxy, kvproxy/protocol, ...)."""

LAYERS = sorted(
    path.name for path in PACKAGE.iterdir() if path.is_dir() and (path / "__init__.py").exists()
)
"""The layers' names (`proxy`, `protocol`, ...): never imported bare."""


def _source_modules() -> dict[str, Path]:
    """Every module of the distribution by its installed name (`kvproxy.proxy.serve.server`)."""
    found: dict[str, Path] = {}
    for directory, subdirectories, files in os.walk(PACKAGE):
        subdirectories[:] = [d for d in subdirectories if d != "__pycache__"]
        relative = Path(directory).relative_to(ROOT).parts
        for name in files:
            if name.endswith(".py"):
                parts = [*relative, name.removesuffix(".py")]
                found[".".join(parts).removesuffix(".__init__")] = Path(directory) / name
    return found


def _modules_mypy_sees() -> set[str]:
    """The checked packages' modules and every module they import."""
    assert PYPROJECT["tool"]["mypy"]["packages"] == ["kvproxy"]
    seen: set[str] = set()
    for module, path in _source_modules().items():
        seen.add(module)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                seen.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                seen.add(node.module)
    return seen


def _matches(pattern: str, module: str) -> bool:
    if pattern.endswith(".*"):
        prefix = pattern.removesuffix(".*")
        return module == prefix or module.startswith(prefix + ".")
    return module == pattern


def test_every_mypy_override_names_a_module_mypy_checks_or_imports() -> None:
    seen = _modules_mypy_sees()
    unused = [
        pattern
        for override in PYPROJECT["tool"]["mypy"]["overrides"]
        for pattern in (
            [override["module"]] if isinstance(override["module"], str) else override["module"]
        )
        if not any(_matches(pattern, module) for module in seen)
    ]
    assert unused == [], f"mypy reports these as unused sections: {unused}"


def test_the_package_is_a_plain_folder_with_no_links() -> None:
    """Tools that read imports as text (import graphs, IDEs, grep) see the files the wheel
    installs: no layer is a link to a folder elsewhere, and no layer sits outside the package."""
    links = [str(path) for path in PACKAGE.rglob("*") if path.is_symlink()]
    assert links == []
    assert "package-dir" not in PYPROJECT["tool"]["setuptools"]
    outside = [name for name in LAYERS if (ROOT / name).exists()]
    assert outside == []
    assert {"protocol", "policies", "proxy", "pipeline", "producer"} <= set(LAYERS)


def test_the_wheel_installs_only_the_kvproxy_package(tmp_path: Path) -> None:
    """What `pip install .` (the Dockerfile's) installs: one top-level package, `kvproxy`, with
    every module of every folder under it (subpackages such as `kvproxy.protocol.records` and
    `kvproxy.policies.builtin` too) and the built-in policies' entry points. Installed alone, it
    imports from where it was installed, with no folder of the repository on the path."""
    source = tmp_path / "src"  # what the Dockerfile copies; the build leaves the checkout alone
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        PACKAGE, source / "kvproxy", ignore=shutil.ignore_patterns("__pycache__", "*.so")
    )
    wheels = tmp_path / "wheels"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = wheels.glob("*.whl")
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    top_level = {
        name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")
    }
    assert top_level == {"kvproxy"}
    (listed,) = [name for name in names if name.endswith(".dist-info/top_level.txt")]
    assert archive.read(listed).decode().split() == ["kvproxy"]
    packed = {name.removesuffix(".py").replace("/", ".") for name in names if name.endswith(".py")}
    packed = {name.removesuffix(".__init__") for name in packed}
    assert packed == set(_source_modules())
    (entry_points,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    text = archive.read(entry_points).decode()
    assert "[kvproxy.policies]" in text
    assert "crc = kvproxy.policies.builtin.broker:CrcPolicy" in text

    installed = tmp_path / "site"
    archive.extractall(installed)
    bare = LAYERS
    probe = (
        "import sys, kvproxy.proxy.serve.server, kvproxy.policies.builtin, kvproxy.commands.cli;"
        "print(kvproxy.proxy.serve.server.__file__);"
        f"print(*sorted({{m.split('.')[0] for m in sys.modules}} & set({bare!r})))"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(installed)},
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    where, stray = ran.stdout.split("\n")[:2]
    assert Path(where).is_relative_to(installed)
    assert stray == ""  # nothing imported under a bare layer name


def test_the_proxy_module_run_by_itself_says_which_command_to_run() -> None:
    """`python -m kvproxy.commands.cli` once served; the command is `kvproxy` now, and the old way
    must not
    exit 0 having done nothing."""
    done = subprocess.run(
        [sys.executable, "-m", "kvproxy.commands.cli", "serve", "-c", "kvproxy.yaml"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done
    assert "run `kvproxy ...` or `python -m kvproxy.cli ...`" in done.stderr


def test_no_file_imports_a_layer_by_its_bare_name() -> None:
    """With the repository's root on the path (pytest, `python -m`), `import proxy` would load a
    second copy of a module beside `kvproxy.proxy`: every file names the namespace."""
    bare = set(LAYERS)
    offenders = []
    for path in ROOT.rglob("*.py"):
        if ".venv" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                else []
            )
            offenders += [f"{path}:{node.lineno}" for n in names if n.split(".")[0] in bare]
    assert offenders == []
