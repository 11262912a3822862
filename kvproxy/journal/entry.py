"""`QuarantineEntry`: one journal entry, and its metadata as stored (bounded, versioned)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvproxy.journal.bounds import (
    MAX_CLIENT_ID_CHARS,
    MAX_MESSAGE_CHARS,
    MAX_RECORD_INDEXES,
    MAX_TOPIC_CHARS,
    clip,
)

METADATA_VERSION = 1
"""The `v` key of every entry's metadata; readers ignore keys they do not know."""


@dataclass(frozen=True, slots=True)
class QuarantineEntry:
    """One quarantined partition (or a mark saying an earlier entry was replayed)."""

    id: str
    time_ms: int
    kind: str  # "rejected" | "warned" | "replayed"
    topic: str
    partition: int
    client_id: str | None = None
    client_address: str | None = None
    produce_version: int = -1
    policy: str | None = None
    code: int = 0
    message: str | None = None
    record_indexes: tuple[int, ...] = ()
    records: bytes = b""  # the original records bytes (empty for "replayed" marks)
    replayed_id: str | None = None  # kind "replayed": the id of the entry replayed
    record_indexes_omitted: int = 0
    """Record indexes left out of the stored metadata (beyond `MAX_RECORD_INDEXES`)."""

    def to_metadata(self) -> dict[str, Any]:
        """The JSON object stored in the entry (everything but the records).

        Its size is bounded whatever the client sent: topic, client id and message are clipped
        (`kvproxy.journal.bounds`) and at most `MAX_RECORD_INDEXES` record indexes are kept, the
        number of the others in `record_indexes_omitted`."""
        omitted = self.record_indexes_omitted + max(
            0, len(self.record_indexes) - MAX_RECORD_INDEXES
        )
        metadata = {
            "v": METADATA_VERSION,
            "id": self.id,
            "time_ms": self.time_ms,
            "kind": self.kind,
            "topic": clip(self.topic, MAX_TOPIC_CHARS),
            "partition": self.partition,
            "client_id": clip(self.client_id, MAX_CLIENT_ID_CHARS),
            "client_address": self.client_address,
            "produce_version": self.produce_version,
            "policy": self.policy,
            "code": self.code,
            "message": clip(self.message, MAX_MESSAGE_CHARS),
            "record_indexes": list(self.record_indexes[:MAX_RECORD_INDEXES]),
            "replayed_id": self.replayed_id,
        }
        if omitted:
            metadata["record_indexes_omitted"] = omitted
        return metadata

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], records: bytes = b"") -> QuarantineEntry:
        """The entry back from its metadata; ValueError when a field is missing or mistyped.

        Unknown keys are ignored (later versions may add some); optional keys may be absent.
        """
        return cls(
            id=_field(metadata, "id", str),
            time_ms=_field(metadata, "time_ms", int),
            kind=_field(metadata, "kind", str),
            topic=_field(metadata, "topic", str),
            partition=_field(metadata, "partition", int),
            client_id=_optional(metadata, "client_id", str),
            client_address=_optional(metadata, "client_address", str),
            produce_version=_optional(metadata, "produce_version", int, -1),
            policy=_optional(metadata, "policy", str),
            code=_optional(metadata, "code", int, 0),
            message=_optional(metadata, "message", str),
            record_indexes=tuple(_int_list(metadata.get("record_indexes"))),
            records=bytes(records),
            replayed_id=_optional(metadata, "replayed_id", str),
            record_indexes_omitted=_optional(metadata, "record_indexes_omitted", int, 0),
        )


def _field(metadata: Mapping[str, Any], key: str, kind: type[Any]) -> Any:
    value = metadata.get(key)
    if not _is(value, kind):
        raise ValueError(f"journal metadata: {key!r} must be {kind.__name__}, got {value!r}")
    return value


def _optional(metadata: Mapping[str, Any], key: str, kind: type[Any], default: Any = None) -> Any:
    value = metadata.get(key)
    if value is None:
        return default
    return _field(metadata, key, kind)


def _is(value: Any, kind: type[Any]) -> bool:
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _int_list(value: Any) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(_is(item, int) for item in value):
        raise ValueError(f"journal metadata: 'record_indexes' must be a list of int: {value!r}")
    return value
