"""Secrets in the configuration, and the secure defaults of TLS and metrics.

A secret (a TLS key password) may be written as `${NAME}` and read from the environment; it is a
`SecretStr`, so no repr, dump or error message shows it. Verification of broker certificates and
host names is on by default, and the metrics endpoint binds to loopback unless told otherwise.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest

from kvproxy.proxy.config.proxy_config import ProxyConfig, load_config, parse_config
from kvproxy.proxy.listen.tls_context import client_side_ssl, upstream_side_ssl
from kvproxy.proxy.serve.reload import sections_needing_restart
from kvproxy.settings.loading import ConfigError
from tests.harness.tls import TlsFiles, make_tls_files

SECRET = "s3cr3t-Passw0rd-7f41"
UPSTREAM = {"bootstrap_servers": ["kafka:9092"]}


def _with_passwords(listen_password: Any, upstream_password: Any) -> dict[str, Any]:
    return {
        "listen": {"tls": {"cert_file": "c", "key_file": "k", "key_password": listen_password}},
        "upstream": {**UPSTREAM, "tls": {"key_password": upstream_password}},
    }


def _error(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, "test.yaml")
    return str(caught.value)


# ---- secure defaults ----


def test_metrics_endpoint_binds_to_loopback_by_default() -> None:
    config = parse_config({"upstream": UPSTREAM})
    assert config.metrics.host == "127.0.0.1"
    assert config.listen.host == "127.0.0.1"


def test_upstream_tls_verifies_certificate_and_host_name_by_default() -> None:
    config = parse_config({"upstream": {**UPSTREAM, "tls": {}}})
    context = upstream_side_ssl(config)
    assert context is not None
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname is True


def test_check_hostname_false_still_verifies_the_certificate() -> None:
    config = parse_config({"upstream": {**UPSTREAM, "tls": {"check_hostname": False}}})
    context = upstream_side_ssl(config)
    assert context is not None
    assert context.check_hostname is False
    assert context.verify_mode == ssl.CERT_REQUIRED


def test_no_upstream_tls_unless_configured() -> None:
    assert upstream_side_ssl(parse_config({"upstream": UPSTREAM})) is None


def test_client_ca_file_makes_client_certificates_required(tmp_path: Path) -> None:
    with make_tls_files(tmp_path) as tls:
        listen = {"cert_file": str(tls.server_cert), "key_file": str(tls.server_key)}
        plain = client_side_ssl(parse_config({"listen": {"tls": listen}, "upstream": UPSTREAM}))
        assert plain is not None and plain.verify_mode == ssl.CERT_NONE
        mutual = client_side_ssl(
            parse_config(
                {
                    "listen": {"tls": {**listen, "client_ca_file": str(tls.ca)}},
                    "upstream": UPSTREAM,
                }
            )
        )
        assert mutual is not None and mutual.verify_mode == ssl.CERT_REQUIRED


# ---- secrets from the environment ----


def test_secret_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPROXY_TEST_LISTEN_PW", SECRET)
    monkeypatch.setenv("KVPROXY_TEST_UPSTREAM_PW", SECRET + "-up")
    config = parse_config(
        _with_passwords("${KVPROXY_TEST_LISTEN_PW}", "${KVPROXY_TEST_UPSTREAM_PW}")
    )
    assert config.listen.tls is not None and config.listen.tls.key_password is not None
    assert config.listen.tls.key_password.get_secret_value() == SECRET
    assert config.upstream.tls is not None and config.upstream.tls.key_password is not None
    assert config.upstream.tls.key_password.get_secret_value() == SECRET + "-up"


def test_a_literal_secret_is_kept_as_written() -> None:
    config = parse_config(_with_passwords(SECRET, "not ${A} reference"))
    assert config.listen.tls is not None and config.listen.tls.key_password is not None
    assert config.listen.tls.key_password.get_secret_value() == SECRET
    assert config.upstream.tls is not None and config.upstream.tls.key_password is not None
    assert config.upstream.tls.key_password.get_secret_value() == "not ${A} reference"


def test_missing_variable_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVPROXY_TEST_NOT_SET", raising=False)
    message = _error(_with_passwords("${KVPROXY_TEST_NOT_SET}", None))
    assert message == (
        "test.yaml: 1 problem(s)\n"
        "  listen.tls.key_password: environment variable KVPROXY_TEST_NOT_SET "
        "is not set"
    )


def test_only_secret_fields_are_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPROXY_TEST_HOST", "kafka.example")
    config = parse_config(
        {"upstream": UPSTREAM, "listen": {"advertised_host": "${KVPROXY_TEST_HOST}"}}
    )
    assert config.listen.advertised_host == "${KVPROXY_TEST_HOST}"


@pytest.mark.parametrize("source", ["literal", "environment"])
def test_secret_never_shown(monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    monkeypatch.setenv("KVPROXY_TEST_PW", SECRET)
    value = SECRET if source == "literal" else "${KVPROXY_TEST_PW}"
    config = parse_config(_with_passwords(value, value))
    for shown in (repr(config), str(config), config.model_dump_json(), str(config.model_dump())):
        assert SECRET not in shown
    assert "**********" in repr(config.listen.tls)
    # Still a problem elsewhere in the file: the error lists it, not the secret.
    bad = _with_passwords(value, value)
    bad["listen"]["port"] = -1
    message = _error(bad)
    assert "listen.port" in message and SECRET not in message


def test_a_secret_of_the_wrong_type_is_not_echoed() -> None:
    message = _error(_with_passwords([SECRET], {"pw": SECRET}))
    assert "listen.tls.key_password: must be a string, not a list" in message
    assert "upstream.tls.key_password: must be a string, not a mapping" in message
    assert SECRET not in message


def test_reload_compares_secret_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reload of an unchanged file asks for no restart; a changed password does."""
    monkeypatch.setenv("KVPROXY_TEST_PW", SECRET)
    running = parse_config(_with_passwords("${KVPROXY_TEST_PW}", None))
    assert sections_needing_restart(running, parse_config(_with_passwords(SECRET, None))) == []
    changed = parse_config(_with_passwords("other", None))
    assert sections_needing_restart(running, changed) == ["listen"]


