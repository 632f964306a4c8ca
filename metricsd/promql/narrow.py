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

from metricsd.promql.engine import range_matrix
from metricsd.promql.rangefuncs import RANGE_FUNCTIONS
from metricsd.promql.selectors import EvalContext, eval_matrix_selector
from metricsd.promql.values import Matrix

__all__ = ["evaluate", "range_call"]


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
    block = RANGE_FUNCTIONS[name](eval_matrix_selector(ctx, matrix_selector))
    steps: np.ndarray = ctx.steps
    return range_matrix(block, steps)
