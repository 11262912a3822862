"""The schema ids a Produce request's checks will read that the catalog cannot answer yet,
gathered before the request is decided: every partition's ids are looked up in one round, then
the chains run once.

Each partition is read by `kvproxy.policies.schemas.ids.schema_ids_wanted`, as the audit's id pass
reads its records, under the request's decoding allowance; a partition that does not parse or
does not fit is skipped (its check answers it).
"""

from __future__ import annotations

from collections.abc import Mapping

from kvproxy.policies.api import Need, Verdict, parse_records
from kvproxy.policies.chain import PolicyChain
from kvproxy.policies.schemas.ids import schema_ids_wanted
from kvproxy.policies.schemas.model import SchemaCatalog
from kvproxy.protocol.budget import Allowance, BudgetExhausted, InlineLimitReached
from kvproxy.protocol.errors import DecodeError
from kvproxy.protocol.messages import Request
from kvproxy.protocol.produce_topics import is_unknown_id, topic_name

__all__ = ["reads_schemas", "request_schema_ids"]


def reads_schemas(chains: Mapping[str, PolicyChain]) -> bool:
    """Whether a chain of the request's topics reads schema ids (`Need.SCHEMAS`)."""
    return any(Need.SCHEMAS in chain.needs for chain in chains.values())


def request_schema_ids(
    request: Request,
    chains: Mapping[str, PolicyChain],
    catalog: SchemaCatalog,
    allowance: Allowance,
    now_ms: int,
    *,
    max_records: int | None = None,
    max_partitions: int | None = None,
) -> set[int]:
    """The ids in the records of `request` that its topics' chains (`chains`) will ask `catalog`
    about and it cannot answer at `now_ms`. With `max_records` / `max_partitions` (an inline
    reading) more than that raises `InlineLimitReached`: the caller reads again off the event
    loop."""
    ids: set[int] = set()
    body = request.body
    version = request.header.api_version
    records_read = partitions_read = 0
    for topic_data in body.topic_data:
        if is_unknown_id(topic_data):  # answered UNKNOWN_TOPIC_ID, its records unread
            continue
        topic = topic_name(topic_data)
        chain = chains[topic]
        if Need.SCHEMAS not in chain.needs:
            continue
        for data in topic_data.partition_data:
            partitions_read += 1
            if max_partitions is not None and partitions_read > max_partitions:
                raise InlineLimitReached(f"the request names over {max_partitions} partitions")
            parsed = parse_records(
                topic,
                int(data.index),
                data.records,
                produce_version=version,
                acks=int(body.acks),
                transactional_id=None,
                compacted=None,
                now_ms=now_ms,
                allowance=allowance,
                schemas=catalog,
            )
            if isinstance(parsed, Verdict):
                continue
            records_read += sum(max(batch.record_count, 0) for batch in parsed.batches)
            if max_records is not None and records_read > max_records:
                parsed.release()
                raise InlineLimitReached(f"the request holds over {max_records} records")
            try:
                ids |= schema_ids_wanted(chain, parsed)
            except (DecodeError, BudgetExhausted):
                continue
            finally:
                parsed.release()
    return ids
