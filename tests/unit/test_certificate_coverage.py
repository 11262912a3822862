"""`kvproxy check` names the SNI listener's server names its certificate does not cover.

Certificates come from trustme (real SAN certificates, read back with `cryptography`); matching
is RFC 6125's: SAN DNS names only, case-insensitive, `*` only as a whole left-most label.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from kvproxy.cli import main
from kvproxy.commands.certificate_coverage import (
    Certificate,
    certificate_coverage,
    covers,
    read_certificate,
)
from kvproxy.proxy.config.sni_names import SniNames
from tests.harness.stub_upstream import run_stub_cluster

NAMES = SniNames("kafka.example.com", "broker-$(nodeId).kafka.example.com")
NOW = datetime.datetime.now(datetime.UTC)


def issue(
    tmp_path: Path,
    *identities: str,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
) -> Certificate:
    """A certificate for `identities` from a throw-away CA, written as a chain (leaf first, then
    the CA, as cert_file holds it) and read back."""
    ca = trustme.CA()
    leaf = ca.issue_cert(
        *identities, common_name="kafka.example.com", not_before=not_before, not_after=not_after
    )
    path = tmp_path / "server.pem"
    path.write_bytes(b"".join(blob.bytes() for blob in [*leaf.cert_chain_pems, ca.cert_pem]))
    return read_certificate(path)


def self_signed(path: Path, *dns_names: str) -> Path:
    """A certificate whose SAN DNS names keep the case given (trustme lower-cases them)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kvproxy test")])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(days=1))
        .not_valid_after(NOW + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name) for name in dns_names]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    path.write_bytes(certificate.public_bytes(Encoding.PEM))
    return path


def test_a_wildcard_covers_the_bootstrap_and_every_broker(tmp_path: Path) -> None:
    certificate = issue(tmp_path, "*.example.com", "*.kafka.example.com")
    with_cluster = certificate_coverage(certificate, NAMES, [1, 2, 3], NOW)
    assert with_cluster.problems == ()
    assert with_cluster.lines[1:] == (
        "kafka.example.com (bootstrap): covered by *.example.com",
        "broker-$(nodeId).kafka.example.com (brokers): 3 of the cluster's 3 broker name(s) covered",
    )
    without_cluster = certificate_coverage(certificate, NAMES, None, NOW)
    assert without_cluster.problems == ()
    assert without_cluster.lines[-1] == (
        "broker-$(nodeId).kafka.example.com (brokers): every broker covered by *.kafka.example.com"
    )


def test_the_bootstrap_name_missing_is_a_problem(tmp_path: Path) -> None:
    certificate = issue(tmp_path, "*.kafka.example.com")  # the CN kafka.example.com is ignored
    coverage = certificate_coverage(certificate, NAMES, [1], NOW)
    assert coverage.problems == ("does not cover the bootstrap name kafka.example.com",)


def test_per_broker_names_missing_node_3(tmp_path: Path) -> None:
    brokers = [f"broker-{node}.kafka.example.com" for node in (1, 2)]
    certificate = issue(tmp_path, "kafka.example.com", *brokers)
    coverage = certificate_coverage(certificate, NAMES, [1, 2, 3], NOW)
    assert coverage.problems == ("does not cover broker-3.kafka.example.com (node 3)",)
    assert "2 of the cluster's 3 broker name(s) covered" in coverage.lines[-1]
    without_cluster = certificate_coverage(certificate, NAMES, None, NOW)
    assert without_cluster.problems == ()
    assert without_cluster.lines[-1] == (
        "broker-$(nodeId).kafka.example.com (brokers): names node(s) 1, 2; whether every broker "
        "of the cluster has its name can only be checked with the cluster reachable "
        "(kvproxy check --connect)"
    )


def test_no_broker_name_at_all_is_a_problem_without_the_cluster(tmp_path: Path) -> None:
    certificate = issue(tmp_path, "kafka.example.com", "*.example.com")
    coverage = certificate_coverage(certificate, NAMES, None, NOW)
    assert coverage.problems == (
        "covers no broker name (broker-$(nodeId).kafka.example.com): it needs "
        "*.kafka.example.com or one name per broker",
    )


def test_a_node_id_below_the_left_most_label_needs_a_name_per_broker(tmp_path: Path) -> None:
    names = SniNames("kafka.example.com", "kafka.b$(nodeId).example.com")
    certificate = issue(tmp_path, "kafka.example.com", "*.b1.example.com")
    coverage = certificate_coverage(certificate, names, None, NOW)
    assert coverage.problems == (
        "covers no broker name (kafka.b$(nodeId).example.com): it needs one name per broker",
    )
    assert certificate_coverage(certificate, names, [1], NOW).problems == ()
    assert certificate_coverage(certificate, names, [1, 2], NOW).problems == (
        "does not cover kafka.b2.example.com (node 2)",
    )


def test_a_wildcard_stands_for_exactly_one_label(tmp_path: Path) -> None:
    certificate = issue(tmp_path, "kafka.example.com", "*.example.com")
    names = SniNames("kafka.example.com", "$(nodeId).b.example.com")
    coverage = certificate_coverage(certificate, names, [1], NOW)
    assert coverage.problems == ("does not cover 1.b.example.com (node 1)",)
    assert not covers("*.example.com", "a.b.example.com")
    assert not covers("*.example.com", "example.com")
    assert covers("*.example.com", "a.example.com")


