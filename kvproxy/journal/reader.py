"""Reading a journal directory while a proxy may write it: no writer thread, nothing repaired."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kvproxy.journal.entry import QuarantineEntry
from kvproxy.protocol.errors import BufferUnderflow, DecodeError
from kvproxy.protocol.journal import iter_entries

SEGMENT_SUFFIX = ".kvq"
WORKER_DIR_PREFIX = "worker-"
"""With `kvproxy serve --workers N`, worker i journals into `<dir>/worker-<i>`; readers of `<dir>`
read those too."""


def segment_name(sequence: int) -> str:
    """`00000000000000000042.kvq`: the sequence number, zero-padded to 20 digits."""
    return f"{sequence:020d}{SEGMENT_SUFFIX}"


def _segment_sequence(path: Path) -> int | None:
    if path.suffix != SEGMENT_SUFFIX or len(path.stem) != 20 or not path.stem.isdigit():
        return None
    return int(path.stem)


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """(sequence, path) of each segment file of `directory`, in sequence order."""
    found = []
    for path in directory.iterdir():
        sequence = _segment_sequence(path)
        if sequence is not None and path.is_file():
            found.append((sequence, path))
    return sorted(found)


@dataclass(frozen=True, slots=True)
class SegmentProblem:
    """A segment a reader could not read to its end."""

    segment: str
    position: int
    error: str
    torn_tail: bool  # the file ends inside an entry (normal for the segment being written)


class JournalReader:
    """Reads a journal directory: no writer thread, nothing truncated or deleted.

    Safe while a proxy writes to the same directory: a torn tail of a segment (an entry being
    written) ends that segment; a corrupt entry ends it too and is recorded in `problems`; a
    segment deleted by retention meanwhile is skipped.
    """

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.problems: list[SegmentProblem] = []

    def segments(self) -> list[Path]:
        """Segment files in write order (an absent directory has none): the directory's own, then
        each worker's (`worker-<i>/`, see WORKER_DIR_PREFIX) in worker order."""
        found: list[Path] = []
        for directory in journal_directories(self.directory):
            try:
                found.extend(path for _, path in list_segments(directory))
            except FileNotFoundError:
                continue
        return found

    def entries(
        self,
        *,
        topic: str | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        kinds: Iterable[str] | None = ("rejected", "warned"),
    ) -> Iterator[QuarantineEntry]:
        """Entries in write order, filtered: `since_ms <= time_ms < until_ms`; `kinds=None` is
        every kind. Entries whose metadata does not make a QuarantineEntry are skipped (and
        recorded in `problems`)."""
        wanted = None if kinds is None else frozenset(kinds)
        self.problems = []
        for path in self.segments():
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            good_end = 0
            try:
                for position, end, metadata, records in iter_entries(data):
                    good_end = end
                    try:
                        entry = QuarantineEntry.from_metadata(metadata, records)
                    except ValueError as exc:
                        self.problems.append(SegmentProblem(path.name, position, str(exc), False))
                        continue
                    if (
                        (wanted is None or entry.kind in wanted)
                        and (topic is None or entry.topic == topic)
                        and (since_ms is None or entry.time_ms >= since_ms)
                        and (until_ms is None or entry.time_ms < until_ms)
                    ):
                        yield entry
            except DecodeError as exc:
                torn = isinstance(exc, BufferUnderflow)
                self.problems.append(SegmentProblem(path.name, good_end, str(exc), torn))

    def replayed_ids(self) -> set[str]:
        """Ids named by "replayed" marks."""
        return {
            entry.replayed_id
            for entry in self.entries(kinds=("replayed",))
            if entry.replayed_id is not None
        }


def journal_directories(directory: Path) -> list[Path]:
    """`directory` and the journals of its workers (`worker-<i>`, in the order of i)."""
    workers: list[tuple[int, Path]] = []
    with contextlib.suppress(OSError):
        for child in directory.iterdir():
            suffix = child.name.removeprefix(WORKER_DIR_PREFIX)
            if child.name.startswith(WORKER_DIR_PREFIX) and suffix.isdigit() and child.is_dir():
                workers.append((int(suffix), child))
    return [directory, *(path for _, path in sorted(workers))]
