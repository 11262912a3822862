"""What a Kafka topic name can be: at most 249 characters of ASCII letters, digits, `.`, `_`, `-`.

A name a client sends need not be one (Produce and Metadata carry any string). Anything keyed by
topic name in the proxy keys by what the client chose, so a name that cannot be a topic is never
kept (it cannot be a broker's topic either: Kafka refuses to create it).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Final

__all__ = ["MAX_TOPIC_NAME_CHARS", "is_legal_topic_name"]

MAX_TOPIC_NAME_CHARS: Final = 249
"""Kafka's `Topic.MAX_NAME_LENGTH`: 255 minus room for a partition suffix in a log directory."""

_LEGAL = re.compile(r"[a-zA-Z0-9._-]{1,249}")


@lru_cache(maxsize=4096)  # each request asks again of the same few names; clients choose them
def is_legal_topic_name(name: str) -> bool:
    """Kafka's `Topic.validate`: 1-249 legal characters, and neither `.` nor `..`."""
    return _LEGAL.fullmatch(name) is not None and name not in {".", ".."}
