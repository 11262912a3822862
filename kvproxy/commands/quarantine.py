"""`kvproxy quarantine list|show|replay`: what the proxy refused, and putting it where it belongs.

The commands read the journal while a proxy may be writing it (they never truncate or delete).
`replay` re-checks entries with the current policies and produces what now passes straight to
the cluster, as kvproxy's own plain producer and by default only the records that were refused
(docs/quarantine.md says why); each replayed entry's id is appended to `replayed.ids` in the
journal folder (one line each, a file of its own so the proxy's writer is never raced), and is
never replayed again.
It exits 1 while some entries still fail, so that a script can tell a partial replay from a whole.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvproxy.client.async_requests import describe_topic_configs
from kvproxy.commands.dump import preview
from kvproxy.commands.replay import (
    entry_leader,
    produce_entry,
    recheck,
    replay_records,
    same_records,
    skip_stored,
)
from kvproxy.journal import JournalReader, QuarantineEntry
from kvproxy.journal.replay_marks import Replayed, mark_line, read_marks, replayed_in_full, union
from kvproxy.policies.topic_settings import from_cluster
from kvproxy.protocol.error_codes import error_name
from kvproxy.protocol.errors import ProtocolError
from kvproxy.protocol.records import iter_batches
from kvproxy.proxy.config.proxy_config import ProxyConfig, load_config
from kvproxy.proxy.ops.logs import escape_controls
from kvproxy.settings.loading import ConfigError

REPLAYED_FILE = "replayed.ids"


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("quarantine", help="inspect and replay rejected records")
    commands = parser.add_subparsers(dest="quarantine_command", required=True, metavar="COMMAND")
    for name, help_text, func in (
        ("list", "summary by topic, policy and code", _list),
        ("show", "the entries with their decoded records", _show),
        ("replay", "re-check with the current policies and produce what passes", _replay),
    ):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("-c", "--config", help="YAML configuration (its quarantine.dir)")
        sub.add_argument("--dir", help="a journal folder (instead of the config's)")
        sub.add_argument("--topic", required=name == "replay", help="only this topic")
        sub.add_argument("--since", help="from this time (ISO 8601 or epoch ms)")
        sub.add_argument("--until", help="before this time (ISO 8601 or epoch ms)")
        if name == "show":
            sub.add_argument("--limit", type=int, default=50, help="at most this many entries")
        if name == "replay":
            sub.add_argument(
                "--all-records",
                action="store_true",
                help="also the records of a batch that were not refused (by default only the "
                "refused ones: a client may have sent the others again itself)",
            )
            sub.add_argument(
                "--skip-stored",
                action="store_true",
                help="read the partition back from shortly before each entry and leave out "
                "records already there (same key, value, headers and timestamp)",
            )
        sub.set_defaults(func=func)


def parse_time(text: str | None) -> int | None:
    if text is None:
        return None
    if text.isdigit():
        return int(text)
    moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def _format_time(ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _journal_dir(args: argparse.Namespace) -> tuple[Path, ProxyConfig | None]:
    if args.dir:
        config = load_config(args.config) if args.config else None
        return Path(args.dir), config
    if not args.config:
        raise ConfigError("give -c FILE (its quarantine.dir) or --dir DIR")
    config = load_config(args.config)
    directory = config.quarantine.dir
    if directory is None:
        raise ConfigError(f"{args.config}: quarantine.dir is not set")
    if not directory.is_absolute():
        directory = Path(args.config).resolve().parent / directory
    return directory, config


def _entries(args: argparse.Namespace, directory: Path) -> Iterator[QuarantineEntry]:
    reader = JournalReader(directory)
    yield from reader.entries(
        topic=args.topic, since_ms=parse_time(args.since), until_ms=parse_time(args.until)
    )
    for problem in reader.problems:
        if not problem.torn_tail:
            print(
                f"warning: {problem.segment} at byte {problem.position}: {problem.error}",
                file=sys.stderr,
            )


def replay_marks(directory: Path) -> dict[str, Replayed]:
    """Entry id -> the record indexes replayed so far (None: every one)."""
    return read_marks(directory / REPLAYED_FILE, JournalReader(directory).replayed_ids())


def replayed_ids(directory: Path) -> set[str]:
    """Ids of entries replayed, in full or in part."""
    return set(replay_marks(directory))


def record_count(records: bytes) -> int | None:
    """How many records an entry holds (batch headers; a magic 0/1 wrapper is decompressed);
    None when its bytes do not decode, as a batch refused for a bad CRC may not."""
    count = 0
    try:
        for batch in iter_batches(records):
            if batch.record_count < 0:
                return None
            count += batch.record_count
    except ProtocolError:
        return None
    return count


def _records_label(entries: list[QuarantineEntry]) -> tuple[str, int]:
    """The records of `entries` ("12", or "10+?" when some do not decode) and the number of
    entries whose records do not decode."""
    counts = [record_count(entry.records) for entry in entries]
    known = sum(count for count in counts if count is not None)
    unknown = counts.count(None)
    return (f"{known}+?" if unknown else str(known)), unknown


def _list(args: argparse.Namespace) -> int:
    directory, _ = _journal_dir(args)
    replayed = replayed_ids(directory)
    groups: dict[tuple[str, str, int, str], list[QuarantineEntry]] = collections.defaultdict(list)
    for entry in _entries(args, directory):
        key = (escape_controls(entry.topic), _safe(entry.policy or "?"), entry.code, entry.kind)
        groups[key].append(entry)
    if not groups:
        print(f"{directory}: no entries")
        return 0
    print(f"{directory}:")
    print(
        f"  {'topic':<24} {'policy':<16} {'code':<28} {'kind':<8} "
        "entries  replayed  records  from .. to"
    )
    for (topic, policy, code, kind), entries in sorted(groups.items()):
        done = sum(1 for e in entries if e.id in replayed)
        # min and max, not first and last: with workers, entries come one worker after another.
        times = [e.time_ms for e in entries]
        span = f"{_format_time(min(times))} .. {_format_time(max(times))}"
        label = f"{code} {error_name(code)}"
        records, _ = _records_label(entries)
        print(
            f"  {topic:<24} {policy:<16} {label:<28} {kind:<8} {len(entries):>7}  {done:>8}  "
            f"{records:>7}  {span}"
        )
    everything = [entry for entries in groups.values() for entry in entries]
    records, unknown = _records_label(everything)
    total = f"  {len(everything)} entries, {records} records"
    if unknown:
        holds = "entry holds" if unknown == 1 else "entries hold"
        total += f" ({unknown} {holds} bytes that do not decode: see `show`)"
    print(total)
    return 0


def _show(args: argparse.Namespace) -> int:
    directory, _ = _journal_dir(args)
    replayed = replayed_ids(directory)
    shown = 0
    for entry in _entries(args, directory):
        if shown >= args.limit:
            print("... more entries (use --limit)")
            break
        shown += 1
        mark = " [replayed]" if entry.id in replayed else ""
        print(
            f"{_format_time(entry.time_ms)} {entry.id} {entry.kind}{mark} "
            f"{escape_controls(entry.topic)}-{entry.partition}"
        )
        print(
            f"  client {_safe(entry.client_id)} at {_safe(entry.client_address)}, "
            f"Produce v{entry.produce_version}"
        )
        print(
            f"  policy {_safe(entry.policy)}, code {entry.code} {error_name(entry.code)}: "
            f"{_safe(entry.message)}"
        )
        culprits = set(entry.record_indexes)
        for line in _record_lines(entry.records, culprits):
            print(f"    {line}")
    if shown == 0:
        print(f"{directory}: no entries")
    return 0


def _safe(text: str | None) -> str:
    """A field a client filled, printed as the log prints it: control characters escaped, so
    it can neither drive the operator's terminal nor start a forged line."""
    return escape_controls(str(text))


