"""The schema ids a Produce request carries that the catalog lacks, read before its lookups:
every partition's ids are looked up in one round, not one partition's per round.

The records are read as the audit's id pass reads them (`kvproxy.policies.schemas.ids`), under the
request's decoding allowance; a partition that does not parse or does not fit is skipped (its
check answers it).
"""

from __future__ import annotations

from collections.abc import Mapping

from kvproxy.policies.api import Verdict, parse_records
from kvproxy.policies.chain import PolicyChain
from kvproxy.policies.schemas.ids import add_schema_ids, schema_sides
from kvproxy.protocol.budget import Allowance, BudgetExhausted, InlineLimitReached
from kvproxy.protocol.errors import DecodeError
from kvproxy.protocol.messages import Request

__all__ = ["request_schema_ids"]


def request_schema_ids(
    request: Request,
    chains: Mapping[str, PolicyChain],
    allowance: Allowance,
    *,
    max_records: int | None = None,
    max_partitions: int | None = None,
) -> set[int]:
    """The ids in the records of `request` whose topic's chain (`chains`) reads them. With
    `max_records` / `max_partitions` (an inline reading) more than that raises
    `InlineLimitReached`: the caller reads again off the event loop."""
    ids: set[int] = set()
    body = request.body
    version = request.header.api_version
    records_read = partitions_read = 0
    for topic_data in body.topic_data:
        topic = str(topic_data.name)
        sides = schema_sides(chains[topic])
        if sides is None:
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
                now_ms=0,
                allowance=allowance,
            )
            if isinstance(parsed, Verdict):
                continue
            try:
                records_read += add_schema_ids(ids, parsed.records(), sides)
            except (DecodeError, BudgetExhausted):
                continue
            finally:
                parsed.release()
            if max_records is not None and records_read > max_records:
                raise InlineLimitReached(f"the request holds over {max_records} records")
    return ids
