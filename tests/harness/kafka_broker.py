"""Run Apache Kafka (the real broker, from Maven Central's jars) for tests: KRaft, one combined
node or a cluster of brokers with one controller, on loopback ports, in log directories the test
owns.

Usage::

    with run_kafka() as kafka:                       # newest 4.x, one combined node (node id 1)
        kafka.bootstrap                              # "127.0.0.1:PORT"
        kafka.create_topic("t", partitions=3, config={"cleanup.policy": "compact"})

    with run_kafka(KAFKA_3, brokers=3) as cluster:   # brokers 1, 2, 3 and a controller (id 9)
        cluster.leader_of("t", 0)                    # node id leading partition 0
        cluster.node(2).kill()                       # kill -9
        cluster.node(2).start()                      # same ports, same log directory
        cluster.add_broker()                         # broker 4 joins the running cluster

The jars of each version are resolved once with Maven (``mvn dependency:copy-dependencies`` of
``kafka_jvm/pom.xml``) into ``$KVPROXY_KAFKA_CACHE`` (default ``~/.cache/kvproxy/kafka``); nothing
else is downloaded. Start-up is waited for by asking the broker (ApiVersions, then Metadata naming
every broker), never by sleeping a fixed time; a node that does not come up raises
:class:`KafkaError` with the last lines of its log.

Like the Tansu harness, this module imports nothing of the code under test.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from tests.harness.process_groups import register

__all__ = [
    "KAFKA_3",
    "KAFKA_4",
    "KAFKA_VERSIONS",
    "KafkaCluster",
    "KafkaError",
    "KafkaNode",
    "Listener",
    "kafka_classpath",
    "run_kafka",
]

HOST: Final = "127.0.0.1"
KAFKA_4: Final = "4.4.0"
"""The newest 4.x Maven Central serves (refuses Produce v0-v2 and message formats 0/1, KIP-896)."""
KAFKA_3: Final = "3.9.2"
"""The newest 3.9.x: the last line that accepts Produce v0-v2 and message formats 0/1."""
KAFKA_VERSIONS: Final = (KAFKA_4, KAFKA_3)
SHARE_GROUPS: Final = ("--feature", "share.version=2")
"""Formatted into every 4.x node: share groups (KIP-932; ShareFetch, ShareAcknowledge) on, named
rather than left to the release's default. Kafka 3.9 has no such feature and does not get it."""
CONTROLLER_ID: Final = 9
"""Node id of the controller of a multi-broker cluster (the brokers are 1..n)."""

FILES: Final = Path(__file__).resolve().parent / "kafka_jvm"
JVM_OPTIONS: Final = (
    "-Xms128m",
    "-Xmx768m",
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
LOG_TAIL_LINES: Final = 60


class KafkaError(RuntimeError):
    """A broker could not be resolved or started (the message carries its log's last lines)."""


# -- jars ------------------------------------------------------------------------------------


def cache_dir() -> Path:
    return Path(os.environ.get("KVPROXY_KAFKA_CACHE", Path.home() / ".cache" / "kvproxy" / "kafka"))


def kafka_classpath(version: str = KAFKA_4) -> str:
    """The classpath (``DIR/*``) of Kafka ``version``'s jars, resolved with Maven on first use.

    Several pytest workers may ask at once: a file lock makes one resolve while the others wait."""
    target = cache_dir() / version
    done = target / ".complete"
    if not done.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / f".{version}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.exists():
                _resolve(version, target)
    return f"{target}/*"


def _resolve(version: str, target: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaError("Maven (mvn) is not installed: `make test` installs it with apt-get")
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    command = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(FILES / "pom.xml"),
        "dependency:copy-dependencies",
        f"-Dkafka.version={version}",
        f"-DoutputDirectory={partial}",
        "-DincludeScope=runtime",
    ]
    if not version.startswith("3."):
        command.append("-Plog4j2")
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0 or not any(partial.glob("kafka_2.13-*.jar")):
        raise KafkaError(f"mvn could not resolve Kafka {version}:\n{done.stdout}\n{done.stderr}")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    (target / ".complete").write_text(version + "\n")


def java_command(version: str, main_class: str, *args: str, jvm: Sequence[str] = ()) -> list[str]:
    """``java`` running one of Kafka ``version``'s main classes (a tool or the broker)."""
    java = shutil.which("java")
    if java is None:
        raise KafkaError("java is not installed: `make test` installs a JRE with apt-get")
    logging = (
        f"-Dlog4j.configuration=file:{FILES / 'log4j.properties'}"
        if version.startswith("3.")
        else f"-Dlog4j2.configurationFile={FILES / 'log4j2.properties'}"
    )
    return [java, *jvm, logging, "-cp", kafka_classpath(version), main_class, *args]


# -- asking the broker -----------------------------------------------------------------------


def _exchange(host: str, port: int, payload: bytes, timeout: float) -> bytes | None:
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(struct.pack(">i", len(payload)) + payload)
            buf = b""
            while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">i", buf)[0]:
                chunk = sock.recv(65536)
                if not chunk:
                    return None
                buf += chunk
            return buf[4:]
    except OSError:
        return None


