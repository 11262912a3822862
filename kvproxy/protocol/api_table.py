"""Every Kafka API the proxy knows of, and which versions of its answer name a node by address.

A relay needs a schema only for the answers it changes: an answer that names a broker by host
and port must be rewritten to a proxy address (or the client would connect past the proxy, and
past every check); every other answer can be relayed unread, at any version, whether the schema
library knows it or not. This table says which is which. It was read off Apache Kafka's own
message specifications (`common/message/*Response.json`, Kafka 4.4.0 and 3.9.2: every field
named `Host` or `Port`, and the versions it is in); a test reads the specifications in the
Kafka jars again and fails when a version carries an address field this table does not name.

Two kinds of address:

- brokers (`brokers_from`): Metadata, FindCoordinator, DescribeCluster, the `node_endpoints` of
  Produce v10+, Fetch v16+, ShareFetch and ShareAcknowledge. The proxy rewrites these, so it can
  offer such an API only up to the newest version its codec decodes.
- controllers (`controllers_from`): the raft voters' listeners (DescribeQuorum v2+; Vote,
  BeginQuorumEpoch, EndQuorumEpoch, FetchSnapshot v1+ and UpdateRaftVoter, which only controllers
  serve). No proxy port leads to a controller, so those versions are not offered.

Fields named `Host` that are not node addresses: an ACL's host (DescribeAcls, DeleteAcls: the
client address a rule matches) and a Kafka Streams member's own endpoint (StreamsGroupHeartbeat,
StreamsGroupDescribe: `application.server`, the application's interactive-query address). They
pass unchanged.

`newest` is the newest version Kafka's specifications define: a broker offering more, or an API
missing here, is newer than this table, and whether its answers carry addresses is unknown
(`kvproxy.proxy.cluster.rewrite.offered_range` decides what to do with it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

__all__ = ["API_TABLE", "NOT_NODE_ADDRESSES", "KafkaApi", "api_label"]


@dataclass(frozen=True, slots=True)
class KafkaApi:
    """One API: its name, the newest version known, and where its answers name nodes."""

    name: str
    newest: int
    brokers_from: int | None = None
    """The first version whose answer names brokers by host and port (rewritten)."""
    controllers_from: int | None = None
    """The first version whose answer names controllers' listeners (not offered)."""


def _api(
    name: str, newest: int, *, brokers: int | None = None, controllers: int | None = None
) -> KafkaApi:
    return KafkaApi(name, newest, brokers, controllers)


