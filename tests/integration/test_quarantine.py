"""Nothing rejected is lost: the quarantine journal, `kvproxy quarantine list|show|replay`, a
kill -9 in the middle of rejections, a journal that cannot be written, dead-letter topics and
warn mode, all with Tansu as the upstream and real clients (confluent-kafka, raw Produce frames).

The guarantees checked are the ones docs/quarantine.md states.
"""

from __future__ import annotations

import datetime
import errno
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

import kvproxy.journal.segments as journal_segments
from kvproxy.journal import Journal, JournalReader, QuarantineEntry, segment_name
from kvproxy.protocol.journal import encode_entry
from kvproxy.protocol.messages import PRODUCE, decode_response
from kvproxy.protocol.records import build_batch, iter_batches
from tests.harness import Broker, create_topic
from tests.harness.metrics import get, scrape, value
from tests.harness.processes import REPO, kvproxy, wait_for_answer, wait_until
from tests.harness.produce import (
    CLIENT_ID,
    INVALID_RECORD,
    JSON_ONLY,
    batch,
    partitions_of,
    produce,
    produce_frame,
    stored,
)
from tests.harness.proxy import RunningProxy, free_port_range, run_proxy
from tests.harness.quarantine import consume, dead_letter_counts, journal_settings, new_entry
from tests.harness.raw_client import RawClientError, RawKafkaClient
from tests.harness.tansu import free_port

HOST = "127.0.0.1"
BINARY = b"\x00\x01\xfe\xff"


# ---- helpers ----


def values_of(records: bytes) -> list[bytes | None]:
    return [r.value for b in iter_batches(records) for r in b.records()]


# ---- list, show, replay ----


def test_rejected_records_are_listed_shown_and_replayed_exactly_once(
    tansu: Broker, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    from confluent_kafka import KafkaError, Producer

    topic = make_topic(1)
    journal_dir = tmp_path / "journal"
    with run_proxy(
        tansu.bootstrap,
        topics=[{"match": topic, **JSON_ONLY}],
        quarantine=journal_settings(journal_dir),
    ) as proxy:
        producer = Producer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "client.id": "quarantine-client",
                "acks": "all",
                "linger.ms": 0,
                "enable.idempotence": False,
                "retries": 0,
            }
        )
        results: list[tuple[bytes, int | None]] = []

        def delivered(error: Any, message: Any) -> None:
            results.append((message.value(), None if error is None else error.code()))

        started_ms = int(time.time() * 1000)
        for payload in (b"not json at all", b'{"ok": 1}', BINARY):
            producer.produce(topic, payload, key=b"key-1", partition=0, on_delivery=delivered)
            assert producer.flush(20) == 0
        finished_ms = int(time.time() * 1000)
        assert results == [
            (b"not json at all", KafkaError.INVALID_RECORD),
            (b'{"ok": 1}', None),
            (BINARY, KafkaError.INVALID_RECORD),
        ], results
        assert KafkaError.INVALID_RECORD == INVALID_RECORD
        assert proxy.server.journal is not None
        assert proxy.server.journal.flush(10), "the journal did not flush"
    assert stored(tansu, topic) == [b'{"ok": 1}']

    entries = list(JournalReader(journal_dir).entries())
    assert [values_of(e.records) for e in entries] == [[b"not json at all"], [BINARY]]
    for entry in entries:
        assert (entry.kind, entry.topic, entry.partition) == ("rejected", topic, 0)
        assert (entry.policy, entry.code, entry.client_id) == ("json", 87, "quarantine-client")
        assert entry.record_indexes == (0,)
        assert entry.client_address is not None and entry.client_address.startswith(HOST + ":")
        assert entry.produce_version >= 3
        assert started_ms <= entry.time_ms <= finished_ms
        assert entry.message and "batchIndex=0" in entry.message, entry.message

    # The config a user would write: the journal folder relative to the config file.
    config = tmp_path / "kvproxy.yaml"
    base = {
        "upstream": {"bootstrap_servers": [tansu.bootstrap]},
        "quarantine": {"dir": "journal"},
    }
    config.write_text(yaml.safe_dump({**base, "topics": [{"match": topic, **JSON_ONLY}]}))

    listed = kvproxy("quarantine", "list", "-c", str(config)).stdout
    rows = [line for line in listed.splitlines() if topic in line]
    assert len(rows) == 1, listed
    row = rows[0].split()
    assert row[:5] == [topic, "json", "87", "INVALID_RECORD", "rejected"], listed
    assert row[5:7] == ["2", "0"], f"2 entries, none replayed: {listed}"
    first, last = (entry_time(entries[0]), entry_time(entries[-1]))
    assert f"{first} .. {last}" in rows[0], listed
    assert "2 entries" in listed

    shown = kvproxy("quarantine", "show", "-c", str(config)).stdout
    blocks = re.split(r"\n(?=\S)", shown.strip())
    assert len(blocks) == 2, shown
    for entry, block, value_preview in zip(
        entries, blocks, ("'not json at all'", "0x" + BINARY.hex()), strict=True
    ):
        lines = block.splitlines()
        assert lines[0].endswith(f"{entry.id} rejected {topic}-0"), block
        assert lines[0].startswith(entry_time(entry)), block
        assert lines[1].strip() == (
            f"client quarantine-client at {entry.client_address}, Produce v{entry.produce_version}"
        ), block
        assert lines[2].strip() == f"policy json, code 87 INVALID_RECORD: {entry.message}", block
        assert lines[3].strip() == f"! #0 key='key-1' value={value_preview}", block
        assert len(lines) == 4, block

    # The cause is fixed: the topic no longer requires JSON. Replay, twice.
    config.write_text(yaml.safe_dump({**base, "topics": []}))
    first_run = kvproxy("quarantine", "replay", "-c", str(config), "--topic", topic).stdout
    for entry in entries:
        assert f"{entry.id} {topic}-0: passes now, 1 record replayed" in first_run, first_run
    assert "2 replayed (2 records), 0 still failing, 0 replayed earlier" in first_run, first_run
    assert (journal_dir / "replayed.ids").read_text().split() == [e.id for e in entries]

    second_run = kvproxy("quarantine", "replay", "-c", str(config), "--topic", topic).stdout
    assert "0 replayed (0 records), 0 still failing, 2 replayed earlier" in second_run, second_run
    assert "passes now" not in second_run, second_run

    messages = consume(tansu.bootstrap, topic, 0, 3)
    assert [m.value() for m in messages] == [b'{"ok": 1}', b"not json at all", BINARY], (
        "each replayed record must be in the topic exactly once, after the accepted one"
    )
    assert [m.key() for m in messages] == [b"key-1"] * 3

    listed = kvproxy("quarantine", "list", "-c", str(config)).stdout
    row = next(line for line in listed.splitlines() if topic in line).split()
    assert row[5:7] == ["2", "2"], f"2 entries, both replayed: {listed}"


