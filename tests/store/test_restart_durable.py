"""A durable store in this process: crashes (a copy of the data directory taken mid-run, which is what a
killed process leaves) and clean restarts come back to the state of a store that never restarted."""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from store_state import assert_same_state

from metricsd.clock import ManualClock
from metricsd.model import InvalidSeries, make_labels, series_id, stale_marker
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest, Unavailable
from metricsd.rpc.wire import labels_to_pb
from metricsd.store.durable import Durability, DurabilitySettings, open_store
from metricsd.store.engine import Store
from metricsd.store.progress import Progress
from metricsd.store.settings import StoreSettings
from metricsd.store.wal import FsyncPolicy, WalError

HOUR = 3_600_000
SETTINGS = StoreSettings(chunk_samples=8, head_keep=3, retention_ms=2 * HOUR, ooo_window_ms=HOUR)
DSET = DurabilitySettings(fsync=FsyncPolicy.NEVER, segment_bytes=4096)
T0 = 1_700_000_000_000
LABELS = [make_labels("cpu", {"namespace": f"ns{i % 3}", "pod": f"p{i}", "workload": f"w{i % 4}"}) for i in range(40)]
IDS = [series_id(lab) for lab in LABELS]


def request(series: list[int], counts: list[int], ts: list[int], vals: list[float],
            with_labels: list[int] | None = None) -> pb.WriteRequest:
    req = pb.WriteRequest(ids=[IDS[i] for i in series], counts=counts, timestamps=ts, values=vals)
    for i in with_labels or []:
        req.series.add(id=IDS[i]).labels.extend(labels_to_pb(LABELS[i]))
    return req


def crash_copy(d: Durability, tmp: Path, n: int) -> Path:
    """What a kill -9 leaves: the files as the kernel has them now (nothing flushed or closed first)."""
    dst = tmp / f"crash{n}"
    shutil.copytree(d.data_dir, dst, ignore=shutil.ignore_patterns("LOCK"))
    return dst


class Twin:
    """A durable store and a reference store that never restarts, fed the same requests."""

    def __init__(self, tmp: Path, dset: DurabilitySettings = DSET) -> None:
        self.tmp = tmp
        self.dset = dset
        self.ref = Store(SETTINGS)
        self.store, self.d = open_store(tmp / "d0", SETTINGS, durability=dset)
        self.n = 0

    def write(self, req: pb.WriteRequest) -> None:
        try:
            got = self.d.api().write(req)
        except BadRequest:
            got = None
        try:
            new = {s.id: tuple((lab.name, lab.value) for lab in s.labels) for s in req.series}
            want = self.ref.write(np.array(req.ids, np.uint64), np.array(req.counts, np.int64),
                                  np.array(req.timestamps, np.int64), np.array(req.values), new)
        except InvalidSeries:
            assert got is None
            return
        assert got is not None and got.samples_written == want.written and list(got.unknown_ids) == want.unknown_ids

    def gc(self) -> None:
        assert self.d.gc() == self.ref.gc()

    def restart(self, crash: bool) -> None:
        self.n += 1
        if crash:
            path = crash_copy(self.d, self.tmp, self.n)
            self.d.close(snapshot=False)
        else:
            self.d.close()
            path = self.d.data_dir
        self.store, self.d = open_store(path, SETTINGS, durability=self.dset)
        assert_same_state(self.store, self.ref)


@pytest.fixture
def twin(tmp_path: Path) -> Iterator[Twin]:
    t = Twin(tmp_path)
    yield t
    t.d.close(snapshot=False)


def test_samples_written_after_a_snapshot_survive_a_crash(twin: Twin) -> None:
    twin.write(request([0, 1], [3, 3], [T0, T0 + 10, T0 + 20] * 2, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [0, 1]))
    twin.d.snapshot_now()
    twin.write(request([0, 2], [1, 2], [T0 + 30, T0 + 5, T0 + 6], [7.0, 8.0, 9.0], [2]))
    twin.restart(crash=True)
    assert twin.d.recovery.snapshot is not None and twin.d.recovery.wal_records == 1
    assert twin.store.stats()["samples"] == 9


def test_a_clean_restart_replays_nothing(twin: Twin) -> None:
    twin.write(request([0], [2], [T0, T0 + 1], [1.0, 2.0], [0]))
    twin.restart(crash=False)
    assert twin.d.recovery.wal_records == 0 and twin.d.recovery.snapshot is not None


def test_batches_that_fail_validation_or_name_unknown_series_are_not_logged(twin: Twin) -> None:
    twin.write(request([0], [1], [T0], [1.0], [0]))
    before = twin.d.wal.stats.records_appended
    with pytest.raises(BadRequest, match="strictly increase"):
        twin.d.api().write(request([0], [2], [T0 + 5, T0 + 5], [1.0, 2.0]))
    resp = twin.d.api().write(request([0, 3], [1, 1], [T0 + 9, T0 + 9], [1.0, 2.0]))
    assert list(resp.unknown_ids) == [IDS[3]]
    assert twin.d.wal.stats.records_appended == before


