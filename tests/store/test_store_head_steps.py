"""The head keeps no timestamps for evenly spaced rings (store/head.py: a regular row's are its
newest one minus its step times each sample's age); a row that leaves its step turns wide (int32
offsets in a side matrix). Against a plain model of every sample written: the rings, the chunks
and every ring reader (newest, oldest_ts, ts_at, rank) give the samples written, through
regular, jittered, gapped and backfilled writes, and after a snapshot's restore."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.model import make_labels, series_id
from metricsd.store.engine import Store
from metricsd.store.head import OFFSET_MAX, Head
from metricsd.store.settings import StoreSettings
from metricsd.store.snapshot import capture, read_snapshot, restore, write_snapshot
from metricsd.store.wal import WalPosition

T0 = 1_700_000_000_000
KEEP = 5  # ring and block: small, so rings turn and blocks seal often
SETTINGS = StoreSettings(head_keep=KEEP, chunk_samples=3 * KEEP, retention_ms=10**13)

# One write: (series, samples, how its timestamps go on: "step" keeps the series' step, "jitter"
# moves one sample by a few ms, "gap" skips a long while, "restep" changes the step; a number; its
# values: "same" the series' constant, "ramp" changing ones, "negzero" -0.0 (the same as 0.0 but
# for its bits), "nan" a NaN, "new" a new constant).
write_st = st.tuples(st.integers(0, 3), st.integers(1, 2 * KEEP + 2),
                     st.sampled_from(["step", "step", "step", "jitter", "gap", "restep"]), st.integers(1, 7),
                     st.sampled_from(["same", "same", "same", "ramp", "negzero", "nan", "new"]))


def _labels(n: int) -> tuple[list, np.ndarray]:
    labels = [make_labels("cpu", {"namespace": "ns", "pod": f"p{i}"}) for i in range(n)]
    return labels, np.array([series_id(lab) for lab in labels], np.uint64)


def _values(how: str, n: int, k: int, constant: float) -> np.ndarray:
    if how == "ramp":
        return np.round(np.arange(n) * 0.5 + k, 1)
    vals = np.full(n, constant)
    if how == "negzero":
        vals[n // 2] = -0.0
    elif how == "nan":
        vals[n // 2] = np.nan
    return vals


def _play(writes: list[tuple[int, int, str, int, str]]) -> tuple[Store, np.ndarray, list[list[int]],
                                                                  list[list[float]]]:
    labels, ids = _labels(4)
    store = Store(SETTINGS)
    model_t: list[list[int]] = [[] for _ in ids]
    model_v: list[list[float]] = [[] for _ in ids]
    step = [10_000] * len(ids)
    constant = [0.0, 2.5, 0.0, 1e9]
    for k, (s, n, how, x, vhow) in enumerate(writes):
        last = model_t[s][-1] if model_t[s] else T0 + 1_000 * s
        if how == "restep":
            step[s] = 1_000 * x
        ts = last + step[s] * np.arange(1, n + 1, dtype=np.int64)
        if how == "jitter":
            ts[n // 2] += x  # still increasing: steps are at least 1,000 ms
        elif how == "gap":
            ts += 3_600_000 * x
        if vhow == "new":
            constant[s] = float(k)
        vals = _values(vhow, n, k, constant[s])
        new = {int(ids[s]): labels[s]} if not model_t[s] else None
        res = store.write(ids[s : s + 1], np.array([n]), ts, vals, new)
        assert res.written == n, res
        model_t[s] += ts.tolist()
        model_v[s] += vals.tolist()
    return store, ids, model_t, model_v


def _bits(v: object) -> list[int]:
    """Values compared by their bits: NaN, the stale marker and -0.0 must come back as written."""
    return np.asarray(v, dtype=np.float64).view(np.uint64).tolist()


def _assert_same(store: Store, ids: np.ndarray, model_t: list[list[int]], model_v: list[list[float]]) -> None:
    store._check()
    head = store.head
    for s, sid in enumerate(ids.tolist()):
        row = store.index.row_of(sid)
        if row is None:
            assert not model_t[s]
            continue
        t, v = store.series_samples(row, 0, 2**62)
        assert t.tolist() == model_t[s] and _bits(v) == _bits(model_v[s])
        rt, rv = head.samples(row)
        f = int(head.filled[row])
        assert rt.tolist() == model_t[s][len(model_t[s]) - f :]
        assert _bits(rv) == _bits(model_v[s][len(model_v[s]) - f :])
        rows = np.array([row])
        for width in (1, 2, KEEP):
            nt, nv, cnt = head.newest(rows, width)
            c = int(cnt[0])
            assert nt[0, :c].tolist() == rt[f - c :].tolist() and _bits(nv[0, :c]) == _bits(rv[f - c :])
        if f:
            assert int(head.oldest_ts(rows)[0]) == int(rt[0])
            assert head.ts_at(rows, np.array([f - 1])).tolist() == [int(rt[-1])]
            for q in (int(rt[0]) - 1, int(rt[f // 2]), int(rt[-1]) + 1):
                assert int(head.rank(rows, q)[0]) == int(np.searchsorted(rt, q, side="right"))


@settings(max_examples=150, deadline=None)
@given(st.lists(write_st, min_size=1, max_size=25))
def test_rings_read_back_as_written_regular_or_wide(writes: list[tuple[int, int, str, int, str]]) -> None:
    store, ids, model_t, model_v = _play(writes)
    _assert_same(store, ids, model_t, model_v)


@settings(max_examples=25, deadline=None)
@given(st.lists(write_st, min_size=1, max_size=25), st.lists(write_st, max_size=8))
def test_a_snapshot_restores_regular_and_wide_rings(tmp_path_factory: object, writes: list, more: list) -> None:
    store, ids, model_t, model_v = _play(writes)
    tmp = Path(tmp_path_factory.mktemp("snap"))  # type: ignore[attr-defined]
    path, _ = write_snapshot(tmp, capture(store, WalPosition(1, 16)))
    back = restore(read_snapshot(path), SETTINGS)
    _assert_same(back, ids, model_t, model_v)
    # writing on after the restore: the restored rings continue (regular rows on their step)
    for s, n, _how, _x, _v in more:
        if not model_t[s]:
            continue
        step = model_t[s][-1] - model_t[s][-2] if len(model_t[s]) > 1 else 10_000
        ts = model_t[s][-1] + step * np.arange(1, n + 1, dtype=np.int64)
        vals = np.full(n, 1.5)
        assert back.write(ids[s : s + 1], np.array([n]), ts, vals).written == n
        model_t[s] += ts.tolist()
        model_v[s] += vals.tolist()
    _assert_same(back, ids, model_t, model_v)


def test_evenly_spaced_rows_keep_no_timestamps_and_an_off_step_row_turns_wide() -> None:
    labels, ids = _labels(4)
    store = Store(SETTINGS)
    for k in range(3 * KEEP + 1):  # the agents' shape: one sample a series a write, every 10 s
        ts = np.full(4, T0 + 10_000 * k)
        ts[3] += 15  # series 3 is scraped 15 ms late each time: evenly spaced too
        store.write(ids, np.ones(4, np.int64), ts, np.full(4, float(k)), dict(zip(ids.tolist(), labels, strict=True)))
    head = store.head
    assert head.n_wide == 0 and len(head.wide_ts) == 0
    rows = np.array([store.index.row_of(int(i)) for i in ids])
    assert head.step[rows].tolist() == [10_000] * 4
    # one late sample: that row alone turns wide, and reads back as written
    late = T0 + 10_000 * (3 * KEEP + 1) + np.array([0, 0, 7, 15])
    store.write(ids, np.ones(4, np.int64), late, np.full(4, 99.0))
    assert head.n_wide == 1 and head.wide[rows].tolist() == [0, 0, 1, 0]
    t, v = store.series_samples(int(rows[2]), 0, 2**62)
    assert t[-2:].tolist() == [T0 + 10_000 * 3 * KEEP, int(late[2])] and v[-1] == 99.0
    store._check()


def test_a_wide_row_whose_ring_cannot_span_its_samples_takes_the_slow_path() -> None:
    """A series written once in weeks: a regular ring of two (a step past step_max) cannot be; the
    wide ring's base cannot reach the next sample, so its ring is sealed and begun again."""
    head = Head(KEEP, rows=1)
    rows = np.array([0])
    one, zero = np.ones(1, np.int64), np.zeros(1, np.int64)
    t0 = np.array([T0])
    assert head.fit(rows, one, zero, t0).all()
    head.write(rows, one, zero, t0, np.zeros(1))
    far = np.array([T0 + OFFSET_MAX + 1])
    assert not head.fit(rows, one, zero, far).any()
    assert head.wide[0] == 1  # off its step first, then too far for int32 offsets
    assert head.samples(0)[0].tolist() == [T0]


