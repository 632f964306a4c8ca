"""The write-ahead log of one store: numbered segment files of records, appended with os.write.

Contract: not safe for concurrent use (the store's event loop thread owns it), except that the
file descriptor from sync_handle() may be fdatasync'ed on another thread.

Lifecycle: construct, replay() to the end (which also truncates a torn or corrupt tail), then
open_for_append(), which always starts a fresh segment, so nothing is ever appended after bytes
that were not verified. append() writes the record to the kernel before it returns (a process
crash then loses nothing); whether it also reaches the disk depends on the fsync policy.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from metricsd.store.wal.record import (
    RECORD_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    RecordType,
    ScanEnd,
    WalFormatError,
    compressed,
    decode_segment_header,
    decompressed,
    encode_record_header,
    encode_segment_header,
    scan_records,
)

__all__ = ["FsyncPolicy", "WalDamage", "WalError", "WalPosition", "WalStats", "WriteAheadLog"]

log = logging.getLogger("metricsd.store.wal")

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
_SUFFIX = ".wal"


class FsyncPolicy(enum.Enum):
    """When appended records are forced to disk. A process crash loses nothing acknowledged under
    any policy (the bytes are in the kernel once append() returns); a machine crash loses nothing
    under ALWAYS, up to the interval under INTERVAL, and whatever the kernel had not written back
    under NEVER."""

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


class WalError(OSError):
    """The log cannot take records (a failed write or fsync); the store must not acknowledge."""


@dataclass(frozen=True, order=True)
class WalPosition:
    """A place in the log: a segment number and a byte offset in it."""

    segment: int
    offset: int


@dataclass(frozen=True)
class WalDamage:
    """Bytes a replay could not read: the segment, where the bad bytes begin, why, how many bytes
    were dropped, and whether the segment was the newest (where a crash mid-append leaves a torn
    record that was never acknowledged)."""

    segment: int
    offset: int
    reason: str
    dropped: int
    newest: bool
    path: str = ""  # where the unreadable bytes were kept, if anywhere

    @property
    def torn_tail(self) -> bool:
        """Only a record cut short at the end of the newest segment (a crash while appending it):
        it was not acknowledged, so nothing is lost. Anything else may have been."""
        if self.reason.startswith("torn segment header"):
            return True  # a file made but not yet written: it never held a record
        return self.newest and self.reason.startswith("torn")


@dataclass
class WalStats:
    records_appended: int = 0
    bytes_appended: int = 0
    fsyncs: int = 0
    segments_created: int = 0
    segments_deleted: int = 0
    records_replayed: int = 0
    corrupt_tails: int = 0  # segments cut back to their last good record on replay
    bytes_truncated: int = 0
    damage: list[WalDamage] = field(default_factory=list)  # what replay found, in order


def segment_path(directory: Path, segment: int) -> Path:
    return directory / f"{segment:08d}{_SUFFIX}"


def list_segments(directory: Path) -> list[int]:
    out = []
    for p in directory.glob(f"*{_SUFFIX}"):
        if p.stem.isdigit():
            out.append(int(p.stem))
    return sorted(out)


def _write_all(fd: int, *bufs: bytes | memoryview) -> None:
    views = [memoryview(b) for b in bufs if len(b)]
    while views:
        n = os.writev(fd, views)
        while n and views:
            if n >= len(views[0]):
                n -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][n:]
                n = 0


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WriteAheadLog:
    def __init__(self, directory: Path, fsync: FsyncPolicy = FsyncPolicy.INTERVAL,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        if segment_bytes < SEGMENT_HEADER_SIZE + RECORD_HEADER_SIZE:
            raise ValueError(f"segment_bytes {segment_bytes} is too small")
        self.directory = directory
        self.policy = fsync
        self.segment_bytes = segment_bytes
        self.stats = WalStats()
        directory.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = None
        self._segment = 0
        self._offset = 0
        self._dirty = False
        self._failed = ""

    # --- replay ----------------------------------------------------------------------------

    def segments(self) -> list[int]:
        return list_segments(self.directory)

    def replay(self, start: WalPosition | None = None,
               progress: Callable[[int, int], None] | None = None
               ) -> Iterator[tuple[WalPosition, RecordType, memoryview]]:
        """Yield (position, type, payload) of every good record at or after ``start`` (None: from the
        oldest segment), oldest first. Each payload view is valid until the next one is yielded.

        A segment is cut back to its last good record (a logged warning, stats.corrupt_tails) and the
        next segment is read on; a segment whose header is unreadable is moved aside to
        ``*.wal.corrupt``. ``progress(done_bytes, total_bytes)`` is called as it goes.
        Consume the iterator to the end before open_for_append().
        """
        if self._fd is not None:
            raise RuntimeError("replay() after open_for_append()")
        segs = [s for s in self.segments() if start is None or s >= start.segment]
        if start is not None and segs and segs[0] > start.segment:
            log.error("WAL starts at segment %d but the snapshot covers it only to %d:%d: writes in between are "
                      "lost from this store (a peer must supply them)", segs[0], start.segment, start.offset)
        sizes = {s: segment_path(self.directory, s).stat().st_size for s in segs}
        total, done = sum(sizes.values()), 0
        for seg in segs:
            path = segment_path(self.directory, seg)
            buf = path.read_bytes()
            newest = seg == segs[-1]
            try:
                number = decode_segment_header(buf)
                if number != seg:
                    raise WalFormatError(f"header says segment {number}")
            except WalFormatError as e:
                self._set_aside(path, buf, str(e), seg, newest)
                done += sizes[seg]
                continue
            first = SEGMENT_HEADER_SIZE
            if start is not None and seg == start.segment:
                first = max(first, start.offset)
                if first > len(buf):
                    log.warning("WAL segment %d holds %d bytes, less than the snapshot covered (%d)", seg, len(buf),
                                first)
                    first = len(buf)
            end = ScanEnd(first)
            for k, (off, rtype, payload) in enumerate(scan_records(buf, first, end)):
                try:
                    rtype, payload = decompressed(rtype, payload)
                except WalFormatError as e:  # its CRC was good: cut the segment there, as for a bad one
                    end.offset, end.reason = off, str(e)
                    break
                self.stats.records_replayed += 1
                yield WalPosition(seg, off), rtype, payload
                if progress is not None and k % 64 == 63:
                    progress(done + off, total)
            if end.reason:
                self._truncate(path, seg, buf, end, newest)
            done += sizes[seg]
            if progress is not None:
                progress(done, total)

    def _set_aside(self, path: Path, buf: bytes, why: str, seg: int, newest: bool) -> None:
        self.stats.corrupt_tails += 1
        self.stats.bytes_truncated += len(buf)
        if len(buf) < SEGMENT_HEADER_SIZE:
            # A crash right after the file was made: torn, and empty of records.
            self.stats.damage.append(WalDamage(seg, 0, f"torn segment header ({len(buf)} bytes)", len(buf), newest))
            log.warning("WAL segment %s is empty or torn in its header (%d bytes): removed", path.name, len(buf))
            path.unlink()
            return
        aside = path.with_name(path.name + ".corrupt")
        self.stats.damage.append(WalDamage(seg, 0, f"unreadable segment header ({why})", len(buf), newest, str(aside)))
        log.error("WAL segment %s: unreadable header (%s) at offset 0; moved aside to %s, %d bytes skipped",
                  path, why, aside.name, len(buf))
        path.rename(aside)

    def _truncate(self, path: Path, seg: int, buf: bytes, end: ScanEnd, newest: bool) -> None:
        dropped = len(buf) - end.offset
        self.stats.corrupt_tails += 1
        self.stats.bytes_truncated += dropped
        damage = WalDamage(seg, end.offset, end.reason, dropped, newest)
        if damage.torn_tail:
            log.warning("WAL segment %s: %s at offset %d (a crash while appending it); truncated to the last good "
                        "record, %d bytes dropped", path, end.reason, end.offset, dropped)
        else:  # keep the bytes for a post-mortem; losing them must not stop the start
            aside = path.with_name(f"{path.name}.corrupt-{end.offset}")
            try:
                aside.write_bytes(buf[end.offset :])
                damage = WalDamage(seg, end.offset, end.reason, dropped, newest, str(aside))
            except OSError as e:
                log.warning("cannot keep the unreadable bytes of %s in %s: %s", path, aside, e)
            log.error("WAL segment %s: %s at offset %d; truncated there, %d bytes dropped (kept in %s): the records "
                      "after it in this segment are lost from this store", path, end.reason, end.offset, dropped,
                      damage.path or "nowhere")
        self.stats.damage.append(damage)
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, end.offset)
            os.fsync(fd)
        finally:
            os.close(fd)

    # --- appending -------------------------------------------------------------------------

    @property
    def position(self) -> WalPosition:
        """Where the next record goes."""
        return WalPosition(self._segment, self._offset)

    @property
    def failed(self) -> str:
        return self._failed

    def open_for_append(self, at_least: int = 1) -> WalPosition:
        """Start a new segment numbered above every existing one and at least ``at_least``."""
        segs = self.segments()
        self._create(max(at_least, (segs[-1] + 1) if segs else 1))
        return self.position

    def _create(self, segment: int) -> None:
        """Make and open segment ``segment``. Raises OSError with nothing left behind (a full disk:
        the half-made file is removed, so the number can be made again once there is room)."""
        path = segment_path(self.directory, segment)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            _write_all(fd, encode_segment_header(segment))
            if self.policy is not FsyncPolicy.NEVER:
                os.fdatasync(fd)
                fsync_dir(self.directory)
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        self._fd, self._segment, self._offset = fd, segment, SEGMENT_HEADER_SIZE
        self._dirty = False
        self.stats.segments_created += 1

    def append(self, rtype: RecordType, payload: bytes | memoryview) -> WalPosition:
        """Write one record (to the kernel, and to disk under ALWAYS) and return the position after it.

        Raises WalError when it could not; the log is then unchanged (a partial write is cut
        off again) or, when even that fails, refuses every later append.
        """
        if self._fd is None:
            raise RuntimeError("append() before open_for_append()")
        if self._failed:
            raise WalError(f"write-ahead log unusable: {self._failed}")
        rtype, payload = compressed(rtype, payload)  # WRITE and CATCH_UP go zstd-compressed
        need = RECORD_HEADER_SIZE + len(payload)
        if self._offset > SEGMENT_HEADER_SIZE and self._offset + need > self.segment_bytes:
            try:
                self.roll()
            except WalError as e:
                raise WalError(f"WAL append failed: {e}") from e
        header = encode_record_header(rtype, payload)
        fd = self._fd
        assert fd is not None
        try:
            _write_all(fd, header, payload)
        except OSError as e:
            try:
                os.ftruncate(fd, self._offset)
                os.lseek(fd, self._offset, os.SEEK_SET)
            except OSError as e2:
                self._failed = f"append failed ({e}) and could not be undone ({e2})"
            raise WalError(f"WAL append failed: {e.strerror or e}") from e
        self._offset += need
        self.stats.records_appended += 1
        self.stats.bytes_appended += need
        if self.policy is FsyncPolicy.ALWAYS:
            self._fsync(fd)
        else:
            self._dirty = True
        return self.position

    def _fsync(self, fd: int) -> None:
        try:
            os.fdatasync(fd)
        except OSError as e:
            # After a failed fsync the kernel may have dropped the dirty pages: nothing written
            # since the last good fsync can be trusted, so stop taking writes.
            self.mark_failed(f"fdatasync failed: {e}")
            raise WalError(self._failed) from e
        self.stats.fsyncs += 1

    def mark_failed(self, reason: str) -> None:
        log.critical("write-ahead log: %s; refusing writes until restart", reason)
        self._failed = reason

    def roll(self) -> WalPosition:
        """Start a new segment unless the current one holds no record yet; returns where the next record goes.

        Raises WalError when the new segment cannot be made (a full disk); the log then goes on
        in the current segment, and the next roll tries again."""
        if self._fd is None:
            raise RuntimeError("roll() before open_for_append()")
        if self._offset == SEGMENT_HEADER_SIZE:
            return self.position
        if self.policy is not FsyncPolicy.NEVER and self._dirty:
            self._fsync(self._fd)
        old = self._fd
        try:
            self._create(self._segment + 1)  # the new one first: a failure leaves the old one open
        except OSError as e:
            raise WalError(f"{e.strerror or e} (creating WAL segment {self._segment + 1})") from e
        os.close(old)
        return self.position

    @property
    def dirty(self) -> bool:
        return self._dirty

    def sync(self) -> None:
        """fdatasync the current segment if anything was appended since the last sync."""
        if self._fd is not None and self._dirty:
            self._dirty = False
            self._fsync(self._fd)

    def sync_handle(self) -> int | None:
        """A duplicate descriptor of the current segment for fdatasync on another thread (the
        caller closes it), or None when nothing is unsynced. Clears the dirty flag."""
        if self._fd is None or not self._dirty:
            return None
        self._dirty = False
        self.stats.fsyncs += 1
        return os.dup(self._fd)

    def delete_before(self, segment: int) -> int:
        """Remove segments numbered below ``segment`` (never the one being written); returns how many."""
        n = 0
        for seg in self.segments():
            if seg >= segment or (self._fd is not None and seg == self._segment):
                continue
            segment_path(self.directory, seg).unlink(missing_ok=True)
            n += 1
        self.stats.segments_deleted += n
        return n

    def close(self) -> None:
        """Sync (unless NEVER) and close. Idempotent."""
        if self._fd is None:
            return
        try:
            if self.policy is not FsyncPolicy.NEVER and self._dirty and not self._failed:
                self._fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = None
