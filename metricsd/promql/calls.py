"""Function calls: route each PromQL function to its implementation, evaluating arguments."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from metricsd.promql.blocks import math_block
from metricsd.promql.functions import MATH_FUNCTIONS, apply_math, clamp, histogram_quantile, round_to, scalar_of
from metricsd.promql.rangefuncs import RANGE_FUNCTIONS, eval_range_function
from metricsd.promql.selectors import RangeArg
from metricsd.promql.values import PromQLError, StepSeries, VectorBlock

if TYPE_CHECKING:
    from metricsd.promql.engine import Value, _Evaluator

__all__ = ["eval_call"]


def _range_arg(ev: _Evaluator, node: Any) -> RangeArg:
    v = ev.eval(node)
    if not isinstance(v, RangeArg):
        raise PromQLError("bad_data", f"expected a range vector, got {node}")
    return v


def eval_call(ev: _Evaluator, node: Any) -> Value:
    name = node.func.name
    args = list(node.args)
    n = ev.ctx.n
    if name in RANGE_FUNCTIONS:
        return eval_range_function(name, _range_arg(ev, args[0]), [])
    if name == "quantile_over_time":
        q = ev.scalar(args[0])
        return eval_range_function(name, _range_arg(ev, args[1]), [q])
    if name in MATH_FUNCTIONS:
        vec = ev.block_or_list(args[0])
        if isinstance(vec, VectorBlock):
            with np.errstate(all="ignore"):
                return math_block(MATH_FUNCTIONS[name](vec.values), vec)
        return apply_math(name, vec)
    if name == "time":
        return ev.ctx.steps / 1000.0
    if name == "vector":
        return [StepSeries((), ev.scalar(args[0]).astype(np.float64), np.ones(n, dtype=bool))]
    if name == "scalar":
        return scalar_of(ev.vector(args[0]), n)
    if name == "round":
        to_nearest = ev.scalar(args[1]) if len(args) > 1 else np.ones(n)
        return round_to(ev.vector(args[0]), to_nearest)
    if name == "clamp":
        vec = ev.vector(args[0])
        return clamp(vec, ev.scalar(args[1]), ev.scalar(args[2]))
    if name == "clamp_min":
        return clamp(ev.vector(args[0]), ev.scalar(args[1]), None)
    if name == "clamp_max":
        return clamp(ev.vector(args[0]), None, ev.scalar(args[1]))
    if name == "histogram_quantile":
        q = ev.scalar(args[0])
        return histogram_quantile(q, ev.vector(args[1]))
    raise PromQLError("execution", f"function {name}() is not supported by metricsd")
