"""Cover digests (replica/coverdigest.py): whole chunks by their kept sums, equal for replicas
holding the same samples, different when one lacks a sample of the range, and equal to hashing
every covered sample."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_replica_digest import T0, data, fill

from metricsd.maths.slots import SlotFilter
from metricsd.proto import metricsd_pb2 as pb
from metricsd.replica.coverdigest import cover_digest, cover_series
from metricsd.replica.digest import combine_slots, digest_series
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings

HOUR = 3_600_000


def req(start: int = T0 + 600_000, end: int = T0 + 600_000 + HOUR // 2) -> pb.DigestRequest:
    return pb.DigestRequest(slots=pb.SlotFilter(slot_count=4, slots=[0, 1, 2, 3]), start_ms=start, end_ms=end,
                            cover_chunks=True)


def reference(store: Store, start: int, end: int) -> pb.DigestResponse:
    """Every sample of each chunk overlapping the range and each unsealed one in it, decoded and
    hashed: what the kept sums must add up to."""
    rows = store.select([], SlotFilter(4, (0, 1, 2, 3)))
    ids, counts, ts_all, vals_all, slots = [], [], [], [], []
    for row in rows.tolist():
        t, v = store.series_samples(row, -2**62, 2**62)
        entries = store.chunks.entries(row)
        sealed = int(store.chunks.samples[row])
        keep = np.zeros(len(t), bool)
        at = 0
        for lo, hi, _, n, _ in entries.tolist():
            if hi >= start and lo <= end:
                keep[at : at + n] = True
            at += n
        assert at == sealed
        keep[sealed:] = (t[sealed:] >= start) & (t[sealed:] <= end)
        if keep.any():
            ids.append(store.index.ids[row])
            counts.append(int(keep.sum()))
            ts_all.append(t[keep])
            vals_all.append(v[keep])
            slots.append(int(store.index.pod_hash[row] % np.uint64(4)))
    d = digest_series(np.array(ids, np.uint64), np.array(counts, np.int64),
                      np.concatenate([np.zeros(0, np.int64), *ts_all]), np.concatenate([np.zeros(0), *vals_all]),
                      -2**62, 2**62, 0, False)
    per = combine_slots(np.arange(4), np.array(slots, np.int64), d)
    out = pb.DigestResponse()
    for i, s in enumerate(per.slots.tolist()):
        out.slots.add(slot=s, series=int(per.series[i]), samples=int(per.samples[i]), hash=int(per.hashes[i]))
    return out


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), chunk=st.sampled_from([16, 50, 720]), keep=st.sampled_from([4, 10, 32]),
       start=st.integers(0, 2_000_000), span=st.integers(0, 2_000_000))
def test_the_kept_sums_add_up_to_hashing_every_covered_sample(seed: int, chunk: int, keep: int, start: int,
                                                              span: int) -> None:
    samples = data(np.random.default_rng(seed), n_series=6, n=203)  # not a whole number of blocks: some unsealed
    total = sum(len(t) for t, _ in samples.values())
    s = Store(StoreSettings(chunk_samples=chunk, head_keep=keep))
    fill(s, samples, np.arange(total), batch=97)
    lo, hi = T0 + start, T0 + start + span
    assert cover_digest(s, req(lo, hi)) == reference(s, lo, hi)


def test_replicas_written_alike_agree_and_one_lacking_a_sample_of_the_range_differs() -> None:
    samples = data(np.random.default_rng(7), n_series=12, n=300)
    total = sum(len(t) for t, _ in samples.values())
    a, b = Store(), Store()
    fill(a, samples, np.arange(total), batch=500)
    fill(b, samples, np.arange(total), batch=500)
    assert cover_digest(a, req()) == cover_digest(b, req())
    # c lacks one sample inside the range
    ts, vs = samples[3]
    inside = int(np.flatnonzero((ts >= T0 + 600_000) & (ts <= T0 + 600_000 + HOUR // 2))[5])
    lacking = dict(samples)
    lacking[3] = (np.delete(ts, inside), np.delete(vs, inside))
    c = Store()
    fill(c, lacking, np.arange(total - 1), batch=500)
    da, dc = cover_digest(a, req()), cover_digest(c, req())
    assert sum(x.hash != y.hash for x, y in zip(da.slots, dc.slots, strict=True)) == 1
    # (its chunks are cut one sample later, so the covered count may even be the same)


def test_nothing_is_decoded() -> None:
    samples = data(np.random.default_rng(9), n_series=8, n=300)
    total = sum(len(t) for t, _ in samples.values())
    s = Store(StoreSettings(chunk_samples=50, head_keep=10))
    fill(s, samples, np.arange(total), batch=300)

    def boom(*_: object) -> None:
        raise AssertionError("a chunk was decoded")

    s.chunks._decode = boom  # type: ignore[method-assign]
    rows = s.select([])
    kept, d = cover_series(s, rows, T0 + 600_000, T0 + 2 * HOUR)
    assert len(kept) == 8 and int(d.samples.sum()) > 0


def test_the_unsealed_samples_in_range_count_and_chunks_overlapping_count_whole() -> None:
    samples = data(np.random.default_rng(11), n_series=6, n=203)  # 203 = 20 blocks of 10 and 3 unsealed
    total = sum(len(t) for t, _ in samples.values())
    s = Store(StoreSettings(chunk_samples=50, head_keep=10))
    fill(s, samples, np.arange(total), batch=97)
    assert int(s.head.unsealed[s.select([])].min()) == 3
    for lo, hi in ((T0, T0 + 3_000_000), (T0 + 1_000_000, T0 + 1_000_000), (T0 + 1_990_000, T0 + 3_000_000)):
        assert cover_digest(s, req(lo, hi)) == reference(s, lo, hi)


def test_a_cover_digest_refuses_what_it_does_not_do() -> None:
    s = Store()

    def ask(slot: int = 0, start: int = 0, **kw: int) -> pb.DigestRequest:
        return pb.DigestRequest(slots=pb.SlotFilter(slot_count=4, slots=[slot]), start_ms=start, end_ms=1,
                                cover_chunks=True, **kw)

    for bad in (ask(per_series=True), ask(bucket_ms=10), ask(slot=9), ask(start=2)):
        with pytest.raises(ValueError):
            cover_digest(s, bad)
