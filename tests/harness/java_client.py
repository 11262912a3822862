"""The Java client (Apache Kafka's kafka-clients) as a subprocess, for tests through kvproxy.

`java_client/KvproxyJavaClient.java` is compiled with javac against the cached Kafka jars once,
into ``~/.cache/kvproxy/java-client/<hash of source and Kafka version>/`` (a lock lets parallel
pytest workers share it), then each call runs one command of it in a JVM of its own and returns
the JSON line it printed. The client's log (log4j2, WARN and above) is kept on `JavaRun.log`, as
the Java client logs retries there rather than raising them.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness.kafka_broker import KAFKA_4, kafka_classpath

SOURCE = Path(__file__).with_name("java_client") / "KvproxyJavaClient.java"
MAIN_CLASS = "KvproxyJavaClient"
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
    digest = hashlib.sha256(SOURCE.read_bytes() + version.encode()).hexdigest()[:16]
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
        command = [javac, "-d", str(target), "-cp", kafka_classpath(version), str(SOURCE)]
        built = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        if built.returncode != 0:
            raise JavaClientError(f"javac failed:\n{built.stdout}\n{built.stderr}")
        (target / "log4j2.properties").write_text(LOG4J2)
        done.write_text(version + "\n")
    return target


def run_java_client(
    command: str,
    bootstrap: str,
    *,
    props: dict[str, str] | None = None,
    version: str = KAFKA_4,
    timeout: float = 180,
    **args: str | int,
) -> JavaRun:
    """Run `KvproxyJavaClient command --bootstrap B --name value ... --prop k=v ...`."""
    classes = compiled(version)
    argv = [
        shutil.which("java") or "java",
        *JVM_OPTIONS,
        f"-Dlog4j2.configurationFile={classes / 'log4j2.properties'}",
        "-cp",
        f"{classes}:{kafka_classpath(version)}",
        MAIN_CLASS,
        command,
        "--bootstrap",
        bootstrap,
    ]
    for name, value in args.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    for key, value in (props or {}).items():
        argv += ["--prop", f"{key}={value}"]
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
