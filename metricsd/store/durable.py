"""A store that survives restarts: WAL before every acknowledged write, periodic snapshots, recovery.

Data directory layout::

    <data-dir>/LOCK                  held (flock) while a process uses the directory
    <data-dir>/wal/00000007.wal      WAL segments (metricsd/store/FORMAT.md)
    <data-dir>/snapshots/00000007.snap   a snapshot; replay resumes at WAL segment 7
    <data-dir>/chunks/00000012.slab      a chunk slab's pages (scratch, not read by recovery:
                                         metricsd/store/slabfiles.py; removed at start and close)

A write is validated, appended to the WAL (in the kernel before the call returns), then applied
and acknowledged; a batch that fails validation is neither logged nor applied. Retention passes
are logged too (a GC record), so replay rebuilds exactly the state the store had.

Restart: load the newest snapshot that reads back whole (a damaged one is moved aside with a
warning naming the file and the byte, and the next older one is tried), then replay the WAL after
it. Each snapshot is read back from the disk once written; then the snapshots before it and the WAL
segments it covers are deleted (the checkpoint: ``keep_snapshots`` 1, the default), so the data
directory holds each sample once. With ``keep_snapshots`` 2 the WAL is kept back to the older of
two, and a snapshot damaged later on the disk costs a longer replay, not data. Whatever could not be
read is reported (RecoveryReport.lost, recovery.losses); a cluster store that lost something
catches up from its peers before it serves reads (metricsd/cmd/store.py).

Run a durable store process:  metricsd store --data-dir D --grpc-port P (metricsd/cmd/store.py)
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from metricsd.clock import Clock, SystemClock
from metricsd.defaults import SNAPSHOT_INTERVAL_S
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import Unavailable
from metricsd.rpc.columns import WriteColumns
from metricsd.store.api import StoreAPI, gc_loop
from metricsd.store.engine import Store, ValidWrite, WriteResult
from metricsd.store.recovery import CATCH_UP_WINDOW_MS, RecoveryReport, load_snapshot, losses, replay_wal
from metricsd.store.settings import StoreSettings
from metricsd.store.slabfiles import SlabFiles
from metricsd.store.snapcheck import verify_snapshot
from metricsd.store.snapshot import SnapshotError, list_snapshots, write_snapshot
from metricsd.store.snapshot_write import LeanImage, capture_lean
from metricsd.store.wal import FsyncPolicy, RecordType, WalError, WriteAheadLog
from metricsd.store.wal.log import DEFAULT_SEGMENT_BYTES

__all__ = ["Durability", "DurabilitySettings", "DurableStoreAPI", "RecoveryReport", "open_store", "run_durability",
           "run_snapshots", "run_wal_sync", "wal_bytes_due"]

log = logging.getLogger("metricsd.store.durable")


@dataclass(frozen=True)
class DurabilitySettings:
    """How a store keeps its data across restarts.

    fsync: ALWAYS syncs each write before acknowledging it; INTERVAL (default) every
        ``fsync_interval_s``; NEVER leaves it to the kernel. A process crash loses nothing
        acknowledged under any policy; a machine crash may lose up to the interval (INTERVAL)
        or the kernel's write-back delay (NEVER, typically up to 30 s).
    segment_bytes: a WAL segment is closed and a new one begun past this size.
    snapshot_interval_s: how often run_snapshots() writes a snapshot (also on clean shutdown).
    snapshot_wal_bytes: a snapshot is also taken once the WAL written since the last one is at
        least this and at least that snapshot's size (0: on the interval only).
    keep_snapshots: snapshots kept; WAL segments are kept back to the oldest of them. One (the
        default) checkpoints the WAL at each snapshot, once the snapshot was read back whole from
        the disk: the directory holds the samples once. Two keep a snapshot's worth of WAL more,
        so that a snapshot damaged later on the disk costs replay time rather than data.
    progress_every_s: how often a long load logs its progress.
    """

    fsync: FsyncPolicy = FsyncPolicy.INTERVAL
    fsync_interval_s: float = 1.0
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    snapshot_interval_s: float = SNAPSHOT_INTERVAL_S
    keep_snapshots: int = 1
    snapshot_wal_bytes: int = 64 << 20
    progress_every_s: float = 5.0

    def __post_init__(self) -> None:
        if self.keep_snapshots < 1 or self.fsync_interval_s <= 0 or self.snapshot_interval_s <= 0:
            raise ValueError("keep_snapshots >= 1 and positive intervals required")


class Durability:
    """The store's WAL and snapshots. Not safe for concurrent use: call from the event loop thread.

    Build it with open_store(), which recovers the store first.
    """

    def __init__(self, store: Store, wal: WriteAheadLog, data_dir: Path, settings: DurabilitySettings, clock: Clock,
                 lock_fd: int, recovery: RecoveryReport, files: SlabFiles | None = None) -> None:
        self.store = store
        self.wal = wal
        self.data_dir = data_dir
        self.snapshot_dir = data_dir / "snapshots"
        self.settings = settings
        self.clock = clock
        self.recovery = recovery
        self.files = files  # the chunk slabs' files (None: anonymous memory)
        self._lock_fd: int | None = lock_fd
        self._snapshotting = False
        self.snapshots_written = 0
        self.snapshot_failures = 0
        self.last_snapshot_bytes = 0
        self.last_snapshot_s = 0.0
        self.wal_bytes_at_snapshot = 0  # wal.stats.bytes_appended when the last snapshot (tried) rolled the WAL

    # --- the write path --------------------------------------------------------------------

    def write(self, request: pb.WriteRequest, catch_up: bool = False) -> WriteResult:
        """write_columns() of a message. Raises InvalidSeries also for a duplicate label name."""
        return self.write_columns(WriteColumns.of_request(request), catch_up)

    def write_columns(self, batch: WriteColumns, catch_up: bool = False, runs: Sequence[int] = ()) -> WriteResult:
        """Validate, log, apply. Raises InvalidSeries (nothing logged or stored) or WalError
        (nothing stored; the caller must not acknowledge).

        ``catch_up``: samples copied from a peer (metricsd/replica/catchup_client.py), applied
        without the out-of-order window and logged as CATCH_UP so that replay does the same."""
        window = CATCH_UP_WINDOW_MS if catch_up else None
        now_s = None if catch_up else self.clock.monotonic()  # series limits: live writes only
        valid = self.store.validate(batch.ids, batch.counts, batch.timestamps, batch.values, batch.labels,
                                    ooo_window_ms=window, now_s=now_s, runs=runs)
        if isinstance(valid, WriteResult):
            return valid  # unknown ids: nothing stored, so nothing to log
        self.wal.append(RecordType.CATCH_UP if catch_up else RecordType.WRITE, self._record(batch, valid))
        return self.store.apply(valid)

    @staticmethod
    def _record(batch: WriteColumns, valid: ValidWrite) -> bytes:
        """The batch as a WriteRequest, with the labels of series new to the store only (replay
        needs only those, and meets them in the same order)."""
        if not batch.labels:
            return batch.wire()
        return batch.wire(labelled=dict.fromkeys(int(i) for i in valid.ids[valid.rows < 0].tolist()))

    def gc(self) -> int:
        """Run retention, logged first so replay drops exactly what this pass dropped."""
        self.wal.append(RecordType.GC, b"")
        return self.store.gc()

    def api(self, member: str = "store") -> DurableStoreAPI:
        return DurableStoreAPI(self, member)

    # --- fsync -----------------------------------------------------------------------------

    async def sync(self) -> None:
        """fdatasync what was appended since the last sync, on a worker thread."""
        fd = self.wal.sync_handle()
        if fd is None:
            return
        try:
            await asyncio.to_thread(os.fdatasync, fd)
        except OSError as e:
            self.wal.mark_failed(f"fdatasync failed: {e}")
        finally:
            os.close(fd)

    # --- snapshots -------------------------------------------------------------------------

    async def snapshot(self) -> Path | None:
        """Write a snapshot (the file on a worker thread), read it back, checkpoint the WAL; None if
        one is under way or it failed."""
        if self._snapshotting:
            return None
        self._snapshotting = True
        try:
            t0 = self.clock.monotonic()
            img = self._capture()
            took = self.clock.monotonic() - t0
            path, size = await asyncio.to_thread(self._write_checked, img)
        except (OSError, SnapshotError) as e:
            self.snapshot_failures += 1
            log.error("snapshot failed (the WAL and the snapshots before it are kept): %s", e)
            return None
        finally:
            self._snapshotting = False
        self._after_snapshot(path, size, len(img.ids), self.clock.monotonic() - t0, took)
        return path

    def snapshot_now(self) -> Path:
        """Write a snapshot on this thread (shutdown, tests). Raises OSError or SnapshotError."""
        t0 = self.clock.monotonic()
        img = self._capture()
        took = self.clock.monotonic() - t0
        path, size = self._write_checked(img)
        self._after_snapshot(path, size, len(img.ids), self.clock.monotonic() - t0, took)
        return path

    def _capture(self) -> LeanImage:
        """The store at a new WAL segment's start (no write interleaves: the event loop's thread)."""
        img = capture_lean(self.store, self.wal.roll())
        self.wal_bytes_at_snapshot = self.wal.stats.bytes_appended
        return img

    def _write_checked(self, img: LeanImage) -> tuple[Path, int]:
        """write_snapshot(), then the file read back from the disk (snapcheck.py): the WAL it covers
        is deleted after this, so it must be whole. A file that is not is moved aside (SnapshotError)."""
        path, size = write_snapshot(self.snapshot_dir, img)
        try:
            verify_snapshot(path)
        except SnapshotError:
            path.rename(path.with_name(path.name + ".corrupt"))
            raise
        return path, size

    def _after_snapshot(self, path: Path, size: int, series: int, took: float, capture_s: float) -> None:
        self.store.chunks.settle()  # the snapshot read every slab: its pages faulted back in
        self.snapshots_written += 1
        self.last_snapshot_bytes = size
        self.last_snapshot_s = took
        snaps = list_snapshots(self.snapshot_dir)
        for _, old in snaps[: -self.settings.keep_snapshots]:
            old.unlink(missing_ok=True)
        kept = snaps[-self.settings.keep_snapshots :]
        # The checkpoint: WAL segments below the oldest kept snapshot hold nothing a snapshot lacks.
        deleted = self.wal.delete_before(kept[0][0]) if len(kept) == self.settings.keep_snapshots else 0
        log.info("snapshot %s: %d series, %.1f MiB in %.2f s (capture %.0f ms); %d WAL segments deleted", path.name,
                 series, size / 2**20, took, capture_s * 1000, deleted)

    # --- lifecycle -------------------------------------------------------------------------

    def close(self, snapshot: bool = True) -> None:
        """Clean shutdown: a final snapshot (so the next start replays nothing), sync, unlock. Idempotent."""
        if self._lock_fd is None:
            return
        try:
            if snapshot and not self.wal.failed:
                try:
                    self.snapshot_now()
                except (OSError, SnapshotError) as e:
                    log.error("final snapshot failed (the WAL still holds everything): %s", e)
            self.wal.close()
        finally:
            if self.files is not None:
                self.files.clear()  # scratch: the mappings stay valid, the directory is left empty
            os.close(self._lock_fd)
            self._lock_fd = None

    def stats(self) -> dict[str, int | float]:
        w = self.wal.stats
        return {
            "wal_records_appended": w.records_appended, "wal_bytes_appended": w.bytes_appended,
            "wal_fsyncs": w.fsyncs, "wal_segments_created": w.segments_created,
            "wal_segments_deleted": w.segments_deleted, "wal_corrupt_tails": w.corrupt_tails,
            "wal_bytes_truncated": w.bytes_truncated, "wal_failed": int(bool(self.wal.failed)),
            "snapshots_written": self.snapshots_written, "snapshot_failures": self.snapshot_failures,
            "last_snapshot_bytes": self.last_snapshot_bytes, "last_snapshot_seconds": self.last_snapshot_s,
            "recovery_snapshot_load_seconds": self.recovery.snapshot_load_s,
            "recovery_wal_replay_seconds": self.recovery.wal_replay_s,
            "recovery_losses": len(self.recovery.lost),
            "chunk_file_bytes": self.files.file_bytes if self.files is not None else 0,
            "chunk_file_fallbacks": self.files.fallbacks if self.files is not None else 0,
        }


class DurableStoreAPI(StoreAPI):
    """StoreAPI whose writes go through the WAL; a WAL failure answers Unavailable (not acknowledged)."""

    def __init__(self, durability: Durability, member: str = "store") -> None:
        super().__init__(durability.store, member, durability.clock)
        self.durability = durability

    def _write(self, batch: WriteColumns, runs: Sequence[int] = ()) -> WriteResult:
        try:
            return self.durability.write_columns(batch, runs=runs)
        except WalError as e:
            raise Unavailable(str(e)) from e


# --- recovery ------------------------------------------------------------------------------


def _lock(data_dir: Path) -> int:
    fd = os.open(data_dir / "LOCK", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        raise RuntimeError(f"data directory {data_dir} is in use by another process") from e
    return fd


def open_store(data_dir: Path, settings: StoreSettings | None = None, fsync: FsyncPolicy | str | None = None,
               durability: DurabilitySettings | None = None, clock: Clock | None = None) -> tuple[Store, Durability]:
    """Recover the store kept in ``data_dir`` (created if missing) and open its WAL for writing.

    ``fsync`` ("always", "interval", "never"), when given, overrides ``durability.fsync``.
    Raises RuntimeError when another process holds the directory, ValueError on an unknown policy.
    """
    settings = settings or StoreSettings()
    dset = durability or DurabilitySettings()
    if fsync is not None:
        dset = dataclasses.replace(dset, fsync=FsyncPolicy(fsync))
    policy = dset.fsync
    clock = clock or SystemClock()
    data_dir.mkdir(parents=True, exist_ok=True)
    lock_fd = _lock(data_dir)
    try:
        snap_dir = data_dir / "snapshots"
        snap_dir.mkdir(exist_ok=True)
        for tmp in snap_dir.glob("*.tmp"):
            tmp.unlink()
        report = RecoveryReport()
        wal = WriteAheadLog(data_dir / "wal", policy, dset.segment_bytes)
        files = SlabFiles(data_dir / "chunks") if settings.chunks_on_disk else None
        if files is not None:
            log.info("chunk pages live in files under %s (page cache, not anonymous memory; --chunks-on-disk off "
                     "to keep them in memory)", files.where)
        else:
            log.info("chunk pages live in anonymous memory (--chunks-on-disk off)")
        loaded = load_snapshot(snap_dir, settings, clock, dset.progress_every_s, report, files)
        if loaded is not None:
            store, start = loaded
        else:
            store, start = Store(settings), None
            if files is not None:
                store.chunks.keep_in(files)
        segments = wal.segments()
        if loaded is None and report.snapshots_skipped:
            log.error("no snapshot could be read; replaying the whole WAL (from segment %s): data covered only by "
                      "the unreadable snapshots is lost here", segments[0] if segments else "none")
        replay_wal(store, wal, start, clock, dset.progress_every_s, report)
        report.lost = losses(start, segments, wal.stats.damage, report.replay_dropped_series)
        if report.lost:
            log.error("recovery of %s may have lost acknowledged data: %s. In a cluster this store copies what it "
                      "lacks from its peers before it serves reads again; alone, it serves what it kept",
                      data_dir, "; ".join(report.lost))
        wal.open_for_append(start.segment if start is not None else 1)
    except BaseException:
        os.close(lock_fd)
        raise
    return store, Durability(store, wal, data_dir, dset, clock, lock_fd, report, files)


# --- background tasks ----------------------------------------------------------------------


async def run_wal_sync(d: Durability) -> None:
    """fdatasync the WAL every fsync_interval_s (only under the INTERVAL policy)."""
    if d.settings.fsync is not FsyncPolicy.INTERVAL:
        return
    while True:
        await asyncio.sleep(d.settings.fsync_interval_s)
        await d.sync()


def wal_bytes_due(wal_since: int, last_snapshot: int, floor: int) -> bool:
    """Whether the WAL written since the last snapshot calls for one now: once it outgrows that
    snapshot (at least ``floor`` bytes; 0 turns it off), the next snapshot and its checkpoint make
    the directory smaller than the WAL would. Pure."""
    return floor > 0 and wal_since >= max(floor, last_snapshot)


async def run_snapshots(d: Durability, every_s: float | None = None, poll_s: float = 1.0) -> None:
    """A snapshot every ``every_s`` (default: the settings' snapshot_interval_s), and sooner when
    the WAL since the last one has outgrown it (wal_bytes_due): a backfill's WAL is ~3 times the
    chunks it makes, so the WAL, not the snapshot, would be most of the directory until the next."""
    every = every_s or d.settings.snapshot_interval_s
    last = d.clock.monotonic()
    while True:
        await asyncio.sleep(min(every, poll_s))
        # counted from the last try's roll, failed or not: a full disk is tried again after as much
        # WAL again (or the interval), not every poll
        since = d.wal.stats.bytes_appended - d.wal_bytes_at_snapshot
        if d.clock.monotonic() - last >= every or wal_bytes_due(since, d.last_snapshot_bytes,
                                                                 d.settings.snapshot_wal_bytes):
            last = d.clock.monotonic()
            await d.snapshot()


async def run_durability(d: Durability, gc_every_s: float | None = 60.0) -> None:
    """Everything a durable store runs in the background: WAL fsync, snapshots, logged retention."""
    tasks = [run_wal_sync(d), run_snapshots(d)]
    if gc_every_s:
        tasks.append(gc_loop(d.gc, gc_every_s, skip=(WalError,)))
    await asyncio.gather(*tasks)
