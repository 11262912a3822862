"""Apache Kafka with SASL and TLS listeners, and client settings to match, for security tests.

A broker with three client listeners (PLAINTEXT first, the inter-broker one; SASL_PLAINTEXT;
SASL_SSL), PLAIN users in its JAAS config, SCRAM-SHA-256/512 users written when its storage is
formatted, and a PEM key store made by :mod:`tests.harness.tls`::

    with make_tls_files(tmp / "kafka-ca") as kafka_tls, run_kafka(
        listeners=SECURE_LISTENERS,
        properties=broker_properties(kafka_tls, tmp),
        format_arguments=scram_format_arguments(),
    ) as cluster:
        cluster.brokers[0].ports["SASL_SSL"]

Client settings for librdkafka (:func:`librdkafka_settings`) and for the Java client's property
files (:func:`java_properties`, :func:`write_properties`) name the same users. Like the other
harness modules, this one imports nothing of the code under test.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final, NamedTuple

from tests.harness.kafka_broker import Listener, java_command
from tests.harness.tls import TlsFiles

__all__ = [
    "MECHANISMS",
    "SECURE_LISTENERS",
    "USERS",
    "SaslAnswer",
    "broker_properties",
    "console_consume",
    "console_produce",
    "consumed_records",
    "java_properties",
    "keystore_pem",
    "librdkafka_settings",
    "run_java_tool",
    "sasl_authenticate_answer",
    "scram_format_arguments",
    "write_properties",
]

MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SECURE_LISTENERS: Final = (
    Listener("PLAINTEXT"),
    Listener("SASL_PLAINTEXT", "SASL_PLAINTEXT"),
    Listener("SASL_SSL", "SASL_SSL"),
)
USERS: Final = {"alice": "alice-secret", "bob": "bob-secret"}
"""The users every mechanism knows (PLAIN from the JAAS config, SCRAM from the storage format)."""

_PLAIN_MODULE: Final = "org.apache.kafka.common.security.plain.PlainLoginModule"
_SCRAM_MODULE: Final = "org.apache.kafka.common.security.scram.ScramLoginModule"


def keystore_pem(cert: Path, key: Path, target: Path) -> Path:
    """One PEM file holding a private key and its certificate chain: what Kafka's
    ``ssl.keystore.type=PEM`` with ``ssl.keystore.location`` reads. Kafka reads PKCS#8 keys only,
    so the key (trustme writes SEC1 ``EC PRIVATE KEY``) is rewritten as PKCS#8."""
    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    pkcs8 = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    target.write_bytes(pkcs8 + cert.read_bytes())
    target.chmod(0o600)
    return target


def broker_properties(
    tls: TlsFiles, directory: Path, users: Mapping[str, str] = USERS
) -> dict[str, str]:
    """server.properties for :data:`SECURE_LISTENERS`: every mechanism on both SASL listeners,
    PLAIN users in the JAAS config, the SASL_SSL listener's key store from ``tls``."""
    plain_users = " ".join(f'user_{name}="{password}"' for name, password in users.items())
    settings = {"sasl.enabled.mechanisms": ",".join(MECHANISMS)}
    for listener in ("sasl_plaintext", "sasl_ssl"):
        prefix = f"listener.name.{listener}"
        settings[f"{prefix}.plain.sasl.jaas.config"] = f"{_PLAIN_MODULE} required {plain_users};"
        for scram in ("scram-sha-256", "scram-sha-512"):
            settings[f"{prefix}.{scram}.sasl.jaas.config"] = f"{_SCRAM_MODULE} required;"
    keystore = keystore_pem(tls.server_cert, tls.server_key, directory / "kafka-keystore.pem")
    settings.update(
        {
            "listener.name.sasl_ssl.ssl.keystore.type": "PEM",
            "listener.name.sasl_ssl.ssl.keystore.location": str(keystore),
            "listener.name.sasl_ssl.ssl.truststore.type": "PEM",
            "listener.name.sasl_ssl.ssl.truststore.location": str(tls.ca),
        }
    )
    return settings


def scram_format_arguments(users: Mapping[str, str] = USERS) -> tuple[str, ...]:
    """``--add-scram`` arguments of the storage format tool: each user under both SCRAM hashes."""
    arguments: list[str] = []
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        for name, password in users.items():
            arguments += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
    return tuple(arguments)


