"""Answers the proxy changes on their way back to the client.

Broker addresses are replaced by proxy addresses (Metadata, FindCoordinator, DescribeCluster, the
`node_endpoints` of Produce v10+, Fetch v16+, ShareFetch and ShareAcknowledge), and ApiVersions is
trimmed so a client never picks a version whose answer would carry an address the proxy does not
rewrite (`kvproxy.protocol.api_table`), or a Produce version the proxy cannot decode; every other
API is offered at every version the broker offers, and relayed unread. Each function takes the
response frame (size prefix removed) and returns the new frame plus the upstream addresses it
learned, so the caller can open listeners for them; the topics a Metadata answer names without an
error are passed to `topics_seen` (the metrics label only topics the cluster has).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final, Protocol, TypeVar

from kio.schema.api_versions.v0.response import ApiVersion as ApiVersionV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16

from kvproxy.protocol.admin import check_node_count, metadata_broker_count, metadata_topic_ids
from kvproxy.protocol.api_table import API_TABLE
from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.messages import (
    API_VERSIONS,
    DESCRIBE_CLUSTER,
    FETCH,
    FIND_COORDINATOR,
    METADATA,
    PRODUCE,
    SHARE_ACKNOWLEDGE,
    SHARE_FETCH,
    Response,
    decode_response,
    encode_response,
    make_response,
    supported_versions,
)
from kvproxy.protocol.produce_shape import answer_names_nodes

SASL_HANDSHAKE: Final = 17
NodeAddress = tuple[str, int]
REWRITE_INLINE_BYTES: Final = 256 * 1024
"""Answers larger than this are decoded and encoded off the event loop (`rewrite_off_loop`):
a few milliseconds of work at most is done on it for one answer."""
REWRITE_INLINE_NODES: Final = 1_000
"""A Metadata answer naming more brokers than this is rewritten off the event loop whatever its
size (10,000 brokers with short host names are 130 KB, and cost 100 ms to rewrite)."""


def rewrite_inline(frame: bytes | memoryview, api_key: int, api_version: int) -> bool:
    """Whether an answer is small enough to rewrite on the event loop (`rewrite_response`);
    otherwise `rewrite_off_loop`."""
    if len(frame) > REWRITE_INLINE_BYTES:
        return False
    if api_key != METADATA:
        return True
    try:
        return metadata_broker_count(frame, api_version) <= REWRITE_INLINE_NODES
    except ProtocolError:
        return False  # it is decoded off the loop, which says what is wrong with it


AddressFor = Callable[[int], NodeAddress | None]
"""Maps an upstream node id to the address a client is told for it (chosen per connection by
the listener it came through); None: the node has none (the answer leaves it out, or names no
coordinator)."""

TopicIdsSeen = Callable[[Iterable[tuple[uuid.UUID, str]]], None]
"""Given the (topic id, name) pairs of each Metadata answer a client gets."""

T = TypeVar("T")


class OffLoop(Protocol):
    """Runs a function on the decoding thread (`ProduceDecider.off_loop`)."""

    def __call__(self, work: Callable[[], T], /) -> Awaitable[T]: ...


PRODUCE_MAX_VERSION: Final = 13
"""The newest Produce version the policies read (v13 names topics by id: they are given their
names first, `kvproxy.protocol.produce_topics`)."""

UNKNOWN_APIS: Final = ("remove", "relay")
"""What the proxy does with an API (or a version) newer than `API_TABLE` (`apis.unknown`)."""

# SaslHandshake v0 is followed by raw, unframed SASL tokens the relay cannot follow; v1 wraps
# them in SaslAuthenticate requests, which pass through like any other request.
_MIN_VERSION: Final[Mapping[int, int]] = MappingProxyType({SASL_HANDSHAKE: 1})


def offered_range(
    api_key: int, broker_min: int, broker_max: int, unknown: str = "remove"
) -> tuple[int, int] | None:
    """The version range the proxy offers for an API the broker offers; None removes it.

    Every version is offered but those whose answer names controllers (no proxy port leads
    there), those naming brokers beyond what the codec can rewrite, and Produce versions the
    policies cannot read. An API or version newer than the table may name nodes in a field the
    proxy has never heard of, which would send the client past the proxy: by default it is not
    offered (`unknown="relay"` offers it, unread)."""
    api = API_TABLE.get(api_key)
    if api is None:
        return (broker_min, broker_max) if unknown == "relay" else None
    low = max(broker_min, _MIN_VERSION.get(api_key, broker_min))
    high = broker_max if unknown == "relay" else min(broker_max, api.newest)
    if api.controllers_from is not None:
        high = min(high, api.controllers_from - 1)
    if api.brokers_from is not None:
        high = min(high, max(supported_versions(api_key), default=-1))
    if api_key == PRODUCE:
        high = min(high, PRODUCE_MAX_VERSION)
    if high < low:
        return None
    return low, high


def needs_rewrite(api_key: int, api_version: int) -> bool:
    if api_key == API_VERSIONS:
        return True
    rewritten = _REWRITERS.get(api_key)
    return rewritten is not None and api_version >= rewritten[0]


def trim_api_versions(body: Any, unknown: str = "remove") -> Any:
    kept = []
    for api in body.api_keys:
        offered = offered_range(
            int(api.api_key), int(api.min_version), int(api.max_version), unknown
        )
        if offered is not None:
            kept.append(
                dataclasses.replace(api, min_version=i16(offered[0]), max_version=i16(offered[1]))
            )
    return dataclasses.replace(body, api_keys=tuple(kept))


def unsupported_api_versions_answer(correlation_id: int) -> bytes:
    """What Kafka answers an ApiVersions request of a version it does not know: a v0 body with
    UNSUPPORTED_VERSION and the ApiVersions range it does support, so the client can retry."""
    versions = supported_versions(API_VERSIONS)
    body = ApiVersionsResponseV0(
        error_code=ErrorCode.unsupported_version,
        api_keys=(
            ApiVersionV0(
                api_key=i16(API_VERSIONS),
                min_version=i16(versions[0]),
                max_version=i16(versions[-1]),
            ),
        ),
    )
    return encode_response(API_VERSIONS, 0, make_response(API_VERSIONS, 0, correlation_id, body))


def proxy_addresses(host: str, port_for: Callable[[int], int | None]) -> AddressFor:
    """Port per broker: every node at the proxy's public `host`, on its own port."""

    def address_for(node_id: int) -> NodeAddress | None:
        port = port_for(node_id)
        return None if port is None else (host, port)

    return address_for