def test_labels_of_known_series_are_left_out_of_the_log(twin: Twin) -> None:
    twin.write(request([0], [1], [T0], [1.0], [0]))
    small = twin.d.wal.stats.bytes_appended
    twin.write(request([0, 1], [1, 1], [T0 + 1, T0 + 1], [1.0, 2.0], [0, 1]))
    twin.write(request([0, 1], [1, 1], [T0 + 2, T0 + 2], [1.0, 2.0], [0, 1]))
    per = twin.d.wal.stats.bytes_appended - small
    assert per < 2 * small + 120  # the second batch carries no labels at all
    twin.restart(crash=True)


def test_a_wal_that_cannot_write_answers_unavailable_and_stores_nothing(twin: Twin,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    twin.write(request([0], [1], [T0], [1.0], [0]))

    def broken(*a: object) -> None:
        raise WalError("disk full")

    monkeypatch.setattr(twin.d.wal, "append", broken)
    samples = twin.store.stats()["samples"]
    with pytest.raises(Unavailable, match="disk full"):
        twin.d.api().write(request([0], [1], [T0 + 1], [2.0]))
    assert twin.store.stats()["samples"] == samples


def test_retention_passes_are_replayed_where_they_happened(twin: Twin) -> None:
    twin.write(request([0, 1], [1, 1], [T0, T0], [1.0, 2.0], [0, 1]))
    twin.write(request([1], [1], [T0 + 3 * HOUR], [3.0]))
    twin.gc()  # drops series 0
    twin.write(request([0], [1], [T0 + 3 * HOUR + 1], [4.0], [0]))  # back, fresh, after the pass
    twin.restart(crash=True)


def test_wal_segments_go_once_the_older_kept_snapshot_covers_them(tmp_path: Path) -> None:
    twin = Twin(tmp_path, DurabilitySettings(fsync=FsyncPolicy.NEVER, segment_bytes=4096, keep_snapshots=2))
    t = T0
    rng = np.random.default_rng(0)  # random values: records zstd cannot shrink much, so segments fill
    for k in range(3):
        for _ in range(60):
            t += 1000
            twin.write(request(list(range(10)), [1] * 10, [t] * 10, rng.random(10).tolist(), list(range(10))))
        segs_before = twin.d.wal.segments()
        path = twin.d.snapshot_now()
        segs_after = twin.d.wal.segments()
        assert len(segs_before) > 2
        if k == 0:
            assert segs_after == [*segs_before, int(path.stem)]  # one snapshot: nothing deleted yet
        else:
            assert segs_after[0] == int(sorted(twin.d.snapshot_dir.glob("*.snap"))[0].stem)
    assert len(list(twin.d.snapshot_dir.glob("*.snap"))) == 2
    twin.restart(crash=True)
    twin.d.close(snapshot=False)


def test_a_damaged_newest_snapshot_falls_back_to_the_older_one_and_loses_nothing(tmp_path: Path) -> None:
    twin = Twin(tmp_path, DurabilitySettings(fsync=FsyncPolicy.NEVER, segment_bytes=4096, keep_snapshots=2))
    t = T0
    for k in range(3):
        for _ in range(20):
            t += 1000
            twin.write(request(list(range(10)), [1] * 10, [t] * 10, [float(k)] * 10, list(range(10))))
        twin.d.snapshot_now()
    newest = sorted(twin.d.snapshot_dir.glob("*.snap"))[-1]
    buf = bytearray(newest.read_bytes())
    buf[len(buf) // 2] ^= 0x40
    newest.write_bytes(bytes(buf))
    twin.restart(crash=True)
    assert twin.d.recovery.snapshots_skipped == [newest.name]
    assert twin.d.recovery.wal_records > 0
    twin.d.close(snapshot=False)


def test_every_snapshot_damaged_still_replays_whatever_wal_is_left(tmp_path: Path) -> None:
    twin = Twin(tmp_path, DurabilitySettings(fsync=FsyncPolicy.NEVER, keep_snapshots=1))
    twin.write(request([0], [1], [T0], [1.0], [0]))
    snap = twin.d.snapshot_now()
    twin.write(request([1], [1], [T0], [2.0], [1]))
    snap.write_bytes(b"garbage")
    path = crash_copy(twin.d, tmp_path, 9)
    twin.d.close(snapshot=False)
    store, d = open_store(path, SETTINGS, durability=twin.dset)
    assert store.index.row_of(IDS[1]) is not None and store.index.row_of(IDS[0]) is None  # lost with the snapshot
    d.close()


def test_a_data_directory_serves_one_process_at_a_time(twin: Twin) -> None:
    with pytest.raises(RuntimeError, match="in use"):
        open_store(twin.d.data_dir, SETTINGS)


def test_a_long_load_logs_percent_and_rate(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock(0)
    p = Progress("replaying WAL", "bytes", clock.monotonic, logging.getLogger("t"), every_s=5.0)
    with caplog.at_level(logging.INFO):
        p.update(10, 100)  # too soon
        clock.advance(6000)
        p.update(40, 100)
        clock.advance(1000)
        p.update(50, 100)  # too soon again
        clock.advance(4000)
        took = p.finish(100)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "replaying WAL: 40% (40 of 100 bytes), 7 bytes/s"
    assert lines[1].startswith("replaying WAL: done, 100 bytes in 11.00 s") and took == 11.0


def _random_request(rng: np.random.Generator, known: set[int], last: dict[int, int]) -> pb.WriteRequest:
    k = int(rng.integers(1, 8))
    series = sorted(rng.choice(len(LABELS), size=k, replace=False).tolist())
    counts, ts, vals = [], [], []
    for i in series:
        c = int(rng.integers(0, 6))
        kind = rng.random()
        base = last.get(i, T0)
        if kind < 0.1:
            start = base - int(rng.integers(0, 2 * HOUR))  # out of order, maybe too old
        elif kind < 0.15:
            start = base  # a duplicate
        else:
            start = base + int(rng.integers(1, 20 * 60_000))
        steps = np.cumsum(rng.integers(1, 90_000, size=c)) - 1
        t = (start + steps).tolist()
        if rng.random() < 0.02 and c > 1:
            t[1] = t[0]  # invalid: not increasing
        v = rng.normal(size=c)
        v[rng.random(c) < 0.1] = np.nan
        if c and rng.random() < 0.05:
            v[-1] = stale_marker()
        counts.append(c)
        ts.extend(t)
        vals.extend(v.tolist())
        if t:
            last[i] = max(last.get(i, T0), t[-1])
    with_labels = [i for i in series if i not in known or rng.random() < 0.1]
    if rng.random() < 0.05 and with_labels:
        with_labels = with_labels[1:]  # an unknown id: the store asks for labels
    return request(series, counts, ts, vals, with_labels)


@pytest.mark.parametrize("seed", range(4))
def test_random_runs_with_crashes_restarts_snapshots_and_gc_match_a_store_that_never_stopped(
        tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    twin = Twin(tmp_path)
    last: dict[int, int] = {}
    for _ in range(250):
        op = rng.random()
        if op < 0.85:
            known = {i for i in range(len(LABELS)) if twin.ref.index.row_of(IDS[i]) is not None}
            twin.write(_random_request(rng, known, last))
        elif op < 0.9:
            twin.gc()
        elif op < 0.94:
            twin.d.snapshot_now()
        else:
            twin.restart(crash=bool(rng.random() < 0.7))
    twin.restart(crash=True)
    assert twin.ref.stats()["samples"] > 500
    twin.d.close()


async def test_writes_go_on_while_a_snapshot_file_is_written(tmp_path: Path) -> None:
    twin = Twin(tmp_path)
    twin.write(request([0], [1], [T0], [1.0], [0]))
    task = asyncio.create_task(twin.d.snapshot())
    await asyncio.sleep(0)  # the capture has run; the file is being written on a thread
    assert await twin.d.snapshot() is None  # one at a time
    twin.write(request([1], [1], [T0], [2.0], [1]))
    path = await task
    assert path is not None and path.exists()
    twin.restart(crash=True)
    assert twin.d.recovery.snapshot == twin.d.data_dir / "snapshots" / path.name
    assert twin.d.recovery.wal_records == 1  # the write made during the snapshot
    twin.d.close()


async def test_the_interval_policy_syncs_on_a_thread_only_what_is_unsynced(tmp_path: Path) -> None:
    twin = Twin(tmp_path, DurabilitySettings(fsync=FsyncPolicy.INTERVAL))
    assert twin.d.wal.policy is FsyncPolicy.INTERVAL
    twin.write(request([0], [1], [T0], [1.0], [0]))
    assert twin.d.wal.dirty
    await twin.d.sync()
    assert not twin.d.wal.dirty and twin.d.wal.stats.fsyncs == 1
    await twin.d.sync()
    assert twin.d.wal.stats.fsyncs == 1
    twin.d.close()


def test_the_fsync_argument_overrides_the_settings(tmp_path: Path) -> None:
    _, d = open_store(tmp_path, SETTINGS, fsync="always", durability=DSET)
    assert d.wal.policy is FsyncPolicy.ALWAYS and d.settings.segment_bytes == DSET.segment_bytes
    d.close()
    with pytest.raises(ValueError):
        open_store(tmp_path, SETTINGS, fsync="sometimes")
