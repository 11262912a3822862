"""The proxy's security guarantees, each shown from outside.

1. Upstream addresses: the proxy connects only to its bootstrap servers and to the addresses the
   cluster's own answers give for its nodes; nothing a client sends adds an address.
2. TLS fails closed: a broker certificate from another CA, an expired one, or one for another host
   name is refused (nothing is relayed); so is a client certificate from another CA or an expired
   one on a listener with `client_ca_file`.
3. SASL passes through byte for byte, SCRAM included.
4. The metrics endpoint binds to loopback unless configured otherwise.
5. Secrets read from the environment never appear in `kvproxy serve` / `check` output.

The address tests use the stub cluster (several brokers, counted connections, an address that
changes: Tansu is one fixed node); SCRAM uses a SCRAM variant of the stub, because Tansu 0.6 offers
SCRAM but cannot store a user (tests/harness/sasl.md). Everything else runs against Tansu.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import hmac
import json
import os
import secrets
import signal
import socket
import ssl
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvproxy.protocol.messages import decode_response
from tests.harness import Broker, RawClientError, RawKafkaClient, api_versions_v0_request
from tests.harness.capture import RecordingRelay
from tests.harness.proxy import RunningProxy, free_port_range, run_proxy
from tests.harness.stub_upstream import (
    StubCluster,
    _AnswerThenClose,
    _compact_nullable_str,
    _nullable_str16,
    _read_uvarint,
    _skip_request_header,
    _str16,
    _uvarint,
    run_stub_cluster,
)
from tests.harness.tansu import free_port, run_tansu
from tests.harness.tls_relay import run_tls_relay

REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
METADATA, SASL_HANDSHAKE, API_VERSIONS, SASL_AUTHENTICATE = 3, 17, 18, 36


def metadata_v1_request(correlation_id: int, topics: list[str], client_id: str = "sec") -> bytes:
    """Metadata v1 naming `topics` (the only strings a Metadata request carries)."""
    raw_id = client_id.encode()
    out = struct.pack(">hhih", METADATA, 1, correlation_id, len(raw_id)) + raw_id
    out += struct.pack(">i", len(topics))
    for topic in topics:
        out += _str16(topic)
    return out


def metric(proxy: RunningProxy, name: str) -> dict[str, float]:
    """`{labels: value}` of one metric family from the proxy's /metrics."""
    with urllib.request.urlopen(proxy.metrics_url + "/metrics", timeout=5) as answer:
        text = answer.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name):
            key, _, value = line.rpartition(" ")
            values[key[len(name) :]] = float(value)
    return values


@contextlib.contextmanager
def trap_listener() -> Iterator[socket.socket]:
    """A listening socket nobody should ever connect to; `accepted(trap)` says if anyone did."""
    sock = socket.socket()
    sock.bind((HOST, 0))
    sock.listen(16)
    try:
        yield sock
    finally:
        sock.close()


def accepted(trap: socket.socket) -> bool:
    trap.setblocking(False)
    try:
        conn, _ = trap.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def connections(cluster: StubCluster) -> dict[int, int]:
    return {node_id: cluster.connection_count(node_id) for node_id in cluster.node_ids}


def requests(cluster: StubCluster) -> dict[int, int]:
    return {node_id: len(cluster.requests(node_id)) for node_id in cluster.node_ids}


# ---- 1. upstream addresses come only from the configuration and the cluster's answers ----


def test_a_node_the_cluster_never_named_has_no_listener_and_no_upstream() -> None:
    with run_stub_cluster(node_ids=(1, 2, 3)) as cluster, run_proxy(cluster.bootstrap) as proxy:
        assert proxy.nodes == cluster.nodes
        assert proxy.stats().listeners == 4  # bootstrap + the three named nodes
        before = connections(cluster), requests(cluster)
        for node_id in (0, 4, 7, 199):  # inside the port range, never named
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((HOST, proxy.broker_port(node_id)), timeout=2).close()
        time.sleep(0.2)
        after = connections(cluster), requests(cluster)
        # The readiness check may connect to the bootstrap server (node 1), sending nothing.
        assert after[1] == before[1]
        assert (after[0][2], after[0][3]) == (before[0][2], before[0][3])
        assert proxy.nodes == cluster.nodes
        assert metric(proxy, "kvproxy_upstream_connect_failures_total") == {}


