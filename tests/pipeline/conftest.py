"""Spark for the audit tests: one local[2] session per test process, shared by every test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from kvproxy.pipeline.spark import start_session

    session = start_session(
        "local[2]",
        {"spark.sql.shuffle.partitions": "4", "spark.ui.showConsoleProgress": "false"},
    )
    yield session
    session.stop()
