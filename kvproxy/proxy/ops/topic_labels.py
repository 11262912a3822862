"""The `topic` label of the metrics: a topic's name once the cluster says the topic exists.

A Produce request may name any string, and some brokers (Tansu) accept records for a name that
is no topic. Labelled by what clients send, 2,000 invented names made 6,065 series, and 1,000
names of 32,000 characters a 192 MB /metrics answer. So a name becomes a label value only when
the cluster knows the topic, and only the first `metrics.topic_label_limit` such topics get one:

- `<name>`: the topic exists (one of the first `limit` topics counted);
- `_other`: the topic exists, but `limit` others already have labels;
- `_unknown`: the cluster says there is no such topic, the name cannot be a topic (longer than
  249 characters, or characters Kafka refuses), or the cluster could not be asked.

What the cluster knows is learned from Metadata: the answers the proxy relays to clients (`seen`:
every client asks for a topic's leader before producing to it, so most topics are known before
their first batch arrives), and otherwise a Metadata request of the proxy's own (v4, with
`allow_auto_topic_creation` false, so asking creates nothing), sent in the background for the
names not known yet, at most one request at a time for up to `MAX_PENDING` names. Metadata
answers the same on Kafka and Tansu; DescribeConfigs (which `topic_configs.py` sends) does not:
Tansu describes any name without an error. Until the answer comes, what was counted for a name is
held (per metric and label values, not per request) and then added under the label the answer
gives; /metrics waits for the answers pending when it is asked (`flush`), so a scrape after a
request sees it counted. Memory is bounded: `MAX_KNOWN` names remembered (least recently used
dropped first), `MAX_PENDING` names held, `limit` names labelled.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

from kvproxy.protocol.topics import is_legal_topic_name

log = logging.getLogger("kvproxy")

__all__ = [
    "ABSENT_TTL_S",
    "MAX_KNOWN",
    "MAX_PENDING",
    "OTHER_TOPICS",
    "UNKNOWN_TOPICS",
    "Lookup",
    "TopicLabels",
]

OTHER_TOPICS: Final = "_other"
UNKNOWN_TOPICS: Final = "_unknown"
MAX_KNOWN: Final = 10_000
"""Names whose existence is remembered (besides the labelled ones); at most 249 characters each."""
MAX_PENDING: Final = 1_000
"""Names waiting for the cluster's answer; a name beyond them is counted as `_unknown` at once."""
ABSENT_TTL_S: Final = 30.0
"""How long "no such topic" is believed: a topic created since is labelled after this at most."""
FAILURE_BACKOFF_S: Final = 5.0
"""After a lookup failed (the cluster did not answer), new names count as `_unknown` this long."""

Lookup = Callable[[list[str]], Awaitable[dict[str, bool | None]]]
"""Asks the cluster about names: True (the topic exists), False (it does not), None or missing
(it cannot say); raises when no broker answers."""

_Counts = dict[tuple[Any, tuple[str, ...]], float]
"""(metric, label values after the topic) -> amount, held for one name."""


