"""Kafka clients of other languages as programs, for tests through kvproxy: the Go clients
(`go_clients/`: franz-go, sarama, kafka-go; `job/` and `kafkago02/`, kafka-go 0.2, are modules of
their own) and kafkajs (`node_clients/`).

Each program reads one job from stdin, `{"bootstrap", "topic", "records": [{"key", "value"}]}`
(a null key is a record without one), produces the records to partition 0 in one batch, and
prints one JSON line: `{"errors": [...], "types": [...]}`, what the application got for each
record (null when it was stored) and the type of that error. Programs are built once into
``~/.cache/kvproxy/<go-clients/<program>|node-clients>/<hash of the sources>/``, each Go
program alone when a test first asks for it (a lock lets parallel pytest workers share it); Go
modules are kept in ``~/.cache/kvproxy/go-modules``, npm's cache in ``~/.cache/kvproxy/npm``.
`make test` installs Go and Node (`make client-deps`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
GO_MODULE = HERE / "go_clients"
NODE_PACKAGE = HERE / "node_clients"
CACHE = Path(os.environ.get("KVPROXY_CLIENT_CACHE", Path.home() / ".cache" / "kvproxy"))


class ClientProgramError(Exception):
    """A program could not be built, failed, or printed no JSON line."""


@dataclass(frozen=True)
class ClientRun:
    errors: list[str | None]
    """What the application got for each record, in order; None: stored."""
    types: list[str | None]
    log: str
    """What the client printed on stderr (its own log, where it logs)."""


GO_TOOLCHAIN = Path.home() / ".cache" / "kvproxy" / "go-toolchain" / "bin" / "go"
"""Where `make client-deps` puts Go when the machine has none recent enough (the Makefile's
GO_TOOLCHAIN): used first when present."""


def _tool(name: str) -> str:
    if name == "go" and GO_TOOLCHAIN.exists():
        return str(GO_TOOLCHAIN)
    path = shutil.which(name)
    if path is None:
        raise ClientProgramError(f"{name} is not installed: `make client-deps` installs it")
    return path


def _sources(root: Path) -> list[Path]:
    skip = {"node_modules"}
    return sorted(p for p in root.rglob("*") if p.is_file() and not skip.intersection(p.parts))


def _built(kind: str, root: Path, build: Callable[[Path], None]) -> Path:
    """The directory `build` filled from `root`'s sources, built once per content."""
    digest = hashlib.sha256()
    for path in _sources(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    target = CACHE / kind / digest.hexdigest()[:16]
    done = target / ".complete"
    if done.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            build(target)
            done.touch()
    return target


def _go_env() -> dict[str, str]:
    return {
        **os.environ,
        "GOMODCACHE": str(CACHE / "go-modules"),
        "GOFLAGS": "-modcacherw -mod=readonly",
    }


def go_program(name: str) -> Path:
    """The built Go program of `go_clients/<name>`, built alone: a cold build of all of them
    takes about a minute on two cores, which the first test of each would otherwise wait for."""
    go = _tool("go")
    folder = GO_MODULE / name

    def build(target: Path) -> None:
        # a program needing another version of a library is a module of its own
        own = (folder / "go.mod").exists()
        argv = [go, "build", "-o", str(target / name), "." if own else f"./{name}"]
        done = subprocess.run(
            argv,
            cwd=folder if own else GO_MODULE,
            env=_go_env(),
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise ClientProgramError(f"go build ./{name} failed:\n{done.stderr}")

    return _built(f"go-clients/{name}", GO_MODULE, build) / name


def node_program(name: str) -> list[str]:
    """`node <node_clients/name.js>` with the package's dependencies installed by `npm ci`."""
    node, npm = _tool("node"), _tool("npm")

    def build(target: Path) -> None:
        for path in _sources(NODE_PACKAGE):
            shutil.copy(path, target / path.name)
        env = {**os.environ, "npm_config_cache": str(CACHE / "npm")}
        argv = [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"]
        done = subprocess.run(
            argv, cwd=target, env=env, capture_output=True, text=True, check=False, timeout=600
        )
        if done.returncode != 0:
            raise ClientProgramError(f"npm ci failed:\n{done.stdout}\n{done.stderr}")

    return [node, str(_built("node-clients", NODE_PACKAGE, build) / f"{name}.js")]


def run_program(
    argv: Sequence[str],
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[bytes | None, bytes]],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 180,
) -> ClientRun:
    """Run a program on one job (`env`: more environment variables) and return what it
    printed."""
    job = {
        "bootstrap": bootstrap,
        "topic": topic,
        "records": [
            {"key": None if key is None else key.decode(), "value": value.decode()}
            for key, value in records
        ],
    }
    done = subprocess.run(
        argv,
        input=json.dumps(job),
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise ClientProgramError(
            f"{argv[-1]} exited with {done.returncode}:\n{done.stdout[-3000:]}\n"
            f"{done.stderr[-5000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1])
    return ClientRun(result["errors"], result["types"], done.stderr)