def test_load_sets_regular_and_wide_rows_at_once() -> None:
    head = Head(KEEP, rows=3)
    ts = np.array([100, 200, 300, 10, 20, 31, 5], np.int64)
    head.load(np.arange(3), np.array([3, 3, 1]), np.array([1, 0, 1]), ts, np.arange(7, dtype=np.float64))
    assert head.wide.tolist() == [0, 1, 0] and head.step[0] == 100
    for r, (want_t, want_v) in enumerate([([100, 200, 300], [0, 1, 2]), ([10, 20, 31], [3, 4, 5]), ([5], [6])]):
        t, v = head.samples(r)
        assert t.tolist() == want_t and v.tolist() == want_v
    assert head.unsealed.tolist() == [1, 0, 1]
    head.last_ts[:3] = [300, 31, 5]  # the snapshot's own column (load leaves it to the caller)
    head._check(3)


def test_constant_rows_keep_one_value_and_a_changed_one_turns_varying() -> None:
    labels, ids = _labels(4)
    store = Store(SETTINGS)
    consts = np.array([0.25, 2.0, 0.0, 1e9])
    for k in range(3 * KEEP + 1):
        vals = consts.copy()
        vals[1] = k  # series 1 changes every sample
        store.write(ids, np.ones(4, np.int64), np.full(4, T0 + 10_000 * k), vals,
                    dict(zip(ids.tolist(), labels, strict=True)))
    head = store.head
    rows = np.array([store.index.row_of(int(i)) for i in ids])
    assert head.varying[rows].tolist() == [0, 1, 0, 0] and head.n_varying == 1
    assert head.flat[rows[[0, 2, 3]]].tolist() == [0.25, 0.0, 1e9]
    # -0.0 equals 0.0 but is not its bits: series 2 turns varying and reads back -0.0
    vals = consts.copy()
    vals[2] = -0.0
    store.write(ids, np.ones(4, np.int64), np.full(4, T0 + 10_000 * (3 * KEEP + 1)), vals)
    assert head.varying[rows].tolist() == [0, 1, 2, 0]
    t, v = store.series_samples(int(rows[2]), 0, 2**62)
    assert len(t) == 3 * KEEP + 2 and _bits(v) == _bits([0.0] * (3 * KEEP + 1) + [-0.0])
    store._check()


def test_a_segment_on_another_step_turns_a_regular_ring_wide() -> None:
    """Two samples 3 s apart after a ring 10 s apart: each gap of the segment agrees with the
    segment, but not with the ring's step, so the row must turn wide to keep its timestamps."""
    head = Head(KEEP, rows=1)
    rows, zero = np.array([0]), np.zeros(1, np.int64)
    for seg in ([T0, T0 + 10_000, T0 + 20_000], [T0 + 23_000, T0 + 26_000]):
        ts = np.array(seg, np.int64)
        assert head.fit(rows, np.array([len(ts)]), zero, ts).all()
        head.write(rows, np.array([len(ts)]), zero, ts, np.zeros(len(ts)))
    assert head.wide[0] == 1
    assert head.samples(0)[0].tolist() == [T0, T0 + 10_000, T0 + 20_000, T0 + 23_000, T0 + 26_000]
