"""A real store process snapshotting every 0.7 s under write load, killed with SIGKILL as a snapshot
is being written (its temp file seen) or just after one landed (its file seen: the read-back and
the WAL's checkpoint under way): every acknowledged sample is there after a restart, and a clean
stop leaves the WAL checkpointed (no segment below the one snapshot)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from test_restart_process import PER_WRITER, WRITERS, StoreProc, _read_all, _writer

from metricsd.rpc.client import MetricsClient

pytestmark = pytest.mark.slow


def _snapshots(data: Path, suffix: str) -> set[str]:
    d = data / "snapshots"
    return {p.name for p in d.glob(f"*{suffix}")} if d.is_dir() else set()


async def _kill_at(proc: StoreProc, data: Path, trigger: str, acked: dict[int, list[int]]) -> bool:
    """Write until ``trigger`` (".snap.tmp": a snapshot being written; ".snap": a new one landed)
    shows in the data directory after a second of load, then SIGKILL; whether it was seen (6 s at most)."""
    stop = asyncio.Event()
    async with MetricsClient(proc.addr, timeout_s=5) as client:
        tasks = [asyncio.create_task(_writer(client, w, acked, stop)) for w in range(WRITERS)]
        await asyncio.sleep(1.0)
        before, seen = _snapshots(data, trigger), False
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline and not seen:
            seen = bool(_snapshots(data, trigger) - before)
            await asyncio.sleep(0.0005)
        proc.kill9()
        await asyncio.gather(*tasks)
    return seen


async def test_a_kill_during_a_snapshot_or_its_checkpoint_loses_nothing(tmp_path: Path, free_ports: object) -> None:
    data = tmp_path / "data"
    port = free_ports()  # type: ignore[operator]
    acked: dict[int, list[int]] = {}
    seen = []
    for trigger in (".snap.tmp", ".snap", ".snap.tmp", ".snap"):
        proc = StoreProc(data, port, "never", tmp_path)
        got = await _read_all(proc.addr)
        lost = {sid: sorted(set(ts) - got.get(sid, set())) for sid, ts in acked.items()}
        assert not any(lost.values()), {k: v[:5] for k, v in lost.items() if v}
        seen.append(await _kill_at(proc, data, trigger, acked))
    assert len(acked) == WRITERS * PER_WRITER
    proc = StoreProc(data, port, "never", tmp_path)
    try:
        got = await _read_all(proc.addr)
        assert all(set(ts) <= got[sid] for sid, ts in acked.items())
    finally:
        assert proc.stop() == 0
    snaps = sorted(int(p.stem) for p in (data / "snapshots").glob("*.snap"))
    wal = sorted(int(p.stem) for p in (data / "wal").glob("*.wal"))
    assert len(snaps) == 1 and wal and min(wal) >= snaps[0], (snaps, wal)
    # a landed snapshot stays ~0.7 s (the next replaces it): those kills came where they were meant
    # to; a temp file may come and go between two looks, so those may be kills under load only
    assert seen[1] and seen[3], seen
