"""The narrow path of the commonest dashboard panel: a range function of one selector,
``rate(sel[d])`` (or increase, delta, irate, ``*_over_time``) over a range of steps.

The general path walks the AST to plan its reads (prefetch.py), reads them concurrently, then runs
the evaluator, which dispatches on node types. For this shape the plan is the selector itself:
:func:`range_call` recognises it, the runner reads it with one awaited call (no gather, no task),
and :func:`evaluate` calls the same selector and range-function code the evaluator calls, then
the same finishing (engine.range_matrix), so the answer is the general path's by construction;
tests/promql/test_promql_narrow.py checks it against the general path on random data.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from metricsd.columns import LabelColumns, SeriesColumns
from metricsd.model import Labels
from metricsd.promql.engine import range_matrix
from metricsd.promql.rangefuncs import EXTRAPOLATED, RANGE_FUNCTIONS, extrapolate
from metricsd.promql.selectors import EvalContext, matrix_arg, matrix_data
from metricsd.promql.values import Matrix, Series, drop_name_labels

__all__ = ["evaluate", "range_call"]

_FIRST = np.zeros(1, dtype=np.int64)  # one series' samples begin at 0
# One series' answer labels (its labels without the metric name) by its label columns: a store keeps
# a one-row selection's LabelColumns (store/api.py _label_columns), so a panel's refreshes hand the
# same object again (~7 us of (b) a question, issue 23 session 38). An entry holds its columns, so no
# other object gets the id while it is kept; columns are never changed in place.
_NAMED_KEPT = 1024
_named: dict[int, tuple[LabelColumns, Labels]] = {}


def range_call(ast: Any) -> tuple[str, Any] | None:
    """``(function name, matrix selector)`` when ``ast`` is a call of a one-argument range
    function (RANGE_FUNCTIONS) on a matrix selector; else None."""
    if type(ast).__name__ != "Call":
        return None
    name = ast.func.name
    if name not in RANGE_FUNCTIONS:
        return None
    args = ast.args
    if len(args) != 1 or type(args[0]).__name__ != "MatrixSelector":
        return None
    return name, args[0]


def evaluate(name: str, matrix_selector: Any, ctx: EvalContext) -> Matrix:
    """``name(matrix_selector)`` over ``ctx``'s steps, from ``ctx.source`` (which must hold the
    selector's data), as Engine.range answers it. Raises what the engine raises (the sample
    budget, the deadline)."""
    ctx.check_deadline()
    data, ends, range_ms = matrix_data(ctx, matrix_selector)
    if len(data) == 1 and name in EXTRAPOLATED:
        return _one_extrapolated(name, data, ends, range_ms, ctx)
    block = RANGE_FUNCTIONS[name](matrix_arg(ctx, data, ends, range_ms))
    steps: np.ndarray = ctx.steps
    return range_matrix(block, steps)


def _one_extrapolated(name: str, data: SeriesColumns, ends: np.ndarray, range_ms: int, ctx: EvalContext) -> Matrix:
    """rate, increase or delta of ONE series (a panel of one pod) on 1-D arrays: the windows by
    two searches, the same element-wise arithmetic as the general path (rangefuncs.extrapolate)
    and the answer's series made directly, without the RangeArg, the series x steps block and its
    finish, whose fixed costs were most of the evaluation at 121 steps. Bit for bit the general
    path's answer (tests/promql/test_promql_narrow_one.py)."""
    lo_s, hi_s = int(data.offsets[0]), int(data.offsets[1])
    ts, vals = data.timestamps[lo_s:hi_s], data.values[lo_s:hi_s]
    lo = ts.searchsorted(ends - range_ms, side="right")
    hi = ts.searchsorted(ends, side="right")
    ctx.charge(int((hi - lo).sum()))
    ok = (hi - lo) >= 2
    if not ok.any():
        return Matrix([])
    is_counter, is_rate = EXTRAPOLATED[name]
    result = extrapolate(ts, vals, _FIRST, lo, hi, ends, range_ms, is_counter=is_counter, is_rate=is_rate)
    steps: np.ndarray = ctx.steps
    return Matrix([Series(_answer_labels(data.labels), steps[ok], result[ok])])


def _answer_labels(labels: LabelColumns) -> Labels:
    """``drop_name_labels`` of the first series' labels, kept per label columns (see _named)."""
    kept = _named.get(id(labels))
    if kept is not None and kept[0] is labels:
        return kept[1]
    named = drop_name_labels(labels.labels_at(0))
    if len(_named) >= _NAMED_KEPT:
        _named.clear()
    _named[id(labels)] = (labels, named)
    return named
