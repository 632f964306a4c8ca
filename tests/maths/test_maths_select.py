"""topk / bottomk pushed down: keeping each time's k best groups loses nothing the client selects."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.maths.select import kept_groups, selected_cells


def _oracle(values: np.ndarray, present: np.ndarray, k: int, largest: bool) -> np.ndarray:
    """Per column, sort the present rows by (NaN last, value, row) and take the first k."""
    out = np.zeros_like(present)
    for t in range(values.shape[1]):
        rows = [g for g in range(len(values)) if present[g, t]]
        rows.sort(key=lambda g: (bool(np.isnan(values[g, t])),
                                 0.0 if np.isnan(values[g, t]) else (-values[g, t] if largest else values[g, t]), g))
        out[rows[:k], t] = True
    return out


@st.composite
def _grids(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int, bool, list[int]]:
    g = draw(st.integers(0, 12))
    t = draw(st.integers(1, 4))
    cells = st.one_of(st.sampled_from([0.0, 1.0, 2.0, -1.0, np.inf, -np.inf, np.nan]), st.floats(-5, 5))
    values = np.array(draw(st.lists(cells, min_size=g * t, max_size=g * t)), dtype=np.float64).reshape(g, t)
    present = np.array(draw(st.lists(st.booleans(), min_size=g * t, max_size=g * t)), dtype=bool).reshape(g, t)
    parts = draw(st.lists(st.integers(0, 2), min_size=g, max_size=g))  # which store holds each group
    return values, present, draw(st.integers(1, 14)), draw(st.booleans()), parts


@settings(max_examples=300, deadline=None)
@given(_grids())
def test_the_selection_is_prometheus_order_and_survives_keeping_only_the_kept_groups(
        grid: tuple[np.ndarray, np.ndarray, int, bool, list[int]]) -> None:
    values, present, k, largest, parts = grid
    want = _oracle(values, present, k, largest)
    np.testing.assert_array_equal(selected_cells(values, present, k, largest), want)
    keep = kept_groups(values, present, k, largest)
    np.testing.assert_array_equal(keep, want.any(axis=1))
    # Each store keeps its own groups' best; the client selects over the union of what they sent.
    union = np.zeros(len(values), dtype=bool)
    for p in set(parts):
        rows = np.flatnonzero(np.array(parts) == p)
        union[rows[kept_groups(values[rows], present[rows], k, largest)]] = True
    got = np.zeros_like(present)
    got[union] = selected_cells(values[union], present[union], k, largest)
    np.testing.assert_array_equal(got, want)


def test_k_zero_keeps_nothing_and_a_large_k_keeps_every_present_group() -> None:
    values = np.array([[1.0], [np.nan], [3.0]])
    present = np.array([[True], [True], [False]])
    assert not selected_cells(values, present, 0, True).any()
    assert kept_groups(values, present, 10, True).tolist() == [True, True, False]
