"""Quarantine entries made up by tests, as the proxy would write them (a fresh id, a time)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from proxy.quarantine import QuarantineEntry


def new_entry(
    kind: str,
    topic: str,
    partition: int,
    *,
    clock: Callable[[], float] = time.time,
    **fields: Any,
) -> QuarantineEntry:
    """A new entry with a fresh id (uuid4 as 32 hex digits) and the current time."""
    return QuarantineEntry(
        id=uuid.uuid4().hex,
        time_ms=int(clock() * 1000),
        kind=kind,
        topic=topic,
        partition=partition,
        **fields,
    )


def replay_mark(
    replayed: QuarantineEntry, *, clock: Callable[[], float] = time.time
) -> QuarantineEntry:
    """The "replayed" mark of `replayed` (same topic and partition, no records)."""
    return new_entry(
        "replayed", replayed.topic, replayed.partition, clock=clock, replayed_id=replayed.id
    )
