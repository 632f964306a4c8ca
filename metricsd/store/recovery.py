"""Restart recovery: load the newest good snapshot, then replay the WAL after it.

Long loads log their progress (percent and rate). A damaged snapshot (a checksum that does not
match, a file cut short: the warning names the file and the byte) is moved aside and the next
older one tried; the WAL is kept back to the oldest kept snapshot (by default one: the WAL is
checkpointed at each snapshot, metricsd/store/durable.py), so falling back to an older one, when
kept, costs replay time, not data. A WAL record whose series' labels were lost with an earlier damaged record is
applied without those series (counted), since the other series' samples are still good.

:func:`losses` then says whether anything acknowledged may be missing: WAL bytes that could not
be read other than a record torn at the end of the newest segment (a crash while appending it,
never acknowledged), segments missing between the snapshot used and the newest one (every
snapshot that covered them was damaged), series dropped for lost labels. A store that lost
something must not answer reads as if it held everything: a cluster store copies what it lacks
from its peers before it serves reads again (metricsd/cmd/store.py, metricsd/replica/replication.py).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from metricsd.clock import Clock
from metricsd.model import InvalidSeries
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import labels_from_pb
from metricsd.store.engine import Store, WriteResult
from metricsd.store.progress import Progress
from metricsd.store.settings import StoreSettings
from metricsd.store.slabfiles import SlabFiles
from metricsd.store.snapshot import SnapshotError, list_snapshots, read_snapshot, restore
from metricsd.store.wal import RecordType, WalPosition, WriteAheadLog
from metricsd.store.wal.log import WalDamage

__all__ = ["CATCH_UP_WINDOW_MS", "Arrays", "RecoveryReport", "load_snapshot", "losses", "replay_wal", "request_arrays"]

log = logging.getLogger("metricsd.store.recovery")

_SHOWN = 5  # records of the same problem logged one by one at most

# The out-of-order window of writes copied from a peer (WAL record CATCH_UP): any age.
CATCH_UP_WINDOW_MS = 2**62


@dataclass
class RecoveryReport:
    """What a restart found and how long it took."""

    snapshot: Path | None = None
    snapshot_series: int = 0
    snapshot_load_s: float = 0.0
    snapshots_skipped: list[str] = field(default_factory=list)
    wal_start: WalPosition | None = None
    wal_records: int = 0
    wal_samples: int = 0
    wal_bytes: int = 0
    wal_replay_s: float = 0.0
    corrupt_tails: int = 0
    bytes_truncated: int = 0
    replay_dropped_series: int = 0  # series of a record whose labels were lost with an earlier record
    replay_rejected_records: int = 0
    replay_dropping_records: int = 0  # records that had series dropped
    lost: list[str] = field(default_factory=list)  # why acknowledged data may be missing (losses())


Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # ids, counts, timestamps, values


def request_arrays(req: pb.WriteRequest) -> Arrays:
    return (np.array(req.ids, dtype=np.uint64), np.array(req.counts, dtype=np.int64),
            np.array(req.timestamps, dtype=np.int64), np.array(req.values, dtype=np.float64))


def load_snapshot(snap_dir: Path, settings: StoreSettings, clock: Clock, every_s: float,
                  report: RecoveryReport, files: SlabFiles | None = None) -> tuple[Store, WalPosition] | None:
    """The store of the newest snapshot that reads back whole (its chunk slabs in ``files`` if
    given), and where the WAL resumes; None when there is none."""
    for _, path in reversed(list_snapshots(snap_dir)):
        progress = Progress(f"loading snapshot {path.name}", "series", clock.monotonic, log, every_s)
        try:
            img = read_snapshot(path)
            store = restore(img, settings, progress.update, files)
        except (SnapshotError, ValueError, IndexError, OSError) as e:
            if files is not None:
                files.clear()  # the half-restored store's slab files: abandoned with it
            log.warning("snapshot %s unusable (%s): moved aside, trying an older one", path.name, e)
            report.snapshots_skipped.append(path.name)
            with contextlib.suppress(OSError):
                path.rename(path.with_name(path.name + ".corrupt"))
            continue
        report.snapshot, report.snapshot_series = path, len(img.ids)
        report.snapshot_load_s = progress.finish(len(img.ids), f"{store.stats()['samples']:,} samples")
        return store, img.position
    return None


def _drop_unknown(store: Store, ids: np.ndarray, counts: np.ndarray, ts: np.ndarray, vals: np.ndarray,
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    known = store.index.rows_of(ids) >= 0
    per_sample = np.repeat(known, counts)
    return ids[known], counts[known], ts[per_sample], vals[per_sample], int((~known).sum())


def replay_wal(store: Store, wal: WriteAheadLog, start: WalPosition | None, clock: Clock, every_s: float,
               report: RecoveryReport) -> None:
    progress = Progress("replaying WAL", "bytes", clock.monotonic, log, every_s)
    report.wal_start = start
    for pos, rtype, payload in wal.replay(start, progress.update):
        report.wal_records += 1
        report.wal_bytes += len(payload)
        if rtype is RecordType.GC:
            store.gc()
            continue
        req = pb.WriteRequest.FromString(bytes(payload))
        arrays = request_arrays(req)
        new = {s.id: labels_from_pb(s.labels) for s in req.series}
        window = CATCH_UP_WINDOW_MS if rtype is RecordType.CATCH_UP else None
        try:
            batch = store.validate(*arrays, new, ooo_window_ms=window)
            if isinstance(batch, WriteResult):
                ids, counts, ts, vals, dropped = _drop_unknown(store, *arrays)
                report.replay_dropped_series += dropped
                report.replay_dropping_records += 1
                if report.replay_dropping_records <= _SHOWN:  # the rest is in the summary (losses)
                    log.warning("WAL record at %d:%d: %d series unknown (their labels were in a lost record): "
                                "dropped", pos.segment, pos.offset, dropped)
                batch = store.validate(ids, counts, ts, vals, new, ooo_window_ms=window)
                assert not isinstance(batch, WriteResult)
        except InvalidSeries as e:
            report.replay_rejected_records += 1
            log.warning("WAL record at %d:%d no longer valid (%s): skipped", pos.segment, pos.offset, e)
            continue
        report.wal_samples += len(batch.values)
        store.apply(batch)
    report.corrupt_tails = wal.stats.corrupt_tails
    report.bytes_truncated = wal.stats.bytes_truncated
    report.wal_replay_s = progress.finish(report.wal_bytes, f"{report.wal_records:,} records, "
                                                            f"{report.wal_samples:,} samples")


def _ranges(numbers: list[int]) -> str:
    out: list[str] = []
    for n in numbers:
        if out and out[-1].split("-")[-1] == str(n - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ", ".join(out)


def losses(start: WalPosition | None, segments: list[int], damage: list[WalDamage],
           dropped_series: int = 0) -> list[str]:
    """Why data acknowledged before the restart may be missing, one phrase per cause (empty: none).
    ``start`` is where replay began (the snapshot used; None: no snapshot), ``segments`` the WAL
    segments found before replay, ``damage`` what replay could not read. Pure."""
    out = [f"WAL segment {d.segment:08d}: {d.reason} at offset {d.offset}, {d.dropped} bytes unreadable"
           for d in damage if not d.torn_tail]
    first = start.segment if start is not None else 1
    if segments:
        have = set(segments)
        missing = [n for n in range(first, max(segments) + 1) if n not in have]
        if missing:
            covered = f"the snapshot used starts at segment {first}" if start else "no snapshot could be used"
            out.append(f"WAL segments {_ranges(missing)} missing ({covered})")
    if dropped_series:
        out.append(f"{dropped_series} series entries of later records dropped (their labels were in lost records)")
    return out
