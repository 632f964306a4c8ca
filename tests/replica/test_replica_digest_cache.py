"""Digests by cached chunk sums (store_digest, store_digest_async) are bit for bit the digests of
every sample decoded (the reference: SlotSamples without the cache, then digest_series), whatever
the chunking, the write order (out-of-order merges), retention, snapshot restore, range and buckets;
and a digest over whole chunks decodes none of them."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.replica.digest import SlotSamples, digest_request, digest_response, store_digest
from metricsd.replica.digestloop import store_digest_async
from metricsd.store import chunks as chunks_module
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings
from metricsd.store.snapshot import capture, restore
from metricsd.store.wal.log import WalPosition

T0 = 1_700_000_000_000
SPAN = 4_000_000  # ms of data per series


def reference(store: Store, request: pb.DigestRequest) -> pb.DigestResponse:
    """The digest as computed before the cache: every sample in range read and hashed."""
    slot_count, slots = digest_request(request)
    samples = SlotSamples(store, slot_count, slots, request.start_ms, request.end_ms)
    samples.read(len(samples.rows))
    assert samples.cached() is None
    return digest_response(request, slots, samples)


def labels(i: int) -> tuple[tuple[str, str], ...]:
    return make_labels("cpu", {"namespace": "ns", "pod": f"p{i % 5}", "container": f"c{i}"})


def write_all(store: Store, series: list[tuple[np.ndarray, np.ndarray]], order: list[int], batch: int) -> None:
    """Write every sample, sample positions in ``order``, ``batch`` at a time (each batch per series in
    time order, as a write must be)."""
    flat = [(i, int(t), float(v)) for i, (ts, vs) in enumerate(series) for t, v in zip(ts, vs, strict=True)]
    chosen = [flat[k] for k in order]
    for b in range(0, len(chosen), batch):
        per: dict[int, list[tuple[int, float]]] = {}
        for i, t, v in chosen[b : b + batch]:
            per.setdefault(i, []).append((t, v))
        ids, counts, ts_all, vals_all, new = [], [], [], [], {}
        for i, tv in per.items():
            tv.sort()
            sid = series_id(labels(i))
            ids.append(sid)
            counts.append(len(tv))
            ts_all += [t for t, _ in tv]
            vals_all += [v for _, v in tv]
            new[sid] = labels(i)
        store.write(np.array(ids, dtype=np.uint64), np.array(counts), np.array(ts_all, dtype=np.int64),
                    np.array(vals_all), new)


@st.composite
def stores(draw: st.DrawFn) -> Store:
    chunk_samples = draw(st.integers(2, 40))
    head_keep = draw(st.integers(1, 12))
    retention = draw(st.sampled_from([SPAN * 10, SPAN // 2, SPAN // 5]))
    store = Store(StoreSettings(chunk_samples=chunk_samples, head_keep=head_keep, retention_ms=retention,
                                ooo_window_ms=10**9))
    n_series = draw(st.integers(1, 6))
    series = []
    for _ in range(n_series):
        n = draw(st.integers(0, 150))
        seed = draw(st.integers(0, 2**32 - 1))
        rng = np.random.default_rng(seed)
        ts = T0 + np.sort(rng.choice(SPAN // 1000, n, replace=False)).astype(np.int64) * 1000
        vals = rng.normal(size=n).round(2)
        if n and draw(st.booleans()):
            vals[rng.integers(n)] = float("nan")
        series.append((ts, vals))
    total = sum(len(t) for t, _ in series)
    shuffled = draw(st.booleans())
    order = list(range(total))
    if shuffled:  # out-of-order writes: merges rewrite chunks
        order = draw(st.permutations(order))
    write_all(store, series, order, draw(st.integers(1, 200)))
    if draw(st.booleans()):
        store.gc()  # retention drops old chunks
    if draw(st.booleans()):  # late samples into the middle of sealed data, after retention ran
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        late = [(np.array([T0 + SPAN // 2 + 1 + int(rng.integers(999))]), np.array([7.0])) for _ in series]
        write_all(store, late, list(range(len(late))), len(late))
    if draw(st.booleans()):  # restored from a snapshot: chunk sums unknown until read
        store = restore(capture(store, WalPosition(1, 0)), store.settings)
    return store


def requests(per_series: bool) -> st.SearchStrategy[pb.DigestRequest]:
    return st.builds(
        lambda start, length, bucket, slots: pb.DigestRequest(
            slots=pb.SlotFilter(slot_count=4, slots=slots), start_ms=T0 + start, end_ms=T0 + start + length,
            bucket_ms=bucket, per_series=per_series),
        st.integers(-SPAN // 4, SPAN), st.integers(0, SPAN + 10_000),
        st.sampled_from([0, 1, 60_000, 200_000, 600_000, 10**7]),
        st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(stores(), st.lists(st.booleans().flatmap(requests), min_size=1, max_size=4))
def test_cached_digests_equal_the_digests_of_every_sample(store: Store, reqs: list[pb.DigestRequest]) -> None:
    everything = pb.DigestRequest(slots=pb.SlotFilter(slot_count=4, slots=[0, 1, 2, 3]), start_ms=T0 - 1,
                                  end_ms=T0 + SPAN + 1_000, bucket_ms=reqs[0].bucket_ms, per_series=reqs[0].per_series)
    for req in [everything, *reqs]:
        if req.per_series and req.bucket_ms == 1 and req.end_ms - req.start_ms > 50_000:
            req.bucket_ms = 1_000  # keep the bucket count reasonable
        want = reference(store, req)
        assert store_digest(store, req) == want
        assert store_digest(store, req) == want  # again, with the sums learnt by the first call
    store._check()  # every cached sum still exact


def test_the_sliced_digest_uses_the_cache_and_equals_the_reference() -> None:
    store = Store(StoreSettings(chunk_samples=10, head_keep=3))
    series = [(T0 + np.arange(0, 95 + i) * 10_000, np.arange(95 + i) * 1.5) for i in range(30)]
    write_all(store, series, list(range(sum(len(t) for t, _ in series))), 500)
    for per_series in (False, True):
        req = pb.DigestRequest(slots=pb.SlotFilter(slot_count=4, slots=[0, 1, 2, 3]), start_ms=T0 + 35_000,
                               end_ms=T0 + 900_000, bucket_ms=100_000, per_series=per_series)
        got = asyncio.run(store_digest_async(store, req, slice_series=7))
        assert got == reference(store, req)


@pytest.mark.parametrize("per_series", [False, True])
def test_a_digest_over_whole_chunks_decodes_none(monkeypatch: pytest.MonkeyPatch, per_series: bool) -> None:
    """10 s data in chunks of 120 samples (20 minutes, 15 blocks of 8). 40-minute buckets from the
    first sample hold whole chunks, so a digest of the whole range decodes nothing; a range that
    cuts the first chunk decodes that one only."""
    n = 10
    store = Store(StoreSettings(chunk_samples=120, head_keep=8))
    series = [(T0 + np.arange(720 + i) * 10_000, np.sin(np.arange(720 + i) + i)) for i in range(n)]
    write_all(store, series, list(range(sum(len(t) for t, _ in series))), 20_000)
    assert all(store.chunks.n_closed[r] == 6 for r in range(n))
    decoded: list[int] = []
    real = chunks_module.decode_chunks

    def counting(buf: bytes, starts: list[int], ends: list[int], counts: list[int]) -> tuple[np.ndarray, np.ndarray]:
        out = real(buf, starts, ends, counts)
        decoded.append(len(out[0]))
        return out

    def req(start_ms: int) -> pb.DigestRequest:
        return pb.DigestRequest(slots=pb.SlotFilter(slot_count=4, slots=[0, 1, 2, 3]), start_ms=start_ms,
                                end_ms=T0 + 10**9, bucket_ms=2_400_000, per_series=per_series)

    monkeypatch.setattr(chunks_module, "decode_chunks", counting)
    got = store_digest(store, req(T0))
    assert decoded == []
    assert got == reference(store, req(T0))
    decoded.clear()
    got = store_digest(store, req(T0 + 50_000))
    if not per_series:  # (per series, the buckets move with the start and cut other chunks)
        assert decoded == [120] * n
    assert got == reference(store, req(T0 + 50_000))
