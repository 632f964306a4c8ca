"""The store against a dict-of-lists oracle under random writes, with _check() after each step."""

from __future__ import annotations

import random

import numpy as np
import pytest

from metricsd.model import InvalidSeries, Labels, make_labels, series_id
from metricsd.selector import Matcher, matches_all, parse_selector
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings


def _labels(i: int) -> Labels:
    return make_labels(
        "m" if i % 4 else "n",
        {"namespace": f"ns{i % 3}", "pod": f"pod-{i}", "workload": f"w{i % 5}", **({"node": "a"} if i % 2 else {})},
    )


class Oracle:
    def __init__(self, ooo: int) -> None:
        self.data: dict[int, dict[int, float]] = {}
        self.newest: dict[int, int] = {}
        self.ooo = ooo

    def write(self, sid: int, ts: list[int], vals: list[float]) -> tuple[int, int]:
        series = self.data.setdefault(sid, {})
        too_old = dup = 0
        newest = self.newest.get(sid)
        for t, v in zip(ts, vals, strict=True):
            if newest is not None and t < newest - self.ooo:
                too_old += 1
            elif t in series:
                dup += 1
            else:
                series[t] = v
        if ts:
            self.newest[sid] = max(newest if newest is not None else ts[-1], ts[-1])
        return too_old, dup