@pytest.mark.parametrize(
    "presented",
    ["b*.example.com", "*b.example.com", "a.*.example.com", "*.*.example.com", "*.com", "*"],
)
def test_partial_and_deep_wildcards_cover_nothing(presented: str) -> None:
    for name in ("b1.example.com", "a.b.example.com", "x.com", "example.com"):
        assert not covers(presented, name), (presented, name)


def test_names_compare_ignoring_case_and_a_trailing_dot(tmp_path: Path) -> None:
    path = self_signed(tmp_path / "upper.pem", "KAFKA.Example.COM", "*.KAFKA.EXAMPLE.COM")
    certificate = read_certificate(path)
    assert certificate.dns_names == ("KAFKA.Example.COM", "*.KAFKA.EXAMPLE.COM")
    assert certificate_coverage(certificate, NAMES, [7], NOW).problems == ()
    assert certificate_coverage(certificate, NAMES, None, NOW).problems == ()
    assert covers("*.example.com", "Broker-1.EXAMPLE.com.")


def test_an_expired_certificate_is_a_problem(tmp_path: Path) -> None:
    expired = datetime.datetime(2020, 1, 2, 3, 4, tzinfo=datetime.UTC)
    certificate = issue(
        tmp_path,
        "kafka.example.com",
        "*.kafka.example.com",
        not_before=expired - datetime.timedelta(days=30),
        not_after=expired,
    )
    coverage = certificate_coverage(certificate, NAMES, None, NOW)
    assert coverage.problems == ("expired on 2020-01-02 03:04 UTC",)


def test_a_certificate_not_valid_yet_is_a_problem(tmp_path: Path) -> None:
    start = NOW + datetime.timedelta(days=2)
    certificate = issue(
        tmp_path,
        "kafka.example.com",
        "*.kafka.example.com",
        not_before=start,
        not_after=start + datetime.timedelta(days=30),
    )
    coverage = certificate_coverage(certificate, NAMES, None, NOW)
    assert coverage.problems == (f"is not valid before {start:%Y-%m-%d %H:%M} UTC",)


def test_the_leaf_is_read_from_a_file_with_the_key_and_the_chain(tmp_path: Path) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("kafka.example.com")
    path = tmp_path / "combined.pem"
    blobs = [leaf.private_key_pem, *leaf.cert_chain_pems, ca.cert_pem]
    path.write_bytes(b"".join(blob.bytes() for blob in blobs))
    assert read_certificate(path).dns_names == ("kafka.example.com",)


def test_a_file_without_a_certificate_cannot_be_read(tmp_path: Path) -> None:
    path = tmp_path / "key.pem"
    trustme.CA().issue_cert("kafka.example.com").private_key_pem.write_to_path(str(path))
    with pytest.raises(ValueError):
        read_certificate(path)


# ---- `kvproxy check` on a config with an SNI listener ----

CONFIG = """\
listen:
  sni:
    port: 9443
    bootstrap: kafka.example.com
    brokers: broker-$(nodeId).kafka.example.com
    tls: {cert_file: server.pem, key_file: server.key}
upstream: {bootstrap_servers: ["k:1"]}
"""


def run_check(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    identities: tuple[str, ...],
    *arguments: str,
    config: str = CONFIG,
) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of `kvproxy check -c kvproxy.yaml` beside a certificate
    for `identities`."""
    leaf = trustme.CA().issue_cert(*identities)
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "server.pem"))
    leaf.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    (tmp_path / "kvproxy.yaml").write_text(config)
    monkeypatch.chdir(tmp_path)
    code = main(["check", "-c", "kvproxy.yaml", *arguments])
    out, err = capsys.readouterr()
    return code, out, err


def test_check_names_what_the_certificate_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_check(tmp_path, monkeypatch, capsys, ("*.kafka.example.com",))
    assert code == 1
    assert "  SNI listener certificate server.pem:\n" in out
    assert err.splitlines() == [
        "kvproxy: the SNI listener's certificate server.pem does not cover the bootstrap name "
        "kafka.example.com"
    ]


def test_check_passes_a_certificate_covering_every_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    identities = ("kafka.example.com", "*.kafka.example.com")
    code, out, err = run_check(tmp_path, monkeypatch, capsys, identities)
    assert (code, err) == (0, "")
    assert "    kafka.example.com (bootstrap): covered by kafka.example.com\n" in out
    assert (
        "    broker-$(nodeId).kafka.example.com (brokers): every broker covered by "
        "*.kafka.example.com\n" in out
    )


def test_check_connect_names_the_broker_the_certificate_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    brokers = ("broker-1.kafka.example.com", "broker-2.kafka.example.com")
    identities = ("kafka.example.com", *brokers)
    with run_stub_cluster(node_ids=(1, 2, 3)) as cluster:
        config = CONFIG.replace('"k:1"', f'"{cluster.bootstrap}"')
        code, out, err = run_check(
            tmp_path, monkeypatch, capsys, identities, "--connect", config=config
        )
    assert code == 1
    assert "  cluster: 3 broker(s)\n" in out
    assert "    broker-$(nodeId).kafka.example.com (brokers): 2 of the cluster's 3 broker" in out
    assert err.splitlines() == [
        "kvproxy: the SNI listener's certificate server.pem does not cover "
        "broker-3.kafka.example.com (node 3)"
    ]


def test_check_says_when_the_certificate_cannot_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "server.pem").write_text("not a certificate\n")
    (tmp_path / "kvproxy.yaml").write_text(CONFIG)
    monkeypatch.chdir(tmp_path)
    assert main(["check", "-c", "kvproxy.yaml"]) == 2
    assert capsys.readouterr().err.startswith(
        "kvproxy: cannot read the SNI listener's certificate server.pem: "
    )
