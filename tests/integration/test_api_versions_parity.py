"""ApiVersions straight from Apache Kafka and through kvproxy (default config), for each tested
Kafka version: kvproxy must offer every API at every version the broker offers, but for the
differences docs/clients.md lists ("What kvproxy offers in ApiVersions"). The test reads that
table from the page, so the page and the proxy cannot drift apart: a difference without a row
fails, and so does a row that no longer differs. The features of ApiVersions v3+ must pass
unchanged. Kafka's own kafka-metadata-quorum tool shows what the DescribeQuorum row costs.
"""

from __future__ import annotations

import contextlib
import json
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvproxy.protocol.api_table import API_TABLE
from tests.harness.kafka_broker import KAFKA_3, KAFKA_4, KafkaCluster
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.raw_client import RawKafkaClient

DOC = Path(__file__).resolve().parents[2] / "docs" / "clients.md"
SECTION = "What kvproxy offers in ApiVersions"
COLUMNS = ["API key", "name", "broker", "kvproxy", "why"]
API_VERSIONS = 18
DESCRIBE_QUORUM = 55
REQUEST_VERSIONS = (0, 3)
"""v0, and v3 with a client software name and version: what librdkafka sends first."""
QUORUM_TOOL = "org.apache.kafka.tools.MetadataQuorumCommand"
Range = tuple[int, int] | None
"""An API's (lowest, highest) version; None: not offered."""


# ---- ApiVersions on the wire (by hand: the harness reads nothing with the proxy's codec) -------


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _compact(text: str) -> bytes:
    raw = text.encode()
    assert len(raw) < 127
    return bytes([len(raw) + 1]) + raw


def api_versions_request(version: int, correlation_id: int = 7) -> bytes:
    client_id = b"kvproxy-parity"
    header = struct.pack(">hhih", API_VERSIONS, version, correlation_id, len(client_id))
    if version < 3:
        return header + client_id
    software = _compact("apache-kafka-java") + _compact("4.4.0")
    return header + client_id + b"\x00" + software + b"\x00"


@dataclass(frozen=True)
class Answer:
    error_code: int
    apis: dict[int, tuple[int, int]]
    throttle_ms: int | None = None
    features: dict[str, object] | None = None
    """v3+: the answer's tagged fields, the features decoded (unknown tags as hex)."""


def _features(tag: int, data: bytes) -> tuple[str, object]:
    if tag == 1:
        return "finalized_features_epoch", struct.unpack(">q", data)[0]
    if tag == 3:
        return "zk_migration_ready", bool(data[0])
    if tag not in (0, 2):
        return f"tag {tag}", data.hex()
    count, pos = _uvarint(data, 0)
    entries = {}
    for _ in range(count - 1):
        size, pos = _uvarint(data, pos)
        name = data[pos : pos + size - 1].decode()
        pos += size - 1
        entries[name] = struct.unpack_from(">hh", data, pos)  # min, max / max, min level
        pos += 4
        tags, pos = _uvarint(data, pos)
        assert tags == 0
    name = "supported_features" if tag == 0 else "finalized_features"
    return name, entries


def parse_answer(version: int, payload: bytes) -> Answer:
    (error_code,) = struct.unpack_from(">h", payload, 4)  # after the correlation id
    apis = {}
    if version < 3:
        (count,) = struct.unpack_from(">i", payload, 6)
        for i in range(count):
            key, low, high = struct.unpack_from(">hhh", payload, 10 + 6 * i)
            apis[key] = (low, high)
        return Answer(error_code, apis)
    count, pos = _uvarint(payload, 6)
    for _ in range(count - 1):
        key, low, high = struct.unpack_from(">hhh", payload, pos)
        apis[key] = (low, high)
        tags, pos = _uvarint(payload, pos + 6)
        assert tags == 0
    (throttle,) = struct.unpack_from(">i", payload, pos)
    tags, pos = _uvarint(payload, pos + 4)
    features = {}
    for _ in range(tags):
        tag, pos = _uvarint(payload, pos)
        size, pos = _uvarint(payload, pos)
        name, value = _features(tag, payload[pos : pos + size])
        features[name] = value
        pos += size
    assert pos == len(payload), f"{len(payload) - pos} bytes after the answer"
    return Answer(error_code, apis, throttle, features)


def ask(host: str, port: int, version: int) -> Answer:
    with RawKafkaClient(host, port) as client:
        return parse_answer(version, client.request(api_versions_request(version)))


# ---- the documented table ---------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    key: int
    name: str
    broker: Range
    kvproxy: Range
    why: str


def _range(cell: str) -> Range:
    if cell == "not offered":
        return None
    match = re.fullmatch(r"(\d+)-(\d+)", cell)
    assert match, f"{SECTION}: {cell!r} is neither LOW-HIGH nor 'not offered'"
    return int(match[1]), int(match[2])


def shown(versions: Range) -> str:
    return "not offered" if versions is None else f"{versions[0]}-{versions[1]}"


