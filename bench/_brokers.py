"""The broker a benchmark measures against (Apache Kafka or Tansu), with the floor in front of it.

The floor is what any proxy pays: HAProxy copying bytes in TCP mode, reading none. With
`upstream("kafka", floor=True)` the broker gets a second listener, FLOOR, whose advertised port is
HAProxy's, and HAProxy relays to that listener's real port: a client bootstrapped at HAProxy is
sent back to HAProxy by every Metadata answer, so all its requests pass through it, while direct
and kvproxy clients keep using the first listener. Tansu advertises one address, so it has no
floor.

`upstream("kafka", floor=True, uvloop_relay=True)` adds a third listener, UVLOOP, in front of
which runs bench/uvloop_relay.py: a Python relay on uvloop that reads nothing either. HAProxy stays
the floor the goals are measured against; the relay says how much of the gap between HAProxy and
kvproxy is the event loop and Python's I/O, and how much is kvproxy's own work per request.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil
import uvloop
from confluent_kafka.admin import AdminClient

from bench._relays import (
    HOST,
    HAProxyProcess,
    ProxyProcess,
    RelayProcess,
    UvloopRelayProcess,
    haproxy_binary,
    metadata_brokers,
    start_haproxy,
    start_uvloop_relay,
)
from tests.harness.kafka_broker import KAFKA_4, Listener, run_kafka
from tests.harness.tansu import TansuServer, create_topic, free_port, run_tansu

__all__ = [
    "UPSTREAMS",
    "BrokerUnderTest",
    "TansuServer",
    "add_upstream_option",
    "add_uvloop_relay_option",
    "create_topic",
    "floor_settings",
    "free_port",
    "relay_sides",
    "run_tansu",
    "tansu",
    "upstream",
]


@contextlib.contextmanager
def tansu() -> Iterator[TansuServer]:
    """Tansu on a free loopback port, in memory."""
    with run_tansu() as server:
        yield server


UPSTREAMS = ("kafka", "tansu")
"""The brokers a benchmark can run against; Apache Kafka (KAFKA_4) is the default."""


@dataclass
class BrokerUnderTest:
    """The broker a benchmark measures against: where clients reach it, what it is, its process.

    `label` names it in printed tables ("Kafka" or "Tansu"), `version` in the results file;
    `floor` is HAProxy in front of it and `uvloop_relay` the Python relay, when asked for and the
    broker can have them."""

    kind: str
    label: str
    version: str
    bootstrap: str
    process: psutil.Process
    floor: HAProxyProcess | None = None
    uvloop_relay: UvloopRelayProcess | None = None

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the broker process so far."""
        times = self.process.cpu_times()
        return float(times.user + times.system)

    def create_topic(self, name: str, partitions: int = 1, timeout: float = 30.0) -> str:
        """Create `name` and wait until Metadata gives every partition a leader (Kafka elects
        them a moment after CreateTopics answers)."""
        create_topic(self.bootstrap, name, partitions, None, timeout)
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + timeout
        while True:
            topic = admin.list_topics(name, timeout=timeout).topics.get(name)
            if topic is not None and all(p.leader >= 0 for p in topic.partitions.values()):
                return name
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name} has no leader for every partition: {topic}")
            time.sleep(0.05)


def add_upstream_option(parser: Any) -> None:
    """`--upstream kafka|tansu` on a benchmark's argument parser."""
    parser.add_argument(
        "--upstream",
        choices=UPSTREAMS,
        default="kafka",
        help=f"the broker: Apache Kafka {KAFKA_4} (default, one KRaft node) or Tansu (in memory)",
    )


def add_uvloop_relay_option(parser: Any) -> None:
    """`--no-uvloop-relay` on a benchmark's argument parser (the relay runs by default)."""
    parser.add_argument(
        "--no-uvloop-relay",
        dest="uvloop_relay",
        action="store_false",
        help="leave out the uvloop side (bench/uvloop_relay.py, a Python relay reading nothing)",
    )


FLOOR_LISTENER = "FLOOR"
"""The broker listener HAProxy relays to; its advertised port is HAProxy's."""
UVLOOP_LISTENER = "UVLOOP"
"""The broker listener the uvloop relay relays to; its advertised port is the relay's."""


