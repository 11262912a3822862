"""A Kafka Streams application (Apache Kafka's kafka-streams, from Maven Central) for tests
through kvproxy.

`kafka_streams/pom.xml` is resolved with Maven once per Kafka version into
``~/.cache/kvproxy/kafka-streams/<version>/``; `kafka_streams/KvproxyStreamsApp.java` is compiled
with javac against it and the broker's jars into a cache keyed by its source (a lock lets
parallel pytest workers share both). `running_app` starts it in a JVM of its own and yields a
`StreamsApp` whose `events` are the JSON lines it printed (state changes, production exception
handler calls, uncaught exceptions); the application stops when the block ends.

    with running_app(proxy.bootstrap, input=topic_in, output=topic_out) as app:
        app.wait_for(lambda e: e["event"] == "state" and e["data"]["to"] == "RUNNING")
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.harness.kafka_broker import KAFKA_4, kafka_classpath
from tests.harness.process_groups import register

FILES = Path(__file__).with_name("kafka_streams")
SOURCE = FILES / "KvproxyStreamsApp.java"
MAIN_CLASS = "KvproxyStreamsApp"
JVM_OPTIONS = ("-Xms64m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
LOG4J2 = """\
status = error
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = err
"""


class StreamsAppError(RuntimeError):
    """The jars could not be resolved, the app did not compile, or an awaited event never came."""


def _cache(name: str) -> Path:
    default = Path.home() / ".cache" / "kvproxy" / name
    return Path(os.environ.get(f"KVPROXY_{name.upper().replace('-', '_')}_CACHE", default))


def _once(target: Path, build: Callable[[Path], None]) -> Path:
    """`target`, built by `build(partial directory)` on first use under a file lock."""
    done = target / ".complete"
    if done.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            partial = target.with_name(target.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            build(partial)
            shutil.rmtree(target, ignore_errors=True)
            partial.rename(target)
            (target / ".complete").write_text("done\n")
    return target


def streams_jars(version: str = KAFKA_4) -> Path:
    """kafka-streams and its dependencies, resolved with Maven on first use."""

    def resolve(into: Path) -> None:
        mvn = shutil.which("mvn")
        if mvn is None:
            raise StreamsAppError("Maven (mvn) is not installed: `make test` installs it")
        command = [
            mvn, "-q", "-B", "-f", str(FILES / "pom.xml"), "dependency:copy-dependencies",
            f"-Dkafka.version={version}", f"-DoutputDirectory={into}", "-DincludeScope=runtime",
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0 or not any(into.glob("kafka-streams-*.jar")):
            raise StreamsAppError(f"mvn could not resolve kafka-streams {version}:\n{done.stdout}")

    return _once(_cache("kafka-streams") / version, resolve)


def classpath(version: str = KAFKA_4) -> str:
    return f"{streams_jars(version)}/*:{kafka_classpath(version)}"


def compiled(version: str = KAFKA_4) -> Path:
    """The compiled application and its log configuration; javac on first use."""
    digest = hashlib.sha256(SOURCE.read_bytes() + version.encode()).hexdigest()[:16]

    def build(into: Path) -> None:
        javac = shutil.which("javac")
        if javac is None:
            raise StreamsAppError("javac is not installed: `make test` installs a JDK")
        command = [javac, "-d", str(into), "-cp", classpath(version), str(SOURCE)]
        built = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        if built.returncode != 0:
            raise StreamsAppError(f"javac failed:\n{built.stdout}\n{built.stderr}")
        (into / "log4j2.properties").write_text(LOG4J2)

    return _once(_cache("kafka-streams-app") / digest, build)


class StreamsApp:
    """A running application: what it printed so far, and what it logged."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.events: list[dict[str, Any]] = []
        self.log_lines: list[str] = []
        self._changed = threading.Condition()
        assert proc.stdout is not None and proc.stderr is not None
        threading.Thread(target=self._read, args=(proc.stdout, True), daemon=True).start()
        threading.Thread(target=self._read, args=(proc.stderr, False), daemon=True).start()

    def _read(self, stream: Any, events: bool) -> None:
        for line in stream:
            with self._changed:
                if events and line.startswith("{"):
                    self.events.append(json.loads(line))
                elif not events:
                    self.log_lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    @property
    def log(self) -> str:
        return "\n".join(self.log_lines)

    def states(self) -> list[str]:
        return [e["data"]["to"] for e in self.events if e["event"] == "state"]

    def wait_for(
        self, found: Callable[[dict[str, Any]], bool], timeout: float = 120
    ) -> dict[str, Any]:
        """The first event for which `found` is true, waiting at most `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for event in self.events:
                    if found(event):
                        return event
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise StreamsAppError(
                        f"no such event in {timeout:.0f}s; events: {self.events}\n"
                        f"log:\n{self.log[-5000:]}"
                    )
                self._changed.wait(min(left, 0.5))

    def wait_for_state(self, state: str, timeout: float = 120) -> None:
        self.wait_for(lambda e: e["event"] == "state" and e["data"]["to"] == state, timeout)

    def stop(self, timeout: float = 60) -> None:
        """Close stdin (the application closes itself) and wait for the JVM."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@contextlib.contextmanager
def running_app(
    bootstrap: str,
    *,
    input: str,
    output: str,
    protocol: str = "classic",
    handler: str = "default",
    app_id: str | None = None,
    version: str = KAFKA_4,
) -> Iterator[StreamsApp]:
    classes = compiled(version)
    argv = [
        shutil.which("java") or "java", *JVM_OPTIONS,
        f"-Dlog4j2.configurationFile={classes / 'log4j2.properties'}",
        "-cp", f"{classes}:{classpath(version)}", MAIN_CLASS,
        "--bootstrap", bootstrap, "--app-id", app_id or f"app-{uuid.uuid4().hex[:10]}",
        "--input", input, "--output", output, "--protocol", protocol, "--handler", handler,
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    register(proc, group=False)  # killed if pytest is stopped (process_groups.py)
    app = StreamsApp(proc)
    try:
        yield app
    finally:
        app.stop()
