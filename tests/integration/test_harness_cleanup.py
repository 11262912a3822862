"""A pytest session stopped from outside (SIGTERM, SIGINT to the pytest process alone, as `kill`,
a CI timeout or `make` do) leaves no broker behind: the harness starts brokers in their own
sessions (a ^C in the terminal does not reach them), so only `tests/harness/process_groups.py`
stops them, in the process itself or, under pytest-xdist, in each worker whose controller is gone.

Each case runs a small pytest session in a subprocess: one test that takes the project's `tansu`
fixture, writes the broker's pid to a file and waits; the session is signalled once the file is
there, and every process of the broker's process group must be gone within a few seconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.harness.processes import REPO

pytestmark = pytest.mark.broker

HELD_BROKER = """
import os
import time
from pathlib import Path

import psutil


def test_holds_a_broker(tansu):
    brokers = [p.pid for p in psutil.Process().children() if "tansu" in p.name()]
    assert brokers, "no Tansu child process"
    ready = Path(os.environ["KVPROXY_CLEANUP_PIDS"])
    partial = ready.with_suffix(".partial")
    partial.write_text(" ".join(map(str, brokers)))
    partial.rename(ready)
    time.sleep(120)
"""

STARTED_WITHIN = 60.0
"""Seconds for the inner session to start (and xdist its worker) and Tansu to answer."""
GONE_WITHIN = 4.0
"""Seconds for every process of the broker's group to be gone after the signal: prompt, not a
wait for xdist's own shutdown of an orphaned worker (a SIGINT to itself after 5 s)."""


def _alive(pgid: int) -> list[psutil.Process]:
    """The processes of group `pgid` that are not zombies (a killed broker whose new parent has
    not reaped it yet is gone as far as its ports and memory are concerned)."""
    alive = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
    return alive


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return not _alive(pgid)


def _inner_env(ready: Path) -> dict[str, str]:
    """This process's environment without what pytest-xdist tells its own workers."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTEST_XDIST", "PYTEST_CURRENT_TEST"))
    }
    return {**env, "KVPROXY_CLEANUP_PIDS": str(ready), "PYTHONUNBUFFERED": "1"}


@pytest.mark.parametrize(
    ("sig", "xdist"),
    [
        (signal.SIGTERM, False),
        (signal.SIGTERM, True),
        (signal.SIGINT, False),
        (signal.SIGINT, True),
    ],
    ids=["sigterm", "sigterm-xdist", "sigint", "sigint-xdist"],
)
def test_a_signalled_session_leaves_no_broker(tmp_path: Path, sig: int, xdist: bool) -> None:
    (tmp_path / "test_held.py").write_text(HELD_BROKER)
    ready = tmp_path / "pids"
    output = tmp_path / "pytest.out"
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
        "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO),
        *(["-p", "xdist", "-n", "1"] if xdist else ["-p", "no:xdist"]),
        str(tmp_path / "test_held.py"),
    ]  # fmt: skip
    groups: list[int] = []
    with output.open("wb") as out:
        session = subprocess.Popen(
            command,
            cwd=REPO,
            env=_inner_env(ready),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its xdist worker too: killed with it below, whatever happens
        )
    try:
        deadline = time.monotonic() + STARTED_WITHIN
        while not ready.exists():
            assert session.poll() is None, f"the session ended early:\n{output.read_text()}"
            assert time.monotonic() < deadline, f"no broker started:\n{output.read_text()}"
            time.sleep(0.05)
        groups = [os.getpgid(int(pid)) for pid in ready.read_text().split()]
        assert groups and all(not _group_gone(pgid) for pgid in groups)

        session.send_signal(sig)  # the pytest process alone, not its process group

        deadline = time.monotonic() + GONE_WITHIN
        while not all(_group_gone(pgid) for pgid in groups):
            if time.monotonic() > deadline:
                left = {pgid: [p.pid for p in _alive(pgid)] for pgid in groups}
                pytest.fail(
                    f"{signal.Signals(sig).name}: broker processes left {GONE_WITHIN}s later "
                    f"(group: pids) {left}\n--- inner session ---\n{output.read_text()}"
                )
            time.sleep(0.05)
    finally:
        for pgid in [*groups, session.pid]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        session.wait(30)
