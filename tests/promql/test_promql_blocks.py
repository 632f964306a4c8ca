"""The columnar operators (promql/blocks.py) against the engine's general per-series code
(aggregations.aggregate, binops.vector_scalar_binop, functions.apply_math) on random blocks:
the same series, values, presence and name dropping."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.columns import LabelColumns
from metricsd.model import Labels
from metricsd.promql import aggregations as agg
from metricsd.promql.binops import vector_scalar_binop
from metricsd.promql.blocks import aggregate_block, math_block, scalar_binop_block
from metricsd.promql.functions import MATH_FUNCTIONS, apply_math
from metricsd.promql.values import StepSeries, VectorBlock

NAMES = ["__name__", "a", "b", "c"]
FLOATS = st.one_of(st.sampled_from([0.0, 1.0, -2.5, 3.0, float("nan"), float("inf"), 1e300, -1e300]),
                   st.floats(-100, 100, allow_nan=False))


@st.composite
def blocks(draw: st.DrawFn) -> VectorBlock:
    steps = draw(st.integers(1, 4))
    labels: set[Labels] = set()
    for _ in range(draw(st.integers(0, 10))):
        names = draw(st.sets(st.sampled_from(NAMES), min_size=1))
        labels.add(tuple(sorted((k, draw(st.sampled_from(["x", "y", "z"]))) for k in names)))
    rows = sorted(labels)
    n = len(rows)
    values = np.array(draw(st.lists(FLOATS, min_size=n * steps, max_size=n * steps)), dtype=np.float64)
    present = np.array(draw(st.lists(st.booleans(), min_size=n * steps, max_size=n * steps)), dtype=bool)
    order = np.array(draw(st.permutations(range(n))), dtype=np.int64)  # the block's series in any order
    cols = LabelColumns.from_labels([rows[i] for i in order])
    return VectorBlock(cols, values.reshape(n, steps), present.reshape(n, steps), drop_name=draw(st.booleans()))


def _as_dict(series: list[StepSeries]) -> dict[Labels, tuple[list[float | None], bool]]:
    """Per label set, its values where present and whether its name is to be dropped (which only
    means anything for a series that has a name)."""
    out = {}
    for s in series:
        vals = [float(v) if p else None for v, p in zip(s.values.tolist(), s.present.tolist(), strict=True)]
        if any(v is not None for v in vals):
            out[s.labels] = (vals, s.drop_name and any(k == "__name__" for k, _ in s.labels))
    return out


def _same(a: dict[Labels, tuple[list[float | None], bool]], b: dict[Labels, tuple[list[float | None], bool]]) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        (va, da), (vb, db) = a[k], b[k]
        if da != db or len(va) != len(vb):
            return False
        for x, y in zip(va, vb, strict=True):
            if (x is None) != (y is None):
                return False
            if x is not None and y is not None and not (x == y or (x != x and y != y) or abs(x - y) <= 1e-9 * abs(x)):
                return False
    return True


@settings(max_examples=300)
@given(blocks(), st.sampled_from(["sum", "avg", "count", "min", "max", "group"]), st.booleans(),
       st.lists(st.sampled_from([*NAMES, "d"]), max_size=3))
def test_aggregations_equal_the_general_path(block: VectorBlock, op: str, by: bool, names: list[str]) -> None:
    fast = aggregate_block(op, block, by, names)
    want = agg.aggregate(op, block.to_series(), by, names, block.values.shape[1])
    if fast is None:  # a sum the plain path could make inexact: the engine takes the general path
        assert op in ("sum", "avg")
        return
    assert _same(_as_dict(fast.to_series()), _as_dict(want))


@settings(max_examples=300)
@given(blocks(), st.sampled_from(["+", "-", "*", "/", "%", "^", "==", "!=", ">", "<", ">=", "<="]), st.booleans(),
       st.booleans(), st.data())
def test_scalar_operators_equal_the_general_path(block: VectorBlock, op: str, scalar_left: bool, return_bool: bool,
                                                 data: st.DataObject) -> None:
    steps = block.values.shape[1]
    scalar = np.array(data.draw(st.lists(FLOATS, min_size=steps, max_size=steps)), dtype=np.float64)
    got = scalar_binop_block(op, block, scalar, scalar_left, return_bool)
    want = vector_scalar_binop(op, block.to_series(), scalar, scalar_left, return_bool)
    assert _same(_as_dict(got.to_series()), _as_dict(want))


@given(blocks(), st.sampled_from(sorted(MATH_FUNCTIONS)))
def test_math_functions_equal_the_general_path(block: VectorBlock, name: str) -> None:
    with np.errstate(all="ignore"):
        got = math_block(MATH_FUNCTIONS[name](block.values), block)
    assert _same(_as_dict(got.to_series()), _as_dict(apply_math(name, block.to_series())))
