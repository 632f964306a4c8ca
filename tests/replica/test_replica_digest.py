"""Digests: pinned hash values, independence from insertion order and chunking, bucket locality."""

from __future__ import annotations

import numpy as np
import pytest

from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.replica.digest import (
    C1,
    combine_slots,
    digest_series,
    mix64,
    repair_ranges,
    sample_hashes,
    store_digest,
)
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings

MASK = 2**64 - 1
T0 = 1_700_000_000_000


def py_mix64(x: int) -> int:
    """The documented formula with Python ints, as an independent check of the vectorised one."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def test_mix64_is_splitmix64s_finaliser_pinned() -> None:
    # splitmix64 seeded with 0 first returns mix64(0x9E3779B97F4A7C15) = 0xE220A8397B1DCDAF.
    assert int(mix64(np.array([int(C1)], dtype=np.uint64))[0]) == 0xE220A8397B1DCDAF
    got = mix64(np.array([0, 1, 2**63], dtype=np.uint64))
    assert [int(x) for x in got] == [0, 0x5692161D100B05E5, 0x25C26EA579CEA98A]


def test_sample_hash_pinned_and_matches_the_formula() -> None:
    ts = np.array([0, T0, -5], dtype=np.int64)
    vals = np.array([0.0, 1.5, float("nan")])
    got = [int(h) for h in sample_hashes(ts, vals)]
    assert got[:2] == [0x48218226FF3CD4BF, 0x1C4EA31F0D888906]
    for t, v, h in zip(ts.tolist(), vals.tolist(), got, strict=True):
        tb = t & MASK
        vb = int(np.array([v]).view(np.uint64)[0])
        assert h == py_mix64(py_mix64(tb ^ 0x9E3779B97F4A7C15) ^ vb)


def test_series_and_slot_digests_pinned() -> None:
    d = digest_series(np.array([7, 9], dtype=np.uint64), np.array([2, 1]), np.array([1000, 2500, 1000]),
                      np.array([1.0, 2.0, 3.0]), 0, 2999, 1000, True)
    assert [int(h) for h in d.hashes] == [0xA78B7C2212F4D553, 0x22EE4F1E383744C8]
    assert d.buckets is not None
    assert d.buckets.tolist() == [[0, 17663275409657378238, 12856348375937687445], [0, 2517036232957445320, 0]]
    # the series hash is the sum of its bucket hashes, modulo 2^64
    assert int(d.hashes[0]) == (int(d.buckets[0, 1]) + int(d.buckets[0, 2])) & MASK
    s = combine_slots(np.array([0, 1]), np.array([1, 1]), d)
    assert s.series.tolist() == [0, 2] and s.samples.tolist() == [0, 3]
    assert [int(h) for h in s.hashes] == [0, 0x84C14F8EB8699ABB]


def labels(i: int) -> tuple[tuple[str, str], ...]:
    return make_labels("cpu", {"namespace": "ns", "pod": f"p{i % 7}", "container": f"c{i}"})


def data(rng: np.random.Generator, n_series: int = 12, n: int = 300) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for i in range(n_series):
        ts = T0 + np.sort(rng.choice(np.arange(0, n * 10_000, 1000), n, replace=False))
        out[i] = (ts.astype(np.int64), rng.normal(size=n).round(3))
    return out


def fill(store: Store, samples: dict[int, tuple[np.ndarray, np.ndarray]], order: np.ndarray, batch: int) -> None:
    """Write every sample, in the order of ``order`` (a permutation of sample positions), in batches."""
    flat = [(i, t, v) for i, (ts, vs) in samples.items() for t, v in zip(ts.tolist(), vs.tolist(), strict=True)]
    chosen = [flat[k] for k in order]
    for b in range(0, len(chosen), batch):
        part = chosen[b : b + batch]
        per: dict[int, list[tuple[int, float]]] = {}
        for i, t, v in part:
            per.setdefault(i, []).append((t, v))
        ids, counts, ts_all, vals_all = [], [], [], []
        new = {}
        for i, tv in per.items():
            tv.sort()
            ids.append(series_id(labels(i)))
            counts.append(len(tv))
            ts_all += [t for t, _ in tv]
            vals_all += [v for _, v in tv]
            new[series_id(labels(i))] = labels(i)
        store.write(np.array(ids, dtype=np.uint64), np.array(counts), np.array(ts_all), np.array(vals_all), new)


def digest(store: Store, per_series: bool = False, bucket_ms: int = 600_000) -> pb.DigestResponse:
    return store_digest(store, pb.DigestRequest(slots=pb.SlotFilter(slot_count=4, slots=[0, 1, 2, 3]), start_ms=T0,
                                                end_ms=T0 + 3_600_000, bucket_ms=bucket_ms, per_series=per_series))


def test_equal_data_equal_digest_regardless_of_insertion_order_and_chunking() -> None:
    rng = np.random.default_rng(3)
    samples = data(rng)
    total = sum(len(t) for t, _ in samples.values())
    a = Store(StoreSettings(chunk_samples=16, head_keep=4))
    fill(a, samples, np.arange(total), batch=500)
    b = Store(StoreSettings(chunk_samples=50, head_keep=10, ooo_window_ms=10**9))  # other chunking
    fill(b, samples, rng.permutation(total), batch=37)  # shuffled: the out-of-order merge path
    assert digest(a, per_series=True) == digest(b, per_series=True)
    assert sum(d.samples for d in digest(a).slots) == total


def test_one_differing_sample_changes_one_bucket_and_one_slot() -> None:
    rng = np.random.default_rng(5)
    samples = data(rng)
    a, b = Store(), Store()
    total = sum(len(t) for t, _ in samples.values())
    fill(a, samples, np.arange(total), batch=1000)
    ts, vs = samples[4]
    vs = vs.copy()
    vs[150] += 1.0
    changed = dict(samples)
    changed[4] = (ts, vs)
    fill(b, changed, np.arange(total), batch=1000)
    da, db = digest(a, per_series=True), digest(b, per_series=True)
    assert sum(x.hash != y.hash for x, y in zip(da.slots, db.slots, strict=True)) == 1
    diff = [(x.id, k) for x, y in zip(da.series, db.series, strict=True)
            for k, (p, q) in enumerate(zip(x.bucket_hashes, y.bucket_hashes, strict=True)) if p != q]
    assert diff == [(series_id(labels(4)), int((ts[150] - T0) // 600_000))]


def test_repair_ranges_names_the_buckets_where_the_remote_has_more() -> None:
    ids = np.array([1, 2], dtype=np.uint64)
    remote = digest_series(ids, np.array([3, 1]), np.array([0, 1500, 3500, 2000]), np.ones(4), 0, 3999, 1000, True)
    local = digest_series(ids[:1], np.array([2]), np.array([0, 3500]), np.ones(2), 0, 3999, 1000, True)
    # series 1 lacks 1500 (bucket 1); series 2 is missing entirely (bucket 2): adjacent, merged
    assert repair_ranges(local, remote, 0, 3999, 1000) == [(1000, 2999)]
    assert repair_ranges(remote, remote, 0, 3999, 1000) == []
    # the local side holding more than the remote is not the remote's to fix
    assert repair_ranges(remote, local, 0, 3999, 1000) == []


def test_too_many_buckets_refused() -> None:
    with pytest.raises(ValueError, match="buckets"):
        digest_series(np.array([1], dtype=np.uint64), np.array([1]), np.array([0]), np.ones(1), 0, 10**12, 1, True)