def test_yaml_file_with_a_secret_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVPROXY_TEST_PW", SECRET)
    path = tmp_path / "kvproxy.yaml"
    path.write_text(
        "listen:\n"
        "  tls:\n"
        "    cert_file: c.pem\n"
        "    key_file: k.pem\n"
        "    key_password: ${KVPROXY_TEST_PW}\n"
        "upstream:\n"
        "  bootstrap_servers: [kafka:9092]\n"
        '  tls: {key_password: "${KVPROXY_TEST_PW}"}\n'
    )
    config = load_config(path)
    assert isinstance(config, ProxyConfig)
    assert config.listen.tls is not None and config.listen.tls.key_password is not None
    assert config.listen.tls.key_password.get_secret_value() == SECRET


# ---- an encrypted key, unlocked with a password from the environment ----


def _encrypt_key(tls: TlsFiles, key: Path, password: str) -> Path:
    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    encrypted = key.with_name(key.stem + "-encrypted.key")
    encrypted.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(password.encode()),
        )
    )
    return encrypted


def test_encrypted_keys_are_unlocked_with_the_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVPROXY_TEST_PW", SECRET)
    with make_tls_files(tmp_path) as tls:
        server_key = _encrypt_key(tls, tls.server_key, SECRET)
        client_key = _encrypt_key(tls, tls.client_key, SECRET)
        config = parse_config(
            {
                "listen": {
                    "tls": {
                        "cert_file": str(tls.server_cert),
                        "key_file": str(server_key),
                        "key_password": "${KVPROXY_TEST_PW}",
                    }
                },
                "upstream": {
                    **UPSTREAM,
                    "tls": {
                        "ca_file": str(tls.ca),
                        "cert_file": str(tls.client_cert),
                        "key_file": str(client_key),
                        "key_password": "${KVPROXY_TEST_PW}",
                    },
                },
            }
        )
        assert client_side_ssl(config) is not None
        assert upstream_side_ssl(config) is not None
        monkeypatch.setenv("KVPROXY_TEST_PW", "wrong-password")
        wrong = parse_config(
            {
                "listen": {
                    "tls": {
                        "cert_file": str(tls.server_cert),
                        "key_file": str(server_key),
                        "key_password": "${KVPROXY_TEST_PW}",
                    }
                },
                "upstream": UPSTREAM,
            }
        )
        with pytest.raises(ssl.SSLError) as caught:
            client_side_ssl(wrong)
        assert "wrong-password" not in str(caught.value)
