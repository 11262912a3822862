"""Each topic's chain and settings now: the routing's rule for it, with the YAML's settings over
those learned from the cluster, kept per topic while neither changes (a request costs two
lookups per topic, not a new view)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvproxy.policies.api import UNKNOWN_TOPIC_CONFIG, TopicConfig
from kvproxy.policies.chain import PolicyChain
from kvproxy.policies.config import TopicRouting, TopicRule
from kvproxy.protocol.fast_accept import FormFields
from kvproxy.protocol.messages import Request
from kvproxy.protocol.produce_topics import is_unknown_id, topic_name

__all__ = ["TopicView", "TopicViews"]

_VIEWS_KEPT = 10_000
"""Topics whose chain and settings are kept (as many as the routing keeps rules of)."""


@dataclass(frozen=True, slots=True)
class TopicView:
    """A topic's chain and settings, read on the event loop for a decision made elsewhere
    (the routing's caches belong to the loop's thread, and a reload may replace it meanwhile)."""

    chain: PolicyChain
    config: TopicConfig
    """The YAML's settings over those learned from the cluster."""
    accept: tuple[str, FormFields] | None = None
    """(name, the chain's compiled form on these settings) for the fast accept; None when the
    chain has none, or reads settings the cluster has not told yet (the Python path describes
    the topic first)."""

    @property
    def compacted(self) -> bool | None:
        return self.config.compacted


def _yaml_over_cluster(override: TopicConfig, learned: TopicConfig) -> TopicConfig:
    """The settings a topic's checks read: the YAML's (`override`) over the cluster's."""
    if override is UNKNOWN_TOPIC_CONFIG:
        return learned
    if learned is UNKNOWN_TOPIC_CONFIG:
        return override
    return override.over(learned)


def _accept(
    topic: str, rule: TopicRule, learned: TopicConfig, config: TopicConfig
) -> tuple[str, FormFields] | None:
    if rule.needs and learned is UNKNOWN_TOPIC_CONFIG:
        return None  # settings to describe first: the Python path does
    if rule.chain.observers:
        return None  # the broker's answer is shown to a policy: the exchange's to do
    form = rule.chain.accept_form(config)
    return None if form is None else (topic, form.fields())


class TopicViews:
    """The views of one routing's topics, made when first asked and again when the rule or
    the cluster's settings they were made of change."""

    def __init__(
        self,
        routing: TopicRouting,
        compacted: Callable[[str], bool | None],
        learned: Callable[[str], TopicConfig] | None = None,
    ) -> None:
        self._routing = routing
        self._compacted = compacted
        self._learned = learned
        """The cluster's settings of a topic; None: its compaction alone (`compacted`)."""
        self._views: dict[str, tuple[TopicRule, TopicConfig, TopicView]] = {}

    def config_for(self, topic: str) -> TopicConfig:
        """The settings a topic's checks read: the YAML's over the cluster's."""
        return self.view(topic).config

    def view(self, topic: str) -> TopicView:
        """A topic's chain and settings now (at most `_VIEWS_KEPT` names are kept: clients
        choose them; the oldest goes first)."""
        rule = self._routing.rule_for(topic)
        if self._learned is not None:
            learned = self._learned(topic)
        else:
            compacted = self._compacted(topic)
            learned = UNKNOWN_TOPIC_CONFIG if compacted is None else TopicConfig(compacted)
        kept = self._views.get(topic)
        if kept is not None and kept[0] is rule and (kept[1] is learned or kept[1] == learned):
            return kept[2]
        config = _yaml_over_cluster(rule.config, learned)
        view = TopicView(rule.chain, config, _accept(topic, rule, learned, config))
        if kept is None and len(self._views) >= _VIEWS_KEPT:
            del self._views[next(iter(self._views))]  # the oldest name
        self._views[topic] = (rule, learned, view)
        return view

    def of_request(self, request: Request) -> dict[str, TopicView]:
        """Each topic of a Produce request with its view now, for `ProduceEngine.decide(topics=)`
        (a decision made off the loop reads no cache)."""
        return {
            topic_name(topic): self.view(topic_name(topic))
            for topic in request.body.topic_data
            if not is_unknown_id(topic)
        }
