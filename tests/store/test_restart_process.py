"""A real store process, killed with SIGKILL under write load and started again on the same data directory:
every acknowledged sample is there."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.client import MetricsClient
from metricsd.rpc.wire import labels_to_pb, matchers_to_pb
from metricsd.selector import parse_selector

pytestmark = pytest.mark.slow

T0 = 1_700_000_000_000
WRITERS = 4
PER_WRITER = 50


class StoreProc:
    def __init__(self, data_dir: Path, port: int, fsync: str, tmp: Path) -> None:
        self.log = open(tmp / f"store-{port}-{os.getpid()}-{len(list(tmp.iterdir()))}.log", "w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "metricsd", "store", "--data-dir", str(data_dir), "--grpc-port", str(port),
             "--wal-fsync", fsync, "--snapshot-every", "0.7"],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "serving gRPC" in line, self.stderr()
        self.addr = f"127.0.0.1:{port}"

    def stderr(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._close()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=30)
        self._close()
        return code

    def _close(self) -> None:
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self.log.close()


def _labels(w: int, i: int) -> tuple[tuple[str, str], ...]:
    return make_labels("cpu", {"namespace": "ns", "pod": f"w{w}-p{i}", "workload": f"w{w}"})


async def _writer(client: MetricsClient, w: int, acked: dict[int, list[int]], stop: asyncio.Event) -> None:
    labels = [_labels(w, i) for i in range(PER_WRITER)]
    ids = [series_id(lab) for lab in labels]
    labels_of = {sid: labels_to_pb(lab) for sid, lab in zip(ids, labels, strict=True)}
    tick = 0
    while not stop.is_set():
        ts = T0 + tick * 10_000
        req = pb.WriteRequest(ids=ids, counts=[3] * PER_WRITER, timestamps=[ts, ts + 1, ts + 2] * PER_WRITER,
                              values=[float(tick)] * (3 * PER_WRITER))
        if tick == 0:
            for sid in ids:
                req.series.add(id=sid).labels.extend(labels_of[sid])
        try:
            resp = await client.write(req, labels_of)
        except Exception:
            return  # the store is gone: what was acknowledged is recorded
        assert not resp.unknown_ids
        for sid in ids:
            acked.setdefault(sid, []).extend((ts, ts + 1, ts + 2))
        tick += 1


async def _load_then_kill(proc: StoreProc, seconds: float) -> dict[int, list[int]]:
    acked: dict[int, list[int]] = {}
    stop = asyncio.Event()
    async with MetricsClient(proc.addr, timeout_s=5) as client:
        tasks = [asyncio.create_task(_writer(client, w, acked, stop)) for w in range(WRITERS)]
        await asyncio.sleep(seconds)
        proc.kill9()  # mid-flight: some requests are in the air
        await asyncio.gather(*tasks)
    return acked


async def _read_all(addr: str) -> dict[int, set[int]]:
    async with MetricsClient(addr, timeout_s=10) as client:
        resp = await client.read(pb.ReadRequest(matchers=matchers_to_pb(parse_selector('namespace="ns"', "cpu")),
                                                start_ms=0, end_ms=T0 * 2))
    return {s.id: set(s.timestamps) for s in resp.series}


@pytest.mark.parametrize("fsync", ["never", "interval"])
async def test_everything_acknowledged_survives_kill_9(tmp_path: Path, free_ports: object, fsync: str) -> None:
    data = tmp_path / "data"
    port = free_ports()  # type: ignore[operator]
    proc = StoreProc(data, port, fsync, tmp_path)
    acked = await _load_then_kill(proc, 2.0)
    total = sum(len(v) for v in acked.values())
    assert total > 1000 and len(acked) == WRITERS * PER_WRITER
    proc = StoreProc(data, port, fsync, tmp_path)  # same dir, same port
    try:
        got = await _read_all(proc.addr)
        lost = {sid: sorted(set(ts) - got.get(sid, set())) for sid, ts in acked.items()}
        assert not any(lost.values()), {k: v[:5] for k, v in lost.items() if v}
        assert "replaying WAL: done" in proc.stderr()
        # a second kill right after recovery loses nothing either
        proc.kill9()
        proc = StoreProc(data, port, fsync, tmp_path)
        got2 = await _read_all(proc.addr)
        assert got2 == got
    finally:
        code = proc.stop()
    assert code == 0
    # a clean stop wrote a final snapshot: the next start replays no record
    proc = StoreProc(data, port, fsync, tmp_path)
    try:
        assert await _read_all(proc.addr) == got
        assert "; 0 records," in proc.stderr()
    finally:
        proc.stop()