def sni_addresses(name_of: Callable[[int], str], port: Callable[[], int]) -> AddressFor:
    """One port for every node (the SNI listener's), each node under its own server name."""
    return lambda node_id: (name_of(node_id), port())


class Nodes(Protocol):
    """Gives a list of an answer's nodes rewritten: `brokers` (a broker list) leaves an entry
    with a negative id out, otherwise (coordinators, leader endpoints) it keeps its id with
    no address."""

    def __call__(self, nodes: tuple[Any, ...], /, *, brokers: bool) -> tuple[Any, ...]: ...


def _rewrite_nodes(
    nodes: tuple[Any, ...],
    address_for: AddressFor,
    learned: dict[int, NodeAddress],
    *,
    brokers: bool,
) -> tuple[Any, ...]:
    """Every node at the proxy address `address_for` gives it. A negative id is no broker
    (Kafka names "no coordinator" or "no leader" so, host "" and port -1): whatever address
    the broker put beside it never reaches the client."""
    check_node_count(len(nodes))
    rewritten = []
    for node in nodes:
        # DescribeCluster names the field broker_id; every other answer node_id
        node_id = int(node.broker_id if hasattr(node, "broker_id") else node.node_id)
        if node_id < 0:
            if not brokers:
                rewritten.append(_no_address(node))
            continue
        address = address_for(node_id)
        if address is None:
            if hasattr(node, "error_code"):  # a coordinator: "not available", which clients retry
                rewritten.append(_no_coordinator(node))
            continue  # a broker list: the node is left out, the others stay usable
        learned[node_id] = (node.host, int(node.port))
        rewritten.append(dataclasses.replace(node, host=address[0], port=address[1]))
    return tuple(rewritten)


def _no_address(node: Any) -> Any:
    if node.host == "" and int(node.port) == -1:
        return node
    return dataclasses.replace(node, host="", port=type(node.port)(-1))


def _no_coordinator(node: Any) -> Any:
    return dataclasses.replace(
        node,
        error_code=ErrorCode.coordinator_not_available,
        node_id=type(node.node_id)(-1),
        host="",
        port=type(node.port)(-1),
    )


Rewriter = Callable[[Any, int, Nodes], Any]
"""Gives an answer body (of a version) with its nodes replaced by what the function makes of
them: the one place that knows where an API's answer names brokers."""


def _brokers(body: Any, _version: int, nodes: Nodes) -> Any:
    return dataclasses.replace(body, brokers=nodes(body.brokers, brokers=True))


def _coordinators(body: Any, version: int, nodes: Nodes) -> Any:
    if version >= 4:
        return dataclasses.replace(body, coordinators=nodes(body.coordinators, brokers=False))
    if int(body.node_id) < 0:  # no coordinator: no address either
        return _no_address(body)
    (node,) = nodes((body,), brokers=False)  # before v4 the body itself is the coordinator
    return node


def _node_endpoints(body: Any, _version: int, nodes: Nodes) -> Any:
    if not body.node_endpoints:
        return body
    return dataclasses.replace(body, node_endpoints=nodes(body.node_endpoints, brokers=False))


_REWRITERS: Final[Mapping[int, tuple[int, Rewriter]]] = MappingProxyType(
    {
        METADATA: (0, _brokers),
        DESCRIBE_CLUSTER: (0, _brokers),
        FIND_COORDINATOR: (0, _coordinators),
        PRODUCE: (10, _node_endpoints),  # node_endpoints of NOT_LEADER_OR_FOLLOWER answers
        FETCH: (16, _node_endpoints),
        SHARE_FETCH: (0, _node_endpoints),  # the leaders of NOT_LEADER_OR_FOLLOWER partitions
        SHARE_ACKNOWLEDGE: (0, _node_endpoints),
    }
)
"""APIs whose answers carry broker addresses: the first version that does, and where. An API
added here is rewritten and offered up to the newest version the proxy can decode."""