class TopicLabels:
    """Chooses the topic label value and counts under it (see the module's docstring)."""

    def __init__(
        self,
        limit: int,
        child: Callable[..., Any],
        *,
        clock: Callable[[], float] = time.monotonic,
        max_known: int | None = None,
        max_pending: int | None = None,
    ) -> None:
        self.limit = limit
        self.lookup: Lookup | None = None
        """Set by the server; without it, names not known from Metadata answers are `_unknown`."""
        self._child = child
        self._clock = clock
        self._max_known = MAX_KNOWN if max_known is None else max_known
        self._max_pending = MAX_PENDING if max_pending is None else max_pending
        self._labelled: set[str] = set()
        self._labelled_cells: dict[tuple[Any, str, tuple[str, ...]], Any] = {}
        """(metric, labelled topic, rest) -> its child: a labelled topic keeps its label."""
        self._known: OrderedDict[str, float] = OrderedDict()
        """name -> until when the answer holds: inf for "exists", a time for "no such topic"."""
        self._queued: dict[str, _Counts] = {}
        self._queued_done: asyncio.Future[None] | None = None
        self._asking: dict[str, _Counts] = {}
        self._asking_done: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._failing_until = -math.inf
        self._failure_logged = False
        self._closed = False

    def sizes(self) -> dict[str, int]:
        """How many names each structure holds (all bounded)."""
        return {
            "labelled": len(self._labelled),
            "known": len(self._known),
            "pending": len(self._queued) + len(self._asking),
        }

    def label(self, topic: str) -> str | None:
        """The label value of `topic`, or None while the cluster has not been asked."""
        if topic in self._labelled:
            return topic
        if not is_legal_topic_name(topic):
            return UNKNOWN_TOPICS
        until = self._known.get(topic)
        if until is None:
            return None
        if until == math.inf:
            if len(self._labelled) < self.limit:
                self._labelled.add(topic)
                del self._known[topic]
                return topic
            self._known.move_to_end(topic)
            return OTHER_TOPICS
        if until > self._clock():
            return UNKNOWN_TOPICS
        del self._known[topic]
        return None

    def cell(self, metric: Any, topic: str, rest: tuple[str, ...]) -> Any:
        """The cell `count` adds to for a topic with a label of its own (None: none yet)."""
        return self._labelled_cells.get((metric, topic, rest))

    def count(self, metric: Any, topic: str, rest: tuple[str, ...], amount: float = 1) -> None:
        """`metric.labels(<topic label>, *rest).inc(amount)`, now or once the cluster answered."""
        cell = self._labelled_cells.get((metric, topic, rest))
        if cell is not None:
            cell.inc(amount)
            return
        label = self.label(topic)
        if label is not None:
            cell = self._child(metric, label, *rest)
            if topic in self._labelled:
                self._labelled_cells[metric, topic, rest] = cell
            cell.inc(amount)
            return
        held = self._queued.get(topic)
        if held is None:
            held = self._asking.get(topic)
        if held is None:
            if not self._can_ask():
                self._child(metric, UNKNOWN_TOPICS, *rest).inc(amount)
                return
            held = self._queued[topic] = {}
            self._ask_soon()
        key = (metric, rest)
        held[key] = held.get(key, 0) + amount

    def seen(self, topics: Iterable[str]) -> None:
        """Topics a Metadata answer of the cluster named without an error: they exist."""
        for topic in topics:
            if topic in self._labelled or not is_legal_topic_name(topic):
                continue
            self._remember(topic, math.inf)

    async def flush(self, timeout: float) -> None:
        """Wait (at most `timeout`) until what was counted before this call is under a label."""
        pending = [f for f in (self._asking_done, self._queued_done) if f is not None]
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    def close(self) -> None:
        """Stop asking; what is still held, and any name not known yet, counts as `_unknown`."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for held in (self._asking, self._queued):
            self._count_held(held, UNKNOWN_TOPICS)
            held.clear()
        for future in (self._asking_done, self._queued_done):
            if future is not None and not future.done():
                future.set_result(None)
        self._asking_done = self._queued_done = None

    # ---- internals ----

    def _can_ask(self) -> bool:
        return (
            self.lookup is not None
            and not self._closed
            and len(self._queued) + len(self._asking) < self._max_pending
            and self._clock() >= self._failing_until
        )

    def _ask_soon(self) -> None:
        loop = asyncio.get_running_loop()
        if self._queued_done is None:
            self._queued_done = loop.create_future()
        if self._task is None:
            self._task = loop.create_task(self._ask_all(), name="kvproxy-topic-labels")

    async def _ask_all(self) -> None:
        """Ask about every queued name, one request at a time, until none is left."""
        try:
            while self._queued and self.lookup is not None:
                self._asking, self._queued = self._queued, {}
                self._asking_done, self._queued_done = self._queued_done, None
                answers = await self._ask(self.lookup, list(self._asking))
                now = self._clock()
                for topic in self._asking:
                    exists = answers.get(topic)
                    if exists is True:
                        self._remember(topic, math.inf)
                    elif exists is False:
                        self._remember(topic, now + ABSENT_TTL_S)
                held, self._asking = self._asking, {}
                for topic, counts in held.items():
                    self._count_held({topic: counts}, self.label(topic) or UNKNOWN_TOPICS)
                done, self._asking_done = self._asking_done, None
                if done is not None and not done.done():
                    done.set_result(None)
        finally:
            self._task = None

    async def _ask(self, lookup: Lookup, topics: list[str]) -> dict[str, bool | None]:
        try:
            answers = await lookup(topics)
        except Exception as exc:  # whatever failed, the names count as _unknown
            self._failing_until = self._clock() + FAILURE_BACKOFF_S
            if not self._failure_logged:
                self._failure_logged = True
                log.warning(
                    "cannot ask the cluster which topics exist (%s): topics not named in a "
                    "Metadata answer are counted as %s until it answers",
                    exc,
                    UNKNOWN_TOPICS,
                )
            return {}
        self._failure_logged = False
        return answers

    def _remember(self, topic: str, until: float) -> None:
        self._known[topic] = until
        self._known.move_to_end(topic)
        while len(self._known) > self._max_known:
            self._known.popitem(last=False)

    def _count_held(self, held: dict[str, _Counts], label: str) -> None:
        for counts in held.values():
            for (metric, rest), amount in counts.items():
                self._child(metric, label, *rest).inc(amount)
