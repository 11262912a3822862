"""What the package says about itself: `kvproxy --version`, the license in pyproject.toml (an
SPDX expression, which setuptools >= 77 wants instead of a table), and mypy's per-module sections
(each must name a module mypy sees, or mypy warns "unused section(s)")."""

from __future__ import annotations

import ast
import importlib.metadata
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


def _modules_mypy_sees() -> set[str]:
    """The checked packages' modules and every module they import."""
    seen: set[str] = set()
    for package in PYPROJECT["tool"]["mypy"]["packages"]:
        for path in (ROOT / package).rglob("*.py"):
            relative = path.relative_to(ROOT).with_suffix("")
            seen.add(".".join(relative.parts).removesuffix(".__init__"))
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


def test_the_wheel_holds_every_package_and_subpackage(tmp_path: Path) -> None:
    """What `pip install .` (the Dockerfile's) installs: every folder of the source packages with
    Python code in it, subpackages such as `protocol/records` and `policies/builtin` too, and
    the built-in policies' entry points."""
    packages = PYPROJECT["tool"]["importlinter"]["root_packages"]
    source = tmp_path / "src"  # what the Dockerfile copies; the build leaves the checkout alone
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in packages:
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packed = {name for name in names if name.endswith(".py")}
    sources = {
        path.relative_to(ROOT).as_posix()
        for package in packages
        for path in (ROOT / package).rglob("*.py")
    }
    assert sources - packed == set()
    (entry_points,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[kvproxy.policies]" in text and "batch_integrity = " in text


def test_the_proxy_module_run_by_itself_says_which_command_to_run() -> None:
    """`python -m proxy.cli` once served; the command is `kvproxy` now, and the old way must not
    exit 0 having done nothing."""
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "serve", "-c", "kvproxy.yaml"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done
    assert "run `kvproxy ...` or `python -m kvproxy.cli ...`" in done.stderr
