"""The kill -9 run of bench/replay_kill.py, smaller: every refused record replayed exactly once.

An idempotent confluent-kafka producer sends 2,000 JSON values (every 10th refused by `json`)
through `kvproxy serve`, which is killed with SIGKILL twice mid-stream and started again on the
same ports and journal; the application resends the records refused only for sharing a batch
(KIP-467); the policy is relaxed and `kvproxy quarantine replay` runs twice. Read back from the
broker: every value exactly once.
"""

from __future__ import annotations

from bench import replay_kill


def test_every_refused_record_is_replayed_exactly_once_after_kills() -> None:
    figures = replay_kill.run(records=2000, kills=2)
    assert figures["kills"] == 2
    assert [replay["exit"] for replay in figures["replays"]] == [0, 0], figures["replays"]
    assert (figures["missing"], figures["stored_twice"]) == (0, 0), figures
    assert figures["refused_stored_once"] == figures["refused"] == 200
    assert figures["good_stored_once"] == figures["good"] == 1800