def _record_lines(records: bytes, culprits: set[int]) -> Iterator[str]:
    index = 0
    try:
        for batch in iter_batches(records):
            for record in batch.records():
                flag = "!" if index in culprits else " "
                headers = ", ".join(f"{k}={preview(v)}" for k, v in record.headers)
                yield (
                    f"{flag} #{index} key={preview(record.key)} value={preview(record.value)}"
                    + (f" headers=[{headers}]" if headers else "")
                )
                index += 1
    except ProtocolError as exc:
        yield f"  (records not decodable after #{index}: {exc}; {len(records)} bytes kept)"


def _replay(args: argparse.Namespace) -> int:
    directory, config = _journal_dir(args)
    if config is None:
        raise ConfigError("replay needs -c FILE: the current policies and the cluster")
    if not directory.is_dir():
        # A mistyped folder must not pass for a journal with nothing to replay.
        raise ConfigError(f"{directory}: no such journal folder")
    config_dir = Path(args.config).resolve().parent
    return asyncio.run(_replay_async(args, directory, config, config_dir))


async def _replay_async(
    args: argparse.Namespace, directory: Path, config: ProxyConfig, config_dir: Path
) -> int:
    from kvproxy.proxy.config.proxy_config import build_routing_for  # noqa: PLC0415
    from kvproxy.proxy.errors import ProxyError  # noqa: PLC0415
    from kvproxy.proxy.listen.tls_context import upstream_side_ssl  # noqa: PLC0415

    try:
        routing = build_routing_for(config, config_dir)
    except ProxyError as exc:
        raise ConfigError(f"{args.config}: {exc}") from None
    bootstrap = list(config.upstream.addresses())
    if config.upstream.embedded:
        bootstrap = [_running_embedded_broker(directory, args.config)]
    ssl_context = upstream_side_ssl(config)
    timeout = config.upstream.connect_timeout_ms / 1000
    marks_read = replay_marks(directory)
    done = set(marks_read)
    whole = replayed_in_full(marks_read)
    # An entry replayed in part stays pending: its other records may be asked for later.
    pending = [e for e in _entries(args, directory) if e.kind == "rejected" and e.id not in whole]
    # A client that retries a refused batch sends the same bytes again, and each refusal is an
    # entry (a retriable answer, or a retry after a lost connection): they are written once.
    written_as: dict[bytes, str] = {}
    replayed_as: dict[bytes, Replayed] = {}  # the records of those bytes replayed so far
    for earlier_entry in JournalReader(directory).entries(topic=args.topic):
        if earlier_entry.kind == "rejected" and earlier_entry.id in done:
            key = same_records(earlier_entry)
            written_as.setdefault(key, earlier_entry.id)
            replayed_as[key] = union(
                replayed_as.get(key, frozenset()), marks_read[earlier_entry.id]
            )
    settings = routing.config_override(args.topic)  # the YAML's, over the cluster's
    if routing.settings_needed(args.topic) and pending:
        described = await describe_topic_configs(
            bootstrap[0][0], bootstrap[0][1], ssl_context, timeout, [args.topic]
        )
        learned = described.get(args.topic)
        if learned is not None:
            settings = settings.over(from_cluster(learned).config)
    passed = failed = records_written = duplicates = 0
    # (topic, partition, leader "host:port") -> [entries, records] produced there
    written: dict[tuple[str, int, str], list[int]] = collections.defaultdict(lambda: [0, 0])
    marks_path = (directory / REPLAYED_FILE).resolve()
    with open(marks_path, "a", encoding="utf-8") as marks:
        for entry in pending:
            where = f"{entry.id} {escape_controls(entry.topic)}-{entry.partition}"
            key = same_records(entry)
            chosen = replay_records(
                entry, all_records=args.all_records, replayed=replayed_as.get(key, frozenset())
            )
            twin = written_as.get(key)
            if not isinstance(chosen, str) and not chosen.count and entry.id in done:
                continue  # what is asked of this entry was replayed by an earlier run
            if (
                twin is not None
                and twin != entry.id
                and not isinstance(chosen, str)
                and not chosen.count
            ):
                marks.write(mark_line(entry.id, replayed_as.get(key)))
                marks.flush()
                os.fsync(marks.fileno())
                duplicates += 1
                print(
                    f"{where}: the same records as entry {twin}, replayed already (a retry of "
                    "the same batch): nothing written; marked replayed"
                )
                continue
            if isinstance(chosen, str):
                failed += 1
                print(f"{where}: still fails: {chosen}")
                continue
            verdict = recheck(routing, entry, chosen.records, settings)
            if not verdict.ok:
                failed += 1
                print(
                    f"{where}: still fails: policy {verdict.policy}, code {verdict.code} "
                    f"{error_name(verdict.code)}: {verdict.message}"
                )
                continue
            asked = chosen.indexes  # the marks name these, stored already or not
            leader, error = await entry_leader(bootstrap, ssl_context, timeout, entry)
            if not error and args.skip_stored:
                kept = await skip_stored(leader, ssl_context, timeout, entry, chosen)
                if isinstance(kept, str):
                    error = kept
                else:
                    if kept.count < chosen.count:
                        print(
                            f"{where}: {chosen.count - kept.count} of {chosen.count} "
                            f"{_plural(chosen.count, 'record')} already stored, left out"
                        )
                    chosen = kept
            if not error and chosen.count:
                error = await produce_entry(leader, ssl_context, timeout, entry, chosen.records)
            if error:
                failed += 1
                print(f"{where}: not written: {error}; the entry stays for a later replay")
                continue
            now = union(replayed_as.get(key, frozenset()), _as_marked(asked))
            marks.write(mark_line(entry.id, _whole_if_complete(now, entry)))
            marks.flush()
            os.fsync(marks.fileno())
            written_as.setdefault(key, entry.id)
            replayed_as[key] = now
            passed += 1
            address = f"{leader[0]}:{leader[1]}"
            if not chosen.count:
                print(f"{where}: every record already stored, nothing written; marked replayed")
                continue
            records_written += chosen.count
            counts = written[(entry.topic, entry.partition, address)]
            counts[0] += 1
            counts[1] += chosen.count
            left_out = (
                f" (the {chosen.left_out} not refused left out; --all-records writes them too)"
                if chosen.left_out
                else ""
            )
            print(
                f"{where}: passes now, {chosen.count} {_plural(chosen.count, 'record')} "
                f"replayed to {address}{left_out}"
            )
            if chosen.transactional:
                print(
                    f"{where}: written outside any transaction (the producer's transaction "
                    "was aborted)"
                )
    routing.close()
    earlier = len(done & {e.id for e in JournalReader(directory).entries(topic=args.topic)})
    print(
        f"{passed} replayed ({records_written} {_plural(records_written, 'record')}), "
        f"{failed} still failing, {earlier} replayed earlier"
        + (f", {duplicates} the same as one replayed" if duplicates else "")
    )
    for (topic, partition, address), (entries, records) in sorted(written.items()):
        print(
            f"produced to {topic}-{partition} at {address}: {entries} {_plural(entries, 'entry')}, "
            f"{records} {_plural(records, 'record')}"
        )
    if not written:
        print("produced nothing")
    print(f"replay marks: {marks_path} ({passed + duplicates} added)")
    # Non-zero while anything is left to replay, so that scripts and operators notice.
    return 1 if failed else 0


