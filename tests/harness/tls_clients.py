"""Client certificates a mutual-TLS listener accepts and ones it refuses, made with ``trustme``::

    certs = write_client_certs(directory)
    certs.ca                      # the CA to trust for clients (`listen.tls.client_ca_file`)
    certs.trusted                 # ClientCert(cert, key) signed by it
    certs.other_ca                # signed by a CA the listener does not trust
    certs.expired                 # signed by `ca`, expired a day ago
    certs.not_yet_valid           # signed by `ca`, valid from tomorrow

The server's own certificate comes from :mod:`tests.harness.tls`; the clients' CA is a separate
one, so a test can tell "the proxy's CA" from "the clients' CA".
"""

from __future__ import annotations

import datetime
import ssl
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ClientCert", "ClientCerts", "write_client_certs"]


@dataclass(frozen=True)
class ClientCert:
    cert: Path  # PEM: the leaf, then its chain
    key: Path  # PEM: unencrypted PKCS#8

    def load_into(self, context: ssl.SSLContext) -> ssl.SSLContext:
        context.load_cert_chain(self.cert, self.key)
        return context


@dataclass(frozen=True)
class ClientCerts:
    ca: Path
    trusted: ClientCert
    other_ca: ClientCert
    expired: ClientCert
    not_yet_valid: ClientCert


def write_client_certs(directory: str | Path) -> ClientCerts:
    """Write the clients' CA (clients-ca.pem) and one certificate and key per kind."""
    import trustme

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="kvproxy test clients CA")
    other = trustme.CA(organization_name="a CA nobody trusts")
    now = datetime.datetime.now(datetime.UTC)
    day = datetime.timedelta(days=1)
    leaves = {
        "trusted": ca.issue_cert("trusted-client", common_name="trusted-client"),
        "other_ca": other.issue_cert("other-ca-client", common_name="other-ca-client"),
        "expired": ca.issue_cert(
            "expired-client", common_name="expired-client", not_before=now - 2 * day,
            not_after=now - day,
        ),
        "not_yet_valid": ca.issue_cert(
            "future-client", common_name="future-client", not_before=now + day,
            not_after=now + 2 * day,
        ),
    }  # fmt: skip
    certs: dict[str, ClientCert] = {}
    for name, leaf in leaves.items():
        written = ClientCert(cert=out / f"{name}.pem", key=out / f"{name}.key")
        with written.cert.open("wb") as f:
            for blob in leaf.cert_chain_pems:
                f.write(blob.bytes())
        leaf.private_key_pem.write_to_path(str(written.key))
        written.key.chmod(0o600)
        certs[name] = written
    ca.cert_pem.write_to_path(str(out / "clients-ca.pem"))
    return ClientCerts(ca=out / "clients-ca.pem", **certs)
