"""The Java client (Apache Kafka's kafka-clients) as a subprocess, for tests through kvproxy.

Every source in `java_client/` (`KvproxyJavaClient.java`; `KvproxyShareConsumer.java`, share
group members, run with ``main_class=SHARE_CONSUMER``) is compiled with javac against the cached
Kafka jars once, into ``~/.cache/kvproxy/java-client/<hash of the sources and Kafka version>/`` (a
lock lets parallel pytest workers share it), then each call runs one command of it in a JVM of its
own and returns the JSON line it printed. The client's log (log4j2, WARN and above) is kept on
`JavaRun.log`, as the Java client logs retries there rather than raising them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from tests.harness import kafka_broker
from tests.harness.kafka_broker import KAFKA_4, kafka_classpath

SOURCES_DIR = Path(__file__).with_name("java_client")
SOURCE = SOURCES_DIR / "KvproxyJavaClient.java"
MAIN_CLASS = "KvproxyJavaClient"
SHARE_CONSUMER = "KvproxyShareConsumer"
"""Members of one share group (KIP-932): `KvproxyShareConsumer.java`'s `share` command."""
TELEMETRY_REPORTER = f"{MAIN_CLASS}$TelemetryReporter"
"""A broker metrics reporter that accepts client telemetry and writes each push it gets to the
file named by the broker property `kvproxy.telemetry.file`."""
JVM_OPTIONS = ("-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xshare:auto")
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


class JavaClientError(Exception):
    """The program failed or printed no JSON line."""


@dataclass(frozen=True)
class JavaRun:
    result: dict[str, Any]
    log: str
    """What the client logged (stderr): WARN and ERROR lines."""


def cache_root() -> Path:
    default = Path.home() / ".cache" / "kvproxy" / "java-client"
    return Path(os.environ.get("KVPROXY_JAVA_CLIENT_CACHE", default))


def compiled(version: str = KAFKA_4) -> Path:
    """The directory holding the compiled classes and the log configuration; javac on first use."""
    sources = sorted(SOURCES_DIR.glob("*.java"))
    hashed = hashlib.sha256(version.encode())
    for source in sources:
        hashed.update(source.name.encode() + b"\0" + source.read_bytes())
    digest = hashed.hexdigest()[:16]
    target = cache_root() / digest
    done = target / ".complete"
    if done.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return target
        javac = shutil.which("javac")
        if javac is None:
            raise JavaClientError("javac is not installed: `make test` installs a JDK")
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        command = [javac, "-d", str(target), "-cp", kafka_classpath(version)]
        command += [str(source) for source in sources]
        built = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        if built.returncode != 0:
            raise JavaClientError(f"javac failed:\n{built.stdout}\n{built.stderr}")
        (target / "log4j2.properties").write_text(LOG4J2)
        done.write_text(version + "\n")
    return target


def java_client_argv(
    command: str,
    bootstrap: str,
    props: dict[str, str] | None = None,
    version: str = KAFKA_4,
    jvm: Sequence[str] = (),
    *,
    main_class: str = MAIN_CLASS,
    **args: str | int,
) -> list[str]:
    """`java ... KvproxyJavaClient command --bootstrap B --name value ... --prop k=v ...`;
    `jvm`: more options of the JVM (system properties such as `-Djava.net.preferIPv4Stack=true`);
    `main_class`: another program of `java_client/` (:data:`SHARE_CONSUMER`)."""
    classes = compiled(version)
    argv = [
        shutil.which("java") or "java",
        *JVM_OPTIONS,
        *jvm,
        f"-Dlog4j2.configurationFile={classes / 'log4j2.properties'}",
        "-cp",
        f"{classes}:{kafka_classpath(version)}",
        main_class,
        command,
        "--bootstrap",
        bootstrap,
    ]
    for name, value in args.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    for key, value in (props or {}).items():
        argv += ["--prop", f"{key}={value}"]
    return argv


def run_java_client(
    command: str,
    bootstrap: str,
    *,
    props: dict[str, str] | None = None,
    version: str = KAFKA_4,
    jvm: Sequence[str] = (),
    timeout: float = 180,
    main_class: str = MAIN_CLASS,
    **args: str | int,
) -> JavaRun:
    """Run one command to its end and return the JSON line it printed."""
    argv = java_client_argv(command, bootstrap, props, version, jvm, main_class=main_class, **args)
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise JavaClientError(
            f"{command} exited with {done.returncode}:\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        )
    return JavaRun(json.loads(lines[-1]), done.stderr)


@contextlib.contextmanager
def held_producer(
    bootstrap: str, *, props: dict[str, str] | None = None, timeout: float = 120, **args: str | int
) -> Iterator[dict[str, Any]]:
    """`produce --hold true`: yields its report while the producer is still open (its telemetry,
    for one, goes on); the producer closes when the block ends."""
    argv = java_client_argv("produce", bootstrap, props, hold="true", **args)
    with subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            line = proc.stdout.readline()  # the report, or "" when the JVM died first
            if not line.startswith("{"):
                raise JavaClientError(f"produce --hold printed {line!r}, exit {proc.poll()}")
            yield json.loads(line)
            proc.stdin.close()
            proc.wait(timeout)
        finally:
            if proc.poll() is None:
                proc.kill()


@contextlib.contextmanager
def brokers_load_the_reporter(version: str = KAFKA_4) -> Iterator[None]:
    """While open, the Kafka JVMs the harness starts (brokers, tools) also load the compiled
    classes, so a broker can name `TELEMETRY_REPORTER` in `metric.reporters`."""
    classes = compiled(version)
    original = kafka_broker.kafka_classpath

    def with_classes(version: str = KAFKA_4) -> str:
        return f"{classes}:{original(version)}"

    with mock.patch.object(kafka_broker, "kafka_classpath", with_classes):
        yield
