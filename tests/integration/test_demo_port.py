"""`kvproxy demo --keep-running` as a user runs it: the same bootstrap port at every run (9192
unless `--port` says otherwise), free ports only when it is taken (and it says so), and commands
to paste that reach it.

The tests choose the port with `--port`, so that they do not depend on 9192 being free."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from kvproxy.commands.demo import DEMO_PORT
from tests.harness.processes import REPO, wait_until
from tests.harness.proxy import free_port_range

HOST = "127.0.0.1"
STAYS_UP = re.compile(r"kvproxy stays up on 127\.0\.0\.1:(\d+);")


class Demo:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 120) -> str:
        def seen() -> bool:
            assert self.proc.poll() is None, self.text()
            return text in self.text()

        wait_until(seen, f"{text!r} in {self.log}", timeout)
        return self.text()

    def port(self) -> int:
        found = STAYS_UP.search(self.wait_for("Point your clients at"))
        assert found is not None, self.text()
        return int(found.group(1))


@contextlib.contextmanager
def demo(tmp_path: Path, port: int, name: str = "demo") -> Iterator[Demo]:
    """`kvproxy demo --keep-running --port PORT` until it is stopped with SIGTERM."""
    log = tmp_path / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvproxy.cli", "demo", "--keep-running", "--port", str(port)],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            yield Demo(proc, log)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def _pasted(line: str) -> str:
    """What the shell prints running a command line the demo printed (without its comment)."""
    done = subprocess.run(
        ["bash", "-c", line.split("   #", 1)[0]],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.stdout + done.stderr


def test_the_default_port_is_kvproxy_serves() -> None:
    assert DEMO_PORT == 9192


def test_the_demo_keeps_its_port_and_prints_commands_that_reach_it(tmp_path: Path) -> None:
    port = free_port_range(2)
    with demo(tmp_path, port) as first:
        assert first.port() == port
        text = first.text()
        assert "taken" not in text
        commands = text.split(f"Point your clients at the bootstrap address {HOST}:{port}")[1]
        lines = [line.strip() for line in commands.splitlines()[1:] if line.strip()]
        assert lines[:2] == [
            f"kcat -b {HOST}:{port} -C -t kvproxy-demo -e",
            f"echo bob | kcat -b {HOST}:{port} -P -t customers   # no key: refused",
        ]
        assert lines[2].startswith(f'{shlex.quote(sys.executable)} -c "from confluent_kafka')
        assert '{"amount": 0}' in _pasted(lines[0])
        assert "Broker: Broker failed to validate record" in _pasted(lines[1])
        assert "INVALID_RECORD" in _pasted(lines[2])
        rejected = "rejected: customers-0 by compacted_key: INVALID_RECORD (87)"
        wait_until(lambda: first.text().count(rejected) == 2, "two rejections printed")
    with demo(tmp_path, port, "again") as again:  # after a restart, the same port
        assert again.port() == port


def test_a_taken_port_is_said_and_free_ports_are_used(tmp_path: Path) -> None:
    port = free_port_range(2)
    with socket.socket() as holder:
        holder.bind((HOST, port))
        holder.listen()
        with demo(tmp_path, port) as taken:
            used = taken.port()
            assert used != port
            assert (
                f"(port {port} is taken, by another program or demo: kvproxy listens on free "
                "ports instead; --port chooses others)"
            ) in taken.text()
            assert f"Point your clients at the bootstrap address {HOST}:{used}" in taken.text()
