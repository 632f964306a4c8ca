"""The operators that work on a :class:`VectorBlock` as columns, with no object per series.

What a selection over tens of thousands of series usually meets next: an aggregation (sum, avg,
count, min, max, group, by or without labels), arithmetic or a comparison with a scalar, a math
function. Each is a few NumPy calls over the (series x steps) matrix; groups come from the label
codes (LabelColumns.group). Anything else takes the block as a list of StepSeries
(VectorBlock.to_series) and the general code in aggregations.py, binops.py and functions.py.

The answers equal the general code's: the same float rules (sums fall back to the Kahan path when
a plain sum could be inexact), the same name dropping.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from metricsd.model import METRIC_NAME
from metricsd.promql.aggregations import FAST_OPS, reduce_groups
from metricsd.promql.binops import COMPARISONS, arith
from metricsd.promql.values import NAME_LABELS, VectorBlock

__all__ = ["aggregate_block", "math_block", "scalar_binop_block"]


def aggregate_block(op: str, block: VectorBlock, by: bool, names: Sequence[str]) -> VectorBlock | None:
    """``op`` by/without ``names`` over the block's series; None when the general path must answer
    (another operator, or a sum whose plain evaluation could lose precision)."""
    if op not in FAST_OPS:
        return None
    groups, gidx = block.labels.group(names, by, always_drop=() if by else NAME_LABELS)
    n_steps = block.values.shape[1]
    if len(groups) == 0:
        return VectorBlock(groups, np.zeros((0, n_steps)), np.zeros((0, n_steps), dtype=bool))
    order = np.argsort(gidx, kind="stable")  # members in input order within a group
    reduced = reduce_groups(op, block.values[order], block.present[order],
                            np.searchsorted(gidx[order], np.arange(len(groups))))
    if reduced is None:
        return None
    keep_name = by and METRIC_NAME in groups.names
    return VectorBlock(groups, reduced[0], reduced[1], drop_name=block.drop_name and keep_name)


def scalar_binop_block(op: str, block: VectorBlock, scalar: np.ndarray, scalar_left: bool,
                       return_bool: bool) -> VectorBlock:
    """Arithmetic or a comparison between every series and a scalar (per step), as
    binops.vector_scalar_binop does series by series."""
    lhs, rhs = (scalar[None, :], block.values) if scalar_left else (block.values, scalar[None, :])
    res = arith(op, lhs, rhs)
    if op not in COMPARISONS:
        return VectorBlock(block.labels, res, block.present, drop_name=True)
    if return_bool:
        return VectorBlock(block.labels, res, block.present, drop_name=True)
    keep = block.present & (res == 1.0)
    rows = np.flatnonzero(keep.any(axis=1))
    return VectorBlock(block.labels.take(rows), block.values[rows], keep[rows], drop_name=block.drop_name)


def math_block(fn_values: np.ndarray, block: VectorBlock) -> VectorBlock:
    """A function applied to every value (abs, ln, ...): the name is dropped."""
    return VectorBlock(block.labels, fn_values, block.present, drop_name=True)