DAY_MS = 86_400_000


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("seed", [0, 5, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2, 3, 4))])
def test_random_writes_match_the_oracle(seed: int, sparse: bool) -> None:
    """``sparse``: series with gaps of weeks, within a batch and between batches, past what the
    head's int32 time offsets reach (24.8 days), so rows are sealed and emptied to rebase."""
    rng = random.Random(seed)
    settings = StoreSettings(chunk_samples=rng.choice([4, 10, 120]), head_keep=rng.choice([1, 3, 8]),
                             ooo_window_ms=50_000)
    store = Store(settings)
    oracle = Oracle(settings.ooo_window_ms)
    labels = {series_id(_labels(i)): _labels(i) for i in range(12)}
    sids = list(labels)
    clock = {sid: 0 for sid in sids}
    for _step in range(120):
        chosen = rng.sample(sids, rng.randint(1, len(sids)))
        ids: list[int] = []
        counts: list[int] = []
        ts: list[int] = []
        vals: list[float] = []
        for sid in chosen:
            n = rng.randint(0, 30)
            r = rng.random()
            if r < 0.2:
                base = clock[sid] + rng.randint(-80_000, -1)
            elif sparse and r > 0.85:
                base = clock[sid] + rng.randint(20, 40) * DAY_MS
            else:
                base = clock[sid] + rng.randint(1, 20_000)
            step = 3 * DAY_MS if sparse and rng.random() < 0.1 else 1000
            t = sorted(set(base + rng.randint(0, 10) * step * k for k in range(n)))
            clock[sid] = max(clock[sid], t[-1] if t else clock[sid])
            ids.append(sid)
            counts.append(len(t))
            ts.extend(t)
            vals.extend(float(rng.randint(0, 100)) for _ in t)
        res = store.write(np.array(ids, dtype=np.uint64), np.array(counts), np.array(ts, dtype=np.int64),
                          np.array(vals), {sid: labels[sid] for sid in chosen})
        too_old = dup = 0
        pos = 0
        for sid, c in zip(ids, counts, strict=True):
            a, b = oracle.write(sid, ts[pos : pos + c], vals[pos : pos + c])
            too_old, dup, pos = too_old + a, dup + b, pos + c
        assert (res.too_old, res.duplicate) == (too_old, dup)
        assert res.written == sum(counts) - too_old - dup
        store._check()
    lo, hi = -(10**9), 10**14
    for sid, series in oracle.data.items():
        got = store.read([Matcher.eq("pod", dict(labels[sid])["pod"])], lo, hi)
        assert len(got) == (1 if series else len(got))
        if got:
            want = sorted(series.items())
            assert got[0].timestamps.tolist() == [t for t, _ in want]
            assert got[0].values.tolist() == [v for _, v in want]
            a, b = sorted(series)[len(series) // 3], sorted(series)[2 * len(series) // 3]
            part = store.read([Matcher.eq("pod", dict(labels[sid])["pod"])], a, b)[0]
            assert part.timestamps.tolist() == [t for t, _ in want if a <= t <= b]


@pytest.mark.parametrize(
    "selector",
    ['workload="w1"', 'workload!="w1"', 'pod=~"pod-1.*"', 'pod!~"pod-1.*"', 'node=""', 'node!=""', 'node=~"a|"',
     'workload="w1",namespace=~"ns[01]"', 'nosuch=""', 'nosuch="x"', 'workload=~".+",pod!="pod-3"'],
)
def test_selectors_find_what_a_scan_finds(selector: str) -> None:
    store = Store()
    all_labels = [_labels(i) for i in range(40)]
    ids = np.array([series_id(lab) for lab in all_labels], dtype=np.uint64)
    store.write(ids, np.ones(40), np.arange(40), np.zeros(40), {int(i): lab for i, lab in zip(ids, all_labels,
                                                                                                strict=True)})
    for metric in (None, "m"):
        matchers = parse_selector(selector, metric)
        got = {store.index.labels[r] for r in store.select(matchers).tolist()}
        assert got == {lab for lab in all_labels if matches_all(matchers, lab)}
    store._check()


def test_gc_drops_old_chunks_and_empty_series() -> None:
    store = Store(StoreSettings(chunk_samples=10, head_keep=2, retention_ms=100_000))
    old, new = _labels(1), _labels(2)
    ido, idn = series_id(old), series_id(new)
    store.write(np.array([ido], np.uint64), np.array([50]), np.arange(50) * 1000, np.ones(50), {ido: old})
    store.write(np.array([idn], np.uint64), np.array([300]), np.arange(300) * 1000, np.ones(300), {idn: new})
    assert store.gc() == 1
    assert store.read([Matcher.eq("pod", "pod-1")], 0, 10**9) == []
    kept = store.read([Matcher.eq("pod", "pod-2")], 0, 10**9)[0].timestamps
    assert kept.min() >= 299_000 - 100_000 - 20_000 and kept.max() == 299_000
    store._check()


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (make_labels("m", {"namespace": "a"}), "required label 'pod'"),
        (make_labels("m", {"namespace": "a", "pod": "b", "bad-name": "x"}), "label name 'bad-name'"),
        (make_labels("", {"namespace": "a", "pod": "b"}), "empty metric name"),
        (make_labels("m", {"namespace": "a", "pod": "b", **{f"l{i}": "x" for i in range(40)}}), "more than the limit"),
    ],
)
def test_a_bad_series_rejects_the_whole_batch(labels: Labels, message: str) -> None:
    store = Store()
    good = _labels(1)
    ids = np.array([series_id(good), series_id(labels)], dtype=np.uint64)
    with pytest.raises(InvalidSeries, match=message):
        store.write(ids, np.array([1, 1]), np.array([1, 1]), np.array([1.0, 2.0]),
                    {series_id(good): good, series_id(labels): labels})
    assert store.stats()["series"] == 0 and store.stats()["samples"] == 0


def test_timestamps_out_of_order_or_out_of_range_in_a_batch_are_rejected() -> None:
    store = Store()
    lab = _labels(1)
    sid = series_id(lab)
    with pytest.raises(InvalidSeries, match="strictly increase"):
        store.write(np.array([sid], np.uint64), np.array([2]), np.array([5, 5]), np.ones(2), {sid: lab})
    with pytest.raises(InvalidSeries, match="out of range"):
        store.write(np.array([sid], np.uint64), np.array([1]), np.array([10**16]), np.ones(1), {sid: lab})
    with pytest.raises(InvalidSeries, match="does not match its labels"):
        store.write(np.array([sid + 1], np.uint64), np.array([1]), np.array([1]), np.ones(1), {sid + 1: lab})
    assert store.stats()["series"] == 0