def test_replay_exits_1_while_entries_still_fail_and_says_where_it_wrote(
    tansu: Broker, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    """One entry passes the current policies, one is refused again, one names a partition the
    topic does not have: the first is produced and marked, the command says to which partition,
    broker and marks file, and exits 1 for the other two (and again on a second run)."""
    topic = make_topic(1)
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    entries = [
        new_entry("rejected", topic, 0, policy="x", code=87, records=batch(b"{}")),
        new_entry("rejected", topic, 0, policy="x", code=87, records=batch(b"no")),
        new_entry("rejected", topic, 5, policy="x", code=87, records=batch(b"{}")),
    ]
    (journal_dir / segment_name(0)).write_bytes(
        b"".join(encode_entry(e.to_metadata(), e.records) for e in entries)
    )
    config = tmp_path / "kvproxy.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "upstream": {"bootstrap_servers": [tansu.bootstrap]},
                "quarantine": {"dir": "journal"},
                "topics": [{"match": topic, **JSON_ONLY}],
            }
        )
    )
    marks = journal_dir.resolve() / "replayed.ids"
    passes, refused, missing = entries

    run = kvproxy("quarantine", "replay", "-c", str(config), "--topic", topic, expect=1).stdout
    passed_line = f"{passes.id} {topic}-0: passes now, 1 record replayed to {tansu.bootstrap}\n"
    assert passed_line in run, run
    assert f"{refused.id} {topic}-0: still fails: policy json, code 87 INVALID_RECORD" in run, run
    assert (
        f"{missing.id} {topic}-5: not written: no leader for {topic}-5 (create the topic or the "
        "partition, or wait for a leader, then replay again); the entry stays for a later "
        "replay\n"
    ) in run, run
    assert run.endswith(
        f"1 replayed (1 record), 2 still failing, 0 replayed earlier\n"
        f"produced to {topic}-0 at {tansu.bootstrap}: 1 entry, 1 record\n"
        f"replay marks: {marks} (1 added)\n"
    ), run
    assert marks.read_text().split() == [passes.id]

    again = kvproxy("quarantine", "replay", "-c", str(config), "--topic", topic, expect=1).stdout
    assert again.endswith(
        f"0 replayed (0 records), 2 still failing, 1 replayed earlier\n"
        "produced nothing\n"
        f"replay marks: {marks} (0 added)\n"
    ), again
    assert stored(tansu, topic) == [b"{}"]


