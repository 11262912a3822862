"""What the benchmarks share: the broker (Apache Kafka or Tansu), a `kvproxy serve` process, the
floor (HAProxy in TCP mode in front of the same broker), CPU and memory readings, alternating runs
and the results file.

Every benchmark compares kvproxy with a baseline measured in the same run (these machines are
noisy): it alternates the variants run by run and reports medians and ratios. Each one writes its
figures to `bench/results/<name>.json`; `bench/run_all.py` collects them into
`bench/results/latest.md`.

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
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import uvloop
from confluent_kafka.admin import AdminClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.harness.kafka_broker import KAFKA_4, Listener, run_kafka  # noqa: E402
from tests.harness.proxy import free_port_range  # noqa: E402
from tests.harness.tansu import TansuServer, create_topic, free_port, run_tansu  # noqa: E402

__all__ = [
    "HAPROXY",
    "KVPROXY",
    "ROOT",
    "SIDE_NAMES",
    "UPSTREAMS",
    "UVLOOP_RELAY",
    "BrokerUnderTest",
    "FloorRow",
    "HAProxyProcess",
    "ProxyProcess",
    "RelayProcess",
    "UvloopRelayProcess",
    "add_upstream_option",
    "add_uvloop_relay_option",
    "against_floor",
    "alternate",
    "create_topic",
    "floor_difference",
    "floor_settings",
    "floor_table",
    "free_port",
    "haproxy_config",
    "machine",
    "median",
    "metadata_brokers",
    "print_floor",
    "relay_sides",
    "run_tansu",
    "start_haproxy",
    "start_proxy",
    "start_uvloop_relay",
    "tansu",
    "upstream",
    "write_results",
]

RESULTS = Path(os.environ.get("KVPROXY_BENCH_RESULTS", ROOT / "bench" / "results"))
"""Where figures go (`KVPROXY_BENCH_RESULTS` moves them, e.g. for the smoke test)."""
HOST = "127.0.0.1"

RECORD_LEVEL_RULE = """\
topics:
  - match: "{pattern}"
    compacted: true
    default_policies: drop
    policies:
      - compacted_key
      - {{max_record_bytes: {{limit: 1048576}}}}
      - json