def test_unknown_ids_store_nothing_and_are_reported() -> None:
    store = Store()
    lab = _labels(1)
    sid = series_id(lab)
    res = store.write(np.array([sid, 42], np.uint64), np.array([1, 1]), np.array([1, 1]), np.ones(2), {sid: lab})
    assert res.unknown_ids == [42] and res.written == 0
    assert store.stats()["series"] == 0


def test_pod_index_lists_a_namespace_by_prefix() -> None:
    store = Store()
    labs = [_labels(i) for i in range(9)]
    ids = np.array([series_id(lab) for lab in labs], np.uint64)
    store.write(ids, np.ones(9), np.ones(9), np.ones(9), {int(i): lab for i, lab in zip(ids, labs, strict=True)})
    assert list(store.index.pods_with_prefix("ns1/")) == ["ns1/pod-1", "ns1/pod-4", "ns1/pod-7"]
    assert list(store.index.pods_with_prefix("ns9/")) == []


def test_samples_weeks_apart_rebase_the_head_and_read_back_whole() -> None:
    """One batch spanning 120 days, then single samples 30 days apart: every offset the head keeps
    stays within int32, nothing is lost, and aggregates and snapshots see absolute times."""
    from metricsd.store.head import OFFSET_MAX
    from metricsd.store.snapshot import capture, restore
    from metricsd.store.wal import WalPosition

    store = Store(StoreSettings(chunk_samples=10, head_keep=3, ooo_window_ms=DAY_MS))
    lab = _labels(1)
    sid = series_id(lab)
    ts = [k * 3 * DAY_MS for k in range(40)] + [120 * DAY_MS + k * 30 * DAY_MS for k in range(1, 5)]
    vals = [float(k) for k in range(len(ts))]
    store.write(np.array([sid], np.uint64), np.array([40]), np.array(ts[:40]), np.array(vals[:40]), {sid: lab})
    for t, v in zip(ts[40:], vals[40:], strict=True):
        store.write(np.array([sid], np.uint64), np.array([1]), np.array([t]), np.array([v]))
        store._check()
    row = store.index.row_of(sid)
    assert row is not None
    head_ts, _ = store.head.samples(row)
    assert len(head_ts) >= 1 and int(head_ts[-1] - head_ts[0]) <= OFFSET_MAX
    got = store.read([Matcher.eq("pod", "pod-1")], 0, 10**14)[0]
    assert got.timestamps.tolist() == ts and got.values.tolist() == vals
    back = restore(capture(store, WalPosition(1, 16)), store.settings)
    back._check()
    again = back.read([Matcher.eq("pod", "pod-1")], 0, 10**14)[0]
    assert again.timestamps.tolist() == ts and again.values.tolist() == vals


def test_a_wave_of_seals_stores_what_sealing_one_series_at_a_time_stores() -> None:
    """50 series filling their blocks at the same writes (the agents' shape) are sealed in one
    encode_blocks call; written one series a request, each block is sealed alone. The chunk bytes,
    rings, chains and reads are the same."""
    from store_state import canonical

    labels = {series_id(_labels(i)): _labels(i) for i in range(50)}
    ids = np.array(list(labels), dtype=np.uint64)

    def fill(store: Store, together: bool) -> None:
        rng = np.random.default_rng(7)
        for tick in range(40):
            vals = np.where(np.arange(50) % 2 == 0, 1.5, rng.random(50).round(3))  # half constant
            vals[3] = float(tick) if tick < 20 else np.nan  # a decimal series leaving its scale: a new chunk
            ts = np.full(50, 1_000_000 + tick * 10_000 + (tick % 7 == 3) * 5)  # some jitter
            if together:
                store.write(ids, np.ones(50, np.int64), ts, vals, labels if tick == 0 else None)
                continue
            for i in range(50):
                store.write(ids[i : i + 1], np.ones(1, np.int64), ts[i : i + 1], vals[i : i + 1],
                            {int(ids[i]): labels[int(ids[i])]} if tick == 0 else None)
        store._check()

    wave = Store(StoreSettings(chunk_samples=10, head_keep=3))
    fill(wave, True)
    alone = Store(StoreSettings(chunk_samples=10, head_keep=3))
    fill(alone, False)
    assert sum(wave.chunks.n_chunks(r) for r in range(50)) > 100  # the seals did happen
    a, b = canonical(wave)["series"], canonical(alone)["series"]
    assert a == b


