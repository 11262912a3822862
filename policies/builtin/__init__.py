"""The built-in policies, by the name used in the YAML config."""

from __future__ import annotations

from policies.builtin.base import BuiltinPolicy, PolicyConfigError, PolicyContext
from policies.builtin.broker import (
    BatchIntegrityPolicy,
    CompactedKeyPolicy,
    CrcPolicy,
    MessageFormatPolicy,
    OffsetsPolicy,
    TimestampsPolicy,
)
from policies.builtin.content import (
    AvroPolicy,
    JsonPolicy,
    JsonSchemaPolicy,
    KeyPatternPolicy,
    MaxRecordBytesPolicy,
    RequiredHeadersPolicy,
)
from policies.builtin.producer import ProducerStatePolicy
from policies.builtin.request import AcksPolicy, CompressionPolicy

__all__ = ["REGISTRY", "BuiltinPolicy", "PolicyConfigError", "PolicyContext"]

REGISTRY: dict[str, type[BuiltinPolicy]] = {
    cls.name: cls
    for cls in (
        BatchIntegrityPolicy,
        CrcPolicy,
        OffsetsPolicy,
        TimestampsPolicy,
        CompactedKeyPolicy,
        MessageFormatPolicy,
        ProducerStatePolicy,
        MaxRecordBytesPolicy,
        RequiredHeadersPolicy,
        KeyPatternPolicy,
        JsonPolicy,
        JsonSchemaPolicy,
        AvroPolicy,
        CompressionPolicy,
        AcksPolicy,
    )
}
