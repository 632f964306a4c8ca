"""The pusher's buffer: a bounded FIFO of Write batches, in memory, spilling to spool files.

Batches leave in the order they came (oldest first, one at a time), which is what keeps every
series' samples in time order at the receiver. Past ``memory_bytes`` new batches are written to
segment files under ``directory`` (layout in metricsd/agent/FORMAT.md); past ``max_bytes`` in
all, the oldest batches are dropped, counted and logged. ``close`` writes what is still in
memory to the spool, so a restarted agent replays everything it had not delivered.

Batches are held without series labels: the buffer keeps one label set per series id (the
``LabelRegistry``) and the sender adds labels for the ids a receiver has not seen. Spooled
records carry the labels of each series the first time it appears in their segment, so a spool
is readable without the process that wrote it.

No asyncio and no clock here; the file I/O is small appends. Not safe to use from several
threads.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.message import DecodeError

from metricsd.agent import spool
from metricsd.model import Labels
from metricsd.proto import metricsd_pb2 as pb

__all__ = ["Batch", "BufferSettings", "BufferStats", "LabelRegistry", "PushBuffer"]

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class BufferSettings:
    """max_bytes: the bound on everything buffered (memory and spool); beyond it the oldest go.
    memory_bytes: past this much in memory, new batches go to the spool (when ``directory``
    is set; without it everything stays in memory up to max_bytes).
    segment_bytes: a spool segment file is closed and a new one started past this size; a
    segment is deleted once all its batches left, so the disk holds up to about max_bytes plus
    one segment."""

    max_bytes: int = 256 * MiB
    memory_bytes: int = 16 * MiB
    directory: Path | None = None
    segment_bytes: int = 8 * MiB

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.memory_bytes < 0 or self.segment_bytes < 1:
            raise ValueError("buffer sizes must be positive")


@dataclass(frozen=True, slots=True)
class Batch:
    """One Write batch as the sender sees it. ``collected_ms`` is when its samples were read
    (0: not a live read, e.g. a backfill, so no collection delay is measured)."""

    request: pb.WriteRequest  # without labels
    collected_ms: int
    samples: int
    seq: int


@dataclass(slots=True)
class BufferStats:
    pushed_batches: int = 0
    pushed_samples: int = 0
    dropped_batches: int = 0  # dropped because the buffer was full (oldest first)
    dropped_samples: int = 0
    spilled_batches: int = 0  # written to the spool
    replayed_batches: int = 0  # found in the spool at start
    replayed_samples: int = 0
    spool_problems: Counter[str] = field(default_factory=Counter)  # by kind: truncated, crc, io_error...


class LabelRegistry:
    """Labels by series id, for the series that buffered batches refer to."""

    def __init__(self) -> None:
        self._labels: dict[int, Labels] = {}
        self._last_seq: dict[int, int] = {}

    def add(self, labels: Mapping[int, Labels], ids: Iterable[int], seq: int) -> None:
        self._labels.update(labels)
        self._last_seq.update(dict.fromkeys(ids, seq))

    def get(self, sid: int) -> Labels | None:
        return self._labels.get(sid)

    def prune(self, before_seq: int) -> list[int]:
        """Forget series no batch from ``before_seq`` on refers to; returns their ids."""
        gone = [sid for sid, last in self._last_seq.items() if last < before_seq]
        for sid in gone:
            del self._last_seq[sid]
            self._labels.pop(sid, None)
        return gone

    def __len__(self) -> int:
        return len(self._labels)


class _Segment:
    def __init__(self, number: int, path: Path, writer: spool.SegmentWriter | None) -> None:
        self.number = number
        self.path = path
        self.writer = writer  # None: a replayed segment, read-only
        self.live = 0  # batches of this segment still in the buffer
        self.labelled: set[int] = set()  # ids whose labels this segment already holds


@dataclass(slots=True)
class _Entry:
    seq: int
    collected_ms: int
    samples: int
    size: int
    request: pb.WriteRequest | None = None  # in memory
    segment: _Segment | None = None  # or in the spool
    offset: int = 0


class PushBuffer:
    """A FIFO of batches with a byte bound; see the module docstring.

    ``push`` never blocks and never fails: when full it drops the oldest batch that is not being
    sent. ``peek`` returns the oldest batch and marks it in flight; ``remove(seq)`` takes it out
    once delivered (or given up on). Spool I/O errors are counted in ``stats.spool_problems``
    and the batch stays in memory instead.
    """

    def __init__(self, settings: BufferSettings | None = None, logger: logging.Logger | None = None) -> None:
        self.settings = settings or BufferSettings()
        self.stats = BufferStats()
        self.labels = LabelRegistry()
        self._log = logger or logging.getLogger("metricsd.agent.buffer")
        self._q: deque[_Entry] = deque()
        self._memory_bytes = 0
        self._disk_bytes = 0
        self._next_seq = 1
        self._inflight: int | None = None
        self._head: Batch | None = None  # the in-flight batch, loaded once
        self._segment: _Segment | None = None  # the one being appended to
        self._next_segment = 1
        if self.settings.directory is not None:
            self._replay(self.settings.directory)

    # --- queries ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._q)

    @property
    def memory_bytes(self) -> int:
        return self._memory_bytes

    @property
    def disk_bytes(self) -> int:
        return self._disk_bytes

    @property
    def total_bytes(self) -> int:
        return self._memory_bytes + self._disk_bytes

    @property
    def samples(self) -> int:
        return sum(e.samples for e in self._q)

    @property
    def oldest_seq(self) -> int:
        """The seq of the oldest batch held, or the next seq to be given when empty."""
        return self._q[0].seq if self._q else self._next_seq

    # --- the queue ----------------------------------------------------------------------------

    def push(self, request: pb.WriteRequest, labels: Mapping[int, Labels], collected_ms: int = 0) -> int:
        """Append a batch (``request`` without labels; ``labels`` covering its ids); returns its seq."""
        seq = self._next_seq
        self._next_seq += 1
        samples = len(request.values)
        self.labels.add(labels, request.ids, seq)
        entry = _Entry(seq, collected_ms, samples, request.ByteSize(), request=request)
        self.stats.pushed_batches += 1
        self.stats.pushed_samples += samples
        if self.settings.directory is not None and self._memory_bytes + entry.size > self.settings.memory_bytes:
            self._spill(entry)
        if entry.request is not None:
            self._memory_bytes += entry.size
        self._q.append(entry)
        self._enforce_bound()
        return seq

    def peek(self) -> Batch | None:
        """The oldest batch, now in flight (not dropped on overflow until removed)."""
        while self._q:
            e = self._q[0]
            if self._head is not None and self._head.seq == e.seq:
                return self._head
            batch = self._load(e)
            if batch is None:  # unreadable from the spool: counted and logged by _load
                self._pop_head()
                continue
            self._inflight, self._head = e.seq, batch
            return batch
        return None

    def remove(self, seq: int) -> bool:
        """Take the batch ``seq`` out after it was delivered or given up on. False when it is no
        longer the oldest (dropped meanwhile)."""
        if not self._q or self._q[0].seq != seq:
            return False
        self._pop_head()
        return True

    def close(self) -> None:
        """Spool what is in memory (when there is a directory) and note what was consumed, so a
        restart replays exactly the batches not yet delivered."""
        directory = self.settings.directory
        if directory is None:
            if self._q:
                self._log.warning("buffer closed with %d batches (%d samples) undelivered and no --buffer-dir: "
                                  "they are lost", len(self._q), self.samples)
            return
        spilled = 0
        for e in self._q:
            if e.request is not None:
                size = e.size
                if self._spill(e):
                    self._memory_bytes -= size
                    spilled += 1
        try:
            # Everything before the oldest batch held has left the buffer (FIFO).
            spool.write_consumed(directory, self.oldest_seq - 1)
        except OSError as err:
            self._problem("io_error", f"cannot write the consumed mark: {err}")
        if self._segment is not None and self._segment.writer is not None:
            self._segment.writer.close()
        self._segment = None  # a push after close starts a new segment rather than append to a closed file
        if spilled or self._q:
            self._log.info("buffer closed: %d batches (%d samples) kept in %s for the next start",
                           len(self._q), self.samples, directory)

    # --- internals ----------------------------------------------------------------------------

    def _pop_head(self) -> None:
        e = self._q.popleft()
        self._release(e)
        if self._inflight == e.seq:
            self._inflight, self._head = None, None

    def _release(self, e: _Entry) -> None:
        if e.request is not None:
            self._memory_bytes -= e.size
            return
        self._disk_bytes -= e.size
        seg = e.segment
        assert seg is not None
        seg.live -= 1
        if seg.live == 0 and seg is not self._segment:
            self._delete_segment(seg)

    def _enforce_bound(self) -> None:
        dropped_batches = dropped_samples = 0
        while self.total_bytes > self.settings.max_bytes:
            # The in-flight batch stays: it may be delivered this very moment.
            i = 1 if self._q and self._q[0].seq == self._inflight else 0
            if i >= len(self._q):
                break  # only the in-flight batch is left; it may exceed the bound on its own
            e = self._q[i]
            del self._q[i]
            self._release(e)
            dropped_batches += 1
            dropped_samples += e.samples
        if dropped_batches:
            self.stats.dropped_batches += dropped_batches
            self.stats.dropped_samples += dropped_samples
            self._log.warning(
                "push buffer full (bound %d bytes): dropped the %d oldest batches (%d samples); "
                "%d dropped since start", self.settings.max_bytes, dropped_batches, dropped_samples,
                self.stats.dropped_batches)

    def _spill(self, e: _Entry) -> bool:
        """Move an in-memory entry to the spool; False (and left in memory) on an I/O error."""
        assert e.request is not None and self.settings.directory is not None
        try:
            seg = self._writable_segment(self.settings.directory)
            assert seg.writer is not None
            new = [sid for sid in dict.fromkeys(e.request.ids) if sid not in seg.labelled]
            payload = self._with_labels(e.request, new).SerializeToString()
            record = spool.encode_record(e.seq, e.collected_ms, e.samples, payload)
            offset = seg.writer.append(record)
        except OSError as err:
            self._problem("io_error", f"cannot spool a batch: {err}")
            return False
        seg.labelled.update(new)
        seg.live += 1
        e.request, e.segment, e.offset, e.size = None, seg, offset, len(record)
        self._disk_bytes += e.size
        self.stats.spilled_batches += 1
        return True

    def _with_labels(self, request: pb.WriteRequest, ids: list[int]) -> pb.WriteRequest:
        if not ids:
            return request
        out = pb.WriteRequest()
        out.CopyFrom(request)
        for sid in ids:
            labels = self.labels.get(sid)
            if labels is not None:
                out.series.add(id=sid, labels=[pb.Label(name=k, value=v) for k, v in labels])
        return out

    def _writable_segment(self, directory: Path) -> _Segment:
        seg = self._segment
        if seg is not None and seg.writer is not None and seg.writer.size < self.settings.segment_bytes:
            return seg
        if seg is not None and seg.writer is not None:
            seg.writer.close()
            if seg.live == 0:
                self._delete_segment(seg)
        number = self._next_segment
        self._next_segment += 1
        path = directory / spool.segment_name(number)
        self._segment = _Segment(number, path, spool.SegmentWriter(path))
        return self._segment

    def _delete_segment(self, seg: _Segment) -> None:
        if seg.writer is not None:
            seg.writer.close()
        if seg is self._segment:
            self._segment = None
        try:
            seg.path.unlink(missing_ok=True)
        except OSError as err:
            self._problem("io_error", f"cannot delete {seg.path}: {err}")

    def _load(self, e: _Entry) -> Batch | None:
        if e.request is not None:
            return Batch(e.request, e.collected_ms, e.samples, e.seq)
        assert e.segment is not None
        try:
            rec = spool.read_record_at(e.segment.path, e.offset, e.size)
            request = pb.WriteRequest.FromString(rec.payload)
        except (OSError, ValueError, DecodeError) as err:
            self._problem("unreadable", f"batch {e.seq} lost from the spool: {err}")
            return None
        del request.series[:]  # labels travel as the receiver needs them, from the registry
        return Batch(request, e.collected_ms, e.samples, e.seq)

    def _problem(self, kind: str, text: str) -> None:
        self.stats.spool_problems[kind] += 1
        self._log.warning("spool: %s", text)

    def _replay(self, directory: Path) -> None:
        """Load the spool left by an earlier run: labels of every record, entries for the batches
        after the consumed mark, in seq order."""
        directory.mkdir(parents=True, exist_ok=True)
        consumed = spool.read_consumed(directory)
        entries: dict[int, _Entry] = {}
        segments: list[_Segment] = []
        for number, path in spool.iter_segments(directory):
            self._next_segment = max(self._next_segment, number + 1)
            seg = _Segment(number, path, None)
            segments.append(seg)
            scan = spool.scan_segment(path)
            if scan.problem:
                kind = "crc" if "CRC" in scan.problem else "truncated" if "truncated" in scan.problem else "corrupt"
                self._problem(kind, f"{path.name}: {scan.problem}; the rest of this segment is skipped")
            for rec in scan.records:
                try:
                    request = pb.WriteRequest.FromString(rec.payload)
                except DecodeError as err:
                    self._problem("corrupt", f"{path.name}: batch {rec.seq} does not decode: {err}")
                    continue
                labels = {s.id: tuple((lab.name, lab.value) for lab in s.labels) for s in request.series}
                self.labels.add(labels, request.ids, rec.seq)
                seg.labelled.update(labels)
                if rec.seq > consumed and rec.seq not in entries:
                    entries[rec.seq] = _Entry(rec.seq, rec.collected_ms, rec.samples, rec.size,
                                              segment=seg, offset=rec.offset)
                    seg.live += 1
        for seg in segments:
            if seg.live == 0:
                self._delete_segment(seg)
        for seq in sorted(entries):
            e = entries[seq]
            self._q.append(e)
            self._disk_bytes += e.size
            self.stats.replayed_batches += 1
            self.stats.replayed_samples += e.samples
        self._next_seq = max([consumed, *entries]) + 1
        if entries:
            self._log.info("replaying %d batches (%d samples) from the spool in %s",
                           len(entries), self.stats.replayed_samples, directory)
        self._enforce_bound()

    def _check(self) -> None:
        """Invariants, for tests: seqs increase, byte and per-segment counts add up."""
        seqs = [e.seq for e in self._q]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), "batches out of order"
        assert self._memory_bytes == sum(e.size for e in self._q if e.request is not None)
        assert self._disk_bytes == sum(e.size for e in self._q if e.request is None)
        live: Counter[int] = Counter(id(e.segment) for e in self._q if e.segment is not None)
        for e in self._q:
            if e.segment is not None:
                assert e.segment.live == live[id(e.segment)], "segment live count off"
        assert all(e.seq < self._next_seq for e in self._q)
