"""Which server names of the SNI listener its certificate does not cover, for `kvproxy check`.

A client checks the proxy's certificate against the name it asked for; a broker name the
certificate lacks fails every client of that broker at the handshake (the client closes, the
proxy counts the reason `closed`), long after `serve` started without a word. So `check` reads
the certificate (the first one of `cert_file`: the leaf) and names what it misses. Matching is
RFC 6125's, as clients do it: subject alternative DNS names only (never the common name),
case-insensitive, and `*` only as the whole left-most label, standing for exactly one label.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cryptography import x509

from kvproxy.proxy.config.sni_names import NODE_ID, SniNames, normal_name


@dataclass(frozen=True, slots=True)
class Certificate:
    """What coverage needs of a certificate: its DNS names and its validity period."""

    dns_names: tuple[str, ...]
    not_valid_before: datetime
    not_valid_after: datetime


@dataclass(frozen=True, slots=True)
class Coverage:
    """What `kvproxy check` prints: `lines` on stdout, and one line per `problems` on stderr
    (any problem makes the check fail)."""

    lines: tuple[str, ...]
    problems: tuple[str, ...]


def read_certificate(path: Path) -> Certificate:
    """The leaf (first) certificate of the PEM file `path`; OSError when the file cannot be read,
    ValueError when it holds no PEM certificate."""
    leaf = x509.load_pem_x509_certificates(path.read_bytes())[0]
    try:
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        dns_names: list[str] = []
    else:
        dns_names = names.value.get_values_for_type(x509.DNSName)
    return Certificate(tuple(dns_names), leaf.not_valid_before_utc, leaf.not_valid_after_utc)


def covers(presented: str, name: str) -> bool:
    """Whether the certificate name `presented` covers the server name `name` (RFC 6125 6.4):
    equal ignoring case, or `*.<parent>` and `name` is one more label before `<parent>`. A
    partial wildcard (`b*.example.com`), a wildcard deeper than the left-most label, and one
    right under a top-level domain (`*.com`) cover nothing but themselves."""
    presented, name = normal_name(presented), normal_name(name)
    if not presented.startswith("*."):
        return presented == name
    parent = presented[2:]
    if "*" in parent or "." not in parent:
        return False
    label, _dot, rest = name.partition(".")
    return bool(label) and rest == parent


def certificate_coverage(
    certificate: Certificate,
    names: SniNames,
    node_ids: Collection[int] | None,
    now: datetime,
) -> Coverage:
    """The bootstrap name, then every broker's name when the cluster named its nodes
    (`node_ids`), else the brokers' pattern as a whole: covered by a wildcard, or said to need
    the cluster; and whether the certificate is valid at `now`."""
    lines = [_validity(certificate)]
    problems = list(_validity_problems(certificate, now))
    bootstrap_by = _covered_by(certificate, names.bootstrap)
    if bootstrap_by is None:
        problems.append(f"does not cover the bootstrap name {names.bootstrap}")
    else:
        lines.append(f"{names.bootstrap} (bootstrap): covered by {bootstrap_by}")
    if node_ids is None:
        _cover_pattern(certificate, names, lines, problems)
    else:
        _cover_nodes(certificate, names, node_ids, lines, problems)
    return Coverage(tuple(lines), tuple(problems))


def _validity(certificate: Certificate) -> str:
    dns_names = ", ".join(certificate.dns_names) or "none"
    return (
        f"valid {certificate.not_valid_before:%Y-%m-%d %H:%M} to "
        f"{certificate.not_valid_after:%Y-%m-%d %H:%M} UTC, DNS names: {dns_names}"
    )


def _validity_problems(certificate: Certificate, now: datetime) -> list[str]:
    if certificate.not_valid_after < now:
        return [f"expired on {certificate.not_valid_after:%Y-%m-%d %H:%M} UTC"]
    if certificate.not_valid_before > now:
        return [f"is not valid before {certificate.not_valid_before:%Y-%m-%d %H:%M} UTC"]
    return []


def _covered_by(certificate: Certificate, name: str) -> str | None:
    """The first certificate name that covers `name`."""
    return next((dns for dns in certificate.dns_names if covers(dns, name)), None)


def _cover_nodes(
    certificate: Certificate,
    names: SniNames,
    node_ids: Collection[int],
    lines: list[str],
    problems: list[str],
) -> None:
    missing = [
        node for node in sorted(node_ids) if _covered_by(certificate, names.name_of(node)) is None
    ]
    lines.append(
        f"{names.brokers} (brokers): {len(node_ids) - len(missing)} of the cluster's "
        f"{len(node_ids)} broker name(s) covered"
    )
    problems.extend(f"does not cover {names.name_of(node)} (node {node})" for node in missing)


def _cover_pattern(
    certificate: Certificate, names: SniNames, lines: list[str], problems: list[str]
) -> None:
    """Without the cluster: a wildcard for the pattern's parent domain covers every broker when
    the node id sits in the left-most label; else the names the certificate gives brokers are
    listed, and none at all is a problem (every broker would fail)."""
    first_label, _dot, parent = names.brokers.partition(".")
    wildcard = f"*.{parent}"
    if NODE_ID in first_label and covers(wildcard, f"x.{parent}"):
        covering = next(
            (dns for dns in certificate.dns_names if normal_name(dns) == wildcard), None
        )
        if covering is not None:
            lines.append(f"{names.brokers} (brokers): every broker covered by {covering}")
            return
        advice = f"{wildcard} or one name per broker"
    else:
        advice = "one name per broker"
    named = sorted(
        {
            node
            for dns in certificate.dns_names
            if (node := names.broker_of(normal_name(dns))) is not None
        }
    )
    if not named:
        problems.append(f"covers no broker name ({names.brokers}): it needs {advice}")
        return
    lines.append(
        f"{names.brokers} (brokers): names node(s) {', '.join(map(str, named))}; whether every "
        "broker of the cluster has its name can only be checked with the cluster reachable "
        "(kvproxy check --connect)"
    )
