"""The WAL checkpointed at each snapshot: once the snapshot reads back whole from the disk, the
segments it covers and the snapshots before it are deleted, so the data directory holds each
sample once; a snapshot that does not read back keeps everything. snapcheck.verify_snapshot
refuses any damaged byte."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from polling import wait_until
from test_restart_durable import DSET, T0, Twin, request

from metricsd.store import durable
from metricsd.store.snapcheck import verify_snapshot
from metricsd.store.snapshot import SnapshotError, write_snapshot


def _fill(twin: Twin, t: int, rng: np.random.Generator, n: int = 60) -> int:
    for _ in range(n):
        t += 1000
        twin.write(request(list(range(10)), [1] * 10, [t] * 10, rng.random(10).tolist(), list(range(10))))
    return t


def test_each_snapshot_deletes_the_wal_it_covers_and_a_crash_loses_nothing(tmp_path: Path) -> None:
    twin = Twin(tmp_path, DSET)
    rng = np.random.default_rng(1)  # random values: records zstd cannot shrink much, so segments fill
    t = T0
    try:
        for _ in range(3):
            t = _fill(twin, t, rng)
            assert len(twin.d.wal.segments()) > 2
            path = twin.d.snapshot_now()
            assert twin.d.wal.segments() == [int(path.stem)]  # the new, empty segment the snapshot starts at
            assert sorted(twin.d.snapshot_dir.iterdir()) == [path]
            t = _fill(twin, t, rng, 20)
            twin.restart(crash=True)  # the snapshot + the segments after it: the same state
            assert twin.d.recovery.snapshot is not None and twin.d.recovery.wal_records == 20
            assert not twin.d.recovery.lost
    finally:
        twin.d.close(snapshot=False)


def test_a_snapshot_that_does_not_read_back_is_moved_aside_and_nothing_is_deleted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    twin = Twin(tmp_path, DSET)
    rng = np.random.default_rng(2)
    try:
        t = _fill(twin, T0, rng)
        first = twin.d.snapshot_now()
        t = _fill(twin, t, rng)
        segments = twin.d.wal.segments()

        def damaged(directory: Path, img: object) -> tuple[Path, int]:
            path, size = write_snapshot(directory, img)  # type: ignore[arg-type]
            buf = bytearray(path.read_bytes())
            buf[size // 2] ^= 0x10  # what the disk gave back differs from what was written
            path.write_bytes(bytes(buf))
            return path, size

        monkeypatch.setattr(durable, "write_snapshot", damaged)
        with pytest.raises(SnapshotError, match="checksum"):
            twin.d.snapshot_now()
        t = _fill(twin, t, rng, 5)
        assert asyncio.run(twin.d.snapshot()) is None and twin.d.snapshot_failures == 1
        names = sorted(p.name for p in twin.d.snapshot_dir.iterdir())
        assert names[0] == first.name and len(names) == 3 and all(n.endswith(".snap.corrupt") for n in names[1:])
        assert twin.d.wal.segments()[: len(segments)] == segments  # every segment kept, new ones begun
        monkeypatch.undo()
        t = _fill(twin, t, rng, 5)
        twin.restart(crash=True)  # the first snapshot + every segment since
        assert twin.d.recovery.snapshot == twin.d.snapshot_dir / first.name and not twin.d.recovery.lost
    finally:
        twin.d.close(snapshot=False)


@pytest.fixture
def snapshot_file(tmp_path: Path) -> Path:
    twin = Twin(tmp_path, DSET)
    _fill(twin, T0, np.random.default_rng(3), 30)
    path = twin.d.snapshot_now()
    twin.d.close(snapshot=False)
    return path


def test_a_whole_snapshot_reads_back(snapshot_file: Path) -> None:
    assert verify_snapshot(snapshot_file) == snapshot_file.stat().st_size


def test_every_flipped_byte_is_refused(snapshot_file: Path) -> None:
    good = snapshot_file.read_bytes()
    for at in range(len(good)):  # headers, lengths, tags, pads, payloads, CRCs, the end marker
        bad = bytearray(good)
        bad[at] ^= 1 << (at % 8)
        snapshot_file.write_bytes(bytes(bad))
        with pytest.raises(SnapshotError):
            verify_snapshot(snapshot_file)


def test_a_cut_short_or_extended_snapshot_is_refused(snapshot_file: Path) -> None:
    good = snapshot_file.read_bytes()
    for size in [*range(0, len(good), 7), len(good) - 1]:
        snapshot_file.write_bytes(good[:size])
        with pytest.raises(SnapshotError):
            verify_snapshot(snapshot_file)
    snapshot_file.write_bytes(good + b"\0")
    with pytest.raises(SnapshotError, match="after the end marker"):
        verify_snapshot(snapshot_file)


@pytest.mark.parametrize(("since", "last", "floor", "due"), [
    (0, 0, 100, False), (99, 0, 100, False), (100, 0, 100, True), (150, 200, 100, False), (200, 200, 100, True),
    (10**9, 0, 0, False),
])
def test_the_wal_calls_for_a_snapshot_once_it_outgrows_the_last_one(since: int, last: int, floor: int,
                                                                     due: bool) -> None:
    assert durable.wal_bytes_due(since, last, floor) is due


class _Polls:
    """run_snapshots' polls counted (each asks wal_bytes_due once while the interval is far): a test
    waits for polls, not for time to pass, so a loaded machine's slow loop cannot thin them out."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        due = durable.wal_bytes_due

        def counted(since: int, last: int, floor: int) -> bool:
            self.n += 1
            return due(since, last, floor)

        monkeypatch.setattr(durable, "wal_bytes_due", counted)

    async def run(self, d: durable.Durability, what: str, done: Callable[[], bool]) -> None:
        """run_snapshots (a far interval, 10 ms polls) until ``done()``."""
        task = asyncio.create_task(durable.run_snapshots(d, every_s=3600, poll_s=0.01))
        try:
            await wait_until(what, done, timeout_s=20.0)
        finally:
            task.cancel()


async def test_a_wal_larger_than_the_last_snapshot_is_checkpointed_before_the_interval(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    polls = _Polls(monkeypatch)
    twin = Twin(tmp_path, durable.DurabilitySettings(fsync=DSET.fsync, segment_bytes=4096, snapshot_wal_bytes=8_000))
    try:
        _fill(twin, T0, np.random.default_rng(4))
        assert twin.d.wal.stats.bytes_appended > 8_000 and len(twin.d.wal.segments()) > 2
        await polls.run(twin.d, "the first snapshot", lambda: twin.d.snapshots_written == 1)
        assert twin.d.snapshots_written == 1 and len(twin.d.wal.segments()) == 1
        after = polls.n
        await polls.run(twin.d, "ten more polls", lambda: polls.n >= after + 10)
        assert twin.d.snapshots_written == 1  # the WAL since (nothing) is below the floor: no second one
    finally:
        twin.d.close(snapshot=False)


async def test_a_failing_snapshot_is_not_retried_every_poll(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    twin = Twin(tmp_path, durable.DurabilitySettings(fsync=DSET.fsync, segment_bytes=4096, snapshot_wal_bytes=8_000))
    tries: list[int] = []

    def full(directory: Path, img: object) -> tuple[Path, int]:
        tries.append(1)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(durable, "write_snapshot", full)
    polls = _Polls(monkeypatch)
    try:
        _fill(twin, T0, np.random.default_rng(5))
        await polls.run(twin.d, "thirty polls", lambda: polls.n >= 30)
        assert tries == [1] and twin.d.snapshot_failures == 1
    finally:
        twin.d.close(snapshot=False)
