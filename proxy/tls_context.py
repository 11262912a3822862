"""TLS contexts of the two sides: clients connecting to the proxy, the proxy to the brokers.

Shared by the relay and every command that talks to the cluster itself (`kvproxy topics`,
`kvproxy quarantine replay`, the connection check), so all of them trust the same brokers.
"""

from __future__ import annotations

import ssl

from proxy.config import ProxyConfig


def client_side_ssl(config: ProxyConfig) -> ssl.SSLContext | None:
    """The context of the proxy's listeners (`listen.tls`); None for plain TCP."""
    tls = config.listen.tls
    if tls is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    password = tls.key_password.get_secret_value() if tls.key_password is not None else None
    context.load_cert_chain(str(tls.cert_file), str(tls.key_file), password)
    if tls.client_ca_file is not None:
        context.load_verify_locations(cafile=str(tls.client_ca_file))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def upstream_side_ssl(config: ProxyConfig) -> ssl.SSLContext | None:
    """The context of connections to the brokers (`upstream.tls`); None for plain TCP."""
    tls = config.upstream.tls
    if tls is None:
        return None
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH, cafile=str(tls.ca_file) if tls.ca_file else None
    )
    context.check_hostname = tls.check_hostname  # verify_mode stays CERT_REQUIRED either way
    if tls.cert_file is not None:
        password = tls.key_password.get_secret_value() if tls.key_password is not None else None
        context.load_cert_chain(
            str(tls.cert_file), str(tls.key_file) if tls.key_file else None, password
        )
    return context