"""
"""A topic rule with the record-level policies of benchmark 1 (keys needed, values JSON)."""


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


@dataclass
class RelayProcess:
    """A process in front of the broker (kvproxy, HAProxy, the uvloop relay), where clients reach
    it, and its CPU and memory over it and its child processes (psutil counts every thread of a
    process)."""

    process: subprocess.Popen[bytes]
    port: int
    _ps: psutil.Process = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._ps = psutil.Process(self.process.pid)

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def processes(self) -> list[psutil.Process]:
        """The process and its children (kvproxy's workers with `--workers N`)."""
        try:
            return [self._ps, *self._ps.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def cpu_seconds(self) -> float:
        """User + system CPU seconds so far, over the proxy and its workers."""
        total = 0.0
        for proc in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                times = proc.cpu_times()
                total += times.user + times.system
        return total

    def rss_bytes(self) -> int:
        """Resident memory over the proxy and its workers."""
        total = 0
        for proc in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                total += proc.memory_info().rss
        return total


@dataclass
class ProxyProcess(RelayProcess):
    """A running `kvproxy serve` and where clients reach it (its log beside its config)."""

    config_path: Path


@dataclass
class HAProxyProcess(RelayProcess):
    """A running HAProxy in TCP mode (the floor) and where clients reach it."""

    config_path: Path


@dataclass
class UvloopRelayProcess(RelayProcess):
    """A running bench/uvloop_relay.py (the floor of a Python proxy) and where clients reach it."""


def _answers_api_versions(port: int) -> bool:
    """True when a relay (kvproxy, HAProxy, the uvloop relay) passes an ApiVersions v0 request
    on and answers it."""
    request = struct.pack(">hhih", 18, 0, 1, 5) + b"bench"
    try:
        with socket.create_connection((HOST, port), timeout=2) as sock:
            sock.sendall(struct.pack(">i", len(request)) + request)
            sock.settimeout(2)
            head = sock.recv(8)
            return len(head) == 8 and struct.unpack(">ii", head)[1] == 1
    except OSError:
        return False


@contextlib.contextmanager
def start_proxy(
    upstream: str,
    *,
    rules: str = "",
    workers: int = 1,
    extra_yaml: str = "",
    listen_yaml: str = "",
    ready_timeout: float = 20.0,
) -> Iterator[ProxyProcess]:
    """`kvproxy serve` in front of `upstream`, default checks unless `rules` adds topic rules.

    `rules` is YAML appended to the config (say `RECORD_LEVEL_RULE.format(pattern="rl-*")`);
    `listen_yaml` more keys of the `listen` mapping (", sni: {...}").
    Stopped with SIGTERM (then SIGKILL) on exit; its stderr goes to a file, printed on failure.
    """
    with tempfile.TemporaryDirectory(prefix="kvbench-") as tmp:
        base = free_port_range(200)
        port = free_port()
        config = Path(tmp) / "kvproxy.yaml"
        config.write_text(
            f"listen: {{port: {port}, broker_port_base: {base}, max_brokers: 200{listen_yaml}}}\n"
            f"upstream: {{bootstrap_servers: ['{upstream}']}}\n"
            "metrics: {port: 0}\n" + extra_yaml + rules
        )
        log_path = Path(tmp) / "kvproxy.log"
        command = [sys.executable, "-m", "kvproxy.cli", "serve", "-c", str(config)]
        command += ["--reload-interval", "0"]
        if workers != 1:
            command += ["--workers", str(workers)]
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(command, stderr=log_file, stdout=log_file, cwd=ROOT)
            proxy = ProxyProcess(process, port, config)
            try:
                deadline = time.monotonic() + ready_timeout
                while not _answers_api_versions(port):
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            "kvproxy did not start:\n" + log_path.read_text(errors="replace")
                        )
                    time.sleep(0.1)
                if workers > 1:
                    time.sleep(0.5 * workers)  # every worker has its listeners open
                yield proxy
            finally:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(5)


HAPROXY_CONFIG = """\
# The floor: HAProxy in TCP mode relaying to one broker listener, copying bytes and reading none.
# Defaults otherwise (threads, buffers, no splicing): what any proxy pays, not a tuned relay.
defaults
    mode tcp
    timeout connect 5s
    timeout client 10m
    timeout server 10m

frontend floor
    bind {host}:{port}
    default_backend broker

backend broker
    server broker {server}
"""
"""Idle connections are cut after 10 minutes, as Kafka's own `connections.max.idle.ms` does."""


def haproxy_config(port: int, server: str) -> str:
    """HAProxy's configuration: TCP mode on HOST:`port`, one backend server `server` (host:port)."""
    return HAPROXY_CONFIG.format(host=HOST, port=port, server=server)


def haproxy_binary() -> str:
    """Where `haproxy` is (Debian puts it in /usr/sbin, off a non-root user's PATH)."""
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise RuntimeError(
            "haproxy is not installed: `make bench` installs it "
            "(apt-get install -y --no-install-recommends haproxy)"
        )
    return found


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


@contextlib.contextmanager
def start_haproxy(
    port: int, server: str, *, ready_timeout: float = 20.0
) -> Iterator[HAProxyProcess]:
    """HAProxy in the foreground with `haproxy_config(port, server)` from a temporary directory,
    ready once an ApiVersions request passes through it; SIGTERM (then SIGKILL) on exit."""
    with tempfile.TemporaryDirectory(prefix="kvbench-haproxy-") as tmp:
        config = Path(tmp) / "haproxy.cfg"
        config.write_text(haproxy_config(port, server))
        command = [haproxy_binary(), "-db", "-f", str(config)]
        with _relay_process("haproxy", command, port, Path(tmp), ready_timeout) as process:
            yield HAProxyProcess(process, port, config)


@contextlib.contextmanager
def start_uvloop_relay(
    port: int, server: str, *, ready_timeout: float = 20.0
) -> Iterator[UvloopRelayProcess]:
    """bench/uvloop_relay.py on HOST:`port` relaying to `server` (host:port), ready once an
    ApiVersions request passes through it; SIGTERM (then SIGKILL) on exit."""
    script = ROOT / "bench" / "uvloop_relay.py"
    command = [sys.executable, str(script), "--port", str(port), "--upstream", server]
    with (
        tempfile.TemporaryDirectory(prefix="kvbench-uvloop-") as tmp,
        _relay_process("the uvloop relay", command, port, Path(tmp), ready_timeout) as process,
    ):
        yield UvloopRelayProcess(process, port)


@contextlib.contextmanager
def _relay_process(
    name: str, command: list[str], port: int, directory: Path, ready_timeout: float
) -> Iterator[subprocess.Popen[bytes]]:
    """`command` run with its output in `directory`, yielded once an ApiVersions request passes
    through `port` (its output in the error when it does not); SIGTERM, then SIGKILL, on exit."""
    log_path = directory / "relay.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=log_file, cwd=ROOT)
        try:
            deadline = time.monotonic() + ready_timeout
            while not _answers_api_versions(port):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{name} did not start:\n" + log_path.read_text(errors="replace")
                    )
                time.sleep(0.1)
            yield process
        finally:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def metadata_brokers(port: int) -> list[tuple[int, str, int]]:
    """(node id, host, port) of every broker a Metadata v1 answer (no topics) from HOST:`port`
    names: through HAProxy, the floor listener must name HAProxy's port."""
    request = struct.pack(">hhih", 3, 1, 2, 5) + b"bench" + struct.pack(">i", 0)
    with socket.create_connection((HOST, port), timeout=5) as sock:
        sock.settimeout(5)
        sock.sendall(struct.pack(">i", len(request)) + request)
        answer = read_frame(sock)
    (count,) = struct.unpack_from(">i", answer, 4)  # after the correlation id
    offset = 8
    brokers = []
    for _ in range(count):
        node_id, host_len = struct.unpack_from(">ih", answer, offset)
        offset += 6
        host = answer[offset : offset + host_len].decode()
        offset += host_len
        broker_port, rack_len = struct.unpack_from(">ih", answer, offset)
        offset += 6 + max(rack_len, 0)
        brokers.append((node_id, host, broker_port))
    return brokers


