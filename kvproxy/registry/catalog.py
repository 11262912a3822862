"""What the registry said about schema ids, kept for a while: the `SchemaCatalog` the proxy's
`schema` policies read, filled by `fetch` with the ids gathered before the chain runs.

Each id is looked up by one task however many requests wait for it; the answer (found, unknown,
or the registry unavailable) is kept `cache_ttl_ms` or, for the last two,
`negative_cache_ttl_ms`, for at most `cache_max_schemas` ids (the oldest go first).

Lookups share `LOOKUPS_AT_ONCE` slots, at most `lookups_per_connection` per client connection,
served in turn (`LookupSlots`). A request waits at most `request_wait_ms` for its lookups; a
lookup whose last waiter leaves (its client gone, or that wait over) is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

from kvproxy.policies.schemas.formats import SchemaCompileError, compile_schema
from kvproxy.policies.schemas.model import (
    CompiledSchema,
    ReferencedSchema,
    RegisteredSchema,
    RegistryUnavailable,
    ResolvedSchema,
    SchemaCatalog,
    SchemaEntry,
    SchemaReference,
    SchemaType,
    UnknownSchema,
)
from kvproxy.registry.answers import (
    SCHEMA_NOT_FOUND,
    AnswerError,
    RegistryError,
    SchemaText,
    is_serialized_protobuf,
    read_schema,
    read_subjects,
    schema_path,
    subject_version_path,
    versions_path,
)
from kvproxy.registry.client import Answer, RegistryClient, RequestObserver, Unreachable
from kvproxy.registry.health import RegistryHealth
from kvproxy.registry.lookup_slots import LookupSlots
from kvproxy.settings.schema_registry import SchemaRegistryConfig

__all__ = ["CatalogObserver", "RegistryCatalog", "StaticCatalog", "resolve"]

log = logging.getLogger("kvproxy.registry")

LOOKUPS_AT_ONCE = 16
"""Ids looked up at the same time, for all clients together (each connection at most
`lookups_per_connection` of them): a client sending ids the registry has never heard of makes
its own requests wait, not the registry drown, nor the other clients wait."""
MAX_REFERENCES = 64
"""Schemas one schema may lead to through its references, transitively."""
FAILURE_LOG_INTERVAL_S = 10.0
PROBE_PATH = "/schemas/types"
"""What asks a registry known silent whether it answers again: small, and the same for every
registry (no id, no subject, nothing to cache)."""


@dataclass(frozen=True, slots=True)
class CatalogObserver:
    """Where the catalog reports what it does (the proxy's metrics); no-ops by default."""

    lookup: Callable[[str], None] = lambda outcome: None
    """Once per id looked up: "found", "unknown" or "unavailable"; "abandoned" when nobody
    waited for the answer any more (the lookup was cancelled), "wait_expired" per id a request
    stopped waiting for at `request_wait_ms`."""
    cache_hit: Callable[[], None] = lambda: None
    request: RequestObserver = lambda outcome, seconds: None


class RegistryCatalog:
    """The proxy's registry answers. `entry` is read by policies (on the event loop or the
    decoding thread); `fetch` runs on the event loop."""

    def __init__(
        self,
        config: SchemaRegistryConfig,
        observer: CatalogObserver | None = None,
    ) -> None:
        self.config = config
        self.observer = observer or CatalogObserver()
        self.client = RegistryClient(config, self.observer.request)
        self.accept_unavailable = config.on_error == "accept"
        self.recheck_ms = config.negative_cache_ttl_ms
        self._entries: OrderedDict[int, tuple[SchemaEntry, float]] = OrderedDict()
        self._lookups: dict[int, _Lookup] = {}
        self.slots = LookupSlots(LOOKUPS_AT_ONCE, config.lookups_per_connection)
        self.health = RegistryHealth(config.negative_cache_ttl_ms)
        self._probing: asyncio.Task[None] | None = None
        self._last_failure_log = 0.0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def lookups_in_flight(self) -> int:
        """Ids being looked up now (waiting for a slot included)."""
        return len(self._lookups)

    def entry(self, schema_id: int) -> SchemaEntry | None:
        found = self.peek(schema_id)
        if found is not None:
            self.observer.cache_hit()
        return found

    def peek(self, schema_id: int) -> SchemaEntry | None:
        held = self._entries.get(schema_id)
        if held is None or held[1] < time.monotonic():
            return None
        return held[0]

    def answers(self) -> dict[int, RegisteredSchema | UnknownSchema | RegistryUnavailable]:
        """What the registry said about each id held, as values that pickle (`StaticCatalog`)."""
        out: dict[int, RegisteredSchema | UnknownSchema | RegistryUnavailable] = {}
        for schema_id, (entry, _expires) in list(self._entries.items()):
            out[schema_id] = entry.registered if isinstance(entry, ResolvedSchema) else entry
        return out

    def with_answers(
        self, answers: dict[int, SchemaEntry], *, exhausted: bool = False
    ) -> SchemaCatalog:
        """This catalog with `answers` (what this request's lookups returned) over it; when
        `exhausted`, an id still missing is answered as the registry unavailable (the request
        may look up nothing more)."""
        return _RequestView(self, answers, exhausted)

    async def fetch(
        self,
        schema_ids: Iterable[int],
        *,
        owner: Hashable | None = None,
        wait_s: float | None = None,
    ) -> dict[int, SchemaEntry]:
        """Look up `schema_ids` (at most `max_lookups_per_request` of them), each once however
        many callers wait for it. What the registry said goes into the catalog and is returned:
        the caller decides with it (`with_answers`) even when the catalog may no longer hold it
        (a negative TTL of 0, or evicted meanwhile).

        `owner` is the client connection asking: its lookups hold at most
        `lookups_per_connection` slots (None: no share, the audit's driver). After `wait_s`
        the ids not answered yet are returned as the registry unavailable. A caller that stops
        waiting (cancelled, or `wait_s` over) leaves its lookups; one nobody waits for any
        more is cancelled."""
        wanted = sorted(set(schema_ids))[: self.config.max_lookups_per_request]
        joined = [self._join(schema_id, owner) for schema_id in wanted]
        try:
            if joined:
                await asyncio.wait([lookup.task for lookup in joined], timeout=wait_s)
        finally:
            for lookup in joined:
                self._leave(lookup)
        out: dict[int, SchemaEntry] = {}
        for lookup in joined:
            task = lookup.task
            if task.done() and not task.cancelled():
                out[lookup.schema_id] = task.result()
            else:
                out[lookup.schema_id] = self._wait_expired(lookup.schema_id)
        return out

    def _join(self, schema_id: int, owner: Hashable | None) -> _Lookup:
        lookup = self._lookups.get(schema_id)
        if lookup is None:
            task = asyncio.get_running_loop().create_task(self._lookup(schema_id, owner))
            lookup = self._lookups[schema_id] = _Lookup(schema_id, task)
            task.add_done_callback(lambda _task: self._looked_up(lookup))
        lookup.waiters += 1
        return lookup

    def _leave(self, lookup: _Lookup) -> None:
        """One waiter fewer; the last one out cancels a lookup still running (its slot goes
        to another lookup, its HTTP requests are closed)."""
        lookup.waiters -= 1
        if lookup.waiters > 0 or lookup.task.done():
            return
        lookup.task.cancel()
        self._looked_up(lookup)
        self.observer.lookup("abandoned")

    def _looked_up(self, lookup: _Lookup) -> None:
        if self._lookups.get(lookup.schema_id) is lookup:  # not a newer lookup of the same id
            del self._lookups[lookup.schema_id]

    def _wait_expired(self, schema_id: int) -> RegistryUnavailable:
        """The answer to a request that stopped waiting for `schema_id`: not kept (another
        request may still get the registry's own)."""
        wait_ms = self.config.request_wait_ms
        entry = RegistryUnavailable(
            schema_id, f"no answer within schema_registry.request_wait_ms ({wait_ms} ms)"
        )
        self.observer.lookup("wait_expired")
        self._log_failure(entry)
        return entry

    async def _lookup(self, schema_id: int, owner: Hashable | None) -> SchemaEntry:
        not_asked = self.health.not_asked()
        if not_asked is not None:  # the registry is known silent: no request, no slot
            if self.health.probe_due():
                self._probing = asyncio.get_running_loop().create_task(self._probe())
            entry = RegistryUnavailable(schema_id, not_asked)
            self._store(entry)
            return entry
        await self.slots.acquire(owner)
        try:
            return await self._lookup_now(schema_id)
        finally:
            self.slots.release(owner)

    async def _lookup_now(self, schema_id: int) -> SchemaEntry:
        fetched_ms = int(time.time() * 1000)
        health = self.health
        try:
            registered = await resolve(self.client, schema_id)
        except Unreachable as exc:
            entry: SchemaEntry = RegistryUnavailable(schema_id, str(exc)[:500])
            if exc.silent:
                health.unanswered(str(exc))
            else:
                health.answered()
        except (AnswerError, _Refused) as exc:
            health.answered()
            entry = RegistryUnavailable(schema_id, str(exc)[:500])
        else:
            health.answered()
            if registered is None:
                entry = UnknownSchema(schema_id)
            else:
                # compiling (fastjsonschema writes and runs code) stays off the event loop
                entry = await asyncio.to_thread(compiled, registered, fetched_ms)
        self._store(entry)
        return entry

    async def _probe(self) -> None:
        """Whether the registry answers again (any answer does), while lookups fail fast."""
        try:
            await self.client.get(PROBE_PATH)
        except Unreachable as exc:
            if exc.silent:
                self.health.unanswered(str(exc))
                return
        except BaseException:
            self.health.abandoned()
            raise
        self.health.answered()

    def _store(self, entry: SchemaEntry) -> None:
        config = self.config
        if isinstance(entry, ResolvedSchema):
            outcome, ttl = "found", config.cache_ttl_ms
        elif isinstance(entry, UnknownSchema):
            outcome, ttl = "unknown", config.negative_cache_ttl_ms
        else:
            outcome, ttl = "unavailable", config.negative_cache_ttl_ms
            self._log_failure(entry)
        self.observer.lookup(outcome)
        self._entries.pop(entry.schema_id, None)
        self._entries[entry.schema_id] = (entry, time.monotonic() + ttl / 1000)
        while len(self._entries) > config.cache_max_schemas:
            self._entries.popitem(last=False)

    def _log_failure(self, entry: RegistryUnavailable) -> None:
        now = time.monotonic()
        if now - self._last_failure_log < FAILURE_LOG_INTERVAL_S:
            return
        self._last_failure_log = now
        action = "let through unchecked" if self.accept_unavailable else "refused (retriable)"
        log.warning(
            "schema registry lookup of id %d failed: %s; records with it are %s for %d ms "
            "(on_error: %s)",
            entry.schema_id,
            entry.reason[:300],
            action,
            self.config.negative_cache_ttl_ms,
            self.config.on_error,
        )

    async def aclose(self) -> None:
        for lookup in list(self._lookups.values()):
            lookup.task.cancel()
        if self._probing is not None:
            self._probing.cancel()
        await self.client.aclose()


class _Lookup:
    """One id being looked up, and how many requests wait for it."""

    __slots__ = ("schema_id", "task", "waiters")

    def __init__(self, schema_id: int, task: asyncio.Task[SchemaEntry]) -> None:
        self.schema_id = schema_id
        self.task = task
        self.waiters = 0


class _RequestView:
    """The catalog as one request sees it: what its own lookups returned comes first."""

    def __init__(
        self, catalog: RegistryCatalog, answers: dict[int, SchemaEntry], exhausted: bool
    ) -> None:
        self._catalog = catalog
        self._answers = answers
        self._exhausted = exhausted
        self.accept_unavailable = catalog.accept_unavailable
        # a subject missing from an answer this request fetched is the registry's last word
        self.recheck_ms = 1 << 62 if exhausted else catalog.recheck_ms

    def entry(self, schema_id: int) -> SchemaEntry | None:
        found = self._answers.get(schema_id)
        if found is None:
            found = self._catalog.entry(schema_id)
        if found is None and self._exhausted:
            limit = self._catalog.config.max_lookups_per_request
            return RegistryUnavailable(
                schema_id, f"the request needs more than {limit} schema ids looked up"
            )
        return found

    def peek(self, schema_id: int) -> SchemaEntry | None:
        found = self._answers.get(schema_id)
        return self._catalog.peek(schema_id) if found is None else found


class StaticCatalog:
    """Registry answers fetched once (the audit's driver) and shipped as values; each schema is
    compiled where it is first used (compiled forms do not pickle)."""

    def __init__(
        self,
        answers: dict[int, RegisteredSchema | UnknownSchema | RegistryUnavailable],
        *,
        accept_unavailable: bool,
    ) -> None:
        self.answers = answers
        self.accept_unavailable = accept_unavailable
        self.recheck_ms = 1 << 62
        self._resolved: dict[int, SchemaEntry] = {}

    def __getstate__(self) -> dict[str, object]:
        return {"answers": self.answers, "accept_unavailable": self.accept_unavailable}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["answers"], accept_unavailable=state["accept_unavailable"])  # type: ignore[misc]

    def entry(self, schema_id: int) -> SchemaEntry | None:
        found = self._resolved.get(schema_id)
        if found is not None:
            return found
        answer = self.answers.get(schema_id)
        if answer is None:
            entry: SchemaEntry = RegistryUnavailable(schema_id, "not looked up")
        elif isinstance(answer, RegisteredSchema):
            entry = compiled(answer)
        else:
            entry = answer
        self._resolved[schema_id] = entry
        return entry

    def peek(self, schema_id: int) -> SchemaEntry | None:
        return self.entry(schema_id)


