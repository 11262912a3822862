"""The compiled fast accept of one engine's Produce requests (`kvproxy.protocol.fast_accept`):
each topic's compiled form from the engine's topic views, v13 topic ids named, the bounds of what
the engine decides on the event loop. A request it accepts is forwarded as it is; one it is not
sure of is decided by `ProduceEngine.decide` (docs/architecture.md, "The fast accept")."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from kvproxy.protocol.fast_accept import Accepted, FormFields, accept_produce
from kvproxy.protocol.framing import Frame
from kvproxy.proxy.ops.log_limits import LineLimit
from kvproxy.proxy.produce.decision import ProduceSettings
from kvproxy.proxy.produce.topic_views import TopicView, TopicViews

__all__ = ["IDS_KEPT", "CompiledAccept"]

IDS_KEPT = 10_000
"""Topic ids whose `uuid.UUID` the fast accept keeps (clients choose them: bounded)."""
_failures = LineLimit("fast accept failures", logging.getLogger("kvproxy"))
"""A failing fast accept is logged at most once per interval (the request is decided in Python)."""


class CompiledAccept:
    """One engine's fast accept: `accept(frame)` is its answer for a request."""

    __slots__ = ("_ids", "_limits", "_topic_named", "_view_now")

    def __init__(
        self,
        views: TopicViews,
        settings: ProduceSettings,
        topic_named: Callable[[uuid.UUID], str | None] | None = None,
    ) -> None:
        self._view_now: Callable[[str], TopicView] = views.view
        self._topic_named = topic_named
        """The name of a Produce v13 topic id, when known (None: no id is)."""
        self._ids: dict[bytes, uuid.UUID] = {}
        """The v13 topic ids the fast accept was given, as `uuid.UUID`s (at most `IDS_KEPT`)."""
        limit = settings.max_records_per_request
        self._limits = (
            settings.inline_max_partitions,
            settings.inline_max_records,
            -1 if limit is None else limit,
        )
        """The accept's bounds: what `decide` decides on the loop, and the request limit."""

    def accept(self, frame: Frame, now_ms: int | None = None) -> Accepted | None:
        """The counts of a request every partition of which passes its topic's checks, or None
        when the fast accept is not sure. `now_ms` as `ProduceEngine.decide`'s."""
        partitions, records, request_records = self._limits
        try:
            return accept_produce(
                frame,
                self._form,
                int(time.time() * 1000) if now_ms is None else now_ms,
                partitions,
                records,
                request_records,
            )
        except Exception:  # a form that cannot be read: never the client's failure
            _failures.log(
                logging.ERROR, "the fast accept failed; deciding in Python", exc_info=True
            )
            return None

    def _form(self, topic: str | bytes) -> tuple[str, FormFields] | None:
        """A topic's name and compiled form now (by its v13 id: named if known)."""
        if type(topic) is bytes:
            if self._topic_named is None:
                return None
            topic_id = self._ids.get(topic)
            if topic_id is None:  # a UUID costs more to make than the rest of the lookup
                if len(self._ids) >= IDS_KEPT:
                    self._ids.clear()
                topic_id = self._ids[topic] = uuid.UUID(bytes=topic)
            name = self._topic_named(topic_id)
            if name is None:
                return None
            topic = name
        return self._view_now(topic).accept  # type: ignore[arg-type]
