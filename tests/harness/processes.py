"""`kvproxy` as a user runs it: `kvproxy serve` as a process until it answers, a one-shot command,
and polling for a condition."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kvproxy.protocol.messages import API_VERSIONS, decode_response
from tests.harness.process_groups import register
from tests.harness.raw_client import RawClientError, RawKafkaClient
from tests.harness.requests import api_versions_request

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]
SET_LIMIT = (
    sys.executable,
    "-c",
    "import os, resource, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2]))); "
    "os.execv(sys.argv[3], sys.argv[3:])",
)
"""`SET_LIMIT SOFT HARD COMMAND...` runs a command with that limit on open files (a preexec_fn is
unsafe: the test process has threads)."""


def _with_open_files(argv: list[str], open_files: tuple[int, int] | None) -> list[str]:
    return argv if open_files is None else [*SET_LIMIT, *map(str, open_files), *argv]


def wait_for_answer(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"kvproxy exited early with {proc.returncode}"
        with (
            contextlib.suppress(OSError, RawClientError),
            RawKafkaClient(HOST, port, connect_timeout=0.5) as client,
        ):
            answer = client.request(api_versions_request(0, 1), timeout=2)
            if decode_response(answer, API_VERSIONS, 0).body.error_code == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"kvproxy did not answer on port {port} within {timeout}s")


@contextlib.contextmanager
def kvproxy_serve(
    config: Path,
    log: Path,
    *,
    module: str = "kvproxy.cli",
    cwd: Path = REPO,
    open_files: tuple[int, int] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m <module> serve -c CONFIG` (`kvproxy.cli` is the installed command's), output to
    `log`, under `open_files` (soft, hard) when given; killed on exit if still running."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            _with_open_files(
                [sys.executable, "-m", module, "serve", "-c", str(config)], open_files
            ),
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        register(proc, group=False)  # killed if pytest is stopped (process_groups.py)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def kvproxy(
    *args: str, timeout: float = 60, expect: int = 0, open_files: tuple[int, int] | None = None
) -> subprocess.CompletedProcess[str]:
    """`kvproxy ARGS` as a user runs it (under `open_files` (soft, hard) when given); fails the
    test on an exit status other than `expect`."""
    done = subprocess.run(
        _with_open_files([sys.executable, "-m", "kvproxy.cli", *args], open_files),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == expect, f"kvproxy {' '.join(args)} exited {done.returncode}: {done}"
    return done


def wait_until(condition: Callable[[], Any], what: str, timeout: float = 15) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