def compiled(registered: RegisteredSchema, fetched_ms: int = 0) -> ResolvedSchema:
    """The schema ready to check payloads, or with the reason it cannot be."""
    form: CompiledSchema | None
    try:
        form = compile_schema(registered)
    except SchemaCompileError as exc:
        return ResolvedSchema(registered, None, str(exc)[:300], fetched_ms)
    return ResolvedSchema(registered, form, None, fetched_ms)


class _Refused(Exception):
    """A 4xx other than "not found" (authentication, authorization, a bad request)."""


async def resolve(client: RegistryClient, schema_id: int) -> RegisteredSchema | None:
    """Everything the registry says about `schema_id`: its text (Protobuf serialized), the
    schemas its references lead to, and its subjects; None when no schema has that id."""
    schema_answer, versions_answer = await asyncio.gather(
        client.get(schema_path(schema_id)), client.get(versions_path(schema_id))
    )
    if isinstance(schema_answer, RegistryError):
        if schema_answer.error_code == SCHEMA_NOT_FOUND or schema_answer.status == 404:
            return None
        raise _Refused(str(schema_answer))
    text = read_schema(schema_answer.body)
    if text.schema_type is SchemaType.PROTOBUF and not is_serialized_protobuf(text.schema):
        text = await _schema_text(client, schema_path(schema_id, serialized=True))
    if isinstance(versions_answer, RegistryError):
        if versions_answer.status != 404:
            raise _Refused(str(versions_answer))
        subjects: frozenset[str] = frozenset()
    else:
        subjects = read_subjects(versions_answer.body)
    referenced = await _references(client, text.references)
    registered = RegisteredSchema(
        schema_id, text.schema_type, text.schema, text.references, referenced, subjects
    )
    return registered


