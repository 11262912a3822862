"""The SNI listener's names: the settings that define them and how a client's name is routed.

A name a client sends is untrusted input: whatever it holds (case, a trailing dot, a node id with
a leading zero or past int32, non-ASCII letters that fold into ASCII ones, empty labels) it
routes to the bootstrap, to exactly the node it spells, or nowhere.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvproxy.proxy.config.proxy_config import parse_config
from kvproxy.proxy.config.sni_names import NO_ROUTE, SniNames
from kvproxy.settings.loading import ConfigError

UPSTREAM = {"bootstrap_servers": ["kafka:9092"]}
TLS = {"cert_file": "/c.pem", "key_file": "/k.pem"}
SNI = {
    "port": 9443,
    "bootstrap": "kafka.example.com",
    "brokers": "broker-$(nodeId).kafka.example.com",
}
NAMES = SniNames("kafka.example.com", "broker-$(nodeId).kafka.example.com")


def listen_of(listen: dict[str, Any]) -> Any:
    return parse_config({"upstream": UPSTREAM, "listen": listen}).listen


def problem_of(listen: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config({"upstream": UPSTREAM, "listen": listen}, source="test.yaml")
    lines = str(caught.value).splitlines()
    assert lines[0] == "test.yaml: 1 problem(s)"
    return lines[1].strip()


def test_no_sni_listener_by_default() -> None:
    listen = listen_of({})
    assert listen.sni is None
    assert listen.port_per_broker is True
    assert listen.sni_tls is None


def test_sni_settings_are_read_lower_case_with_listen_tls_as_the_default() -> None:
    sni = {
        "port": 9443,
        "bootstrap": "Kafka.Example.COM.",
        "brokers": "Broker-$(nodeId).Kafka.Example.com",
    }
    listen = listen_of({"tls": TLS, "sni": sni})
    assert listen.sni.bootstrap == "kafka.example.com"
    assert listen.sni.brokers == "broker-$(nodeId).kafka.example.com"
    assert (listen.sni.host, listen.sni.advertised_port, listen.sni.without_sni) == (
        None,
        None,
        "refuse",
    )
    assert listen.sni_tls == listen.tls
    assert listen.sni.names == NAMES


def test_the_sni_listener_may_have_its_own_tls_and_stand_alone() -> None:
    own = {"cert_file": "/sni.pem", "key_file": "/sni.key"}
    listen = listen_of({"port_per_broker": False, "sni": {**SNI, "tls": own, "port": 9192}})
    assert listen.sni_tls is not None and str(listen.sni_tls.cert_file) == "/sni.pem"
    assert listen.port_per_broker is False


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        (
            {"sni": SNI},
            "listen: sni needs TLS (the server name is read from the TLS "
            "handshake): set sni.tls or listen.tls",
        ),
        (
            {"port_per_broker": False},
            "listen: port_per_broker: false needs sni: without either, no client could connect",
        ),
        (
            {"tls": TLS, "sni": {**SNI, "brokers": "broker.kafka.example.com"}},
            "listen.sni.brokers: 'broker.kafka.example.com' must hold $(nodeId) "
            "exactly once (where the node id goes)",
        ),
        (
            {"tls": TLS, "sni": {**SNI, "brokers": "b-$(nodeId)-$(nodeId).example.com"}},
            "listen.sni.brokers: 'b-$(nodeId)-$(nodeId).example.com' must hold "
            "$(nodeId) exactly once (where the node id goes)",
        ),
        (
            {"tls": TLS, "sni": {**SNI, "brokers": "b_$(nodeId).example.com"}},
            "listen.sni.brokers: 'b_$(nodeId).example.com' does not make DNS "
            "names: with a node id it has the label 'b_2147483647': labels are letters a-z, "
            "digits and '-', not starting or ending with '-'",
        ),
        (
            {"tls": TLS, "sni": {**SNI, "brokers": "$(nodeId)" + "x" * 55 + ".example.com"}},
            "listen.sni.brokers: '$(nodeId)"
            + "x" * 55
            + ".example.com' does not make DNS names: with a node id it has a label of 65 "
            "characters (at most 63): 2147483647xxxxxxxxxx...",
        ),
        (
            {"tls": TLS, "sni": {**SNI, "bootstrap": "kafka..example.com"}},
            "listen.sni.bootstrap: 'kafka..example.com' is not a DNS name: it has "
            "an empty label (two dots in a row, or a leading dot)",
        ),
        (
            {"tls": TLS, "sni": {**SNI, "bootstrap": "*.example.com"}},
            "listen.sni.bootstrap: '*.example.com' is not a DNS name: it has the "
            "label '*': labels are letters a-z, digits and '-', not starting or ending with '-'",
        ),
        (
            {"tls": TLS, "sni": {**SNI, "bootstrap": "kafka.exämple.com"}},
            "listen.sni.bootstrap: 'kafka.exämple.com' is not a DNS name: it has "
            "the label 'exämple': labels are letters a-z, digits and '-', not starting or "
            "ending with '-'",
        ),
        (
            {"tls": TLS, "sni": {**SNI, "bootstrap": ("a" * 60 + ".") * 4 + "example.com"}},
            "listen.sni.bootstrap: '"
            + ("a" * 60 + ".") * 4
            + "example.com' is not a DNS name: it is 255 characters long (a DNS name has at "
            "most 253)",
        ),
        (
            {"tls": TLS, "sni": {**SNI, "bootstrap": "Broker-7.kafka.example.com"}},
            "listen.sni: bootstrap 'broker-7.kafka.example.com' matches the "
            "brokers pattern 'broker-$(nodeId).kafka.example.com': it would name a broker",
        ),
        (
            {"tls": TLS, "sni": {**SNI, "port": 9192}},
            "listen: sni.port 9192 is the bootstrap's port (listen.port)",
        ),
        (
            {"tls": TLS, "sni": {**SNI, "port": 9250}},
            "listen: sni.port 9250 falls inside the broker port range starting at 9193",
        ),
        (
            {"tls": TLS, "sni": {**SNI, "without_sni": "drop"}},
            "listen.sni.without_sni: must be refuse or bootstrap, not 'drop'",
        ),
        (
            {"tls": TLS, "sni": {**SNI, "advertised_port": 0}},
            "listen.sni.advertised_port: must be at least 1, not 0",
        ),
    ],
)
def test_wrong_sni_settings_are_refused_in_clear_words(
    listen: dict[str, Any], expected: str
) -> None:
    assert problem_of(listen) == expected


def test_the_broker_port_range_is_free_for_sni_when_port_per_broker_is_off() -> None:
    listen = listen_of({"port_per_broker": False, "tls": TLS, "sni": {**SNI, "port": 9250}})
    assert listen.sni.port == 9250


def test_name_of_a_node() -> None:
    assert NAMES.name_of(3) == "broker-3.kafka.example.com"
    assert NAMES.name_of(0) == "broker-0.kafka.example.com"
    assert NAMES.name_of(2**31 - 1) == "broker-2147483647.kafka.example.com"


@pytest.mark.parametrize(
    ("name", "route"),
    [
        ("kafka.example.com", None),
        ("KAFKA.Example.Com", None),
        ("kafka.example.com.", None),
        ("broker-3.kafka.example.com", 3),
        ("BROKER-3.KAFKA.EXAMPLE.COM.", 3),
        ("broker-0.kafka.example.com", 0),
        ("broker-1001.kafka.example.com", 1001),
        ("broker-2147483647.kafka.example.com", 2**31 - 1),
        # nothing else names a node
        ("broker-2147483648.kafka.example.com", NO_ROUTE),
        ("broker-99999999999999999999999.kafka.example.com", NO_ROUTE),
        ("broker-03.kafka.example.com", NO_ROUTE),
        ("broker-00.kafka.example.com", NO_ROUTE),
        ("broker-.kafka.example.com", NO_ROUTE),
        ("broker--1.kafka.example.com", NO_ROUTE),
        ("broker-+1.kafka.example.com", NO_ROUTE),
        ("broker- 1.kafka.example.com", NO_ROUTE),
        ("broker-1_0.kafka.example.com", NO_ROUTE),
        ("broker-\u0661.kafka.example.com", NO_ROUTE),  # an Arabic-Indic digit one
        ("broker-\uff13.kafka.example.com", NO_ROUTE),  # a full-width digit three
        ("broker-3.\u212aafka.example.com", NO_ROUTE),  # KELVIN SIGN lowers to "k"
        ("\u212aafka.example.com", NO_ROUTE),
        ("broker-3.kafka.example.com..", NO_ROUTE),
        ("broker-3..kafka.example.com", NO_ROUTE),
        ("broker-3.kafka.example.com.evil.com", NO_ROUTE),
        ("evil.broker-3.kafka.example.com", NO_ROUTE),
        ("x.kafka.example.com", NO_ROUTE),
        ("example.com", NO_ROUTE),
        ("", NO_ROUTE),
        (".", NO_ROUTE),
        ("broker-3.kafka.example.com\x00", NO_ROUTE),
        ("\x00kafka.example.com", NO_ROUTE),
        ("a" * 100_000, NO_ROUTE),
    ],
)
def test_route_of_a_server_name(name: str, route: object) -> None:
    assert NAMES.route(name) == route


def test_a_pattern_with_digits_beside_the_node_id_still_reads_back_each_node() -> None:
    names = SniNames("k.example.com", "b1$(nodeId)2.example.com")
    for node_id in (0, 1, 12, 120, 2**31 - 1):
        assert names.route(names.name_of(node_id)) == node_id
    assert names.route("b12.example.com") == NO_ROUTE
