"""The onward buffer: every accepted batch, on disk, until each remote-write target has sent it.

One append-only log shared by all targets (the disk holds each batch once however many targets
there are), in segment files of the agent's spool format (metricsd/agent/spool.py, drawn in
metricsd/onward/FORMAT.md). Records carry a sequence number; each target keeps a cursor, the
highest seq it has sent (or given up on), in ``targets/<name>/consumed``, written atomically when
it moves. A restarted process reads the segments back and each target resumes after its cursor.

Every segment holds the labels of every series it refers to, in a series record before the first
samples record that refers to it (the appender passes them), so a segment is readable on its own.

Bounded: past ``max_bytes`` the oldest segment is deleted even if a target has not sent it; the
samples that target loses are counted (``on_drop``) and its cursor moves past them. A segment
every cursor has passed is deleted at once. The segment being appended to is never deleted.

Recent batches are also kept in memory as the columns they were appended as (at most
``recent_samples``; dropped once every target's cursor has passed them), so a sender that keeps up
takes them from there instead of reading its file back and decoding it (``columns``).

Not thread-safe: one event loop appends and reads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from metricsd.agent import spool
from metricsd.clock import Clock
from metricsd.onward import records
from metricsd.onward.records import Columns

__all__ = ["BufferSettings", "OnwardBuffer", "Record"]

log = logging.getLogger("metricsd.onward.buffer")

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


@dataclass(frozen=True)
class BufferSettings:
    """max_bytes: the buffer's bound on disk. An hour of 40,000 series at a 10 s interval (14.4 M
    samples) takes about 150 MiB, so the default holds several hours of a receiver being down.
    segment_bytes: size at which a segment is closed and a new one begun; the unit of deletion."""

    max_bytes: int = 2 << 30
    segment_bytes: int = 64 << 20
    recent_samples: int = 400_000  # about 7 MiB: a few rounds of a sender that keeps up

    def __post_init__(self) -> None:
        if self.segment_bytes < 4096 or self.max_bytes < 2 * self.segment_bytes:
            raise ValueError("the onward buffer needs segment_bytes >= 4096 and max_bytes >= 2 segments")


@dataclass(frozen=True, slots=True)
class Record:
    seq: int
    segment: int
    offset: int
    size: int
    kind: int
    samples: int
    queued_ms: int
    cum: int  # samples of every samples record up to and including this one, since the process started


@dataclass
class _Segment:
    number: int
    path: Path
    size: int
    first: int = 0  # index into OnwardBuffer._index of its first record
    records: int = 0


class OnwardBuffer:
    """Append batches, read them back per target. ``on_drop(target, samples)`` is told of samples
    a target loses to the bound."""

    def __init__(self, directory: Path, settings: BufferSettings | None = None, *, clock: Clock,
                 on_drop: Callable[[str, int], None] | None = None) -> None:
        self.directory = directory
        self.settings = settings or BufferSettings()
        self.clock = clock
        self.on_drop = on_drop or (lambda name, n: None)
        (directory / "targets").mkdir(parents=True, exist_ok=True)
        self._index: list[Record] = []  # every record on disk, in seq order
        self._base = 1  # seq of _index[0] (the next seq when empty)
        self._segments: list[_Segment] = []
        self._writer: spool.SegmentWriter | None = None
        self._cursors: dict[str, int] = {}
        self._saved: dict[str, int] = {}  # per target, the cursor its file holds
        self._appended = asyncio.Event()
        self._recent: dict[int, Columns] = {}  # seq -> the columns appended, oldest first
        self._recent_samples = 0
        self.problems = 0  # segments read back with a damaged tail
        self._load()

    # --- start-up -----------------------------------------------------------------------------

    def _load(self) -> None:
        cum = 0
        for number, path in spool.iter_segments(self.directory):
            scan = spool.scan_segment(path)
            if scan.problem:
                self.problems += 1
                log.warning("onward buffer %s: %s; records after it are lost", path.name, scan.problem)
            seg = _Segment(number, path, path.stat().st_size, len(self._index))
            for r in scan.records:
                if self._index and r.seq != self._index[-1].seq + 1:
                    log.warning("onward buffer %s: seq %d follows %d; reading stops here", path.name, r.seq,
                                self._index[-1].seq)
                    break
                try:
                    kind = records.kind_of(r.payload)
                except records.CorruptPayload:
                    break
                cum += r.samples if kind == records.SAMPLES else 0
                self._index.append(Record(r.seq, number, r.offset, r.size, kind, r.samples, r.collected_ms, cum))
                seg.records += 1
            self._segments.append(seg)
        if self._index:
            self._base = self._index[0].seq

    @property
    def next_seq(self) -> int:
        return self._base + len(self._index)

    @property
    def last_seq(self) -> int:
        return self.next_seq - 1

    def disk_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    # --- targets ------------------------------------------------------------------------------

    def register(self, name: str) -> int:
        """A target's cursor (0: nothing sent yet; a new target starts at the oldest record kept)."""
        if not _NAME.match(name):
            raise ValueError(f"target name {name!r}: letters, digits, '_', '.', '-' only")
        d = self.directory / "targets" / name
        d.mkdir(parents=True, exist_ok=True)
        saved = spool.read_consumed(d)
        cursor = max(saved, self._base - 1)
        self._cursors[name] = cursor
        self._saved[name] = saved
        return cursor

    def cursor(self, name: str) -> int:
        return self._cursors[name]

    def commit(self, name: str, seq: int, save: bool = True) -> None:
        """Target ``name`` has sent (or given up on) every record up to ``seq``. ``save``: write
        the cursor's file now; a sender saves at most once a second (a file written and renamed
        each round was 3% of its CPU) and when it stops (``save_cursor``), so a process killed
        resends at most the last second's rounds, which receivers take as no-ops. A segment
        is deleted only once the cursors past it are saved."""
        if seq <= self._cursors[name]:
            return
        self._cursors[name] = seq
        if save:
            self.save_cursor(name)
        self._forget_recent(min(self._cursors.values()))

    def save_cursor(self, name: str) -> None:
        """Write target ``name``'s cursor to its file (if it moved since it was last written)."""
        seq = self._cursors.get(name)
        if seq is None or self._saved.get(name) == seq:
            return
        spool.write_consumed(self.directory / "targets" / name, seq)
        self._saved[name] = seq
        self._release()

    def pending(self, name: str) -> int:
        """Samples after the target's cursor."""
        if not self._index:
            return 0
        return self._index[-1].cum - self._cum_at(self._cursors[name])

    def _cum_at(self, seq: int) -> int:
        """Samples up to and including record ``seq`` (a seq before the oldest kept counts them all)."""
        if seq >= self._base:
            return self._index[seq - self._base].cum
        first = self._index[0]
        return first.cum - first.samples

    def oldest_pending_ms(self, name: str) -> int | None:
        """When the oldest samples record after the cursor was queued (None: nothing pending)."""
        for rec in self._index[max(0, self._cursors[name] + 1 - self._base):]:
            if rec.kind == records.SAMPLES:
                return rec.queued_ms
        return None

    # --- appending ----------------------------------------------------------------------------

    def next_segment(self) -> int:
        """The number of the segment the next ``append`` goes into."""
        seg = self._segments[-1] if self._segments else None
        if seg is not None and self._writer is not None and seg.size < self.settings.segment_bytes:
            return seg.number
        return seg.number + 1 if seg is not None else 1

    def append(self, cols: Columns, series: Sequence[bytes] = ()) -> int:
        """Log one batch; returns its seq. ``series``: the serialized SeriesLabels
        (records.series_entry) of every series of ``cols`` that segment ``next_segment()`` has not
        been given yet, which are logged first (the caller keeps track: tee.py). A process crash
        after this returns loses nothing (the bytes are in the OS)."""
        seg = self._segment()
        if series:
            self._write(seg, records.encode_series(series), 0)
        seq = self._write(seg, records.encode_samples(cols), cols.samples)
        self._keep_recent(seq, cols)
        self._enforce_bound()
        self._appended.set()
        self._appended = asyncio.Event()
        return seq

    def _segment(self) -> _Segment:
        seg = self._segments[-1] if self._segments and self._writer is not None else None
        if seg is not None and seg.size < self.settings.segment_bytes:
            return seg
        if self._writer is not None:
            self._writer.close()
        number = (self._segments[-1].number + 1) if self._segments else 1
        path = self.directory / spool.segment_name(number)
        self._writer = spool.SegmentWriter(path)
        seg = _Segment(number, path, self._writer.size, len(self._index))
        self._segments.append(seg)
        return seg

    def _write(self, seg: _Segment, payload: bytes, samples: int) -> int:
        assert self._writer is not None
        seq = self.next_seq
        now = self.clock.now_ms()
        encoded = spool.encode_record(seq, now, samples, payload)
        offset = self._writer.append(encoded)
        cum = (self._index[-1].cum if self._index else 0) + samples
        self._index.append(Record(seq, seg.number, offset, len(encoded), payload[0], samples, now, cum))
        seg.records += 1
        seg.size = self._writer.size
        return seq

    def _keep_recent(self, seq: int, cols: Columns) -> None:
        if cols.samples > self.settings.recent_samples:
            return
        for a in (cols.ids, cols.counts, cols.timestamps, cols.values):
            a.setflags(write=False)  # readers share them
        self._recent[seq] = cols
        self._recent_samples += cols.samples
        while self._recent_samples > self.settings.recent_samples:
            self._recent_samples -= self._recent.pop(next(iter(self._recent))).samples

    def _forget_recent(self, upto: int) -> None:
        """Drop the kept columns of records up to ``upto`` (oldest first: seqs increase)."""
        while self._recent:
            first = next(iter(self._recent))
            if first > upto:
                return
            self._recent_samples -= self._recent.pop(first).samples

    def columns(self, seq: int) -> Columns | None:
        """The columns of samples record ``seq`` as appended, if still kept in memory (read-only)."""
        return self._recent.get(seq)

    def _enforce_bound(self) -> None:
        while self.disk_bytes() > self.settings.max_bytes and len(self._segments) > 1:
            seg = self._segments[0]
            last = self._index[seg.records - 1]
            for name, cursor in self._cursors.items():
                if cursor < last.seq:
                    lost = last.cum - self._cum_at(cursor)
                    log.warning("onward buffer over %d bytes: target %s loses %d unsent samples of %s",
                                self.settings.max_bytes, name, lost, seg.path.name)
                    self.on_drop(name, lost)
                    self._cursors[name] = last.seq
                    spool.write_consumed(self.directory / "targets" / name, last.seq)
                    self._saved[name] = last.seq
            self._delete_first()
            self._forget_recent(min(self._cursors.values(), default=self.last_seq))

    def _release(self) -> None:
        """Delete the segments every target's saved cursor has passed."""
        if not self._cursors:
            return
        low = min(self._saved.get(name, -1) for name in self._cursors)
        while len(self._segments) > 1 and self._segments[0].records and \
                self._index[self._segments[0].records - 1].seq <= low:
            self._delete_first()

    def _delete_first(self) -> None:
        seg = self._segments.pop(0)
        del self._index[: seg.records]
        self._base += seg.records
        for s in self._segments:
            s.first -= seg.records
        try:
            seg.path.unlink()
        except OSError as e:
            log.warning("onward buffer: cannot delete %s: %s", seg.path, e)

    # --- reading ------------------------------------------------------------------------------

    def records_from(self, seq: int, head: bool = False) -> Iterable[Record]:
        """The records from ``seq`` on (as they are now); with ``head``, preceded by the series
        records of the segment that holds ``seq``: a reader resuming there needs their labels."""
        i = max(0, seq - self._base)
        if i >= len(self._index):
            return []
        if not head:
            return self._index[i:]
        seg = next(s for s in self._segments if s.number == self._index[i].segment)
        labels = [r for r in self._index[seg.first:i] if r.kind == records.SERIES]
        return labels + self._index[i:]

    def payload(self, rec: Record) -> bytes:
        """Raises OSError or ValueError when its file changed under us."""
        path = self.directory / spool.segment_name(rec.segment)
        return spool.read_record_at(path, rec.offset, rec.size).payload

    def payloads(self, recs: Sequence[Record]) -> Iterator[tuple[Record, bytes | Exception]]:
        """Each record's payload, or the OSError or ValueError of reading it (its file deleted or
        changed under us). Records that follow each other in one segment are read with one read."""
        i = 0
        while i < len(recs):
            j = i + 1
            while j < len(recs) and recs[j].segment == recs[i].segment and \
                    recs[j].offset == recs[j - 1].offset + recs[j - 1].size:
                j += 1
            run = recs[i:j]
            path = self.directory / spool.segment_name(run[0].segment)
            try:
                got = spool.read_records_at(path, run[0].offset, [r.size for r in run])
                yield from ((r, g.payload) for r, g in zip(run, got, strict=True))
            except (OSError, ValueError):
                for r in run:  # find which: the others are still there
                    try:
                        yield r, self.payload(r)
                    except (OSError, ValueError) as e:
                        yield r, e
            i = j

    async def wait_beyond(self, seq: int) -> None:
        """Return once a record after ``seq`` exists."""
        while self.last_seq <= seq:
            await self._appended.wait()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                fd = os.open(self._writer.path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError:
                pass
            self._writer = None

    def forget_target(self, name: str) -> None:
        """Remove a target's cursor (it was taken out of the configuration)."""
        self._cursors.pop(name, None)
        self._saved.pop(name, None)
        shutil.rmtree(self.directory / "targets" / name, ignore_errors=True)