def documented_rows() -> list[Row]:
    """The rows of the table under the section's heading in docs/clients.md."""
    lines = DOC.read_text().splitlines()
    heading = [i for i, line in enumerate(lines) if re.fullmatch(rf"#+ {SECTION}", line)]
    assert len(heading) == 1, f"docs/clients.md has {len(heading)} sections '{SECTION}'"
    table: list[list[str]] = []
    for line in lines[heading[0] + 1 :]:
        if line.startswith("#") or (table and not line.startswith("|")):
            break
        if line.startswith("|"):
            table.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    assert table and table[0] == COLUMNS, f"{SECTION}: the table's columns are not {COLUMNS}"
    rows = [Row(int(c[0]), c[1], _range(c[2]), _range(c[3]), c[4]) for c in table[2:]]
    assert rows, f"{SECTION}: the table has no rows"
    return rows


def differences_table(title: str, lines: list[tuple[int, Range, Range, str]]) -> str:
    """A markdown table of differences, each with what the page says of it."""
    head = ["| API key | name | broker | kvproxy | docs/clients.md |", "|---|---|---|---|---|"]
    body = [
        f"| {key} | {name_of(key)} | {shown(broker)} | {shown(proxied)} | {says} |"
        for key, broker, proxied, says in sorted(lines, key=lambda line: line[0])
    ]
    return "\n".join([title, *head, *body])


def name_of(key: int) -> str:
    api = API_TABLE.get(key)
    return "(unknown to kvproxy)" if api is None else api.name


# ---- fixtures ---------------------------------------------------------------------------------