def _header(api_key: int, version: int, correlation_id: int) -> bytes:
    client_id = b"kvproxy-harness"
    return struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id


def api_versions_ok(host: str, port: int, timeout: float = 1.0) -> bool:
    """True if ``host:port`` answers ApiVersions v0 with error code 0."""
    answer = _exchange(host, port, _header(18, 0, 0x5EED), timeout)
    return answer is not None and struct.unpack_from(">ih", answer) == (0x5EED, 0)


def metadata_broker_ids(host: str, port: int, timeout: float = 1.0) -> set[int]:
    """The node ids a Metadata v1 answer (no topics) names; empty when it does not answer."""
    answer = _exchange(host, port, _header(3, 1, 0x5EEE) + struct.pack(">i", 0), timeout)
    if answer is None or len(answer) < 8:
        return set()
    offset = 4
    (count,) = struct.unpack_from(">i", answer, offset)
    offset += 4
    ids = set()
    for _ in range(count):
        (node_id,) = struct.unpack_from(">i", answer, offset)
        ids.add(node_id)
        offset += 4
        (host_len,) = struct.unpack_from(">h", answer, offset)
        offset += 2 + host_len + 4
        (rack_len,) = struct.unpack_from(">h", answer, offset)
        offset += 2 + max(rack_len, 0)
    return ids


# -- one node --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Listener:
    """A client listener: its name (``PLAINTEXT``, ``SASL_SSL``, ...) and security protocol.

    ``advertised_port``: the port Metadata names for this listener instead of its own (a relay
    listening there in front of it, so that every request of its clients passes through it)."""

    name: str
    protocol: str = "PLAINTEXT"
    advertised_port: int | None = None


