"""Catch-up: paging and resume tokens, the out-of-order bypass (in memory and through the WAL), and a
wiped store brought level with a peer over gRPC while writes continue."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.replica.catchup import build_page, decode_token, encode_token, missing_only, pages, slot_series
from metricsd.replica.catchup_client import CatchUpError, catch_up, local_apply, sync_slots
from metricsd.replica.digest import store_digest
from metricsd.replica.servicer import StoreNodeServicer
from metricsd.rpc.server import GRPC_OPTIONS, start_grpc_server
from metricsd.rpc.wire import labels_to_pb
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.durable import DurabilitySettings, open_store
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings
from metricsd.store.wal import FsyncPolicy

T0 = 1_700_000_000_000
HOUR = 3_600_000
SLOTS = 4


def labels(i: int) -> tuple[tuple[str, str], ...]:
    return make_labels("mem", {"namespace": "ns", "pod": f"p{i % 5}", "container": f"c{i}"})


def write(store: Store, series: range, ts: list[int], value: float = 1.0) -> None:
    ids = [series_id(labels(i)) for i in series]
    n = len(ts)
    store.write(np.array(ids, dtype=np.uint64), np.full(len(ids), n), np.tile(np.array(ts), len(ids)),
                np.arange(len(ids) * n, dtype=np.float64) + value, {series_id(labels(i)): labels(i) for i in series})


def samples_of(store: Store) -> dict[int, list[tuple[int, float]]]:
    return {s.id: list(zip(s.timestamps.tolist(), s.values.tolist(), strict=True))
            for s in store.read([], 0, 2**62) if len(s.timestamps)}


def page_samples(batches: list[pb.WriteRequest]) -> list[tuple[int, int, float]]:
    out = []
    for b in batches:
        pos = 0
        for sid, c in zip(b.ids, b.counts, strict=True):
            out += [(sid, t, v) for t, v in zip(b.timestamps[pos : pos + c], b.values[pos : pos + c], strict=True)]
            pos += c
    return out


@pytest.fixture
def full() -> Store:
    store = Store(StoreSettings(chunk_samples=16, head_keep=4))
    write(store, range(12), [T0 + 10_000 * k for k in range(100)])
    return store


def request(max_samples: int, token: bytes = b"", slots: list[int] | None = None) -> pb.CatchUpRequest:
    return pb.CatchUpRequest(slots=pb.SlotFilter(slot_count=SLOTS, slots=slots or list(range(SLOTS))), start_ms=T0,
                             end_ms=T0 + HOUR, resume_token=token, max_samples_per_page=max_samples)


def test_token_round_trip_and_malformed_tokens_refused() -> None:
    assert decode_token(encode_token(2**64 - 1, -5)) == (2**64 - 1, -5)
    assert decode_token(b"") is None
    with pytest.raises(ValueError, match="bytes"):
        decode_token(b"\x01abc")
    with pytest.raises(ValueError, match="version"):
        decode_token(b"\x02" + encode_token(1, 1)[1:])


def test_pages_are_bounded_in_series_then_time_order_and_cover_everything(full: Store) -> None:
    got = list(pages(full, request(max_samples=130)))
    assert all(len(p.batch.timestamps) <= 130 for p in got)
    assert [bool(p.resume_token) for p in got] == [True] * (len(got) - 1) + [False]
    flat = page_samples([p.batch for p in got])
    assert len(flat) == 1200 and len(set((s, t) for s, t, _ in flat)) == 1200
    keys = [(s, t) for s, t, _ in flat]
    assert keys == sorted(keys)  # series by id, each in time order
    want = samples_of(full)
    assert {(s, t, v) for s, t, v in flat} == {(s, t, v) for s, tv in want.items() for t, v in tv}
    # every page carries the labels of every series in it
    assert all({s.id for s in p.batch.series} == set(p.batch.ids) for p in got)


def test_slot_filter_and_time_range_restrict_the_pages(full: Store) -> None:
    req = request(max_samples=10_000, slots=[1])
    req.start_ms, req.end_ms = T0 + 100_000, T0 + 199_999
    flat = page_samples([p.batch for p in pages(full, req)])
    ids = set(slot_series(full, pb.SlotFilter(slot_count=SLOTS, slots=[1])).tolist())
    assert flat and {s for s, _, _ in flat} <= ids
    assert {t for _, t, _ in flat} == {T0 + 10_000 * k for k in range(10, 20)}


@pytest.mark.parametrize("k", [1, 3, 7])
def test_a_stream_broken_after_k_pages_resumes_without_loss_or_duplicates(full: Store, k: int) -> None:
    first = list(pages(full, request(max_samples=170)))
    whole = page_samples([p.batch for p in first])
    head = first[:k]
    write(full, range(12, 14), [T0 + 5])  # series added between the calls: the resumed call may include them
    rest = list(pages(full, request(max_samples=170, token=head[-1].resume_token)))
    resumed = page_samples([p.batch for p in head + rest])
    keys = [(s, t) for s, t, _ in resumed]
    assert len(keys) == len(set(keys))
    assert set(whole) <= set(resumed)


def test_build_page_skips_series_dropped_since_the_stream_began(full: Store) -> None:
    ids = slot_series(full, pb.SlotFilter())
    row = full.index.row_of(int(ids[0]))
    assert row is not None
    full.index.remove(row)  # as retention would
    page, token = build_page(full, ids, T0, T0 + HOUR, None, 10**6)
    assert token == b"" and int(ids[0]) not in set(page.ids) and len(page.ids) == len(ids) - 1


def test_missing_only_keeps_what_the_store_lacks() -> None:
    src = Store()
    write(src, range(3), [T0, T0 + 1000, T0 + 2000])
    dst = Store()
    write(dst, range(1), [T0 + 1000])
    (page,) = list(pages(src, pb.CatchUpRequest(start_ms=T0, end_ms=T0 + HOUR)))
    out = missing_only(dst, page.batch)
    got = page_samples([out])
    assert len(got) == 8 and (series_id(labels(0)), T0 + 1000) not in {(s, t) for s, t, _ in got}
    assert {s.id for s in out.series} == {series_id(labels(1)), series_id(labels(2))}  # labels only for new ones


def test_catch_up_writes_bypass_the_out_of_order_window(tmp_path: Path) -> None:
    settings = StoreSettings(ooo_window_ms=HOUR)
    src = Store(settings)
    write(src, range(2), [T0, T0 + 1000])
    (page,) = list(pages(src, pb.CatchUpRequest(start_ms=T0, end_ms=T0 + HOUR)))
    plain = Store(settings)
    write(plain, range(2), [T0 + 5 * HOUR])
    res = plain.write(np.array(page.batch.ids, dtype=np.uint64), np.array(page.batch.counts),
                      np.array(page.batch.timestamps), np.array(page.batch.values))
    assert res.too_old == 4 and res.written == 0  # the default is unchanged
    assert local_apply(plain)(page.batch) == 4
    # through the WAL: logged as CATCH_UP, replayed with the same bypass
    store, d = open_store(tmp_path / "d", settings, durability=DurabilitySettings(fsync=FsyncPolicy.NEVER))
    d.write(pb.WriteRequest(ids=[series_id(labels(i)) for i in range(2)], counts=[1, 1],
                            timestamps=[T0 + 5 * HOUR, T0 + 5 * HOUR], values=[0.0, 1.0],
                            series=[pb.SeriesLabels(id=series_id(labels(i)), labels=labels_to_pb(labels(i)))
                                    for i in range(2)]))
    assert local_apply(store, d)(page.batch) == 4
    want = samples_of(store)
    d.close(snapshot=False)
    again, d2 = open_store(tmp_path / "d", settings, durability=DurabilitySettings(fsync=FsyncPolicy.NEVER))
    assert samples_of(again) == want and d2.recovery.wal_samples == 2 + 4
    d2.close(snapshot=False)


class BreakingStub:
    """CatchUp from a store in this process, failing with UNAVAILABLE after every ``k`` pages."""

    def __init__(self, store: Store, k: int, refuse: bool = False) -> None:
        self.store, self.k, self.refuse = store, k, refuse
        self.calls = 0

    def CatchUp(self, req: pb.CatchUpRequest, timeout: float | None = None) -> AsyncIterator[pb.CatchUpPage]:
        self.calls += 1
        code = grpc.StatusCode.INVALID_ARGUMENT if self.refuse else grpc.StatusCode.UNAVAILABLE

        async def stream() -> AsyncIterator[pb.CatchUpPage]:
            for n, page in enumerate(pages(self.store, req)):
                if n == self.k:
                    raise grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "cut", None)
                yield page

        return stream()


async def test_client_resumes_broken_streams_without_loss_or_duplicates(full: Store) -> None:
    dst = Store(StoreSettings(chunk_samples=16, head_keep=4))
    received: list[pb.WriteRequest] = []
    apply = local_apply(dst)

    def record(batch: pb.WriteRequest) -> int:
        received.append(batch)
        return apply(batch)

    stub = BreakingStub(full, k=2)
    stats = await catch_up(stub, pb.SlotFilter(), T0, T0 + HOUR, record,  # type: ignore[arg-type]
                           page_samples=150, max_resumes=100, backoff_s=0.0)
    flat = page_samples(received)
    assert len(flat) == len({(s, t) for s, t, _ in flat}) == 1200
    assert stats.resumes == stub.calls - 1 >= 3 and stats.samples_written == 1200
    assert samples_of(dst) == samples_of(full)
    with pytest.raises(CatchUpError, match="broke 2 times"):
        await catch_up(BreakingStub(full, k=1), pb.SlotFilter(), T0, T0 + HOUR, record,  # type: ignore[arg-type]
                       page_samples=150, max_resumes=1, backoff_s=0.0)
    with pytest.raises(CatchUpError, match="refused"):
        await catch_up(BreakingStub(full, k=0, refuse=True), pb.SlotFilter(), T0, T0 + HOUR,  # type: ignore[arg-type]
                       record)


async def test_a_wiped_store_becomes_level_with_its_peer_while_writes_continue() -> None:
    settings = StoreSettings(chunk_samples=32, head_keep=8, ooo_window_ms=100 * HOUR)
    peer, wiped = Store(settings), Store(settings)
    n_series = 40
    write(peer, range(n_series), [T0 + 10_000 * k for k in range(300)])
    api = StoreAPI(peer)
    server, port = await start_grpc_server(StoreNodeServicer(LocalBackend(api), api), "127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS)
    stub = pb_grpc.MetricsStub(channel)
    stop = asyncio.Event()

    async def live_writes() -> int:
        """Both replicas keep taking the same new samples while the wiped one catches up."""
        k = 300
        while not stop.is_set():
            for s in (peer, wiped):
                write(s, range(n_series), [T0 + 10_000 * k])
            k += 1
            await asyncio.sleep(0)
        return k

    writer = asyncio.ensure_future(live_writes())
    try:
        stats = await sync_slots(stub, wiped, local_apply(wiped), SLOTS, list(range(SLOTS)), T0, T0 + 2 * HOUR,
                                 600_000, page_samples=500)
        stop.set()
        last = await writer
        occupied = sum(d.samples > 0 for d in store_digest(peer, pb.DigestRequest(
            slots=pb.SlotFilter(slot_count=SLOTS, slots=list(range(SLOTS))), start_ms=T0, end_ms=T0)).slots)
        assert stats.slots_differing == occupied and stats.pages > 10 and stats.samples_written >= 300 * n_series
        req = pb.DigestRequest(slots=pb.SlotFilter(slot_count=SLOTS, slots=list(range(SLOTS))), start_ms=T0,
                               end_ms=T0 + 2 * HOUR, bucket_ms=600_000)
        assert last > 300 and store_digest(wiped, req) == store_digest(peer, req)
        wiped._check()
        # a gap in the middle (one replica missed some writes) is found per bucket and filled alone
        write(peer, range(n_series), [T0 + 10_000 * k + 5 for k in range(100, 110)])
        again = await sync_slots(stub, wiped, local_apply(wiped), SLOTS, list(range(SLOTS)), T0, T0 + 2 * HOUR,
                                 600_000)
        assert again.samples_written == 10 * n_series and again.ranges_copied <= SLOTS
        assert store_digest(wiped, req) == store_digest(peer, req)
    finally:
        stop.set()
        await channel.close(None)
        await server.stop(None)
