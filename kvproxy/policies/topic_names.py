"""The rule of a Produce to a name that cannot be a Kafka topic (`kvproxy.protocol.topics`: more
than 249 characters, or characters other than letters, digits, `.`, `_`, `-`).

Such a topic cannot exist, so the proxy answers as the broker does for a topic it does not
have, UNKNOWN_TOPIC_OR_PARTITION (3), without matching the name against any rule: a client
chooses the name, and a long one would otherwise be matched against every pattern on every
request. Nothing of the batch is kept (`Verdict.resend`): the broker keeps nothing either, and
the client's retries would each add a copy.
"""

from __future__ import annotations

from typing import Final

from kvproxy.policies.api import ProducedRecords, Verdict
from kvproxy.protocol import error_codes
from kvproxy.protocol.topics import MAX_TOPIC_NAME_CHARS

__all__ = ["NO_SUCH_TOPIC", "NoSuchTopicPolicy"]

NO_SUCH_TOPIC: Final = "no_such_topic"


class NoSuchTopicPolicy:
    """Refuses every partition with UNKNOWN_TOPIC_OR_PARTITION, as Kafka answers a Produce to a
    topic it does not have (whatever the name: it sends no message)."""

    name = NO_SUCH_TOPIC

    def validate(self, topic: str, partition: int, batch: ProducedRecords) -> Verdict:
        shown = topic[:64] + ("..." if len(topic) > 64 else "")
        return Verdict(
            error_codes.UNKNOWN_TOPIC_OR_PARTITION,
            f"{shown!r} ({len(topic)} characters) cannot be a topic name: at most "
            f"{MAX_TOPIC_NAME_CHARS} of ASCII letters, digits, '.', '_' and '-'",
            policy=NO_SUCH_TOPIC,
            resend=True,
        )

    def close(self) -> None:
        """Holds nothing."""
