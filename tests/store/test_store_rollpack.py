"""Packed closed hours of rollups: bit for bit what was packed, and a store's rollups with packing
give the same answers as without it through writes, late and out-of-order samples, retention and
snapshots."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.store import rollpack
from metricsd.store.rollup import HOUR_MS, Rollups

_floats = st.floats(allow_nan=True, allow_infinity=True, width=64)


@st.composite
def _records(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = np.array(sorted(draw(st.sets(st.integers(0, 5_000), max_size=60))), np.int32)
    k = len(rows)
    vals = np.array(draw(st.lists(_floats, min_size=4 * k, max_size=4 * k)), np.float64).reshape(k, 4)
    count = np.array(draw(st.lists(st.integers(0, 2**31 - 1), min_size=k, max_size=k)), np.int32)
    return rows, vals, count


def _same(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> None:
    assert a[0].tolist() == b[0].tolist()
    assert a[1].view(np.uint64).tolist() == b[1].view(np.uint64).tolist()  # NaN payloads and -0.0 too
    assert a[2].tolist() == b[2].tolist()


@settings(max_examples=150, deadline=None)
@given(_records(), st.integers(1, 9), st.lists(st.integers(0, 5_000), max_size=10))
def test_pack_round_trip_and_frames(rec: tuple[np.ndarray, np.ndarray, np.ndarray], frame: int,
                                    want: list[int]) -> None:
    rows, vals, count = rec
    p = rollpack.pack(rows, vals, count, frame)
    assert len(p) == len(rows) and len(p.data) == -(-len(rows) // frame)
    _same(rollpack.unpack(p), rec)
    # the frames of some rows hold every one of them that has a record
    w = np.array(want, np.int64)
    r, _, _ = rollpack.unpack(p, rollpack.frames_of(p, w))
    assert set(w.tolist()) & set(rows.tolist()) <= set(r.tolist())
    # replacing a run of frames by their own records minus one changes only that
    if len(p.data):
        lo = len(p.data) // 2
        r, v, c = rollpack.unpack(p, np.array([lo]))
        q = rollpack.replace(p, lo, lo + 1, r[1:], v[1:], c[1:])
        gone = int(p.starts[lo])
        keep = np.arange(len(rows)) != gone
        _same(rollpack.unpack(q), (rows[keep], vals[keep], count[keep]))


@settings(max_examples=200, deadline=None)
@given(_records(), st.integers(1, 9), st.lists(st.integers(0, 5_000), max_size=120), st.booleans(), st.booleans(),
       st.integers(1, 12))
def test_lookup_equals_a_search(rec: tuple[np.ndarray, np.ndarray, np.ndarray], frame: int, want: list[int],
                                dense: bool, ordered: bool, step: int) -> None:
    """Every path of a lookup (whole frames, a gather across frames, dense frames whose rows are not
    decoded, sorted selections) against a plain search of the records."""
    rows, vals, count = rec
    if dense:  # consecutive rows from some start, as a store's blocks mostly are
        rows = np.arange(len(rows), dtype=np.int32) + (int(rows[0]) if len(rows) else 0)
    w = np.array(sorted(set(want)) if ordered else want, np.int64)
    if dense and len(rows) and len(w):  # most of them hit
        w = np.concatenate([w[:step], rows[::step]]).astype(np.int64)  # few or most of the rows
        if ordered:
            w = np.unique(w)
    p = rollpack.pack(rows, vals, count, frame)
    found, v, c = rollpack.lookup(p, w)
    at = np.minimum(np.searchsorted(rows, w), max(len(rows) - 1, 0))
    hit = np.flatnonzero(rows[at] == w) if len(rows) else np.zeros(0, np.int64)
    assert found.tolist() == hit.tolist()
    assert v.view(np.uint64).tolist() == vals[at[hit]].view(np.uint64).tolist()
    assert c.tolist() == count[at[hit]].tolist()
    assert bool(p.dense.all()) or not dense


def _drive(ro: Rollups, seed: int) -> None:
    """Writes over 30 hours to 40 rows: most on time, some series late to close their hour, some
    samples out of order into closed hours, and series forgotten (retention)."""
    rng = np.random.default_rng(seed)
    ro.ensure_rows(40)
    for step in range(30 * 6):
        t = step * 600_000
        rows = np.flatnonzero(rng.random(40) < 0.8)
        ro.add(rows.astype(np.int64), np.full(len(rows), t, np.int64), rng.normal(size=len(rows)).round(2))
        if step % 7 == 3:  # out of order, into an hour up to 5 back (closed, most of them packed)
            r = rng.integers(0, 40, 3)
            back = t - rng.integers(1, 5 * 6, 3) * 600_000
            ro.add(r, back, rng.normal(size=3))
        if step % 40 == 39:
            ro.forget(rng.integers(0, 40, 4))
            ro.drop_before(t - 20 * HOUR_MS)
        if step % 11 == 0:
            ro.points_many(np.arange(40), 0, t)  # reads settle parts in between


@pytest.mark.parametrize("seed", range(4))
def test_packed_rollups_answer_as_plain(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rollpack, "FRAME", 3)  # many frames of a few rows each
    packed = Rollups()
    _drive(packed, seed)
    plain = Rollups()
    plain.packing = False
    _drive(plain, seed)
    packed.pack_old(10**9)  # what the retention pass does (out-of-order samples made plain old hours)
    assert sum(b.packed is not None for b in packed.blocks) == len(packed.blocks) - 1 > 10
    assert all(b.packed is None for b in plain.blocks)
    packed._check()
    for want in (np.arange(40), np.array([5]), np.array([39, 0, 17])):
        for a, b in zip(packed.points_many(want, 0, 10**13), plain.points_many(want, 0, 10**13), strict=True):
            for f in ("hour", "min", "max", "sum", "count", "last"):
                assert getattr(a, f).view(np.uint64 if f != "hour" else np.int64).tolist() == \
                    getattr(b, f).view(np.uint64 if f != "hour" else np.int64).tolist(), f
    got, ref = packed.closed_of(np.arange(40)), plain.closed_of(np.arange(40))
    for x, y in zip(got, ref, strict=True):
        assert x.view(np.uint8).tolist() == y.view(np.uint8).tolist()
    # a snapshot's closed hours restored: packed again, the same records
    again = Rollups()
    again.ensure_rows(40)
    again.restore_closed(*got)
    assert all(b.packed is None for b in again.blocks)  # a restart does not pack ...
    assert again.pack_old(25) >= 25  # ... the retention passes do, a budget at a time
    assert 0 < sum(b.packed is not None for b in again.blocks) < len(again.blocks) - 1
    again.pack_old(10**9)
    assert sum(b.packed is not None for b in again.blocks) == len(again.blocks) - 1
    for x, y in zip(again.closed_of(np.arange(40)), ref, strict=True):
        assert x.view(np.uint8).tolist() == y.view(np.uint8).tolist()


def _two_hours(ro: Rollups, rows: np.ndarray, late: tuple[int, ...]) -> None:
    """Hours 0 and 1 closed by writes in hour 2, except the ``late`` rows', which have not written in hour 2 yet."""
    ro.ensure_rows(len(rows))
    for t in range(0, 2 * HOUR_MS + 60_000, 600_000):
        live = rows if t < 2 * HOUR_MS else rows[~np.isin(rows, late)]
        ro.add(live, np.full(len(live), t, np.int64), (live * 1.5 + t / 1e6).round(3))