def _running_embedded_broker(directory: Path, config_file: str) -> tuple[str, int]:
    """The broker of the `kvproxy serve` running this config: the embedded broker lives inside
    serve and keeps its data in memory, so replay writes there, or nowhere."""
    from kvproxy.proxy.serve.embedded import ADDRESS_FILE, advertised_broker  # noqa: PLC0415

    broker = advertised_broker(directory)
    if broker is None:
        raise ConfigError(
            "upstream.embedded: the embedded broker runs inside `kvproxy serve` and keeps its "
            f"data in memory, and no running serve names one in {directory / ADDRESS_FILE}. "
            f"Start `kvproxy serve -c FILE` (FILE: {config_file}, or any config with this "
            "quarantine.dir) and replay while it runs; or set upstream.bootstrap_servers to "
            "replay to a cluster"
        )
    return broker.host, broker.port


def _as_marked(indexes: tuple[int, ...] | None) -> Replayed:
    return None if indexes is None else frozenset(indexes)


def _whole_if_complete(replayed: Replayed, entry: QuarantineEntry) -> Replayed:
    """Every record of the entry replayed: marked as the whole entry."""
    total = record_count(entry.records)
    if replayed is not None and total is not None and replayed >= set(range(total)):
        return None
    return replayed


def _plural(count: int, word: str) -> str:
    if count == 1:
        return word
    return word.removesuffix("y") + "ies" if word.endswith("y") else word + "s"