def librdkafka_settings(
    mechanism: str,
    password: str,
    *,
    user: str = "alice",
    ca: Path | None = None,
    client_cert: tuple[Path, Path] | None = None,
) -> dict[str, str]:
    """confluent-kafka settings: SASL_SSL trusting ``ca`` (and presenting ``client_cert``, a
    certificate and key, for mutual TLS), or SASL_PLAINTEXT without ``ca``."""
    settings = {
        "security.protocol": "SASL_SSL" if ca is not None else "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }
    if ca is not None:
        settings["ssl.ca.location"] = str(ca)
    if client_cert is not None:
        settings["ssl.certificate.location"] = str(client_cert[0])
        settings["ssl.key.location"] = str(client_cert[1])
    return settings


def java_properties(
    mechanism: str,
    password: str,
    *,
    user: str = "alice",
    ca: Path | None = None,
    keystore: Path | None = None,
) -> dict[str, str]:
    """Java client settings (``--command-config`` / ``--producer.config`` files): SASL_SSL
    trusting ``ca`` (a PEM trust store; ``keystore``, a PEM key and chain, for mutual TLS), or
    SASL_PLAINTEXT without ``ca``."""
    module = _PLAIN_MODULE if mechanism == "PLAIN" else _SCRAM_MODULE
    settings = {
        "security.protocol": "SASL_SSL" if ca is not None else "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.jaas.config": f'{module} required username="{user}" password="{password}";',
    }
    if ca is not None:
        settings["ssl.truststore.type"] = "PEM"
        settings["ssl.truststore.location"] = str(ca)
    if keystore is not None:
        settings["ssl.keystore.type"] = "PEM"
        settings["ssl.keystore.location"] = str(keystore)
    return settings


def write_properties(path: Path, settings: Mapping[str, str]) -> Path:
    """A Java properties file (values here hold no character that needs escaping but ``\\``)."""
    lines = [f"{key}={value.replace(chr(92), chr(92) * 2)}\n" for key, value in settings.items()]
    path.write_text("".join(lines))
    return path


def run_java_tool(
    version: str,
    main_class: str,
    *args: str,
    stdin: str | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """One of Kafka ``version``'s command-line tools run to completion (a small heap, quick JIT),
    its output captured."""
    return subprocess.run(
        java_command(version, main_class, *args, jvm=_TOOL_JVM),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


_TOOL_JVM: Final[Sequence[str]] = ("-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


def console_produce(
    version: str, bootstrap: str, topic: str, config: Path, lines: Sequence[str]
) -> subprocess.CompletedProcess[str]:
    """Kafka's console producer (``kafka-console-producer``) sending ``lines`` with the client
    settings in ``config``; it exits when its input ends."""
    if version.startswith("3."):
        main_class, option = "kafka.tools.ConsoleProducer", "--producer.config"
    else:
        main_class, option = "org.apache.kafka.tools.ConsoleProducer", "--command-config"
    arguments = ("--bootstrap-server", bootstrap, "--topic", topic, option, str(config))
    return run_java_tool(
        version, main_class, *arguments, "--sync", stdin="".join(f"{line}\n" for line in lines)
    )


def console_consume(
    version: str, bootstrap: str, topic: str, config: Path, count: int, *, timeout_ms: int = 30_000
) -> subprocess.CompletedProcess[str]:
    """Kafka's console consumer (``kafka-console-consumer``) reading ``count`` records from the
    beginning with the client settings in ``config`` (it gives up after ``timeout_ms`` without a
    record). Each record is printed as ``Partition:P<TAB>Offset:O<TAB>VALUE``, which
    :func:`consumed_records` picks out of the log lines the tool writes to stdout as well."""
    if version.startswith("3."):
        option, formatter = "--consumer.config", "--property"
    else:
        option, formatter = "--command-config", "--formatter-property"
    return run_java_tool(
        version,
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        option,
        str(config),
        "--from-beginning",
        "--max-messages",
        str(count),
        "--timeout-ms",
        str(timeout_ms),
        formatter,
        "print.partition=true",
        formatter,
        "print.offset=true",
    )


_RECORD_LINE: Final = re.compile(r"^Partition:(\d+)\tOffset:(\d+)\t(.*)$")


def consumed_records(stdout: str) -> list[tuple[int, int, str]]:
    """(partition, offset, value) of each record :func:`console_consume` printed."""
    found = (_RECORD_LINE.match(line) for line in stdout.splitlines())
    return [(int(m.group(1)), int(m.group(2)), m.group(3)) for m in found if m]


class SaslAnswer(NamedTuple):
    """What a SaslAuthenticate answer carries besides the mechanism's bytes."""

    error_code: int
    error_message: str | None
    session_lifetime_ms: int | None
    """v1 and up: how long the login holds (0: until the connection closes)."""


def sasl_authenticate_answer(version: int, payload: bytes) -> SaslAnswer:
    """Decode a SaslAuthenticate answer (``payload`` without the size prefix): what the broker
    put on the wire."""
    flexible = version >= 2
    offset = 4 + (1 if flexible else 0)  # correlation id, then the header's empty tagged fields
    code = int.from_bytes(payload[offset : offset + 2], "big", signed=True)
    offset += 2
    message, offset = _string(payload, offset, flexible)
    if version < 1:
        return SaslAnswer(code, message, None)
    if flexible:
        length, offset = _uvarint(payload, offset)
        offset += length - 1  # compact bytes
    else:
        offset += 4 + int.from_bytes(payload[offset : offset + 4], "big", signed=True)
    lifetime = int.from_bytes(payload[offset : offset + 8], "big", signed=True)
    return SaslAnswer(code, message, lifetime)


def _string(data: bytes, offset: int, compact: bool) -> tuple[str | None, int]:
    if compact:
        length, offset = _uvarint(data, offset)
        length -= 1
    else:
        length = int.from_bytes(data[offset : offset + 2], "big", signed=True)
        offset += 2
    if length < 0:
        return None, offset
    return data[offset : offset + length].decode(), offset + length


def _uvarint(data: bytes, offset: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7
