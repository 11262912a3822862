"""What a proxy is left in after a test: no connection or task behind, and still serving."""

from __future__ import annotations

from kvproxy.protocol.messages import API_VERSIONS, decode_response
from tests.harness.proxy import RunningProxy
from tests.harness.raw_client import RawKafkaClient
from tests.harness.requests import api_versions_request, correlation_id_of


def assert_idle(proxy: RunningProxy, timeout: float = 10.0) -> None:
    stats = proxy.wait_until_idle(timeout)
    assert (stats.client_connections, stats.upstream_connections, stats.pending_tasks) == (0, 0, 0)


def assert_serves(proxy: RunningProxy, correlation_id: int = 77) -> None:
    """A new client gets a proper answer through the bootstrap listener."""
    with RawKafkaClient(proxy.host, proxy.port) as client:
        answer = client.request(api_versions_request(0, correlation_id))
    assert correlation_id_of(answer) == correlation_id
    assert decode_response(answer, API_VERSIONS, 0).body.error_code == 0
