"""Produce decisions: the policy rules in force, and where each request is decided.

A request cheap to check is decided on the event loop; one that needs more decoding memory than
`INLINE_DECODE_BYTES` (or more records than the engine decides inline) is decided on the decoding
thread. What the chains need is gathered before they run: the topic settings a check reads are
described first when the cache lacks them, and the schema ids the records carry that the
catalog cannot answer are looked up (`kvproxy.proxy.lookups.schema_ids`); then the chains run once.
A reload swaps the rules (`replace`): a request already decided keeps its verdict.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from kvproxy.policies.chain import PolicyChain
from kvproxy.policies.config import TopicRouting
from kvproxy.policies.schemas.model import SchemaCatalog
from kvproxy.protocol.budget import Allowance, InlineLimitReached, MemoryBudget
from kvproxy.protocol.error_codes import ErrorProfile
from kvproxy.protocol.framing import Frame
from kvproxy.protocol.messages import Request
from kvproxy.protocol.produce_topics import (
    FIRST_WITH_TOPIC_IDS,
    is_unknown_id,
    name_topics,
    topic_name,
    unnamed_ids,
)
from kvproxy.proxy.config.proxy_config import ProxyConfig
from kvproxy.proxy.lookups.schema_ids import reads_schemas, request_schema_ids
from kvproxy.proxy.lookups.topic_configs import TopicConfigCache
from kvproxy.proxy.lookups.topic_ids import TopicIds
from kvproxy.proxy.ops.metrics import ProxyMetrics
from kvproxy.proxy.produce.decision import ProduceDecision, ProduceSettings
from kvproxy.proxy.produce.decoding_thread import DecodingThread
from kvproxy.proxy.produce.engine import ProduceEngine
from kvproxy.registry.catalog import RegistryCatalog

INLINE_DECODE_BYTES = 4 * 1024 * 1024
"""Decoding memory a Produce request may use on the event loop (a few milliseconds of work);
one that needs more is decided again on the decoding thread."""


class ProduceDecider:
    """The rules in force (`routing`, `engine`) and the entry points that decide a request."""

    def __init__(
        self,
        config: ProxyConfig,
        routing: TopicRouting,
        topic_configs: TopicConfigCache,
        decode_memory: MemoryBudget,
        metrics: ProxyMetrics,
        *,
        schemas: RegistryCatalog | None = None,
        topic_ids: TopicIds | None = None,
    ) -> None:
        self.config = config
        self.schemas = schemas
        self.topic_ids = (
            TopicIds(tuple, None, 1.0, config.topic_configs) if topic_ids is None else topic_ids
        )
        """Topic id -> name, for Produce v13 (kept across reloads)."""
        """The registry's answers (`schema_registry` section), kept across reloads."""
        self.routing = routing
        self.topic_configs = topic_configs
        self.decode_memory = decode_memory
        """What every Produce request being decoded may hold together."""
        self.metrics = metrics
        self.decoding = DecodingThread()
        """Where a request too costly to check on the event loop is checked."""
        self.off_loop = self.decoding.run
        self.engine = self._make_engine()

    def replace(self, config: ProxyConfig, routing: TopicRouting) -> TopicRouting:
        """Decide the next requests under `routing` and `config`'s reloadable sections; returns
        the routing replaced."""
        old = self.routing
        self.routing = routing
        self.config = config
        self.topic_ids.settings = config.topic_configs
        self.engine = self._make_engine()
        return old

    def close(self) -> None:
        self.decoding.close()

    def decide_now(
        self, engine: ProduceEngine, payload: Frame, request: Request
    ) -> ProduceDecision | None:
        """The decision, made on the event loop, or None when it needs more than
        `INLINE_DECODE_BYTES` of decoding or more than the engine's inline record count, or
        schema ids looked up first."""
        chains = self._schema_chains(engine, request)
        if chains is not None:
            assert self.schemas is not None
            if self._schema_ids_inline(engine, request, chains, self.schemas) != set():
                return None  # ids to look up first, or too many records to read them here
        return self._decide_on_loop(engine, payload, request, self.schemas)

    async def decide_later(
        self, engine: ProduceEngine, payload: Frame, request: Request, topics: list[str]
    ) -> ProduceDecision:
        """The decision of a request `decide_now` could not make: the topics described, the
        schema ids the checks will read that the catalog lacks looked up (one round, at most
        `max_lookups_per_request` ids, waiting at most `request_wait_ms`; an id still missing
        then is answered as the registry unavailable), then decided on the loop if that is
        cheap, else on the decoding thread.

        The lookups are shared as this connection's (`RegistryCatalog.fetch`'s owner is this
        task: a connection decides one request at a time); when it goes, its task is
        cancelled, and lookups nobody else waits for with it."""
        if topics:
            await self.describe_topics(topics)
        schemas: SchemaCatalog | None = self.schemas
        chains = self._schema_chains(engine, request)
        if chains is not None:
            assert self.schemas is not None
            loop = asyncio.get_running_loop()
            started = loop.time()
            wanted = await self._schema_ids_wanted(engine, request, chains, self.schemas)
            if wanted:
                wait_ms = self.schemas.config.request_wait_ms
                fetched = await self.schemas.fetch(
                    wanted,
                    owner=asyncio.current_task(),
                    wait_s=max(0.0, started + wait_ms / 1000 - loop.time()),
                )
                schemas = self.schemas.with_answers(fetched, exhausted=True)
        decision = self._decide_on_loop(engine, payload, request, schemas)
        if decision is None:
            decision = await self._decide_off_loop(engine, payload, request, schemas)
        return decision

    def _schema_chains(
        self, engine: ProduceEngine, request: Request
    ) -> dict[str, PolicyChain] | None:
        """The chains of the request's topics when one of them reads schema ids and there is a
        registry to ask; else None (nothing to gather)."""
        if self.schemas is None:
            return None
        chains = {
            name: engine.routing.chain_for(name)
            for name in {topic_name(topic) for topic in request.body.topic_data}
        }
        return chains if reads_schemas(chains) else None

    async def _schema_ids_wanted(
        self,
        engine: ProduceEngine,
        request: Request,
        chains: dict[str, PolicyChain],
        catalog: RegistryCatalog,
    ) -> set[int]:
        """`request_schema_ids`, read on the loop when cheap, else on the decoding thread."""
        wanted = self._schema_ids_inline(engine, request, chains, catalog)
        if wanted is not None:
            return wanted
        limit = self.config.limits.decode_bytes_per_request
        now_ms = _now_ms()

        def read() -> set[int]:
            full = Allowance(limit, self.decode_memory)
            try:
                return request_schema_ids(request, chains, catalog, full, now_ms)
            finally:
                full.release()

        return await self.off_loop(read)

    def _schema_ids_inline(
        self,
        engine: ProduceEngine,
        request: Request,
        chains: dict[str, PolicyChain],
        catalog: SchemaCatalog,
    ) -> set[int] | None:
        """`request_schema_ids` read on the loop, or None when that is not cheap."""
        settings = engine.settings
        allowance = Allowance(INLINE_DECODE_BYTES, self.decode_memory, inline=True)
        try:
            return request_schema_ids(
                request,
                chains,
                catalog,
                allowance,
                _now_ms(),
                max_records=settings.inline_max_records,
                max_partitions=settings.inline_max_partitions,
            )
        except InlineLimitReached:
            return None
        finally:
            allowance.release()

    def _decide_on_loop(
        self,
        engine: ProduceEngine,
        payload: Frame,
        request: Request,
        schemas: SchemaCatalog | None,
    ) -> ProduceDecision | None:
        """The decision on the loop, or None when it is not cheap (`InlineLimitReached`)."""
        allowance = Allowance(INLINE_DECODE_BYTES, self.decode_memory, inline=True)
        try:
            return engine.decide(payload, request, allowance=allowance, schemas=schemas)
        except InlineLimitReached:
            return None
        finally:
            allowance.release()

    async def _decide_off_loop(
        self,
        engine: ProduceEngine,
        payload: Frame,
        request: Request,
        schemas: SchemaCatalog | None,
    ) -> ProduceDecision:
        """The decision, made on the decoding thread with the full per-request allowance."""
        topics = engine.views.of_request(request)  # the routing's caches are read on the loop only
        allowance = Allowance(self.config.limits.decode_bytes_per_request, self.decode_memory)
        self.metrics.off_loop_decisions.inc()

        def decide() -> ProduceDecision:
            try:
                return engine.decide(
                    payload, request, allowance=allowance, topics=topics, schemas=schemas
                )
            finally:
                allowance.release()

        return await self.off_loop(decide)

    def topics_to_describe(self, request: Request, client: object | None = None) -> list[str]:
        """Topics whose settings a check reads, that the YAML does not give and the proxy has
        not learned yet (`TopicRouting.settings_needed`), within `client`'s lookup budget
        (`TopicConfigCache.admit`: the others are decided with their settings unknown)."""
        wanted = []
        for topic_data in request.body.topic_data:
            if is_unknown_id(topic_data):
                continue
            topic = topic_name(topic_data)
            if self.routing.settings_needed(topic) and not self.topic_configs.known(topic):
                wanted.append(topic)
        return self.topic_configs.admit(wanted, client) if wanted else wanted

    def name_topics(
        self, request: Request, client: object | None = None
    ) -> tuple[Request, list[uuid.UUID]]:
        """A Produce v13 request with its topics named (`kvproxy.protocol.produce_topics`),
        and the ids to ask the cluster about before it is decided, within `client`'s lookup
        budget (an id not asked, or not known, is answered UNKNOWN_TOPIC_ID)."""
        if request.header.api_version < FIRST_WITH_TOPIC_IDS:
            return request, []
        named = name_topics(request, self.topic_ids.name_of)
        missing = self.topic_ids.missing(unnamed_ids(named))
        return named, self.topic_ids.admit(missing, client) if missing else []

    async def name_after_asking(
        self, request: Request, ids: list[uuid.UUID], client: object | None
    ) -> tuple[Request, list[str]]:
        """`name_topics` once `ids` are asked about, and the topics it names to describe."""
        await self.topic_ids.resolve(ids)
        named = name_topics(request, self.topic_ids.name_of)
        return named, self.topics_to_describe(named, client)

    async def describe_topics(self, topics: list[str]) -> None:
        await self.topic_configs.refresh(topics)

    def _make_engine(self) -> ProduceEngine:
        errors = self.config.errors
        return ProduceEngine(
            self.routing,
            ProduceSettings(
                profile=ErrorProfile(errors.profile),
                legacy_below=errors.legacy_below,
                legacy_code=errors.legacy_code,
                reject_request=self.config.reject == "request",
                max_records_per_request=self.config.limits.max_records_per_request,
            ),
            self.topic_configs.compacted,
            self.topic_configs.config,
            self.topic_ids.name_of,
        )


def _now_ms() -> int:
    return int(time.time() * 1000)