@contextlib.contextmanager
def upstream(
    kind: str = "kafka", *, floor: bool = False, uvloop_relay: bool = False
) -> Iterator[BrokerUnderTest]:
    """A fresh broker on loopback for one benchmark: Apache Kafka KAFKA_4 (one combined KRaft
    node, log directory in a temporary directory removed afterwards) or Tansu in memory.

    `floor`: HAProxy in front of Kafka on a second listener (the module docstring), checked to be
    what Metadata names through it; `uvloop_relay`: bench/uvloop_relay.py the same way on a
    third. Tansu gets neither (it advertises one address), which is said.
    """
    if kind == "kafka":
        ports = {FLOOR_LISTENER: free_port(), UVLOOP_LISTENER: free_port()}
        relays = {FLOOR_LISTENER: floor, UVLOOP_LISTENER: uvloop_relay}
        listeners = [Listener("PLAINTEXT")] + [
            Listener(name, advertised_port=ports[name]) for name in relays if relays[name]
        ]
        with contextlib.ExitStack() as stack:
            cluster = stack.enter_context(run_kafka(KAFKA_4, listeners=tuple(listeners)))
            node = cluster.brokers[0]
            assert node.proc is not None
            broker = BrokerUnderTest(
                "kafka", "Kafka", KAFKA_4, cluster.bootstrap, psutil.Process(node.proc.pid)
            )
            if floor:
                backend = f"{HOST}:{node.ports[FLOOR_LISTENER]}"
                broker.floor = stack.enter_context(start_haproxy(ports[FLOOR_LISTENER], backend))
                _check_named_alone(broker.floor, "HAProxy")
            if uvloop_relay:
                backend = f"{HOST}:{node.ports[UVLOOP_LISTENER]}"
                port = ports[UVLOOP_LISTENER]
                broker.uvloop_relay = stack.enter_context(start_uvloop_relay(port, backend))
                _check_named_alone(broker.uvloop_relay, "the uvloop relay")
            yield broker
    elif kind == "tansu":
        if floor or uvloop_relay:
            print(
                "haproxy and uvloop variants left out: Tansu advertises one address (its own), so "
                "Metadata cannot send clients back through a relay; run with --upstream kafka for "
                "the floor",
                flush=True,
            )
        with tansu() as server:
            assert server.proc is not None
            yield BrokerUnderTest(
                "tansu", "Tansu", "0.6", server.broker.bootstrap, psutil.Process(server.proc.pid)
            )
    else:
        raise ValueError(f"unknown upstream {kind!r}: one of {', '.join(UPSTREAMS)}")


def relay_sides(broker: BrokerUnderTest, proxy: ProxyProcess) -> dict[str, RelayProcess]:
    """The relays a benchmark's sides go through, by side name, in the order they alternate:
    HAProxy ("haproxy") and the uvloop relay ("uvloop") when the broker has them, then kvproxy
    ("proxy"). The side "direct" goes through none."""
    relays: dict[str, RelayProcess] = {}
    if broker.floor is not None:
        relays["haproxy"] = broker.floor
    if broker.uvloop_relay is not None:
        relays["uvloop"] = broker.uvloop_relay
    relays["proxy"] = proxy
    return relays


def _check_named_alone(relay: RelayProcess, name: str) -> None:
    """Stop unless Metadata asked through `relay` names the relay's port alone (so every request
    of a client bootstrapped there passes through it)."""
    named = {(host, port) for _, host, port in metadata_brokers(relay.port)}
    if named != {(HOST, relay.port)}:
        raise RuntimeError(f"Metadata through {name} names {named}, not {name}")


def floor_settings(broker: BrokerUnderTest) -> dict[str, str] | None:
    """For a results file: HAProxy's version and configuration when the broker has the floor,
    and the uvloop relay's uvloop version when it has that."""
    settings = {}
    if broker.floor is not None:
        shown = subprocess.run(
            [haproxy_binary(), "-v"], capture_output=True, text=True, timeout=30, check=False
        )
        version = shown.stdout.splitlines()[0] if shown.stdout else "?"
        settings = {"haproxy": version, "config": broker.floor.config_path.read_text()}
    if broker.uvloop_relay is not None:
        settings["uvloop_relay"] = f"bench/uvloop_relay.py, uvloop {uvloop.__version__}"
    return settings or None