def _rewrite_body(
    api_key: int,
    api_version: int,
    body: Any,
    *,
    address_for: AddressFor,
    learned: dict[int, NodeAddress],
    unknown_apis: str = "remove",
) -> Any:
    if api_key == API_VERSIONS:
        return trim_api_versions(body, unknown_apis)
    first, rewriter = _REWRITERS[api_key]
    if api_version < first:
        return body

    def nodes(entries: tuple[Any, ...], /, *, brokers: bool) -> tuple[Any, ...]:
        return _rewrite_nodes(entries, address_for, learned, brokers=brokers)

    return rewriter(body, api_version, nodes)


def existing_topics(body: Any) -> Iterable[str]:
    """The topics a Metadata answer names with no error or LEADER_NOT_AVAILABLE: they exist."""
    for topic in body.topics:
        if topic.name is not None and int(topic.error_code) in (0, 5):
            yield str(topic.name)


def rewrite_response(
    frame: bytes | memoryview,
    api_key: int,
    api_version: int,
    address_for: AddressFor,
    *,
    topics_seen: Callable[[Iterable[str]], None] | None = None,
    unknown_apis: str = "remove",
    topic_ids_seen: TopicIdsSeen | None = None,
) -> tuple[bytes | memoryview, dict[int, NodeAddress]]:
    """The frame with proxy addresses (or trimmed versions), and the node addresses it named.

    An unchanged body is returned as the original bytes, so the common case costs one decode;
    a Produce answer that names no broker (`answer_names_nodes`: almost all) costs none.
    """
    if api_key == PRODUCE and not answer_names_nodes(frame, api_version):
        return frame, {}
    response, existing, ids = decode_answer(frame, api_key, api_version)
    if topics_seen is not None and existing:
        topics_seen(existing)
    if topic_ids_seen is not None and ids:
        topic_ids_seen(ids.items())
    rewritten, learned = rewrite_decoded(
        response, api_key, api_version, address_for, unknown_apis=unknown_apis
    )
    if rewritten is None:
        return frame, learned
    return encode_answer(rewritten, api_key, api_version), learned


async def rewrite_off_loop(
    frame: bytes | memoryview,
    api_key: int,
    api_version: int,
    address_for: AddressFor,
    *,
    topics_seen: Callable[[Iterable[str]], None] | None,
    off_loop: OffLoop,
    unknown_apis: str = "remove",
    topic_ids_seen: TopicIdsSeen | None = None,
) -> tuple[bytes | memoryview, dict[int, NodeAddress]]:
    """`rewrite_response` of an answer too large to decode and encode on the event loop (a
    Metadata answer naming 100,000 topics takes seconds): decoded, rewritten and encoded by
    `off_loop` in one piece (`address_for` is called there: it only reads and claims ports), so
    an answer naming many nodes holds no other client; the loop is given the topics it names.
    An answer naming more than `MAX_NODES_PER_ANSWER` nodes raises `TooManyNodes` there."""

    def work() -> tuple[bytes | memoryview, dict[int, NodeAddress], list[str], Any]:
        response, existing, ids = decode_answer(frame, api_key, api_version)
        rewritten, learned = rewrite_decoded(
            response, api_key, api_version, address_for, unknown_apis=unknown_apis
        )
        out = frame if rewritten is None else encode_answer(rewritten, api_key, api_version)
        return out, learned, existing, ids

    out, learned, existing, ids = await off_loop(work)
    if topics_seen is not None and existing:
        topics_seen(existing)
    if topic_ids_seen is not None and ids:
        topic_ids_seen(ids.items())
    return out, learned


def decode_answer(
    frame: bytes | memoryview, api_key: int, api_version: int
) -> tuple[Response, list[str], dict[uuid.UUID, str]]:
    """The answer decoded, and (Metadata) the topics it names that exist, and their ids (v10+:
    what Produce v13 names them by)."""
    if api_key == METADATA:  # too many brokers: refused before a million objects are made
        check_node_count(metadata_broker_count(frame, api_version))
    response: Response = decode_response(frame, api_key, api_version)
    if api_key != METADATA:
        return response, [], {}
    return response, list(existing_topics(response.body)), metadata_topic_ids(response.body)


def rewrite_decoded(
    response: Response,
    api_key: int,
    api_version: int,
    address_for: AddressFor,
    *,
    unknown_apis: str = "remove",
) -> tuple[Response | None, dict[int, NodeAddress]]:
    """The answer with proxy addresses (None: unchanged) and the node addresses it named."""
    learned: dict[int, NodeAddress] = {}
    body = _rewrite_body(
        api_key,
        api_version,
        response.body,
        address_for=address_for,
        learned=learned,
        unknown_apis=unknown_apis,
    )
    if body is response.body:
        return None, learned
    return Response(response.header, body), learned


def encode_answer(response: Response, api_key: int, api_version: int) -> bytes:
    return encode_response(api_key, api_version, response)