def test_the_bootstrap_listener_reaches_only_the_configured_bootstrap_server() -> None:
    with run_stub_cluster(node_ids=(1, 2, 3)) as cluster, run_proxy(cluster.address(2)) as proxy:
        before = connections(cluster)
        for n in range(5):
            with RawKafkaClient(proxy.host, proxy.port) as client:
                client.request(api_versions_v0_request(n))
        after = connections(cluster)
        assert after[2] - before[2] >= 5  # and the readiness check's connections
        assert after[1] == before[1] and after[3] == before[3]


def test_client_requests_cannot_teach_the_proxy_an_address() -> None:
    """Host names in a Metadata request (topics, client id), and an answer-shaped frame sent by
    the client, teach the proxy nothing; only the cluster's answer names nodes."""
    with (
        run_stub_cluster(node_ids=(1, 2)) as cluster,
        run_proxy(cluster.bootstrap, max_brokers=10) as proxy,
        trap_listener() as trap,
    ):
        trap_address = f"{HOST}:{trap.getsockname()[1]}"
        learned = proxy.nodes
        assert learned == cluster.nodes
        with RawKafkaClient(proxy.host, proxy.port) as client:
            answer = client.request(
                metadata_v1_request(5, [trap_address, "evil.example:9092"], trap_address)
            )
            brokers = decode_response(answer, METADATA, 1).body.brokers
            assert {(b.host, b.port) for b in brokers} == {
                (HOST, proxy.broker_port(1)),
                (HOST, proxy.broker_port(2)),
            }
            # A frame shaped like a Metadata answer naming node 5 at the trap, sent as a
            # request: it goes to the broker (which drops it), never into the node directory.
            forged = struct.pack(">hhi", METADATA, 1, 9) + _str16("x")
            forged += struct.pack(">i", 1) + struct.pack(">i", 5) + _str16(HOST)
            forged += struct.pack(">i", trap.getsockname()[1])
            client.send_frame(forged)
            with contextlib.suppress(RawClientError):  # the stub reads it as a Metadata request
                client.recv_frame()
        assert proxy.nodes == learned
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((HOST, proxy.broker_port(5)), timeout=2).close()
        assert not accepted(trap)
        assert proxy.stats().listeners == 3


def readvertise(cluster: StubCluster, node_id: int, address: tuple[str, int]) -> None:
    """Make the stub name `node_id` at another address from now on (a broker that moved)."""
    node = cluster._nodes[node_id]
    node.host, node.port = address


def test_a_node_that_moves_is_followed_from_the_clusters_next_answer() -> None:
    """The proxy learns a new address only from an answer of the cluster: until one names the
    new address, new connections go to the old one; after, to the new one. Connections already
    open stay where they are."""
    with (
        run_stub_cluster(node_ids=(1, 2)) as cluster,
        run_stub_cluster(node_ids=(2,)) as moved,
        run_proxy(cluster.bootstrap, max_brokers=10) as proxy,
    ):
        old, new = cluster.nodes[2], moved.nodes[2]
        assert proxy.nodes[2] == old
        with RawKafkaClient(HOST, proxy.broker_port(2)) as early:
            early.request(api_versions_v0_request(1))
            readvertise(cluster, 2, new)
            with RawKafkaClient(HOST, proxy.broker_port(2)) as before_answer:
                before_answer.request(api_versions_v0_request(2))
            assert (cluster.connection_count(2), moved.connection_count(2)) == (2, 0)
            with RawKafkaClient(proxy.host, proxy.port) as client:
                client.request(metadata_v1_request(3, []))
            assert proxy.nodes[2] == new
            with RawKafkaClient(HOST, proxy.broker_port(2)) as after_answer:
                after_answer.request(api_versions_v0_request(4))
            assert (cluster.connection_count(2), moved.connection_count(2)) == (2, 1)
            early.request(api_versions_v0_request(5))  # still on the old broker
        assert [cid for _, _, cid in cluster.requests(2)] == [1, 2, 5]
        assert [cid for _, _, cid in moved.requests(2)] == [4]