def _gc_visiting_every_row(store: Store) -> int:
    """Retention as a pass over every live row did it before expiry floors (the oracle): each row's
    chunks older than the cutoff dropped, a row left with nothing and no sample the cutoff keeps
    removed, each floor set exactly."""
    from metricsd.store.head import NO_TS

    cutoff = store.max_ts - store.settings.retention_ms
    head, chunks, removed = store.head, store.chunks, []
    for row in list(store.index.live_rows()):
        chunks.drop_before(row, cutoff)
        if not chunks.samples[row]:
            head.unsealed[row] = head.filled[row]
            if int(head.last_ts[row]) < cutoff:
                store.index.remove(row)
                head.reset_row(row)
                chunks.reset_row(row)
                removed.append(row)
                continue
        first = chunks.first_max_ts(row)
        head.expiry_floor[row] = first if first != NO_TS else (int(head.oldest_ts(np.array([row]))[0])
                                                               if head.filled[row] else NO_TS)
    store._generation += 1
    store.rollups.forget(np.array(removed, dtype=np.int64))
    store.rollups.drop_before(store.max_ts - store.settings.rollup_retention_ms)
    return len(removed)


@pytest.mark.parametrize("seed", [0, 1, *(pytest.param(s, marks=pytest.mark.slow) for s in (2, 3, 4, 5))])
def test_retention_visiting_only_rows_past_their_floor_matches_a_pass_over_every_row(seed: int) -> None:
    """Two stores get the same random writes (dense, sparse, out of order, late new series) and a
    retention pass now and then: one visits only the rows its expiry floors select (the rows whose
    oldest chunk outlives the cutoff in one NumPy pass), the other every row one by one, as every
    pass did before (the oracle above). Their contents stay identical."""

    rng = random.Random(seed)
    settings = StoreSettings(chunk_samples=rng.choice([4, 10]), head_keep=rng.choice([1, 3]),
                             ooo_window_ms=rng.choice([0, 30_000]), retention_ms=rng.choice([60_000, 200_000]),
                             rollup_retention_ms=rng.choice([2, 4]) * 3_600_000)
    fast, full = Store(settings), Store(settings)
    labels = {series_id(_labels(i)): _labels(i) for i in range(10)}
    sids = list(labels)
    clock = {sid: rng.randint(0, 100) * 1000 for sid in sids}
    visited = 0
    for step in range(150):
        chosen = rng.sample(sids[: 4 + step // 20], rng.randint(1, min(len(sids), 4 + step // 20)))
        ids: list[int] = []
        counts: list[int] = []
        ts: list[int] = []
        for sid in chosen:
            n = rng.randint(1, 12)
            if rng.random() < 0.15:  # out of order, within or past the window
                start = clock[sid] - rng.randint(1, 60) * 1000
            else:
                start = clock[sid] + rng.choice([1000, 1000, 10_000, 400_000])  # now and then a gap
            points = [start + k * 1000 for k in range(n)]
            clock[sid] = max(clock[sid], points[-1])
            ids.append(sid)
            counts.append(n)
            ts.extend(points)
        args = (np.array(ids, np.uint64), np.array(counts), np.array(ts, np.int64),
                np.array([rng.random() for _ in ts]), {sid: labels[sid] for sid in ids})
        for store in (fast, full):
            store.write(*args)
        if rng.random() < 0.2:
            before = int((fast.head.expiry_floor[: fast.index.n_rows] < fast.max_ts - settings.retention_ms).sum())
            visited += before
            assert fast.gc() == _gc_visiting_every_row(full)
            fast._check()
            full._check()
            assert sorted(fast.index.ids[r] for r in fast.index.live_rows()) == \
                sorted(full.index.ids[r] for r in full.index.live_rows())
            everything = parse_selector('pod=~".+"')
            got = {s.id: (s.timestamps.tolist(), s.values.tolist()) for s in fast.read(everything, 0, 10**12)}
            want = {s.id: (s.timestamps.tolist(), s.values.tolist()) for s in full.read(everything, 0, 10**12)}
            assert got == want
            got_r = {i: p.hour.tolist() + p.sum.tolist() for i, _, p in fast.rollup_points(everything, 0, 10**12)}
            want_r = {i: p.hour.tolist() + p.sum.tolist() for i, _, p in full.rollup_points(everything, 0, 10**12)}
            assert got_r == want_r
    assert visited  # the passes had something to do


def test_an_older_sample_merged_into_a_series_lowers_what_retention_looks_at() -> None:
    """The merge rewrites a series' chunks, and its oldest chunk may now end sooner than the floor a
    retention pass set before; the next pass must still find it (against a pass over every row)."""
    from metricsd.store.head import NO_TS

    settings = StoreSettings(chunk_samples=4, head_keep=1, ooo_window_ms=30_000, retention_ms=20_000)
    fast, full = Store(settings), Store(settings)
    lab = _labels(3)
    sid = series_id(lab)

    def write(ts: list[int]) -> None:
        for store in (fast, full):
            store.write(np.array([sid], np.uint64), np.array([len(ts)]), np.array(ts, np.int64),
                        np.ones(len(ts)), {sid: lab})

    def gc_both() -> None:
        full.head.expiry_floor[:] = NO_TS
        assert fast.gc() == full.gc()
        fast._check()
        a, b = (s.read([Matcher.eq("pod", "pod-3")], 0, 10**9)[0].timestamps.tolist() for s in (fast, full))
        assert a == b

    write(list(range(0, 21_000, 1000)))
    gc_both()  # cutoff 0: nothing to drop; the floor is now the oldest chunk's newest sample
    assert int(fast.head.expiry_floor[0]) == 3000  # the oldest chunk holds 0 - 3,000
    write([500])  # older than the floor: merged, chunks rewritten; the oldest now ends at 2,000
    write([22_500])  # cutoff 2,500: between the two
    gc_both()
    assert fast.read([Matcher.eq("pod", "pod-3")], 0, 10**9)[0].timestamps[0] == 3000  # that chunk went


def test_a_series_with_no_chunk_yet_is_removed_past_retention_and_kept_with_its_ring_as_floor() -> None:
    """Series of fewer samples than a block have no chunk: the first pass keeps the one whose newest
    sample the cutoff keeps (its floor its ring's oldest) and removes the others."""
    store = Store(StoreSettings(retention_ms=60_000))
    old, recent, late = (series_id(_labels(i)) for i in range(3))
    for sid, ts in ((old, [1_000, 2_000]), (recent, [50_000, 100_000]), (late, [140_000])):
        store.write(np.array([sid], np.uint64), np.array([len(ts)]), np.array(ts, np.int64), np.ones(len(ts)),
                    {sid: _labels([old, recent, late].index(sid))})
    assert int(store.chunks.samples[: store.index.n_rows].sum()) == 0  # all in the rings
    assert store.gc() == 1  # cutoff 80,000: old goes, recent stays for its sample at 100,000
    assert store.index.row_of(old) is None
    row = store.index.row_of(recent)
    assert row is not None and int(store.head.expiry_floor[row]) == 50_000
    assert store.series_samples(row, 0, 10**9)[0].tolist() == [50_000, 100_000]
    store._check()


def test_a_batch_with_as_many_samples_as_series_is_still_checked_for_order_unless_one_each() -> None:
    """The live shape (one sample a series) skips the order check; an empty entry beside one of two
    samples has as many samples as series but not one each, and is checked."""
    store = Store()
    a, b = series_id(_labels(1)), series_id(_labels(2))
    labels = {a: _labels(1), b: _labels(2)}
    ids = np.array([a, b], np.uint64)
    with pytest.raises(InvalidSeries, match="strictly increase"):
        store.write(ids, np.array([0, 2]), np.array([20_000, 10_000], np.int64), np.ones(2), labels)
    assert store.index.n_alive == 0
    store.write(ids, np.array([1, 1]), np.array([20_000, 10_000], np.int64), np.ones(2), labels)
    assert store.index.n_alive == 2
