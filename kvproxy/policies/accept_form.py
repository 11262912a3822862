"""A policy's compiled fast-accept form: what a partition must satisfy for its check to pass.

The compiled fast accept (`kvproxy.protocol.fast_accept`) proves that no check of a topic's
chain fires, without restating any: it only knows a few conditions, and each policy that can be
proven that way says which of them it needs (its optional `accept_form(config)` method, read by
`kvproxy.policies.declaration`). A chain whose every policy has a form has one, the forms merged
(the strictest of each); a chain with one policy without a form has none, and every request to
its topics is decided by the Python path.

Every partition the fast accept passes is also plainly well formed whatever the forms say: one
uncompressed magic-2 batch at base offset 0, CreateTime, neither control nor carrying bits the
proxy does not know, its CRC32C right, its records walked exactly (offset deltas 0, 1, ...,
lengths, header keys in UTF-8), and transactional only with a transactional id. A form adds:
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ANY_PARTITION", "AcceptForm", "merged_forms"]

_INT64_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class AcceptForm:
    """The conditions one policy's check needs, on top of the plain shape."""

    max_batch_bytes: int | None = None
    """The batch's size (offset and length included) at most this (max.message.bytes)."""
    max_partition_bytes: int | None = None
    """The partition's records at most this many bytes (segment.bytes)."""
    timestamp_window: tuple[int, int] | None = None
    """(before max ms, after max ms): every record's timestamp within [now - before,
    now + after] (CreateTime topics)."""
    keys_required: bool = False
    """Every record has a key (compacted topics)."""

    def __post_init__(self) -> None:
        if self.timestamp_window is not None and min(self.timestamp_window) < 0:
            raise ValueError(f"a timestamp window is two bounds >= 0, not {self.timestamp_window}")

    def merged(self, other: AcceptForm) -> AcceptForm:
        """Both forms' conditions: the smaller limit, the narrower window."""
        window = self.timestamp_window
        if window is None:
            window = other.timestamp_window
        elif other.timestamp_window is not None:
            window = (
                min(window[0], other.timestamp_window[0]),
                min(window[1], other.timestamp_window[1]),
            )
        return AcceptForm(
            _smaller(self.max_batch_bytes, other.max_batch_bytes),
            _smaller(self.max_partition_bytes, other.max_partition_bytes),
            window,
            self.keys_required or other.keys_required,
        )

    def fields(self) -> tuple[int, int, int, int, int]:
        """The form as the compiled accept reads it: -1 for no limit, every value within a
        signed 64-bit long (a larger one lowered to it: only ever stricter)."""
        before, after = (-1, -1) if self.timestamp_window is None else self.timestamp_window
        return (
            _field(self.max_batch_bytes),
            _field(self.max_partition_bytes),
            _field(before),
            _field(after),
            int(self.keys_required),
        )


ANY_PARTITION = AcceptForm()
"""The form of a check that the plain shape alone proves passes (the CRC, the offsets)."""


def merged_forms(forms: list[AcceptForm | None]) -> AcceptForm | None:
    """The chain's form: every policy's merged, or None when one of them has none."""
    merged = ANY_PARTITION
    for form in forms:
        if form is None:
            return None
        merged = merged.merged(form)
    return merged


def _smaller(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _field(value: int | None) -> int:
    if value is None:
        return -1
    return min(max(value, 0), _INT64_MAX)  # a negative limit: no batch passes it
