"""Message versions that kio does not generate: Produce v0-v2 and DescribeConfigs v0.

Kafka 4.0 dropped these versions from its message JSON, so kio (generated from that JSON) lacks
them; clients and brokers still in service send them. They are declared here in kio's own schema
form, so kio's native reader and writer serialize them like every other message.
"""

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar, Final

from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader as _KioRequestHeader
from kio.schema.response_header.v0.header import ResponseHeader as _KioResponseHeader
from kio.schema.types import TopicName
from kio.static.constants import EntityType
from kio.static.primitive import (
    Records,
    TZAware,
    i8,
    i16,
    i32,
    i32Timedelta,
    i64,
)

# Shared class attributes of every legacy schema class, spelled out per class because kio reads
# them from the class itself.
_PRODUCE = i16(0)
_DESCRIBE_CONFIGS = i16(32)


# ---- Produce v0-v2 requests: the v3 shape without transactional_id ----


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionProduceData:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(2)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = _PRODUCE
    __header_schema__: ClassVar[type[_KioRequestHeader]] = _KioRequestHeader
    index: i32 = field(metadata={"kafka_type": "int32"})
    records: Records | None = field(metadata={"kafka_type": "records"})


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicProduceData:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(2)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = _PRODUCE
    __header_schema__: ClassVar[type[_KioRequestHeader]] = _KioRequestHeader
    name: TopicName = field(metadata={"kafka_type": "string"})
    partition_data: tuple[PartitionProduceData, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceRequestV0:
    """Produce v0-v2 request (the three versions share one shape)."""

    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = _PRODUCE
    __header_schema__: ClassVar[type[_KioRequestHeader]] = _KioRequestHeader
    acks: i16 = field(metadata={"kafka_type": "int16"})
    timeout: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
    topic_data: tuple[TopicProduceData, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceRequestV1(ProduceRequestV0):
    __version__: ClassVar[i16] = i16(1)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceRequestV2(ProduceRequestV0):
    __version__: ClassVar[i16] = i16(2)


# ---- Produce v0-v2 responses ----


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionProduceResponseV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = _PRODUCE
    __header_schema__: ClassVar[type[_KioResponseHeader]] = _KioResponseHeader
    index: i32 = field(metadata={"kafka_type": "int32"})
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    base_offset: i64 = field(metadata={"kafka_type": "int64"})


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionProduceResponseV2(PartitionProduceResponseV0):
    """v2 adds the log append time (-1 unless the topic uses LogAppendTime)."""

    __version__: ClassVar[i16] = i16(2)
    log_append_time: TZAware | None = field(metadata={"kafka_type": "datetime_i64"}, default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicProduceResponseV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = _PRODUCE
    __header_schema__: ClassVar[type[_KioResponseHeader]] = _KioResponseHeader
    name: TopicName = field(metadata={"kafka_type": "string"})
    partition_responses: tuple[PartitionProduceResponseV0, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicProduceResponseV2:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(2)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = _PRODUCE
    __header_schema__: ClassVar[type[_KioResponseHeader]] = _KioResponseHeader
    name: TopicName = field(metadata={"kafka_type": "string"})
    partition_responses: tuple[PartitionProduceResponseV2, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceResponseV0:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = _PRODUCE
    __header_schema__: ClassVar[type[_KioResponseHeader]] = _KioResponseHeader
    responses: tuple[TopicProduceResponseV0, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceResponseV1:
    """v1 adds throttle_time_ms after the responses."""

    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(1)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = _PRODUCE
    __header_schema__: ClassVar[type[_KioResponseHeader]] = _KioResponseHeader
    responses: tuple[TopicProduceResponseV0, ...]
    throttle_time: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceResponseV2:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(2)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = _PRODUCE
    __header_schema__: ClassVar[type[_KioResponseHeader]] = _KioResponseHeader
    responses: tuple[TopicProduceResponseV2, ...]
    throttle_time: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})


# ---- DescribeConfigs v0: v1 without include_synonyms, with is_default instead of sources ----


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeConfigsResourceV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = _DESCRIBE_CONFIGS
    __header_schema__: ClassVar[type[_KioRequestHeader]] = _KioRequestHeader
    resource_type: i8 = field(metadata={"kafka_type": "int8"})
    resource_name: str = field(metadata={"kafka_type": "string"})
    configuration_keys: tuple[str, ...] | None = field(metadata={"kafka_type": "string"})


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeConfigsRequestV0:
    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = _DESCRIBE_CONFIGS
    __header_schema__: ClassVar[type[_KioRequestHeader]] = _KioRequestHeader
    resources: tuple[DescribeConfigsResourceV0, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeConfigsResourceResultV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = _DESCRIBE_CONFIGS
    __header_schema__: ClassVar[type[_KioResponseHeader]] = _KioResponseHeader
    name: str = field(metadata={"kafka_type": "string"})
    value: str | None = field(metadata={"kafka_type": "string"})
    read_only: bool = field(metadata={"kafka_type": "bool"})
    is_default: bool = field(metadata={"kafka_type": "bool"})
    is_sensitive: bool = field(metadata={"kafka_type": "bool"})


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeConfigsResultV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = _DESCRIBE_CONFIGS
    __header_schema__: ClassVar[type[_KioResponseHeader]] = _KioResponseHeader
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    error_message: str | None = field(metadata={"kafka_type": "string"})
    resource_type: i8 = field(metadata={"kafka_type": "int8"})
    resource_name: str = field(metadata={"kafka_type": "string"})
    configs: tuple[DescribeConfigsResourceResultV0, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeConfigsResponseV0:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = _DESCRIBE_CONFIGS
    __header_schema__: ClassVar[type[_KioResponseHeader]] = _KioResponseHeader
    throttle_time: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
    results: tuple[DescribeConfigsResultV0, ...]


LEGACY_SCHEMAS: Final[MappingProxyType[tuple[int, int], tuple[type, type]]] = MappingProxyType(
    {
        (0, 0): (ProduceRequestV0, ProduceResponseV0),
        (0, 1): (ProduceRequestV1, ProduceResponseV1),
        (0, 2): (ProduceRequestV2, ProduceResponseV2),
        (32, 0): (DescribeConfigsRequestV0, DescribeConfigsResponseV0),
    }
)
"""(api key, version) -> (request schema, response schema) for the versions kio lacks."""
