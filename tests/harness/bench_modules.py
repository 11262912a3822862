"""The scripts of bench/ loaded as modules, for the tests of their pieces (bench/ is no package)."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def bench_module(name: str) -> Iterator[ModuleType]:
    """bench/<name>.py as the module `bench_<name>`, registered while in use (its dataclasses
    look their module up); the `sys.path` entries it adds are taken back afterwards."""
    saved = list(sys.path)
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path[:] = saved
        sys.modules.pop(spec.name, None)