KVPROXY = "kvproxy"
HAPROXY = "HAProxy"
UVLOOP_RELAY = "uvloop relay"
SIDE_NAMES = {"proxy": KVPROXY, "haproxy": HAPROXY, "uvloop": UVLOOP_RELAY}
"""The names in the against-the-floor rows of the benchmarks' sides."""


@dataclass(frozen=True)
class FloorRow:
    """One side against a floor on one figure from the same run (kvproxy against HAProxy, the
    goals; kvproxy against the uvloop relay; the uvloop relay against HAProxy): both readings, how
    they compare (measured / floor, or measured - floor for latencies), round by round, the goal."""

    figure: str
    measured: str
    floor: str
    measured_reading: float
    floor_reading: float
    comparison: str
    """"ratio" (measured / floor) or "difference" (measured - floor)."""
    value: float
    per_round: tuple[float, ...]
    goal: str | None
    met: bool | None


def against_floor(
    figure: str,
    floor_readings: Sequence[float],
    measured_readings: Sequence[float],
    *,
    at_most: float | None = None,
    at_least: float | None = None,
    measured: str = KVPROXY,
    floor: str = HAPROXY,
) -> FloorRow:
    """The measured side's median over the floor's median of one figure, with the ratio of each
    round's pair (the runs of one round were measured next to each other)."""
    pairs = zip(measured_readings, floor_readings, strict=True)
    return _floor_row(
        figure,
        (measured, floor),
        (median(measured_readings), median(floor_readings)),
        comparison="ratio",
        value=median(measured_readings) / median(floor_readings),
        per_round=[m / f for m, f in pairs],
        at_most=at_most,
        at_least=at_least,
    )


