"""Test harness: a real Tansu broker, a raw socket client, a recording relay, and every helper
more than one test module uses (a test module imports from here, never from another test module).

The broker, the raw client and the relay import nothing of the code under test (``protocol/``,
``proxy/``, ...); the request builders and answer readers use the project's codec.
"""

from tests.harness.raw_client import (
    RawClientError,
    RawKafkaClient,
    api_versions_v0_request,
    parse_api_versions_v0_response,
)
from tests.harness.tansu import (
    Broker,
    TansuError,
    TansuServer,
    create_topic,
    free_port,
    run_tansu,
    unique_topic_name,
)

__all__ = [
    "Broker",
    "RawClientError",
    "RawKafkaClient",
    "TansuError",
    "TansuServer",
    "api_versions_v0_request",
    "create_topic",
    "free_port",
    "parse_api_versions_v0_response",
    "run_tansu",
    "unique_topic_name",
]
