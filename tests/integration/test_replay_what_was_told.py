"""`kvproxy quarantine replay` writes what the client was told failed: the refused records when
the answer named them (Produce v8+ record_errors), every record of the batch when it did not
(v7 and older: the client was told the whole batch failed and kept none of it). An entry
replayed in part can still be replayed for its other records, once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kvproxy.journal import JournalReader
from kvproxy.protocol.messages import PRODUCE, decode_response
from tests.harness.produce import JSON_ONLY, stored
from tests.harness.proxy import run_proxy
from tests.harness.quarantine import journal_settings, relaxed_config, replay
from tests.harness.raw_client import RawKafkaClient
from tests.harness.requests import produce_request
from tests.harness.upstream import Upstream

pytestmark = pytest.mark.upstreams("tansu")

GOOD_BAD_GOOD = [(b"k", b'{"n": 0}'), (b"k", b"bad 1"), (b"k", b'{"n": 2}')]


def produce(client: RawKafkaClient, version: int, topic: str) -> tuple[int, list[int]]:
    """The partition's error code and the record indexes the answer names."""
    client.send_frame(produce_request(version, 7, topic, GOOD_BAD_GOOD))
    body = decode_response(client.recv_frame(timeout=30), PRODUCE, version).body
    ((partition,),) = [t.partition_responses for t in body.responses]
    named = [int(e.batch_index) for e in getattr(partition, "record_errors", ())]
    return int(partition.error_code), named


def test_replay_writes_what_each_client_was_told_failed(
    upstream: Upstream, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    v7_topic, v9_topic = make_topic(1), make_topic(1)
    journal_dir = tmp_path / "journal"
    with run_proxy(
        upstream.bootstrap,
        topics=[{"match": t, **JSON_ONLY} for t in (v7_topic, v9_topic)],
        quarantine=journal_settings(journal_dir),
    ) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as client:
            v7_answer = produce(client, 7, v7_topic)
            v9_answer = produce(client, 9, v9_topic)
        assert proxy.server.journal is not None and proxy.server.journal.flush(10)
    # v7: the batch failed, no record named; v9: record 1 named.
    assert v7_answer[1] == [] and v7_answer[0] != 0, v7_answer
    assert v9_answer[1] == [1] and v9_answer[0] != 0, v9_answer
    assert stored(upstream, v7_topic) == [] and stored(upstream, v9_topic) == []
    entries = {e.topic: e for e in JournalReader(journal_dir).entries()}
    assert (entries[v7_topic].produce_version, entries[v9_topic].produce_version) == (7, 9)
    config = relaxed_config(tmp_path, upstream, journal_dir)

    # v7: the client kept none of the batch; every record is written.
    out = replay(config, v7_topic)
    assert f"{entries[v7_topic].id} {v7_topic}-0: passes now, 3 records replayed to" in out, out
    assert stored(upstream, v7_topic) == [value for _, value in GOOD_BAD_GOOD]

    # v9: the client resends the innocent records itself; only the refused one is written.
    out = replay(config, v9_topic)
    v9_id = entries[v9_topic].id
    assert f"{v9_id} {v9_topic}-0: passes now, 1 record replayed to" in out, out
    assert stored(upstream, v9_topic) == [b"bad 1"]

    # The client did not resend them after all: --all-records still writes the other two, once.
    out = replay(config, v9_topic, "--all-records")
    assert f"{v9_id} {v9_topic}-0: passes now, 2 records replayed to" in out, out
    assert stored(upstream, v9_topic) == [b"bad 1", b'{"n": 0}', b'{"n": 2}']
    out = replay(config, v9_topic, "--all-records")
    assert "0 replayed (0 records), 0 still failing, 1 replayed earlier" in out, out
    assert stored(upstream, v9_topic) == [b"bad 1", b'{"n": 0}', b'{"n": 2}']
