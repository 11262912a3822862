"""How much client-chosen text the proxy writes out per log line or quarantine entry.

A Produce request carries topic names and a client id of up to 32,767 characters each, and a
policy's message may quote what it read. Logged or journalled whole, one connection inventing
names wrote 64 KB lines at several MB/s. Every such string is clipped to a fixed length, with the
number of characters left out, so a line or an entry's metadata has a size known in advance.
"""

from __future__ import annotations

import re
from typing import Final, overload

from kvproxy.protocol.topics import MAX_TOPIC_NAME_CHARS

__all__ = [
    "MAX_CLIENT_ID_CHARS",
    "MAX_MESSAGE_CHARS",
    "MAX_RECORD_INDEXES",
    "MAX_TOPIC_CHARS",
    "clip",
]

MAX_TOPIC_CHARS: Final = MAX_TOPIC_NAME_CHARS
"""A longer name cannot be a Kafka topic: 249 characters say which name it was."""
MAX_CLIENT_ID_CHARS: Final = 256
"""Client ids are short in practice (`rdkafka`, `producer-1`, `app@host`)."""
MAX_MESSAGE_CHARS: Final = 2000
"""A rejection message: the policy's reason, with at most three record errors quoted."""
MAX_RECORD_INDEXES: Final = 1000
"""Record indexes kept per quarantine entry; the rest are counted (`record_indexes_omitted`)."""


@overload
def clip(text: str, limit: int) -> str: ...
@overload
def clip(text: None, limit: int) -> None: ...
@overload
def clip(text: str | None, limit: int) -> str | None: ...
def clip(text: str | None, limit: int) -> str | None:
    """`text` cut to `limit` characters, followed by `...(+N chars)` when it was longer.

    A clipped topic name ends in characters no topic name may hold, so it never names a real one.
    Clipping a clipped text changes nothing (an entry read back and written again stays as is).
    """
    if text is None or len(text) <= limit:
        return text
    if _CLIPPED.fullmatch(text, limit) and len(text) <= limit + _MARK_MAX:
        return text
    return f"{text[:limit]}...(+{len(text) - limit} chars)"


_CLIPPED = re.compile(r"\.\.\.\(\+[1-9][0-9]{0,19} chars\)")
"""What `clip` appends (matched from position `limit` of a clipped text)."""
_MARK_MAX = len("...(+ chars)") + 20