# ---- 2. TLS: verification on by default, failing closed ----


@dataclass(frozen=True)
class Pki:
    """A trusted CA and another one, with good, expired and misnamed certificates (PEM files)."""

    ca: Path
    other_ca: Path
    certs: dict[str, tuple[Path, Path]]
    """name -> (certificate chain, key): server, other_ca_server, expired_server,
    misnamed_server, client, other_ca_client, expired_client."""

    def server_context(self, name: str) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*self.certs[name])
        return context

    def client_context(self, name: str | None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        if name is not None:
            context.load_cert_chain(*self.certs[name])
        return context


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    import trustme

    out = tmp_path_factory.mktemp("pki")
    trusted = trustme.CA(organization_name="kvproxy trusted CA")
    other = trustme.CA(organization_name="kvproxy other CA")
    now = datetime.datetime.now(datetime.UTC)
    past = {
        "not_before": now - datetime.timedelta(days=30),
        "not_after": now - datetime.timedelta(days=1),
    }
    issued = {
        "server": trusted.issue_cert(HOST, "localhost"),
        "other_ca_server": other.issue_cert(HOST, "localhost"),
        "expired_server": trusted.issue_cert(HOST, "localhost", **past),
        "misnamed_server": trusted.issue_cert("broker.invalid"),
        "client": trusted.issue_cert("client", common_name="client"),
        "other_ca_client": other.issue_cert("client", common_name="client"),
        "expired_client": trusted.issue_cert("client", common_name="client", **past),
    }
    certs = {}
    for name, leaf in issued.items():
        cert, key = out / f"{name}.pem", out / f"{name}.key"
        with cert.open("wb") as f:
            for blob in leaf.cert_chain_pems:
                f.write(blob.bytes())
        leaf.private_key_pem.write_to_path(str(key))
        certs[name] = (cert, key)
    trusted.cert_pem.write_to_path(str(out / "ca.pem"))
    other.cert_pem.write_to_path(str(out / "other-ca.pem"))
    return Pki(out / "ca.pem", out / "other-ca.pem", certs)


class SwitchableContext:
    """Stands in for the TLS relay's SSLContext: the certificate it serves can be changed."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.current = context

    def wrap_socket(self, sock: socket.socket, **kwargs: Any) -> ssl.SSLSocket:
        return self.current.wrap_socket(sock, **kwargs)


@dataclass
class TlsBroker:
    """Tansu behind a TLS relay (what the proxy connects to) and a recording relay (what reached
    the broker: nothing, when the proxy refused the certificate)."""

    bootstrap: str
    context: SwitchableContext
    recorder: RecordingRelay


@pytest.fixture(scope="module")
def tls_broker(pki: Pki) -> Iterator[TlsBroker]:
    listener = socket.socket()
    listener.bind((HOST, 0))
    tls_port = listener.getsockname()[1]
    context = SwitchableContext(pki.server_context("server"))
    with (
        run_tansu(advertised_port=tls_port) as tansu,
        RecordingRelay() as recorder,
    ):
        recorder.start(tansu.host, tansu.port)
        with run_tls_relay(listener, (HOST, recorder.port), context):  # type: ignore[arg-type]
            yield TlsBroker(f"{HOST}:{tls_port}", context, recorder)


def api_versions_answered(proxy: RunningProxy) -> bool:
    """True when an ApiVersions request through the proxy gets an answer; False when the
    connection is closed without one."""
    with RawKafkaClient(proxy.host, proxy.port) as client:
        try:
            answer = client.request(api_versions_v0_request(7), timeout=10)
        except RawClientError:
            return False
        return answer[:4] == struct.pack(">i", 7)


@pytest.mark.parametrize(
    ("served", "settings"),
    [
        ("other_ca_server", {}),
        ("expired_server", {}),
        ("expired_server", {"check_hostname": False}),
        ("misnamed_server", {}),
    ],
    ids=["other-ca", "expired", "expired-without-hostname-check", "misnamed"],
)
def test_upstream_certificate_refused(
    pki: Pki, tls_broker: TlsBroker, served: str, settings: dict[str, Any]
) -> None:
    tls_broker.context.current = pki.server_context(served)
    upstream = {"tls": {"ca_file": str(pki.ca), **settings}}
    with run_proxy(tls_broker.bootstrap, upstream=upstream) as proxy:
        tls_broker.recorder.clear()
        assert proxy.nodes == {}  # the start-up Metadata request was refused too
        assert not api_versions_answered(proxy)
        assert tls_broker.recorder.frames == []  # nothing reached the broker
        failures = metric(proxy, "kvproxy_upstream_connect_failures_total")
        assert failures == {f'{{upstream="{tls_broker.bootstrap}"}}': 1.0}


@pytest.mark.parametrize(
    ("served", "settings"),
    [("server", {}), ("misnamed_server", {"check_hostname": False})],
    ids=["trusted", "misnamed-without-hostname-check"],
)
def test_upstream_certificate_accepted(
    pki: Pki, tls_broker: TlsBroker, served: str, settings: dict[str, Any]
) -> None:
    tls_broker.context.current = pki.server_context(served)
    upstream = {"tls": {"ca_file": str(pki.ca), **settings}}
    with run_proxy(tls_broker.bootstrap, upstream=upstream) as proxy:
        assert list(proxy.nodes.values()) == [(HOST, int(tls_broker.bootstrap.split(":")[1]))]
        tls_broker.recorder.clear()
        assert api_versions_answered(proxy)
        assert [f.api_key for f in tls_broker.recorder.requests()] == [API_VERSIONS]


def test_upstream_without_a_ca_file_trusts_only_the_system_cas(
    pki: Pki, tls_broker: TlsBroker
) -> None:
    tls_broker.context.current = pki.server_context("server")
    with run_proxy(tls_broker.bootstrap, upstream={"tls": {}}) as proxy:
        tls_broker.recorder.clear()
        assert not api_versions_answered(proxy)
        assert tls_broker.recorder.frames == []


def client_answered(proxy: RunningProxy, context: ssl.SSLContext) -> bool:
    """An ApiVersions request over TLS: True when answered, False when the proxy refused the
    handshake or closed the connection."""
    with socket.create_connection((proxy.host, proxy.port), timeout=5) as raw:
        try:
            secure = context.wrap_socket(raw, server_hostname=HOST)
            request = api_versions_v0_request(3)
            secure.sendall(struct.pack(">i", len(request)) + request)
            return len(secure.recv(65536)) > 0
        except (ssl.SSLError, ConnectionError):
            return False


@pytest.mark.parametrize(
    ("presented", "expected"),
    [
        ("client", True),
        ("other_ca_client", False),
        ("expired_client", False),
        (None, False),
    ],
    ids=["trusted", "other-ca", "expired", "none"],
)
def test_client_certificates_on_a_mutual_tls_listener(
    pki: Pki, presented: str | None, expected: bool
) -> None:
    with RecordingRelay() as recorder, run_tansu(advertised_port=recorder.port) as tansu:
        recorder.start(tansu.host, tansu.port)
        cert, key = pki.certs["server"]
        listen = {
            "tls": {"cert_file": str(cert), "key_file": str(key), "client_ca_file": str(pki.ca)}
        }
        with run_proxy(recorder.bootstrap, listen=listen) as proxy:
            recorder.clear()
            assert client_answered(proxy, pki.client_context(presented)) is expected
            proxy.wait_until_idle()
            if not expected:
                assert recorder.frames == []  # refused before any upstream connection
                assert proxy.stats().upstream_connections == 0


def test_librdkafka_with_a_certificate_from_another_ca_is_refused(pki: Pki, tansu: Broker) -> None:
    from confluent_kafka import KafkaError, Producer

    cert, key = pki.certs["server"]
    listen = {"tls": {"cert_file": str(cert), "key_file": str(key), "client_ca_file": str(pki.ca)}}
    with run_proxy(tansu.bootstrap, listen=listen) as proxy:
        other_cert, other_key = pki.certs["other_ca_client"]
        errors: list[Any] = []
        producer = Producer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "security.protocol": "SSL",
                "ssl.ca.location": str(pki.ca),
                "ssl.certificate.location": str(other_cert),
                "ssl.key.location": str(other_key),
                "error_cb": errors.append,
            }
        )
        deadline = time.monotonic() + 10
        while not errors and time.monotonic() < deadline:
            producer.poll(0.5)
        assert errors, "the client was not refused"
        assert all(
            e.code() in (KafkaError._SSL, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN)
            for e in errors
        )
        assert proxy.stats().upstream_connections == 0


# ---- 3. SASL: SCRAM passes through byte for byte ----

_HASHES = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}
_AUTHENTICATION_FAILED, _ILLEGAL_SASL_STATE, _UNSUPPORTED_MECHANISM = 58, 34, 33


class ScramStubCluster(StubCluster):
    """The stub cluster authenticating with SCRAM-SHA-256/512 (RFC 5802) instead of PLAIN."""

    ITERATIONS = 4096

    def __init__(self, users: dict[str, str]) -> None:
        super().__init__((1,), sasl_plain={})  # SASL mode: nothing but ApiVersions before login
        self.users = users
        self._exchanges: dict[int, tuple[str, str, str]] = {}
        """id(connection state) -> (client-first-bare, server-first, nonce)."""

    def _sasl(
        self, node: Any, state: Any, payload: bytes, api_key: int, api_version: int
    ) -> bytes | object:
        flexible = api_key == SASL_AUTHENTICATE and api_version >= 2
        cid, pos = _skip_request_header(payload, flexible)
        self._record(node, api_key, api_version, cid)
        if api_key == SASL_HANDSHAKE:
            (n,) = struct.unpack_from(">h", payload, pos)
            mechanism = payload[pos + 2 : pos + 2 + n].decode()
            ok = mechanism in _HASHES and state.mechanism is None
            body = struct.pack(">ihi", cid, 0 if ok else _UNSUPPORTED_MECHANISM, len(_HASHES))
            body += b"".join(_str16(name) for name in _HASHES)
            if not ok:
                return _AnswerThenClose(body)
            state.mechanism = mechanism
            return body
        if flexible:
            n, pos = _read_uvarint(payload, pos)
            token = payload[pos : pos + n - 1].decode()
        else:
            (n,) = struct.unpack_from(">i", payload, pos)
            token = payload[pos + 4 : pos + 4 + n].decode()
        error, message, reply = self._step(state, token)
        if flexible:
            out = struct.pack(">i", cid) + b"\x00" + struct.pack(">h", error)
            out += _compact_nullable_str(message) + _uvarint(len(reply) + 1) + reply
            out += struct.pack(">q", 0) + b"\x00"
        else:
            out = struct.pack(">ih", cid, error) + _nullable_str16(message)
            out += struct.pack(">i", len(reply)) + reply
            if api_version >= 1:
                out += struct.pack(">q", 0)
        return out if error == 0 else _AnswerThenClose(out)

    def _step(self, state: Any, token: str) -> tuple[int, str | None, bytes]:
        mechanism = state.mechanism
        if mechanism not in _HASHES or state.authenticated:
            return _ILLEGAL_SASL_STATE, "Unexpected SaslAuthenticate request", b""
        failed = (
            _AUTHENTICATION_FAILED,
            "Authentication failed during authentication due to invalid credentials with SASL "
            f"mechanism {mechanism}",
            b"",
        )
        digest = _HASHES[mechanism]
        exchange = self._exchanges.pop(id(state), None)
        if exchange is None:  # client-first: "n,,n=user,r=nonce"
            bare = token.split(",", 2)[2]
            fields = dict(part.split("=", 1) for part in bare.split(","))
            if fields.get("n") not in self.users:
                return failed
            nonce = fields["r"] + secrets.token_hex(12)
            salt = hashlib.sha256(fields["n"].encode()).digest()[:16]
            server_first = f"r={nonce},s={base64.b64encode(salt).decode()},i={self.ITERATIONS}"
            self._exchanges[id(state)] = (bare, server_first, nonce)
            return 0, None, server_first.encode()
        bare, server_first, nonce = exchange
        without_proof, _, proof = token.rpartition(",p=")
        user = dict(part.split("=", 1) for part in bare.split(","))["n"]
        salt = hashlib.sha256(user.encode()).digest()[:16]
        salted = hashlib.pbkdf2_hmac(
            digest().name, self.users[user].encode(), salt, self.ITERATIONS
        )
        client_key = hmac.new(salted, b"Client Key", digest).digest()
        auth_message = f"{bare},{server_first},{without_proof}".encode()
        signature = hmac.new(digest(client_key).digest(), auth_message, digest).digest()
        expected = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        if f"r={nonce}" not in without_proof.split(",") or base64.b64decode(proof) != expected:
            return failed
        state.authenticated = True
        server_key = hmac.new(salted, b"Server Key", digest).digest()
        verifier = hmac.new(server_key, auth_message, digest).digest()
        return 0, None, b"v=" + base64.b64encode(verifier)


@pytest.mark.parametrize("mechanism", sorted(_HASHES))
@pytest.mark.parametrize("password", ["secret", "wrong"])
def test_scram_passes_through_byte_for_byte(mechanism: str, password: str) -> None:
    """librdkafka logs in with SCRAM through the proxy (recorded on the client's side of the
    proxy): every SASL request reaches the broker as sent and every answer reaches the client as
    the broker sent it. SCRAM's proofs cover the nonces, so a changed byte fails the login."""
    from confluent_kafka import KafkaError, Producer

    with (
        ScramStubCluster({"alice": "secret"}) as cluster,
        run_proxy(cluster.bootstrap, max_brokers=10) as proxy,
        RecordingRelay() as client_side,
    ):
        client_side.start(proxy.host, proxy.port)
        errors: list[Any] = []
        delivered: list[Any] = []
        producer = Producer(
            {
                "bootstrap.servers": client_side.bootstrap,
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": mechanism,
                "sasl.username": "alice",
                "sasl.password": password,
                "message.timeout.ms": 3000,
                "error_cb": errors.append,
            }
        )
        producer.produce(
            "stub-topic", b"v", partition=0, on_delivery=lambda e, m: delivered.append(e)
        )
        producer.flush(10)
        if password == "secret":
            assert delivered == [None] and errors == []
            assert cluster.produced(1) == 1
        else:
            assert any(e.code() == KafkaError._AUTHENTICATION for e in errors)
            assert any("invalid credentials" in str(e) for e in errors)
            assert cluster.produced(1) == 0
        # librdkafka keeps logging in again (wrong password) while this runs: compare what was
        # answered, taking the client's side first, so the broker's copy holds all of it.
        answers = {(f.conn, f.correlation_id): f.payload for f in client_side.responses()}
        sasl = [
            r
            for r in client_side.requests()
            if r.api_key in (SASL_HANDSHAKE, SASL_AUTHENTICATE)
            and (r.conn, r.correlation_id) in answers
        ]
        broker_saw = dict(cluster.frames(1))
        assert [r.api_key for r in sasl][:3] == [
            SASL_HANDSHAKE,
            SASL_AUTHENTICATE,
            SASL_AUTHENTICATE,
        ]
        for request in sasl:
            assert request.payload in broker_saw  # the broker got the client's bytes
            assert answers[(request.conn, request.correlation_id)] == broker_saw[request.payload]


# ---- 4 and 5. metrics on loopback; secrets from the environment never shown ----

SECRET = "Kv-" + secrets.token_hex(8) + "-pw"


def encrypted_key(key: Path, password: str) -> Path:
    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    out = key.with_name(key.stem + "-encrypted.key")
    out.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(password.encode()),
        )
    )
    return out