class Proxies:
    """One kvproxy (default config) in front of each session broker, shared by the module."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self._stack = stack
        self._running: dict[str, RunningProxy] = {}

    def of(self, kafka: KafkaCluster) -> RunningProxy:
        if kafka.version not in self._running:
            proxy = self._stack.enter_context(run_proxy(kafka.bootstrap_servers))
            self._running[kafka.version] = proxy
        return self._running[kafka.version]


@pytest.fixture(scope="module")
def proxies() -> Iterator[Proxies]:
    with contextlib.ExitStack() as stack:
        yield Proxies(stack)


# ---- ApiVersions ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", REQUEST_VERSIONS, ids=lambda v: f"ApiVersions-v{v}")
def test_only_the_documented_differences(
    any_kafka: KafkaCluster, proxies: Proxies, version: int
) -> None:
    """Every API and version the broker offers is offered through kvproxy, but for the rows of
    the page's table whose broker range is this broker's; each of those rows must hold."""
    proxy = proxies.of(any_kafka)
    direct = ask(any_kafka.host, any_kafka.port, version)
    through = ask(proxy.host, proxy.port, version)
    assert (direct.error_code, through.error_code) == (0, 0)

    rows = [row for row in documented_rows() if direct.apis.get(row.key) == row.broker]
    measured = {
        key: (direct.apis.get(key), through.apis.get(key))
        for key in sorted(direct.apis.keys() | through.apis.keys())
        if direct.apis.get(key) != through.apis.get(key)
    }
    lines, wrong = [], False
    for key, (broker, proxied) in measured.items():
        row = next((row for row in rows if row.key == key), None)
        says = "no row" if row is None else "as documented"
        if row is not None and row.kvproxy != proxied:
            says = f"the row says kvproxy {shown(row.kvproxy)}"
        wrong |= not says.startswith("as documented")
        lines.append((key, broker, proxied, says))
    for row in rows:
        if row.key not in measured:
            wrong = True
            says = f"the row says kvproxy {shown(row.kvproxy)}: no longer differs"
            lines.append((row.key, row.broker, through.apis.get(row.key), says))
    title = (
        f"ApiVersions v{version} of Kafka {any_kafka.version}, straight and through kvproxy, "
        f"against docs/clients.md '{SECTION}':"
    )
    assert not wrong, differences_table(title, lines)


def test_every_row_is_a_difference(
    kafka: KafkaCluster, kafka3: KafkaCluster, proxies: Proxies
) -> None:
    """A row must name the API as kvproxy knows it and hold on at least one tested Kafka
    version, for every request version: a row of a difference that is gone fails here."""
    rows = documented_rows()
    holds: dict[Row, list[str]] = {row: [] for row in rows}
    for cluster in (kafka, kafka3):
        proxy = proxies.of(cluster)
        answers = [
            (ask(cluster.host, cluster.port, v), ask(proxy.host, proxy.port, v))
            for v in REQUEST_VERSIONS
        ]
        for row in rows:
            if all(
                (direct.apis.get(row.key), through.apis.get(row.key)) == (row.broker, row.kvproxy)
                for direct, through in answers
            ):
                holds[row].append(cluster.version)
    problems = [
        f"row {row.key} {row.name} ({shown(row.broker)} -> {shown(row.kvproxy)}): holds on none "
        f"of Kafka {KAFKA_4}, {KAFKA_3}"
        for row, versions in holds.items()
        if not versions
    ]
    problems += [
        f"row {row.key}: named {row.name}, kvproxy knows it as {name_of(row.key)}"
        for row in rows
        if row.name != name_of(row.key)
    ]
    problems += [f"row {row.key}: no reason given" for row in rows if not row.why]
    assert not problems, "\n".join(problems)


def test_features_pass_unchanged(any_kafka: KafkaCluster, proxies: Proxies) -> None:
    """ApiVersions v3+: supported and finalized features, their epoch, throttle time, as the
    broker answered (asked straight before and after, in case the epoch moved meanwhile)."""
    proxy = proxies.of(any_kafka)
    before = ask(any_kafka.host, any_kafka.port, 3)
    through = ask(proxy.host, proxy.port, 3)
    after = ask(any_kafka.host, any_kafka.port, 3)
    finalized = (before.features or {}).get("finalized_features")
    assert isinstance(finalized, dict) and "metadata.version" in finalized, before.features
    answered = [(a.throttle_ms, a.features) for a in (before, after)]
    assert (through.throttle_ms, through.features) in answered, (
        f"through kvproxy: {json.dumps(through.features)}\nstraight: {json.dumps(before.features)}"
    )


# ---- DescribeQuorum: Kafka's kafka-metadata-quorum tool ---------------------------------------


VOTERS_THROUGH_KVPROXY = {KAFKA_4: '[{"id": 1}]', KAFKA_3: '[{"id": 1, "directoryId": null}]'}
"""What `describe --status` shows as CurrentVoters through kvproxy: DescribeQuorum v1 names
no voter's endpoints (3.9's tool prints the directory id it does not have as null)."""


def quorum(kafka: KafkaCluster, bootstrap: str, *command: str) -> tuple[str, str]:
    run = kafka.tool(QUORUM_TOOL, "--bootstrap-server", bootstrap, "describe", *command, timeout=60)
    assert run.returncode == 0, f"{command} via {bootstrap}:\n{run.stdout}\n{run.stderr}"
    return run.stdout, run.stdout + run.stderr


def status(stdout: str) -> dict[str, str]:
    """`describe --status`: its `Name: value` lines (3.9's tool logs to stdout too)."""
    return dict(re.findall(r"^([A-Z][A-Za-z]+):\s+(\S.*?)\s*$", stdout, flags=re.M))


def replication(stdout: str) -> list[dict[str, str]]:
    """`describe --replication`: the table's rows, by column."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("NodeId\t"))
    columns = lines[start].split()
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip() or line.startswith("["):
            break
        rows.append(dict(zip(columns, line.split(), strict=True)))
    return rows


def test_metadata_quorum_tool_through_kvproxy(any_kafka: KafkaCluster, proxies: Proxies) -> None:
    """The tool gets DescribeQuorum v1 through kvproxy and shows everything it shows straight
    but the voters' endpoints; nothing it prints names the broker's or controller's address."""
    proxy = proxies.of(any_kafka)
    broker_port, controller_port = any_kafka.port, any_kafka.nodes[0].controller_port
    before = len(proxy.responses)
    straight, _ = quorum(any_kafka, any_kafka.bootstrap, "--status")
    through, printed = quorum(any_kafka, proxy.bootstrap, "--status")
    through_rows, printed_rows = quorum(any_kafka, proxy.bootstrap, "--replication")
    straight_rows, _ = quorum(any_kafka, any_kafka.bootstrap, "--replication")
    answered = {v for key, v, _ in proxy.responses[before:] if key == DESCRIBE_QUORUM}
    assert answered == {1}

    direct, proxied = status(straight), status(through)
    endpoints = [f"CONTROLLER://127.0.0.1:{controller_port}"]
    assert [voter["endpoints"] for voter in json.loads(direct["CurrentVoters"])] == [endpoints]
    assert proxied["CurrentVoters"] == VOTERS_THROUGH_KVPROXY[any_kafka.version]
    assert json.loads(proxied["CurrentVoters"]) == [
        {name: value for name, value in voter.items() if name != "endpoints"}
        for voter in json.loads(direct["CurrentVoters"])
    ]
    same = ["ClusterId", "LeaderId", "LeaderEpoch", "MaxFollowerLag", "CurrentObservers"]
    assert {k: proxied[k] for k in same} == {k: direct[k] for k in same}
    assert (proxied["LeaderId"], proxied["CurrentObservers"]) == ("1", "[]")

    direct_rows, rows = replication(straight_rows), replication(through_rows)
    moving = ("LogEndOffset", "LastFetchTimestamp", "LastCaughtUpTimestamp")
    fixed = [{k: v for k, v in row.items() if k not in moving} for row in rows]
    assert fixed == [{k: v for k, v in row.items() if k not in moving} for row in direct_rows]
    assert fixed == [
        {"NodeId": "1", "DirectoryId": "AAAAAAAAAAAAAAAAAAAAAA", "Lag": "0", "Status": "Leader"}
    ]
    # asked in this order, the high watermark and the leader's log end offset only grow
    marks = [direct["HighWatermark"], proxied["HighWatermark"]]
    marks += [rows[0]["LogEndOffset"], direct_rows[0]["LogEndOffset"]]
    assert [int(m) for m in marks] == sorted(int(m) for m in marks), marks

    for output in (printed, printed_rows):
        assert "endpoints" not in output
        for port in (broker_port, controller_port):
            assert f":{port}" not in output, f"port {port} in what the tool printed:\n{output}"