@dataclass
class KafkaNode:
    """One Kafka process (broker, controller, or both). Ports and log directory stay the same
    across restarts, so a killed node comes back as itself."""

    version: str
    node_id: int
    roles: str
    directory: Path
    controller_port: int
    voters: str
    listeners: tuple[Listener, ...] = (Listener("PLAINTEXT"),)
    properties: Mapping[str, str] = field(default_factory=dict)
    format_arguments: Sequence[str] = ()
    ports: dict[str, int] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def is_broker(self) -> bool:
        return "broker" in self.roles

    @property
    def port(self) -> int:
        """The port of the first client listener."""
        return self.ports[self.listeners[0].name]

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The log's first ERROR/FATAL lines (the cause; a failed start ends in pages of
        shutdown) and then its last ``lines`` lines."""
        if not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").splitlines()
        starts = [i for i, line in enumerate(text) if " ERROR " in line or " FATAL " in line]
        errors = [line for i in starts[:5] for line in text[i : i + 3]]  # with the exception
        cause = ["--- first errors ---", *errors, "--- last lines ---"] if errors else []
        return "\n".join([*cause, *text[-lines:]])

    def write_config(self, cluster_id: str) -> Path:
        if self.is_broker and not self.ports:
            self.ports.update({listener.name: _free_port() for listener in self.listeners})
        listeners = (
            [f"CONTROLLER://{HOST}:{self.controller_port}"] if "controller" in self.roles else []
        )
        protocols = {"CONTROLLER": "PLAINTEXT"}
        advertised = []
        if self.is_broker:
            for listener in self.listeners:
                listeners.append(f"{listener.name}://{HOST}:{self.ports[listener.name]}")
                shown = listener.advertised_port or self.ports[listener.name]
                advertised.append(f"{listener.name}://{HOST}:{shown}")
                protocols[listener.name] = listener.protocol
        settings = {
            "process.roles": self.roles,
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters,
            "controller.listener.names": "CONTROLLER",
            "listeners": ",".join(listeners),
            "listener.security.protocol.map": ",".join(f"{k}:{v}" for k, v in protocols.items()),
            "log.dirs": str(self.directory / "data"),
            "num.partitions": "1",
            "offsets.topic.num.partitions": "4",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "true",
            "log.flush.interval.messages": "9223372036854775807",
            **self.properties,
        }
        if self.is_broker:
            settings["advertised.listeners"] = ",".join(advertised)
            settings.setdefault("inter.broker.listener.name", self.listeners[0].name)
        path = self.directory / "server.properties"
        self.directory.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        if not (self.directory / "data" / "meta.properties").exists():
            self._format(path, cluster_id)
        return path

    def _format(self, config: Path, cluster_id: str) -> None:
        command = java_command(
            self.version,
            "kafka.tools.StorageTool",
            "format",
            "-t",
            cluster_id,
            "-c",
            str(config),
            "--ignore-formatted",
            *(() if self.version.startswith("3.") else SHARE_GROUPS),
            *self.format_arguments,
            jvm=("-Xmx256m", "-XX:TieredStopAtLevel=1"),
        )
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise KafkaError(
                f"formatting node {self.node_id} failed:\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )

    def start(self) -> None:
        """Start the process (config written and log directory formatted beforehand)."""
        assert not self.running, f"node {self.node_id} is already running"
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                java_command(
                    self.version,
                    "kafka.Kafka",
                    str(self.directory / "server.properties"),
                    jvm=JVM_OPTIONS,
                ),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            register(self.proc)  # killed if pytest is stopped before stop() (process_groups.py)
        finally:
            log.close()

    def kill(self) -> None:
        """kill -9: no shutdown, no flush."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a controlled shutdown), then SIGKILL after ``timeout`` seconds."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def check_alive(self, what: str) -> None:
        """Raise :class:`KafkaError` with the log's last lines if the process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise KafkaError(
                f"Kafka {self.version} node {self.node_id} exited with code {self.proc.returncode} "
                f"while waiting for {what}\n"
                f"--- last lines of {self.log_path} ---\n{self.log_tail()}"
            )


# -- a cluster -------------------------------------------------------------------------------


@dataclass
class KafkaCluster:
    """One combined node (``brokers == 1``), or brokers 1..n and the controller
    :data:`CONTROLLER_ID`."""

    version: str
    directory: Path
    nodes: list[KafkaNode]
    cluster_id: str
    ready_timeout: float = 120.0

    @property
    def brokers(self) -> list[KafkaNode]:
        return [node for node in self.nodes if node.is_broker]

    @property
    def bootstrap(self) -> str:
        """The first listener of every broker, comma-separated."""
        return ",".join(f"{HOST}:{node.port}" for node in self.brokers)

    @property
    def bootstrap_servers(self) -> list[str]:
        """``host:port`` of every broker's first listener (kvproxy's upstream servers)."""
        return [f"{HOST}:{node.port}" for node in self.brokers]

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        return self.brokers[0].port

    def node(self, node_id: int) -> KafkaNode:
        return next(node for node in self.nodes if node.node_id == node_id)

    def start(self) -> None:
        for node in self.nodes:
            node.write_config(self.cluster_id)
        for node in self.nodes:
            node.start()
        self.wait_ready()

    def wait_ready(self, node_ids: Sequence[int] | None = None) -> None:
        """Until every (or each named) broker answers ApiVersions and its Metadata names every
        broker of the cluster (they have all registered with the controller)."""
        wanted = {node.node_id for node in self.brokers}
        waiting = [self.node(n) for n in node_ids] if node_ids else self.brokers
        deadline = time.monotonic() + self.ready_timeout
        for node in waiting:
            while True:
                for each in self.nodes:
                    each.check_alive(f"node {node.node_id} to answer")
                if api_versions_ok(HOST, node.port) and wanted <= metadata_broker_ids(
                    HOST, node.port
                ):
                    break
                if time.monotonic() > deadline:
                    raise KafkaError(
                        f"Kafka {self.version} node {node.node_id} did not answer on "
                        f"{HOST}:{node.port} "
                        f"within {self.ready_timeout:.0f}s\n--- last lines of {node.log_path} ---\n"
                        f"{node.log_tail()}"
                    )
                time.sleep(0.1)

    def stop(self) -> None:
        for node in self.brokers:
            node.stop()
        for node in self.nodes:
            node.stop()

    def restart(self, node_id: int) -> None:
        """Start a stopped or killed node again and wait until it has rejoined."""
        self.node(node_id).start()
        self.wait_ready([node_id] if self.node(node_id).is_broker else None)

    def add_broker(self) -> KafkaNode:
        """A new broker joining the running cluster (a multi-broker one: the combined node is
        the only voter of its own): the next node id, the same cluster id, controller quorum,
        listeners and settings as the others; started and waited for until every broker's
        Metadata names it."""
        model = self.brokers[-1]
        assert model.roles == "broker", "a broker joins a cluster with a separate controller"
        node_id = max(node.node_id for node in self.brokers) + 1
        if node_id == CONTROLLER_ID:
            node_id += 1
        node = KafkaNode(
            self.version,
            node_id,
            "broker",
            self.directory / f"node-{node_id}",
            model.controller_port,
            model.voters,
            model.listeners,
            model.properties,
            model.format_arguments,
        )
        self.nodes.append(node)
        node.write_config(self.cluster_id)
        node.start()
        self.wait_ready()
        return node

    # -- topics through the Java-independent admin client (librdkafka) ------------------------
    def admin(self, **settings: str):  # type: ignore[no-untyped-def]
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap, **settings})

    def create_topic(
        self,
        name: str | None = None,
        partitions: int = 1,
        config: Mapping[str, str] | None = None,
        replication_factor: int | None = None,
        timeout: float = 30.0,
        *,
        replicas_on: Sequence[Sequence[int]] | None = None,
    ) -> str:
        """Create a topic (a fresh unique name unless given) and wait until every partition has a
        leader in Metadata. Replication factor: the number of brokers, at most 3. `replicas_on`:
        the brokers of each partition instead, its leader first (`[[4]]`: one partition on
        broker 4); `partitions` and `replication_factor` are then ignored."""
        from confluent_kafka.admin import NewTopic

        name = name or f"t-{uuid.uuid4().hex[:12]}"
        settings = dict(config or {})
        if replicas_on is None:
            replicas = replication_factor or min(3, len(self.brokers))
            new = NewTopic(name, partitions, replicas, config=settings)
        else:
            partitions = len(replicas_on)
            assignment = [list(brokers) for brokers in replicas_on]
            new = NewTopic(name, partitions, replica_assignment=assignment, config=settings)
        admin = self.admin()
        futures = admin.create_topics(
            [new],
            operation_timeout=timeout,
            request_timeout=timeout,
        )
        futures[name].result(timeout)
        deadline = time.monotonic() + timeout
        while True:
            topic = admin.list_topics(name, timeout=timeout).topics.get(name)
            if (
                topic is not None
                and topic.error is None
                and len(topic.partitions) == partitions
                and all(p.leader >= 0 for p in topic.partitions.values())
            ):
                return name
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name} has no leader for every partition: {topic}")
            time.sleep(0.05)

    def leader_of(self, topic: str, partition: int = 0, timeout: float = 30.0) -> int:
        """The partition's leader as Metadata names it. Brokers learn of a new topic one by one,
        so a broker that has not yet heard of it is asked again until the deadline."""
        admin = self.admin()
        deadline = time.monotonic() + timeout
        while True:
            found = admin.list_topics(topic, timeout=10).topics.get(topic)
            known = found.partitions.get(partition) if found is not None else None
            if known is not None and known.leader >= 0:
                return int(known.leader)
            if time.monotonic() > deadline:
                raise TimeoutError(f"no leader of {topic}-{partition} in Metadata: {found}")
            time.sleep(0.05)

    def tool(
        self, main_class: str, *args: str, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run one of Kafka's own tools (a main class of this version's jars) to completion."""
        return subprocess.run(
            java_command(self.version, main_class, *args, jvm=("-Xmx512m",)),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _cluster_id() -> str:
    """A random cluster id as Kafka writes one (base64url of 16 bytes), never starting with
    ``-`` (the storage tool would read it as an option)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def build_cluster(
    version: str,
    directory: Path,
    *,
    brokers: int = 1,
    listeners: tuple[Listener, ...] = (Listener("PLAINTEXT"),),
    properties: Mapping[str, str] | None = None,
    format_arguments: Sequence[str] = (),
) -> KafkaCluster:
    """The nodes of a cluster (not started): one combined node with id 1, or ``brokers`` brokers
    1..n and one controller with id :data:`CONTROLLER_ID`."""
    props = dict(properties or {})
    controller_port = _free_port()
    if brokers == 1:
        voters = f"1@{HOST}:{controller_port}"
        nodes = [
            KafkaNode(
                version,
                1,
                "broker,controller",
                directory / "node-1",
                controller_port,
                voters,
                listeners,
                props,
                format_arguments,
            )
        ]
    else:
        voters = f"{CONTROLLER_ID}@{HOST}:{controller_port}"
        replicated = {
            "offsets.topic.replication.factor": "3",
            "transaction.state.log.replication.factor": "3",
            "transaction.state.log.min.isr": "2",
            "default.replication.factor": "3",
            "min.insync.replicas": "2",
            "unclean.leader.election.enable": "false",
            **props,
        }
        nodes = [
            KafkaNode(
                version,
                CONTROLLER_ID,
                "controller",
                directory / f"node-{CONTROLLER_ID}",
                controller_port,
                voters,
                listeners,
                props,
                format_arguments,
            )
        ] + [
            KafkaNode(
                version,
                n,
                "broker",
                directory / f"node-{n}",
                controller_port,
                voters,
                listeners,
                replicated,
                format_arguments,
            )
            for n in range(1, brokers + 1)
        ]
    return KafkaCluster(version, directory, nodes, _cluster_id())


@contextlib.contextmanager
def run_kafka(
    version: str = KAFKA_4,
    *,
    brokers: int = 1,
    listeners: tuple[Listener, ...] = (Listener("PLAINTEXT"),),
    properties: Mapping[str, str] | None = None,
    format_arguments: Sequence[str] = (),
    directory: Path | None = None,
) -> Iterator[KafkaCluster]:
    """Start Apache Kafka ``version`` (KRaft) on loopback, yield it, stop it and remove its
    directory (unless ``directory`` was given: then it stays for the test to read)."""
    owned = directory is None
    root = Path(tempfile.mkdtemp(prefix=f"kafka-{version}-")) if directory is None else directory
    cluster = build_cluster(
        version,
        root,
        brokers=brokers,
        listeners=listeners,
        properties=properties,
        format_arguments=format_arguments,
    )
    try:
        cluster.start()
        yield cluster
    finally:
        for node in cluster.nodes:
            node.kill()
        if owned:
            shutil.rmtree(root, ignore_errors=True)
