"""Pushed-down aggregates against brute force over raw samples; partials merge exactly."""

from __future__ import annotations

import functools
import math
import random

import numpy as np
import pytest
from oracle import reduce_one

from metricsd.maths.partials import AcrossFn, finalize, group_partials, merge_partials
from metricsd.maths.select import kept_groups
from metricsd.maths.spec import AggregateSpec, SideQuery
from metricsd.maths.window import SeriesFn
from metricsd.model import make_labels, series_id
from metricsd.selector import parse_selector
from metricsd.store.engine import Store
from metricsd.store.query import run_aggregate
from metricsd.store.settings import StoreSettings


@functools.cache
def _build(seed: int) -> tuple[Store, dict[str, tuple[dict[str, str], list[int], list[float]]]]:
    """Built once per seed and shared: the tests only read it."""
    rng = random.Random(seed)
    store = Store(StoreSettings(chunk_samples=rng.choice([6, 120]), head_keep=rng.choice([2, 32])))
    raw: dict[str, tuple[dict[str, str], list[int], list[float]]] = {}
    for p in range(30):
        for metric in ("usage", "request"):
            lab = {"namespace": "ns", "pod": f"p{p}", "workload": f"w{p % 4}", "node": f"n{p % 3}"}
            labels = make_labels(metric, lab)
            t0 = rng.randint(0, 50_000)
            n = rng.randint(0, 80)
            ts = [t0 + k * 10_000 + rng.randint(0, 500) for k in range(n)]
            if metric == "usage":
                vals = list(np.cumsum([rng.uniform(0, 5) for _ in ts]).tolist())
                if n > 10 and rng.random() < 0.3:
                    vals = vals[: n // 2] + [v - vals[n // 2] for v in vals[n // 2 :]]  # counter reset
            else:
                vals = [float(rng.choice([1, 2, 4]))] * n
            sid = series_id(labels)
            for a in range(0, n, 7):
                store.write(np.array([sid], np.uint64), np.array([len(ts[a : a + 7])]), np.array(ts[a : a + 7]),
                            np.array(vals[a : a + 7]), {sid: labels})
            raw[f"{metric}/{p}"] = ({"__name__": metric, **lab}, ts, vals)
    return store, raw


def _brute(raw: dict, metric: str, fn: str, across: str, window: int, t: int, by: str, q: float = 0.5) -> dict:
    groups: dict[str, list[float]] = {}
    for labels, ts, vals in raw.values():
        if labels["__name__"] != metric:
            continue
        v, n = reduce_one(ts, vals, t, window, fn)
        if n:
            groups.setdefault(labels[by] if by else "", []).append(v)
    out = {}
    for g, vs in groups.items():
        if across == "sum":
            out[g] = sum(vs)
        elif across == "avg":
            out[g] = sum(vs) / len(vs)
        elif across == "min":
            out[g] = min(vs)
        elif across == "max":
            out[g] = max(vs)
        elif across == "count":
            out[g] = float(len(vs))
        else:
            s = sorted(vs)
            r = q * (len(s) - 1)
            lo = math.floor(r)
            hi = min(lo + 1, len(s) - 1)
            out[g] = s[lo] * (1 - (r - lo)) + s[hi] * (r - lo)
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("fn", ["rate", "avg", "last", "max", "increase", "count"])
@pytest.mark.parametrize("across", ["avg", "sum", "min", "max", "count", "quantile"])
def test_aggregate_equals_brute_force(seed: int, fn: str, across: str) -> None:
    store, raw = _build(seed)
    for by in ("workload", ""):
        for t, window in ((400_000, 60_000), (800_000, 300_000), (300_000, 900_000)):
            spec = AggregateSpec(
                SideQuery(parse_selector("", "usage"), SeriesFn[fn.upper()], window), AcrossFn[across.upper()],
                t, t, group_by=[by] if by else [], quantile=0.9,
            )
            res = run_aggregate(store, spec)
            want = _brute(raw, "usage", fn, across, window, t, by, q=0.9)
            got = {(dict(g).get(by, "")): float(res.values[i, 0]) for i, g in enumerate(res.groups)
                   if not math.isnan(res.values[i, 0])}
            assert set(got) == set(want)
            for g in want:
                assert got[g] == pytest.approx(want[g], rel=1e-9, abs=1e-9)


def test_ratio_is_across_usage_over_across_request_per_group() -> None:
    store, raw = _build(7)
    t = 500_000
    spec = AggregateSpec(
        SideQuery(parse_selector("", "usage"), SeriesFn.RATE, 60_000), AcrossFn.SUM, t, t, group_by=["workload"],
        denominator=SideQuery(parse_selector("", "request"), SeriesFn.LAST, 300_000),
    )
    res = run_aggregate(store, spec)
    num = _brute(raw, "usage", "rate", "sum", 60_000, t, "workload")
    den = _brute(raw, "request", "last", "sum", 300_000, t, "workload")
    for i, g in enumerate(res.groups):
        w = dict(g)["workload"]
        if w in num and w in den:
            assert res.values[i, 0] == pytest.approx(num[w] / den[w])


def test_range_aggregate_equals_instant_at_each_step() -> None:
    store, _ = _build(3)
    side = SideQuery(parse_selector("", "usage"), SeriesFn.RATE, 120_000)
    rng = run_aggregate(store, AggregateSpec(side, AcrossFn.AVG, 200_000, 600_000, 50_000, ["workload"]))
    for j, t in enumerate(rng.times.tolist()):
        one = run_aggregate(store, AggregateSpec(side, AcrossFn.AVG, t, t, 0, ["workload"]))
        assert one.groups == rng.groups[: len(one.groups)] or set(one.groups) <= set(rng.groups)
        for i, g in enumerate(one.groups):
            k = rng.groups.index(g)
            np.testing.assert_allclose(rng.values[k, j], one.values[i, 0], rtol=1e-12, equal_nan=True)


def test_partials_of_two_halves_merge_to_the_whole() -> None:
    rng = np.random.default_rng(1)
    values = rng.normal(size=(50, 3))
    samples = rng.integers(0, 3, size=(50, 3)).astype(np.uint32)
    group = rng.integers(0, 4, size=50)
    whole = group_partials(values, samples, group, 4)
    merged = merge_partials(group_partials(values[:20], samples[:20], group[:20], 4),
                            group_partials(values[20:], samples[20:], group[20:], 4))
    for name in ("sum", "count", "min", "max"):
        np.testing.assert_allclose(getattr(merged, name), getattr(whole, name))


def test_times_where_no_series_has_a_value_give_no_value() -> None:
    values = np.array([[1.0, np.nan], [2.0, np.nan]])
    samples = np.array([[1, 0], [1, 0]], dtype=np.uint32)
    p = group_partials(values, samples, np.array([0, 0]), 1)
    assert p.sum.dtype == np.float64
    np.testing.assert_array_equal(finalize(AcrossFn.SUM, p), [[3.0, np.nan]])
    p = group_partials(values, np.zeros_like(samples), np.array([0, 0]), 1)  # nothing at all
    assert np.isnan(finalize(AcrossFn.AVG, p)).all() and np.isnan(finalize(AcrossFn.SUM, p)).all()


@pytest.mark.parametrize(("across", "ratio"), [("sum", False), ("avg", True), ("quantile", False), ("min", False)])
@pytest.mark.parametrize("top", [True, False])
def test_top_k_keeps_each_times_best_groups_and_their_series(across: str, ratio: bool, top: bool) -> None:
    """A store's top_k / bottom_k answer is its whole answer cut to the selected groups: partials,
    values and per-series rows (group indices renumbered); what was scanned stays counted."""
    store, _ = _build(2)
    den = SideQuery(parse_selector("", "request"), SeriesFn.LAST, 300_000) if ratio else None
    base = dict(query=SideQuery(parse_selector("", "usage"), SeriesFn.RATE, 60_000), across=AcrossFn[across.upper()],
                start_ms=200_000, end_ms=700_000, step_ms=100_000, group_by=["pod"], denominator=den,
                quantile=0.5, per_series=True)
    whole = run_aggregate(store, AggregateSpec(**base))  # type: ignore[arg-type]
    k = 3
    cut = run_aggregate(store, AggregateSpec(**base, top_k=k if top else 0, bottom_k=0 if top else k))  # type: ignore[arg-type]
    present = whole.numerator.partials.count > 0
    if whole.denominator is not None:
        present &= whole.denominator.partials.count > 0
    keep = kept_groups(whole.values, present, k, largest=top)
    assert 0 < keep.sum() < len(whole.groups)  # the data gives a real cut
    assert cut.groups == [g for g, kept in zip(whole.groups, keep.tolist(), strict=True) if kept]
    np.testing.assert_array_equal(cut.values, whole.values[keep])
    sides = [(cut.numerator, whole.numerator)] + ([(cut.denominator, whole.denominator)] if ratio else [])
    for got, want in sides:
        assert got is not None and want is not None
        np.testing.assert_array_equal(got.partials.sum, want.partials.sum[keep])
        np.testing.assert_array_equal(got.partials.count, want.partials.count[keep])
        rows = keep[want.group]
        np.testing.assert_array_equal(got.ids, want.ids[rows])
        assert [cut.groups[g] for g in got.group.tolist()] == [whole.groups[g] for g in want.group[rows].tolist()]
        np.testing.assert_array_equal(got.values, want.values[rows])
    assert (cut.series_scanned, cut.samples_scanned) == (whole.series_scanned, whole.samples_scanned)