API_TABLE: Final[Mapping[int, KafkaApi]] = MappingProxyType(
    {
        0: _api("Produce", 13, brokers=10),
        1: _api("Fetch", 18, brokers=16),
        2: _api("ListOffsets", 11),
        3: _api("Metadata", 13, brokers=0),
        4: _api("LeaderAndIsr", 7),  # inter-broker (ZooKeeper mode), gone in 4.0
        5: _api("StopReplica", 4),
        6: _api("UpdateMetadata", 8),
        7: _api("ControlledShutdown", 3),
        8: _api("OffsetCommit", 10),
        9: _api("OffsetFetch", 10),
        10: _api("FindCoordinator", 6, brokers=0),
        11: _api("JoinGroup", 9),
        12: _api("Heartbeat", 4),
        13: _api("LeaveGroup", 5),
        14: _api("SyncGroup", 5),
        15: _api("DescribeGroups", 6),
        16: _api("ListGroups", 5),
        17: _api("SaslHandshake", 1),
        18: _api("ApiVersions", 5),
        19: _api("CreateTopics", 7),
        20: _api("DeleteTopics", 6),
        21: _api("DeleteRecords", 2),
        22: _api("InitProducerId", 6),
        23: _api("OffsetForLeaderEpoch", 4),
        24: _api("AddPartitionsToTxn", 5),
        25: _api("AddOffsetsToTxn", 4),
        26: _api("EndTxn", 5),
        27: _api("WriteTxnMarkers", 2),
        28: _api("TxnOffsetCommit", 6),
        29: _api("DescribeAcls", 3),  # `host`: the client address an ACL matches
        30: _api("CreateAcls", 3),
        31: _api("DeleteAcls", 3),  # `host`: as DescribeAcls
        32: _api("DescribeConfigs", 4),
        33: _api("AlterConfigs", 2),
        34: _api("AlterReplicaLogDirs", 2),
        35: _api("DescribeLogDirs", 5),
        36: _api("SaslAuthenticate", 2),
        37: _api("CreatePartitions", 3),
        38: _api("CreateDelegationToken", 3),
        39: _api("RenewDelegationToken", 2),
        40: _api("ExpireDelegationToken", 2),
        41: _api("DescribeDelegationToken", 3),
        42: _api("DeleteGroups", 3),
        43: _api("ElectLeaders", 2),
        44: _api("IncrementalAlterConfigs", 1),
        45: _api("AlterPartitionReassignments", 1),
        46: _api("ListPartitionReassignments", 0),
        47: _api("OffsetDelete", 0),
        48: _api("DescribeClientQuotas", 1),
        49: _api("AlterClientQuotas", 1),
        50: _api("DescribeUserScramCredentials", 0),
        51: _api("AlterUserScramCredentials", 0),
        52: _api("Vote", 2, controllers=1),
        53: _api("BeginQuorumEpoch", 1, controllers=1),
        54: _api("EndQuorumEpoch", 1, controllers=1),
        55: _api("DescribeQuorum", 2, controllers=2),
        56: _api("AlterPartition", 3),
        57: _api("UpdateFeatures", 2),
        58: _api("Envelope", 0),
        59: _api("FetchSnapshot", 1, controllers=1),
        60: _api("DescribeCluster", 2, brokers=0),
        61: _api("DescribeProducers", 0),
        62: _api("BrokerRegistration", 4),
        63: _api("BrokerHeartbeat", 2),
        64: _api("UnregisterBroker", 0),
        65: _api("DescribeTransactions", 0),
        66: _api("ListTransactions", 2),
        67: _api("AllocateProducerIds", 0),
        68: _api("ConsumerGroupHeartbeat", 1),
        69: _api("ConsumerGroupDescribe", 1),
        70: _api("ControllerRegistration", 0),
        71: _api("GetTelemetrySubscriptions", 0),
        72: _api("PushTelemetry", 0),
        73: _api("AssignReplicasToDirs", 0),
        74: _api("ListConfigResources", 1),  # ListClientMetricsResources before 4.1
        75: _api("DescribeTopicPartitions", 0),
        76: _api("ShareGroupHeartbeat", 1),
        77: _api("ShareGroupDescribe", 1),
        78: _api("ShareFetch", 2, brokers=0),
        79: _api("ShareAcknowledge", 2, brokers=0),
        80: _api("AddRaftVoter", 1),
        81: _api("RemoveRaftVoter", 0),
        82: _api("UpdateRaftVoter", 0, controllers=0),
        83: _api("InitializeShareGroupState", 0),
        84: _api("ReadShareGroupState", 0),
        85: _api("WriteShareGroupState", 1),
        86: _api("DeleteShareGroupState", 0),
        87: _api("ReadShareGroupStateSummary", 1),
        88: _api("StreamsGroupHeartbeat", 1),  # `host`: a member's application.server
        89: _api("StreamsGroupDescribe", 1),  # `host`: as StreamsGroupHeartbeat
        90: _api("DescribeShareGroupOffsets", 1),
        91: _api("AlterShareGroupOffsets", 0),
        92: _api("DeleteShareGroupOffsets", 0),
        93: _api("StreamsGroupTopologyDescriptionUpdate", 0),
        94: _api("UnregisterController", 0),
    }
)

NOT_NODE_ADDRESSES: Final[Mapping[int, str]] = MappingProxyType(
    {
        29: "an ACL's host: the client address the rule matches",
        31: "an ACL's host: the client address the rule matches",
        88: "a Streams member's own endpoint (application.server)",
        89: "a Streams member's own endpoint (application.server)",
    }
)
"""APIs whose answers have a `Host` field that names no node: relayed unchanged."""


def api_label(api_key: int) -> str:
    """The API's name, or "unknown" for one newer than the table (a bounded metric label)."""
    api = API_TABLE.get(api_key)
    return "unknown" if api is None else api.name