def floor_difference(
    figure: str,
    floor_reading: float,
    measured_reading: float,
    per_round: Sequence[float],
    *,
    at_most: float | None = None,
    measured: str = KVPROXY,
    floor: str = HAPROXY,
) -> FloorRow:
    """Measured - floor of one figure (a latency percentile), with the differences per round."""
    return _floor_row(
        figure,
        (measured, floor),
        (measured_reading, floor_reading),
        comparison="difference",
        value=measured_reading - floor_reading,
        per_round=per_round,
        at_most=at_most,
        at_least=None,
    )


def _floor_row(
    figure: str,
    sides: tuple[str, str],
    readings: tuple[float, float],
    *,
    comparison: str,
    value: float,
    per_round: Sequence[float],
    at_most: float | None,
    at_least: float | None,
) -> FloorRow:
    sign = "+" if comparison == "difference" else ""
    if at_most is not None:
        goal, met = f"<= {sign}{at_most:g}", value <= at_most
    elif at_least is not None:
        goal, met = f">= {sign}{at_least:g}", value >= at_least
    else:
        goal, met = None, None
    rounds = tuple(per_round)
    return FloorRow(figure, *sides, *readings, comparison, value, rounds, goal, met)


def _reading(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def floor_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Lines of a table of FloorRow fields (as written to a results file)."""
    lines = [
        f"{'':44}{'measured / floor':24}{'floor':>9}{'measured':>9}{'compared':>10}{'goal':>9}"
        f"{'met':>5}  per round",
    ]
    for row in rows:
        difference = row["comparison"] == "difference"
        sides = f"{row['measured']} {'-' if difference else '/'} {row['floor']}"
        value = f"{row['value']:+.3f}" if difference else f"{row['value']:.2f}x"
        rounds = " ".join(f"{x:+.3f}" if difference else f"{x:.2f}" for x in row["per_round"])
        met = "-" if row["met"] is None else ("yes" if row["met"] else "NO")
        lines.append(
            f"{row['figure']:44}{sides:24}{_reading(row['floor_reading']):>9}"
            f"{_reading(row['measured_reading']):>9}{value:>10}{row['goal'] or '-':>9}{met:>5}"
            f"  {rounds}".rstrip()
        )
    return lines


def print_floor(rows: Sequence[FloorRow]) -> None:
    """The against-the-floor table of one benchmark."""
    floors = "HAProxy TCP mode"
    if any(UVLOOP_RELAY in (row.measured, row.floor) for row in rows):
        floors += "; the uvloop relay: a Python relay reading nothing"
    print(f"\nagainst the floor ({floors}; same run)")
    print("compared = measured / floor, or measured - floor in ms for latencies")
    print("\n".join(floor_table([asdict(row) for row in rows])))


def alternate(
    rounds: int, variants: Mapping[str, Callable[[int], float]]
) -> dict[str, list[float]]:
    """Run every variant once per round, in turn (variant(round) -> figure); figures by name."""
    results: dict[str, list[float]] = {name: [] for name in variants}
    for round_index in range(rounds):
        for name, run in variants.items():
            figure = run(round_index)
            results[name].append(figure)
            print(f"  round {round_index + 1}/{rounds} {name}: {figure:,.2f}", flush=True)
    return results


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def write_results(name: str, figures: Mapping[str, Any]) -> Path:
    """Save one benchmark's figures (with the machine) as bench/results/<name>.json."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), **figures}, indent=2))
    print(f"figures written to {path}")
    return path


def read_frame(sock: socket.socket) -> bytes:
    """One size-prefixed Kafka frame from `sock` (without its prefix)."""

    def read(size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("connection closed by the proxy")
            data += chunk
        return bytes(data)

    return read(int.from_bytes(read(4), "big"))


def report(result: dict[str, Any], json_path: Path | None) -> dict[str, Any]:
    """Print a benchmark's result as JSON, and write it to `json_path` when given."""
    print(json.dumps(result, indent=2), flush=True)
    if json_path:
        json_path.write_text(json.dumps(result, indent=2))
    return result
