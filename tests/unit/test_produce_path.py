"""A Produce request's path through one client connection, without sockets: the request is read
once, and the broker's answer reaches the client as the broker wrote it when the proxy refused
nothing (the per-request work of a small request is most of what the proxy adds)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kvproxy.protocol import fast_accept, messages, produce_shape, request_view
from kvproxy.protocol import produce_request as plain_reader
from kvproxy.protocol.framing import size_prefix
from kvproxy.proxy.cluster import rewrite
from kvproxy.proxy.produce import compiled_accept
from tests.harness.connection_pair import (
    ConnectionPair,
    connection_pair,
    produce_answer_ok,
    produce_request,
)


@pytest.fixture
def pair() -> Iterator[ConnectionPair]:
    with connection_pair() as made:
        yield made


@pytest.mark.parametrize(
    "compiled", [pytest.param(True, marks=pytest.mark.compiled), False], ids=["compiled", "python"]
)
@pytest.mark.parametrize("version", [3, 9, 12])
def test_a_forwarded_produce_request_is_read_once(
    pair: ConnectionPair, monkeypatch: pytest.MonkeyPatch, version: int, compiled: bool
) -> None:
    """The compiled fast accept's one pass and no Python reader; or, on the Python path, one view
    of the request's bytes (`RequestView`): its prefix read on arrival, its header once, its body
    by one reader. No step reads again what an earlier one read."""
    if not compiled:
        monkeypatch.setattr(compiled_accept, "accept_produce", fast_accept.python_accept_produce)
    elif not fast_accept.COMPILED:
        pytest.fail("the fast accept is not compiled (KVPROXY_NO_EXTENSIONS, or no compiler)")
    reads: list[str] = []
    for module, name in [
        (request_view, "read_request_prefix"),
        (request_view, "read_request_header"),
        (request_view, "read_produce"),
        (request_view, "scan_produce"),  # the partition count alone
        (request_view, "decode_request"),
        (messages, "read_request"),  # the codec, wherever it is called from
        (messages, "read_request_header"),
        (plain_reader, "read_request_header"),
        (produce_shape, "read_request_header"),
    ]:
        original = getattr(module, name)

        def counted(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            reads.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    payload = produce_request(version, 5)
    pair.request(payload)
    assert bytes(pair.to_broker.written) == size_prefix(payload) + payload  # forwarded as sent
    if compiled:
        assert reads == []  # the compiled pass read it, before any Python reader
        metrics = pair.server.metrics
        assert metrics.child(metrics.decided, "compiled").pending == 1
    else:
        assert reads == ["read_request_prefix", "read_request_header", "read_produce"]


@pytest.mark.parametrize("version", [9, 10, 12])
def test_the_brokers_answer_reaches_the_client_unchanged_when_nothing_was_refused(
    pair: ConnectionPair, monkeypatch: pytest.MonkeyPatch, version: int
) -> None:
    def no_decoding(*_args: object) -> None:
        raise AssertionError("the answer was decoded")

    monkeypatch.setattr(rewrite, "decode_response", no_decoding)
    pair.request(produce_request(version, 5))
    answer = produce_answer_ok(version, 5)
    pair.answer(answer)
    assert bytes(pair.to_client.written) == size_prefix(answer) + answer
