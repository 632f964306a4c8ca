"""A full disk under a store, on a real filesystem filled to the last byte (a 40 MiB tmpfs, root only):
writes are refused with UNAVAILABLE ("WAL append failed: No space left on device"), reads are
answered, snapshots fail without keeping the space they took, and all resumes when space returns,
with nothing acknowledged lost and nothing refused stored. In a cluster, writes go on at W through
the other replicas and hinted hand-off fills the full one once it has room: nothing lost."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import grpc
import pytest
from small_fs import fill, free_bytes, small_fs

from metricsd.clock import SystemClock
from metricsd.cluster.assign import assign
from metricsd.cluster.mapsource import StaticMapSource
from metricsd.cluster.shardmap import Member
from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.proxy.backend import ProxyBackend
from metricsd.proxy.settings import HandoffSettings, HealthSettings, ProxySettings
from metricsd.rpc.server import start_grpc_server
from metricsd.rpc.servicer import MetricsServicer
from metricsd.rpc.wire import labels_to_pb
from metricsd.store.api import LocalBackend
from metricsd.store.durable import Durability, DurabilitySettings, open_store
from metricsd.store.engine import Store
from metricsd.store.wal import FsyncPolicy
from metricsd.store.wal import record as wal_record

LABELS = [make_labels("container_memory_rss", {"namespace": "shop", "pod": f"p{i}"}) for i in range(50)]
IDS = [series_id(lab) for lab in LABELS]
DSET = DurabilitySettings(fsync=FsyncPolicy.ALWAYS, segment_bytes=64 * 1024)


def _batch(ts: int, labelled: bool, series: int = len(IDS)) -> pb.WriteRequest:
    """``series`` series, 20 samples each (14.5 KB in the WAL for all 50 without labels, 1.4 KB for 5)."""
    ids = IDS[:series]
    # Values from a seeded generator, so that no snapshot of these samples compresses below the 4 KiB
    # the test leaves free (regular values made a 3.7-5.1 KB snapshot, depending on the clock).
    rng = random.Random(ts)
    req = pb.WriteRequest(ids=ids, counts=[20] * len(ids), timestamps=[ts + k for _ in ids for k in range(20)],
                          values=[rng.random() for _ in ids for _ in range(20)])
    if labelled:
        for sid, lab in zip(ids, LABELS, strict=False):
            req.series.add(id=sid).labels.extend(labels_to_pb(lab))
    return req


def _read_req() -> pb.ReadRequest:
    return pb.ReadRequest(matchers=[pb.Matcher(type=pb.Matcher.EQ, name="namespace", value="shop")],
                          start_ms=0, end_ms=2**62)


def _held(store: Store) -> set[tuple[int, int]]:
    out = set()
    for row in store.index.live_rows():
        for t in store.series_samples(row, 0, 2**62)[0].tolist():
            out.add((store.index.ids[row], t))
    return out


def _want(stamps: list[int], series: int = len(IDS)) -> set[tuple[int, int]]:
    return {(sid, ts + k) for ts in stamps for sid in IDS[:series] for k in range(20)}


async def test_a_store_on_a_full_disk_refuses_writes_answers_reads_and_resumes_when_space_returns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # WAL records as long as the requests (no zstd frame: the store's threshold raised), so that
    # which write needs a new segment follows from the sizes below, and a refused write needs new
    # pages (a zstd record of these regular samples fits in the last page's unused bytes)
    monkeypatch.setattr(wal_record, "MIN_COMPRESSED", 1 << 30)
    now = int(time.time() * 1000)
    with small_fs(tmp_path / "fs") as fs:
        store, d = open_store(fs / "data", durability=DSET)
        server, port = await start_grpc_server(MetricsServicer(LocalBackend(d.api("store"))), "127.0.0.1", 0)
        acked: list[int] = []
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.MetricsStub(channel)
                for k in range(8):
                    await stub.Write(_batch(now + k * 1000, k == 0), timeout=10)
                    acked.append(now + k * 1000)
                    if k == 3:
                        assert await asyncio.to_thread(d.snapshot_now)  # a new segment: 4 x 14.5 KB after
                (fs / "reserve").write_bytes(b"\0" * 8192)
                filler = fill(fs)
                assert free_bytes(fs) == 0  # to the last byte
                refused: list[int] = []
                for k in range(8, 16):
                    # A small batch fits the segment (the write itself fails); a big one needs a new
                    # segment (creating it fails). Both refused, and both alike.
                    small = k < 12
                    req = _batch(now + k * 1000, False, 15 if small else len(IDS))
                    fits = d.wal.position.offset + 9 + req.ByteSize() <= DSET.segment_bytes
                    assert fits is small
                    with pytest.raises(grpc.aio.AioRpcError) as e:
                        await stub.Write(req, timeout=10)
                    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
                    assert e.value.details().startswith("WAL append failed: No space left on device"), e.value.details()
                    refused.append(now + k * 1000)
                read = await stub.Read(_read_req(), timeout=10)  # reads are answered
                assert {(s.id, t) for s in read.series for t in s.timestamps} == _want(acked)
                assert await d.snapshot() is None and d.snapshot_failures == 1  # no room for a new segment
                (fs / "reserve").unlink()  # room for a new segment, not for a snapshot file
                assert await d.snapshot() is None and d.snapshot_failures == 2
                assert not list((fs / "data" / "snapshots").glob("*.tmp"))  # the failed file keeps no space
                assert free_bytes(fs) == 4096 and d.wal.failed == ""
                filler.unlink()  # space returns
                for k in range(20, 24):
                    resp = await stub.Write(_batch(now + k * 1000, False), timeout=10)
                    assert resp.samples_written == 1000
                    acked.append(now + k * 1000)
                assert await d.snapshot() is not None
            assert _held(store) == _want(acked)
        finally:
            await server.stop(None)
            d.close(snapshot=False)
        again, d2 = open_store(fs / "data", durability=DSET)  # what a restart finds: every ack, no refusal
        try:
            assert _held(again) == _want(acked) and not _held(again) & _want(refused)
            assert d2.recovery.lost == [] and d2.recovery.corrupt_tails == 0
        finally:
            d2.close(snapshot=False)


async def test_in_a_cluster_writes_go_on_while_one_disk_is_full_and_hand_off_fills_it_when_space_returns(
        tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    with small_fs(tmp_path / "fs") as fs:
        dirs = [fs / "store-0", tmp_path / "store-1", tmp_path / "store-2"]
        opened: list[tuple[Store, Durability]] = [open_store(p, durability=DSET) for p in dirs]
        servers = []
        for i, (_, d) in enumerate(opened):
            servers.append(await start_grpc_server(MetricsServicer(LocalBackend(d.api(f"store-{i}"))),
                                                   "127.0.0.1", 0))
        shard_map = assign([Member(f"store-{i}", f"127.0.0.1:{port}") for i, (_, port) in enumerate(servers)],
                           None, 8, 3)
        settings = ProxySettings(call_timeout_s=5.0, retries=0, health=HealthSettings(0.05, 0.2),
                                 handoff=HandoffSettings(retry_initial_s=0.05, retry_max_s=0.2))
        proxy = ProxyBackend(StaticMapSource(shard_map), settings, SystemClock())
        acked: list[int] = []
        try:
            resp = await proxy.write(_batch(now, True))
            assert resp.samples_written == 1000
            acked.append(now)
            # The ack came at W = 2: the third replica's part may still be on its way. Wait for it, or
            # the disk fills under it and the first batch joins the hand-off (CI saw store-0 empty).
            await proxy.writes.wait_idle()
            assert _held(opened[0][0]) == _want(acked)
            filler = fill(fs)
            assert free_bytes(fs) == 0
            for k in range(1, 30):
                resp = await proxy.write(_batch(now + k * 1000, False))  # W = 2 of the other two
                assert resp.samples_written == 1000
                acked.append(now + k * 1000)
            await proxy.writes.wait_idle()
            full = opened[0][0]
            assert _held(full) == _want(acked[:1])  # refused while full: nothing half-stored
            assert proxy.counters["handoff_queued"] > 0 and "store-0" in proxy.writes.handoff.pending()
            for store, _ in opened[1:]:
                assert _held(store) == _want(acked)
            filler.unlink()
            # Each hint is one Write with fsync=ALWAYS: ~5 ms alone, but up to ~1.4 s apiece was seen
            # on a machine loaded by disk-heavy benchmarks (29 hints: ~25 s). A bound, not a timing.
            deadline = time.monotonic() + 90
            while _held(full) != _want(acked):
                assert time.monotonic() < deadline, f"hand-off left {len(_want(acked) - _held(full))} samples"
                await asyncio.sleep(0.1)
        finally:
            await proxy.close()
            for server, _ in servers:
                await server.stop(None)
            for _, d in opened:
                d.close(snapshot=False)