async def _schema_text(client: RegistryClient, path: str) -> SchemaText:
    answer = await client.get(path)
    if isinstance(answer, RegistryError):
        raise _Refused(f"{path}: {answer}")
    assert isinstance(answer, Answer)
    return read_schema(answer.body)


async def _references(
    client: RegistryClient, references: tuple[SchemaReference, ...]
) -> tuple[ReferencedSchema, ...]:
    """Every schema `references` leads to, each after those it references itself."""
    ordered: list[ReferencedSchema] = []
    seen: set[tuple[str, int]] = set()

    async def visit(reference: SchemaReference, depth: int) -> None:
        key = (reference.subject, reference.version)
        if key in seen:
            return
        seen.add(key)
        if len(seen) > MAX_REFERENCES:
            raise _Refused(f"the schema leads to more than {MAX_REFERENCES} references")
        path = subject_version_path(reference.subject, reference.version)
        text = await _schema_text(client, path)
        if text.schema_type is SchemaType.PROTOBUF and not is_serialized_protobuf(text.schema):
            path = subject_version_path(reference.subject, reference.version, serialized=True)
            text = await _schema_text(client, path)
        for inner in text.references:
            await visit(inner, depth + 1)
        ordered.append(ReferencedSchema(reference.name, text.schema_type, text.schema))

    for reference in references:
        await visit(reference, 0)
    return tuple(ordered)
