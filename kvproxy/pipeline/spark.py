"""Starting Spark for the audit: a clear error without Java, the project's code on executors."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["SparkUnavailable", "find_java", "ship_packages", "start_session"]

PACKAGES = ("protocol", "policies", "settings", "registry", "client", "pipeline")
"""The folders executors import (as `kvproxy.<folder>`); shipped as one zip when they do not
share the driver's install."""


class SparkUnavailable(Exception):
    """Spark cannot start here (no Java, no pyspark): the message says what to install."""


def find_java() -> str:
    """The `java` Spark will run; SparkUnavailable when there is none."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file():
            return str(candidate)
        raise SparkUnavailable(
            f"JAVA_HOME is {home} but {candidate} does not exist: point JAVA_HOME at a Java 17 "
            "(or newer) installation"
        )
    found = shutil.which("java")
    if found is None:
        raise SparkUnavailable(
            "Java was not found: Spark needs Java 17 or newer (on Debian: apt-get install "
            "openjdk-17-jre-headless), on PATH or named by JAVA_HOME"
        )
    return found


def start_session(
    master: str = "local[*]", conf: Mapping[str, str] | None = None, app_name: str = "kvproxy audit"
) -> Any:
    """A SparkSession; on a local master bound to loopback, without the web UI unless asked."""
    find_java()
    try:
        from pyspark.sql import SparkSession  # noqa: PLC0415  (pyspark is an optional extra)
    except ImportError:
        raise SparkUnavailable(
            "pyspark is not installed: pip install 'kafka-validation-proxy[spark]'"
        ) from None
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    local = master.startswith("local")
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName(app_name)
    # The audit shows its own progress (kvproxy.pipeline.progress); Spark's bar would break
    # into its lines.
    settings = {"spark.ui.showConsoleProgress": "false"}
    if local:
        settings.update({"spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1"})
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if not local:
        ship_packages(session)
    return session


def ship_packages(session: Any) -> str:
    """Zip the project's packages under `kvproxy/`, as they are imported, and add them to every
    executor's Python path."""
    folder = Path(tempfile.mkdtemp(prefix="kvproxy-audit-"))
    target = folder / "kvproxy_packages.zip"
    namespace = Path(__file__).resolve().parent.parent
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.write(namespace / "__init__.py", "kvproxy/__init__.py")
        for package in PACKAGES:
            for path in sorted((namespace / package).rglob("*.py")):
                archive.write(path, path.relative_to(namespace.parent).as_posix())
    session.sparkContext.addPyFile(str(target))
    return str(target)