def entry_time(entry: QuarantineEntry) -> str:
    """An entry's time the way the commands print it (ISO 8601, milliseconds, Z)."""
    moment = datetime.datetime.fromtimestamp(entry.time_ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ---- kill -9 ----


def serve_config(tmp_path: Path, tansu: Broker, topic: str, journal_dir: Path) -> Path:
    config = tmp_path / "serve.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": {
                    "host": HOST,
                    "port": free_port(),
                    "broker_port_base": free_port_range(20),
                    "lowest_node_id": 100,  # Tansu is node 111
                    "max_brokers": 20,
                },
                "upstream": {"bootstrap_servers": [tansu.bootstrap]},
                "shutdown": {"drain_timeout_ms": 2000},
                "metrics": {"host": HOST, "port": free_port()},
                "topics": [{"match": topic, **JSON_ONLY}],
                "quarantine": journal_settings(journal_dir, segment_bytes=4096),
            }
        )
    )
    return config


def start_serve(config: Path, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = int(yaml.safe_load(config.read_text())["listen"]["port"])
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvproxy.cli", "serve", "-c", str(config)],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        wait_for_answer(port, proc)
    except BaseException:
        proc.kill()
        proc.wait(10)
        raise
    return proc, port


def test_kill_9_mid_loop_keeps_every_entry_before_the_torn_tail(
    tansu: Broker, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = make_topic(1)
    journal_dir = tmp_path / "journal"
    config = serve_config(tmp_path, tansu, topic, journal_dir)
    log = tmp_path / "serve.log"
    proc, port = start_serve(config, log)
    settings = yaml.safe_load(config.read_text())["metrics"]
    metrics = SimpleNamespace(metrics_url=f"http://{settings['host']}:{settings['port']}")
    kill_after = 40  # answers; then one more request goes out and the proxy dies under it
    acknowledged = sent = 0
    handed_to_write = -1
    try:
        with RawKafkaClient(HOST, port) as client:
            while True:
                frame = produce_frame(9, 1000 + sent, [(topic, 0, batch(b"bad-%d" % sent))])
                if acknowledged == kill_after:
                    # Entries the writer has written (write(2) returned) right now: a lower
                    # bound for what it has written when the kill comes a moment later.
                    written = value(
                        scrape(metrics), "kvproxy_quarantine_entries_total", result="written"
                    )
                    handed_to_write = int(written)
                    client.send_frame(frame)
                    sent += 1
                    os.kill(proc.pid, signal.SIGKILL)
                    break
                answer = client.request(frame, timeout=10)
                sent += 1
                body = decode_response(answer, PRODUCE, 9).body
                code = partitions_of(body)[(topic, 0)].error_code
                assert code == INVALID_RECORD, f"answer {sent}: {code}"
                acknowledged += 1
            # The last request may still have been answered before the kill landed; after
            # that the connection ends. Either way no further answer comes.
            with pytest.raises((RawClientError, OSError)):
                while True:
                    answer = client.recv_frame(timeout=5)
                    body = decode_response(answer, PRODUCE, 9).body
                    assert partitions_of(body)[(topic, 0)].error_code == INVALID_RECORD
                    acknowledged += 1
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL

    journal = Journal(journal_dir, segment_bytes=4096)
    report = journal.open()
    try:
        entries = list(JournalReader(journal.directory).entries(kinds=None))
    finally:
        journal.close()
    assert report.corrupt_segments == ()
    assert report.entries == len(entries), report
    # A segment rolls before it would pass 4096 bytes: as many segments as that takes. (How
    # many entries reached the disk before the kill depends on how far the writer had got.)
    on_disk = sum(path.stat().st_size for path in journal_dir.glob("*.kvq"))
    assert on_disk > 0
    assert report.segments >= -(-on_disk // 4096), f"segment_bytes 4096 should roll: {report}"
    # docs/quarantine.md, "What a crash can lose": a process crash loses the entries still in
    # the in-memory queue and the one being written; every entry handed to write(2) survives.
    # So at least the entries written before the kill (`handed_to_write`, read from
    # /metrics just before it), at most what was sent. Acknowledged rejections beyond that were
    # still queued: the queue is a backlog when fsyncs (each roll of a 4 KiB segment, each
    # 50 ms flush) hold the writer back, and the docs allow losing it.
    assert 0 <= handed_to_write <= acknowledged
    assert handed_to_write <= len(entries) <= sent, (
        f"{len(entries)} entries on disk after kill -9, but {handed_to_write} had been written "
        f"before it (the client was told {acknowledged} were rejected and sent {sent}; "
        f"report {report})"
    )
    assert [values_of(e.records) for e in entries] == [
        [b"bad-%d" % n] for n in range(len(entries))
    ], "entries must be the first requests, in order, with no gap"
    assert len({e.id for e in entries}) == len(entries)
    for entry in entries:
        assert (entry.kind, entry.topic, entry.partition, entry.policy, entry.code) == (
            "rejected",
            topic,
            0,
            "json",
            INVALID_RECORD,
        ), entry
        assert (entry.client_id, entry.produce_version, entry.record_indexes) == (
            CLIENT_ID,
            9,
            (0,),
        ), entry
        assert entry.client_address and entry.client_address.startswith(HOST + ":"), entry

    # The proxy starts again on the same journal (the dead process's lock is gone), reports what
    # it found, and appends after it.
    lines_before = len(log.read_text(errors="replace").splitlines())
    proc, port = start_serve(config, log)
    try:
        answers = produce(HOST, port, 9, [(topic, 0, batch(b"after the restart"))])
        assert answers[(topic, 0)].error_code == INVALID_RECORD
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    restart_log = log.read_text(errors="replace").splitlines()[lines_before:]
    assert any(f"{len(entries)} entries in" in line for line in restart_log), restart_log
    after = list(JournalReader(journal_dir).entries())
    assert [values_of(e.records) for e in after] == [
        *([b"bad-%d" % n] for n in range(len(entries))),
        [b"after the restart"],
    ]


# ---- a journal that cannot be written ----


def readyz(proxy: RunningProxy) -> tuple[int, str]:
    return get(f"{proxy.metrics_url}/readyz")


def test_failing_journal_writes_keep_client_answers_and_report_degraded(
    tansu: Broker, make_topic: Callable[..., str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = make_topic(2)
    journal_dir = tmp_path / "journal"
    real_write_all = journal_segments._write_all
    disk_full = True

    def write_all(fd: int, data: bytes) -> None:
        if disk_full:  # like a full disk: part of the entry lands, then ENOSPC
            os.write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write_all(fd, data)

    monkeypatch.setattr(journal_segments, "_write_all", write_all)
    with run_proxy(
        tansu.bootstrap,
        topics=[{"match": topic, **JSON_ONLY}],
        quarantine=journal_settings(journal_dir),
    ) as proxy:
        journal = proxy.server.journal
        assert journal is not None
        wait_until(lambda: readyz(proxy)[0] == 200, "ready")

        answers = produce(
            proxy.host,
            proxy.port,
            9,
            [(topic, 0, batch(b"lost to a full disk")), (topic, 1, batch(b'{"n": 1}'))],
        )
        assert answers[(topic, 0)].error_code == INVALID_RECORD, answers
        assert answers[(topic, 1)].error_code == 0, answers
        assert not journal.flush(10), "flush must report the failed write"
        status, text = wait_until(
            lambda: (answer := readyz(proxy))[1].startswith("ready, degraded") and answer,
            "/readyz to say degraded",
        )
        assert status == 200, text
        assert "No space left on device" in text, text
        samples = scrape(proxy)
        assert value(samples, "kvproxy_quarantine_degraded") == 1
        assert value(samples, "kvproxy_quarantine_entries_total", result="failed") >= 1
        assert value(samples, "kvproxy_quarantine_entries_total", result="written") == 0

        disk_full = False  # space comes back
        answers = produce(proxy.host, proxy.port, 9, [(topic, 0, batch(b"kept again"))])
        assert answers[(topic, 0)].error_code == INVALID_RECORD, answers
        assert journal.flush(10), "the journal must heal once writes succeed"
        status, text = wait_until(
            lambda: (answer := readyz(proxy))[1].startswith("ready:") and answer,
            "/readyz to stop saying degraded",
        )
        assert status == 200, text
        samples = scrape(proxy)
        assert value(samples, "kvproxy_quarantine_degraded") == 0
        assert value(samples, "kvproxy_quarantine_entries_total", result="written") == 1
        assert value(samples, "kvproxy_quarantine_entries_total", result="failed") == 1
    assert stored(tansu, topic, 0) == []
    assert stored(tansu, topic, 1) == [b'{"n": 1}']
    reader = JournalReader(journal_dir)
    kept = list(reader.entries())
    assert [values_of(e.records) for e in kept] == [[b"kept again"]], (
        "the half-written entry must have been cut back, leaving a readable journal"
    )
    assert reader.problems == [], reader.problems


# ---- dead-letter topics ----


def same_answer(answer: Any, reference: Any, reference_tp: str, tp: str) -> None:
    """`answer` is what `reference` (a rejection on `reference_tp`) would be on `tp`."""
    assert answer.error_code == reference.error_code == INVALID_RECORD, answer
    assert answer.error_message == reference.error_message.replace(reference_tp, tp), (
        "a failed dead letter must not change the client's answer"
    )
    assert [(e.batch_index, e.batch_index_error_message) for e in answer.record_errors] == [
        (e.batch_index, e.batch_index_error_message.replace(reference_tp, tp))
        for e in reference.record_errors
    ]


def test_dead_letter_topic_gets_the_rejected_records_with_the_documented_headers(
    tansu: Broker, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = make_topic(2)
    create_topic(tansu.bootstrap, topic + ".dlq", 2)
    narrow = make_topic(2)  # its dead-letter topic has no partition 1
    create_topic(tansu.bootstrap, narrow + ".dlq", 1)
    original = build_batch([(b"the-key", b"not json", (("trace", b"abc"),), None)])
    with run_proxy(
        tansu.bootstrap,
        topics=[{"match": topic, **JSON_ONLY}, {"match": narrow, **JSON_ONLY}],
        quarantine=journal_settings(tmp_path / "journal", dead_letter_suffix=".dlq"),
    ) as proxy:
        answers = produce(
            proxy.host, proxy.port, 9, [(topic, 0, batch(b"[1]")), (topic, 1, original)]
        )
        assert answers[(topic, 0)].error_code == 0, answers
        assert answers[(topic, 1)].error_code == INVALID_RECORD, answers
        wait_until(lambda: dead_letter_counts(proxy) == (1, 0), "the dead letter to be written")

        narrow_answers = produce(proxy.host, proxy.port, 9, [(narrow, 1, batch(b"nope"))])
        same_answer(narrow_answers[(narrow, 1)], answers[(topic, 1)], f"{topic}-1", f"{narrow}-1")
        wait_until(
            lambda: dead_letter_counts(proxy) == (1, 1),
            "the dead letter to a missing partition to be counted as failed",
        )
    message = answers[(topic, 1)].error_message

    dead = consume(tansu.bootstrap, topic + ".dlq", 1, 1)
    assert len(dead) == 1, dead
    assert (dead[0].key(), dead[0].value()) == (b"the-key", b"not json")
    assert dead[0].partition() == 1
    assert dead[0].headers() == [
        ("trace", b"abc"),
        ("kvproxy.policy", b"json"),
        ("kvproxy.code", b"87"),
        ("kvproxy.message", message.encode()),
        ("kvproxy.original.partition", b"1"),
        ("kvproxy.client.id", CLIENT_ID.encode()),
    ]
    assert stored(tansu, topic + ".dlq", 0) == [], "only the rejected partition's copy"
    assert stored(tansu, topic, 0) == [b"[1]"] and stored(tansu, topic, 1) == []
    assert stored(tansu, narrow + ".dlq", 0) == [], "never to another partition"


def test_missing_dead_letter_topic_is_counted_failed_and_not_created(
    tansu: Broker, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    """docs/quarantine.md: "the topic must exist; the proxy does not create it"."""
    from confluent_kafka.admin import AdminClient

    topic, reference = make_topic(1), make_topic(1)
    create_topic(tansu.bootstrap, reference + ".dlq", 1)
    with run_proxy(
        tansu.bootstrap,
        topics=[{"match": topic, **JSON_ONLY}, {"match": reference, **JSON_ONLY}],
        quarantine=journal_settings(tmp_path / "journal", dead_letter_suffix=".dlq"),
    ) as proxy:
        answers = produce(proxy.host, proxy.port, 9, [(reference, 0, batch(b"nope"))])
        wait_until(lambda: dead_letter_counts(proxy) == (1, 0), "the reference dead letter")
        orphan_answers = produce(proxy.host, proxy.port, 9, [(topic, 0, batch(b"nope"))])
        same_answer(orphan_answers[(topic, 0)], answers[(reference, 0)], reference, topic)
        counts = wait_until(
            lambda: (c := dead_letter_counts(proxy)) != (1, 0) and c,
            "the dead letter to a missing topic to be counted",
        )
    existing = AdminClient({"bootstrap.servers": tansu.bootstrap}).list_topics(timeout=10).topics
    assert counts == (1, 1) and topic + ".dlq" not in existing, (
        f"no dead-letter topic {topic}.dlq existed: the copy must fail and be counted "
        f'result="failed", and the topic must not be created; got (written, failed) = {counts} '
        f"and the topic {'now exists' if topic + '.dlq' in existing else 'does not exist'} "
        "(the dead-letter leader lookup, client.async_requests.partition_leader, sends "
        "Metadata v1, which asks the broker to auto-create the topic)"
    )


# ---- warn mode ----


def test_warn_mode_stores_the_record_and_journals_it_as_warned(
    tansu: Broker, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = make_topic(1)
    journal_dir = tmp_path / "journal"
    with run_proxy(
        tansu.bootstrap,
        topics=[{"match": topic, "mode": "warn", "default_policies": "drop", "policies": ["json"]}],
        quarantine=journal_settings(journal_dir, dead_letter_suffix=".dlq"),
    ) as proxy:
        answers = produce(proxy.host, proxy.port, 9, [(topic, 0, batch(b"not json", b"{}"))])
        assert answers[(topic, 0)].error_code == 0, answers
        assert proxy.server.journal is not None and proxy.server.journal.flush(10)
        samples = scrape(proxy)
    assert stored(tansu, topic) == [b"not json", b"{}"]
    entries = list(JournalReader(journal_dir).entries())
    assert len(entries) == 1, entries
    entry = entries[0]
    assert (entry.kind, entry.topic, entry.partition, entry.policy, entry.code) == (
        "warned",
        topic,
        0,
        "json",
        INVALID_RECORD,
    ), entry
    assert entry.record_indexes == (0,)
    assert values_of(entry.records) == [b"not json", b"{}"]
    # warned batches were forwarded: no dead-letter copy is attempted
    assert value(samples, "kvproxy_dead_letters_total", result="written") == 0
    assert value(samples, "kvproxy_dead_letters_total", result="failed") == 0
    # and replay only takes rejected entries: nothing to do for a warned one
    assert list(JournalReader(journal_dir).entries(kinds=("rejected",))) == []


def test_a_batch_past_the_decoding_budget_goes_to_the_dead_letter_topic_as_sent(
    tansu: Broker, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Refused because checking it would need more memory than allowed: its dead letter is not
    decoded either (that would cost the same memory), it carries the records as the client sent
    them, marked `kvproxy.unreadable`."""
    from kvproxy.protocol.compression import Codec

    topic = make_topic()
    create_topic(tansu.bootstrap, topic + ".dlq")
    bomb = build_batch(
        [(b"k", bytes(1024 * 1024), None, None) for _ in range(20)], codec=Codec.ZSTD
    )
    with run_proxy(
        tansu.bootstrap,
        limits={"decode_bytes_per_request": 8 * 1024 * 1024},
        quarantine=journal_settings(tmp_path / "journal", dead_letter_suffix=".dlq"),
    ) as proxy:
        answers = produce(proxy.host, proxy.port, 9, [(topic, 0, bomb)])
        assert answers[(topic, 0)].error_code == 10, answers  # MESSAGE_TOO_LARGE
        wait_until(lambda: dead_letter_counts(proxy) == (1, 0), "the dead letter to be written")
        assert proxy.server.decode_memory.in_use == 0
        assert proxy.server.decode_memory.peak <= 8 * 1024 * 1024
    dead = consume(tansu.bootstrap, topic + ".dlq", 0, 1)
    assert len(dead) == 1, dead
    assert dead[0].value() == bomb
    headers = dict(dead[0].headers())
    assert headers["kvproxy.unreadable"] == b"1"
    assert headers["kvproxy.policy"] == b"decode_budget"
    assert headers["kvproxy.code"] == b"10"