def _points(ro: Rollups, rows: np.ndarray) -> list[list[int]]:
    out = []
    for p in ro.points_many(rows, 0, 10**13):
        out += [getattr(p, f).view(np.int64).tolist() for f in ("hour", "min", "max", "sum", "count", "last")]
    return out


def test_the_newest_closed_hour_is_packed_once_no_series_closes_into_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rollpack, "FRAME", 4)
    rows = np.arange(30)
    packed, plain = Rollups(), Rollups()
    plain.packing = False
    for ro in (packed, plain):
        _two_hours(ro, rows, late=(7,))
    newest = packed.blocks[-1]
    assert newest.hour == HOUR_MS and newest.packed is None
    packed.pack_old(10**9)
    assert newest.packed is None  # one pass: not yet known to be quiet
    packed.add(np.array([3]), np.array([2 * HOUR_MS + 70_000]), np.array([1.0]))  # row 3 writes again: no closing
    plain.add(np.array([3]), np.array([2 * HOUR_MS + 70_000]), np.array([1.0]))
    packed.pack_old(10**9)
    assert newest.packed is not None  # nothing closed into it between the two passes
    assert _points(packed, rows) == _points(plain, rows)
    for ro in (packed, plain):  # the late series closes into the packed hour
        ro.add(np.array([7]), np.array([2 * HOUR_MS + 80_000]), np.array([2.5]))
    assert _points(packed, rows) == _points(plain, rows)
    packed._check()
    for x, y in zip(packed.closed_of(rows), plain.closed_of(rows), strict=True):
        assert x.view(np.uint8).tolist() == y.view(np.uint8).tolist()


def test_the_newest_closed_hour_stays_plain_while_series_close_into_it() -> None:
    ro = Rollups()
    _two_hours(ro, np.arange(30), late=(7, 8, 9))
    for late in (7, 8, 9):  # a series closes into the newest hour between each two passes
        ro.pack_old(10**9)
        ro.add(np.array([late]), np.array([2 * HOUR_MS + 90_000]), np.array([1.0]))
        assert ro.blocks[-1].packed is None
    ro.pack_old(10**9)  # sees the last closing
    assert ro.blocks[-1].packed is None
    ro.pack_old(10**9)  # a quiet pass since
    assert ro.blocks[-1].packed is not None