def write_config(path: Path, pki: Pki, bootstrap: str, **extra: str) -> int:
    """A kvproxy.yaml whose key password is `${KVPROXY_TEST_KEY_PASSWORD}`; the bootstrap port."""
    cert, key = pki.certs["server"]
    port = free_port()
    lines = [
        "listen:",
        f"  port: {port}",
        f"  broker_port_base: {free_port_range(200)}",
        "  max_brokers: 200",
        "  tls:",
        f"    cert_file: {cert}",
        f"    key_file: {encrypted_key(key, SECRET)}",
        "    key_password: ${KVPROXY_TEST_KEY_PASSWORD}",
        "upstream:",
        f"  bootstrap_servers: [{bootstrap}]",
        "metrics:",
        "  port: 0",
    ]
    lines += [f"{k}: {v}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return port


def kvproxy(*args: str, password: str | None = SECRET) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KVPROXY_TEST_KEY_PASSWORD"}
    if password is not None:
        env["KVPROXY_TEST_KEY_PASSWORD"] = password
    return subprocess.run(
        [sys.executable, "-m", "kvproxy.cli", *args],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_serve_uses_the_secret_and_never_shows_it(pki: Pki, tansu: Broker, tmp_path: Path) -> None:
    """`kvproxy serve` with a key password from the environment: clients connect over TLS, the
    metrics endpoint is on 127.0.0.1 (the default), and the password is in none of its output."""
    config = tmp_path / "kvproxy.yaml"
    port = write_config(config, pki, tansu.bootstrap)
    env = {**os.environ, "KVPROXY_TEST_KEY_PASSWORD": SECRET, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvproxy.cli", "serve", "-c", str(config), "--log-format", "json"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        answered = False
        while not answered and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            with (
                contextlib.suppress(OSError),
                socket.create_connection((HOST, port), timeout=1) as raw,
            ):
                secure = pki.client_context(None).wrap_socket(raw, server_hostname=HOST)
                request = api_versions_v0_request(11)
                secure.sendall(struct.pack(">i", len(request)) + request)
                got = b""
                while len(got) < 8 and (chunk := secure.recv(65536)):
                    got += chunk
                answered = got[4:8] == struct.pack(">i", 11)
            time.sleep(0.1)
        assert answered, proc.poll()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    records = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    endpoints = [r["message"] for r in records if r["message"].startswith("metrics, /healthz")]
    assert len(endpoints) == 1 and "http://127.0.0.1:" in endpoints[0]
    assert SECRET not in stdout + stderr


def test_check_and_config_errors_never_show_the_secret(
    pki: Pki, tansu: Broker, tmp_path: Path
) -> None:
    config = tmp_path / "kvproxy.yaml"
    write_config(config, pki, tansu.bootstrap)
    checked = kvproxy("check", "-c", str(config))
    assert checked.returncode == 0, checked.stderr
    assert "(TLS)" in checked.stdout
    assert SECRET not in checked.stdout + checked.stderr

    missing = kvproxy("check", "-c", str(config), password=None)
    assert missing.returncode == 2
    assert (
        "listen.tls.key_password: environment variable KVPROXY_TEST_KEY_PASSWORD "
        "is not set" in missing.stderr
    )

    broken = tmp_path / "broken.yaml"
    write_config(broken, pki, tansu.bootstrap, reject="sometimes")
    refused = kvproxy("serve", "-c", str(broken), "--log-format", "json")
    assert refused.returncode == 2 and "reject" in refused.stderr
    assert SECRET not in refused.stdout + refused.stderr

    # The wrong password: serve cannot load the key and says so, without echoing it.
    wrong = kvproxy("serve", "-c", str(config), "--log-format", "json", password=SECRET + "x")
    assert wrong.returncode != 0
    assert SECRET not in wrong.stdout + wrong.stderr
