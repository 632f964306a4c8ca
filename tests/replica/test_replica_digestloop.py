"""A digest computed a slice at a time (digestloop.py) equals the one computed at once, and other
tasks run while it is computed: the store's event loop is not held for the whole digest."""

from __future__ import annotations

import asyncio

import numpy as np

from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.replica.digest import store_digest
from metricsd.replica.digestloop import store_digest_async
from metricsd.store.engine import Store

T0 = 1_700_000_000_000


def _store(n: int = 120) -> Store:
    store = Store()
    labels = [make_labels("cpu", {"namespace": "ns", "pod": f"p{i}"}) for i in range(n)]
    ids = np.array([series_id(lab) for lab in labels], np.uint64)
    for k in range(30):
        store.write(ids, np.ones(n), np.full(n, T0 + k * 10_000), np.arange(n) * float(k),
                    {int(i): lab for i, lab in zip(ids, labels, strict=True)})
    return store


def _request(per_series: bool) -> pb.DigestRequest:
    return pb.DigestRequest(slots=pb.SlotFilter(slot_count=8, slots=list(range(8))), start_ms=T0,
                            end_ms=T0 + 3_600_000, bucket_ms=600_000, per_series=per_series)


async def test_sliced_digests_equal_the_whole_and_let_other_tasks_run() -> None:
    store = _store()
    for per_series in (False, True):
        ticks = [0]
        stop = asyncio.Event()

        async def other(ticks: list[int] = ticks, stop: asyncio.Event = stop) -> None:
            while not stop.is_set():
                ticks[0] += 1
                await asyncio.sleep(0)

        task = asyncio.ensure_future(other())
        got = await store_digest_async(store, _request(per_series), slice_series=10)
        stop.set()
        await task
        assert got == store_digest(store, _request(per_series))
        assert ticks[0] >= 10  # 120 series in slices of 10: the other task ran between them


async def test_a_series_written_during_the_digest_is_seen_whole_or_not_at_all() -> None:
    store = _store()
    extra = make_labels("cpu", {"namespace": "ns", "pod": "late"})
    sid = series_id(extra)

    async def write_meanwhile() -> None:
        await asyncio.sleep(0)
        store.write(np.array([sid], np.uint64), np.array([3]), np.array([T0, T0 + 10_000, T0 + 20_000]),
                    np.array([1.0, 2.0, 3.0]), {sid: extra})

    task = asyncio.ensure_future(write_meanwhile())
    got = await store_digest_async(store, _request(True), slice_series=10)
    await task
    counts = {s.id: s.samples for s in got.series}
    assert counts.get(sid, 3) == 3 and all(n == 30 for i, n in counts.items() if i != sid)
