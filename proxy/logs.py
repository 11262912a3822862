"""kvproxy's log output: human-readable or JSON lines, and the rejection log.

Every rejection is logged once with its topic, partition, policy, code, message, client id and
client address, as structured fields (`extra`) so the JSON format carries them as keys.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from protocol.error_codes import error_name

log = logging.getLogger("kvproxy.rejections")


@dataclass(frozen=True, slots=True)
class RejectionEvent:
    topic: str
    partition: int
    policy: str
    code: int
    message: str | None
    client_id: str | None
    client_address: str
    enforced: bool
    """False in warn mode: the batch was forwarded, the rejection only logged and counted."""


class RejectionLogger:
    """Logs rejections."""

    def rejected(self, event: RejectionEvent) -> None:
        log.warning(
            "%s %s-%d: policy %s, code %d (%s): %s [client %s at %s]",
            "rejected" if event.enforced else "would reject (warn mode)",
            event.topic,
            event.partition,
            event.policy,
            event.code,
            error_name(event.code),
            event.message,
            event.client_id,
            event.client_address,
            extra={
                "event": "rejection",
                "topic": event.topic,
                "partition": event.partition,
                "policy": event.policy,
                "code": event.code,
                "error": error_name(event.code),
                "error_message": event.message,
                "client_id": event.client_id,
                "client_address": event.client_address,
                "enforced": event.enforced,
            },
        )
