"""Answer PromQL aggregations inside the stores (``backend.aggregate``) when the shape allows.

The shapes, each with no ``offset`` or ``@`` on its selector:

* ``AGG [by (l, ...)] (FN(m{...}[w]))`` with AGG one of sum, avg, min, max, count, quantile(q)
  and FN one of rate, increase, avg|min|max|sum|count_over_time;
* ``AGG [by (...)] (m{...})``: the newest sample within the lookback, as an instant selector;
* ``A / B`` where A and B are both of the shapes above with the same AGG (not quantile) and the
  same ``by`` labels, and no ``on``/``ignoring``/``bool`` modifier: the ratio is pushed down as
  a numerator and a denominator (utilisation = sum of usage / sum of requests).

Everything else (``without``, ``by (__name__)``, nested or mixed expressions) returns None from
:func:`plan` and is evaluated by the engine over prefetched data. The stores reduce each series
over (t - w, t] with Prometheus' rules (extrapolated rate, stale markers skipped), so the answers
equal the engine's up to floating-point summation order.

The stores add plainly where Prometheus uses Kahan summation, so :func:`trustworthy` checks the
answer before it is used: a non-finite value (an overflow, or NaN/Inf data) or a sum whose
rounding error could exceed 1e-9 of it (large values of both signs cancelling) sends the query to
the engine instead. For same-signed data, such as rates and usage, that never happens below
millions of series per group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import promql_parser as pp

from metricsd.maths.select import present_cells, requested, selected_cells
from metricsd.promql.selectors import td_ms, to_matchers
from metricsd.promql.values import Matrix, PromQLError, Result, Sample, Series, Vector
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import float_array, labels_from_pb, matchers_to_pb

__all__ = ["PushdownPlan", "plan", "result_of", "trustworthy"]

_EPS = float(np.finfo(np.float64).eps)
_MAX_REL_ERROR = 1e-9
_MAX_K = 2**32 - 1  # AggregateRequest.top_k is a uint32

_SERIES_FN = {
    "rate": pb.SERIES_RATE,
    "increase": pb.SERIES_INCREASE,
    "avg_over_time": pb.SERIES_AVG,
    "min_over_time": pb.SERIES_MIN,
    "max_over_time": pb.SERIES_MAX,
    "sum_over_time": pb.SERIES_SUM,
    "count_over_time": pb.SERIES_COUNT,
}
_ACROSS_FN = {
    "sum": pb.ACROSS_SUM,
    "avg": pb.ACROSS_AVG,
    "min": pb.ACROSS_MIN,
    "max": pb.ACROSS_MAX,
    "count": pb.ACROSS_COUNT,
    "quantile": pb.ACROSS_QUANTILE,
}


@dataclass(frozen=True)
class _Agg:
    across: Any
    group_by: tuple[str, ...]
    query: pb.AggregateQuery
    quantile: float = 0.0


@dataclass(frozen=True)
class PushdownPlan:
    """An aggregate request, plus whether the query was instant (a vector) or a range (a matrix)."""

    request: pb.AggregateRequest
    instant: bool

    @property
    def select(self) -> tuple[int, bool] | None:
        """topk / bottomk over the aggregate's groups, (k, largest): the stores keep each step's k
        best groups (AggregateRequest.top_k / bottom_k) and result_of selects per step."""
        return requested(self.request.top_k, self.request.bottom_k)


def _strip(node: Any) -> Any:
    while type(node).__name__ == "ParenExpr":
        node = node.expr
    return node


def _plain(vs: Any) -> bool:
    return bool(vs.offset is None and vs.at is None and not vs.matchers.or_matchers)


def _side(node: Any, lookback_ms: int) -> pb.AggregateQuery | None:
    node = _strip(node)
    kind = type(node).__name__
    if kind == "VectorSelector" and _plain(node):
        return pb.AggregateQuery(matchers=matchers_to_pb(to_matchers(node)), series_fn=pb.SERIES_LAST,
                                 window_ms=lookback_ms)
    if kind != "Call" or node.func.name not in _SERIES_FN or len(node.args) != 1:
        return None
    arg = _strip(node.args[0])
    if type(arg).__name__ != "MatrixSelector" or not _plain(arg.vector_selector):
        return None
    window = td_ms(arg.range)
    if window <= 0:
        return None
    return pb.AggregateQuery(matchers=matchers_to_pb(to_matchers(arg.vector_selector)),
                             series_fn=_SERIES_FN[node.func.name], window_ms=window)


def _agg(node: Any, lookback_ms: int) -> _Agg | None:
    node = _strip(node)
    if type(node).__name__ != "AggregateExpr":
        return None
    op = str(node.op)
    if op not in _ACROSS_FN:
        return None
    mod = node.modifier
    if mod is not None and mod.type != pp.AggModifierType.By:
        return None
    group_by = tuple(sorted(set(mod.labels))) if mod is not None else ()
    if "__name__" in group_by:
        return None
    q = 0.0
    if op == "quantile":
        param = _strip(node.param)
        if type(param).__name__ != "NumberLiteral" or not 0.0 <= float(param.val) <= 1.0:
            return None
        q = float(param.val)
    side = _side(node.expr, lookback_ms)
    if side is None:
        return None
    return _Agg(_ACROSS_FN[op], group_by, side, q)


def _ratio(node: Any, lookback_ms: int) -> tuple[_Agg, _Agg] | None:
    node = _strip(node)
    if type(node).__name__ != "BinaryExpr" or str(node.op).strip() != "/":
        return None
    mod = node.modifier
    if mod is not None and (mod.return_bool or mod.matching is not None or mod.group_labels):
        return None
    num, den = _agg(node.lhs, lookback_ms), _agg(node.rhs, lookback_ms)
    if num is None or den is None or num.across != den.across or num.group_by != den.group_by:
        return None
    if num.across == pb.ACROSS_QUANTILE:
        return None
    return num, den


def _select(node: Any, lookback_ms: int) -> tuple[str, int, _Agg] | None:
    """``topk|bottomk(k, <aggregation the stores answer>)`` without by/without on the selection."""
    node = _strip(node)
    if type(node).__name__ != "AggregateExpr" or str(node.op) not in ("topk", "bottomk") or node.modifier:
        return None
    param = _strip(node.param)
    if type(param).__name__ != "NumberLiteral" or not float(param.val).is_integer() or float(param.val) < 1:
        return None
    inner = _agg(node.expr, lookback_ms)
    if inner is None:
        return None
    return str(node.op), int(param.val), inner


def plan(
    ast: Any, start_ms: int, end_ms: int, step_ms: int, lookback_ms: int, *, instant: bool
) -> PushdownPlan | None:
    """The aggregate request answering ``ast`` over the steps, or None when it cannot be pushed."""
    select: tuple[str, int] | None = None
    try:
        single = _agg(ast, lookback_ms)
        pair = None if single is not None else _ratio(ast, lookback_ms)
        if single is None and pair is None:
            picked = _select(ast, lookback_ms)
            if picked is not None:
                select, single = (picked[0], picked[1]), picked[2]
    except PromQLError:
        return None
    if single is None and pair is None:
        return None
    num, den = (single, None) if single is not None else pair  # type: ignore[misc]
    req = pb.AggregateRequest(query=num.query, across=num.across, quantile=num.quantile,
                              group_by=list(num.group_by), start_ms=start_ms, end_ms=end_ms,
                              step_ms=0 if instant else step_ms)
    if den is not None:
        req.denominator.CopyFrom(den.query)
    if select is not None:
        k = min(select[1], _MAX_K)  # a k past every group keeps them all
        if select[0] == "topk":
            req.top_k = k
        else:
            req.bottom_k = k
    return PushdownPlan(req, instant=instant)


def result_of(p: PushdownPlan, resp: pb.AggregateResponse) -> Result:
    """The aggregate's answer as the engine would give it: groups with no value are absent."""
    times = np.array(resp.timestamps, dtype=np.int64)
    shape = (len(resp.groups), len(times))
    values = float_array(resp.values).reshape(shape)
    present = _present(p, resp).reshape(shape)
    groups = [labels_from_pb(g.labels) for g in resp.groups]
    if p.select is not None:
        present = selected_cells(values, present, *p.select)
    if p.instant:
        t = int(times[0]) if len(times) else p.request.start_ms
        return Vector(t, [Sample(g, float(values[i, 0])) for i, g in enumerate(groups) if present[i, 0]])
    series = [Series(g, times[present[i]], values[i, present[i]]) for i, g in enumerate(groups) if present[i].any()]
    return Matrix(sorted(series, key=lambda s: s.labels))


def _present(p: PushdownPlan, resp: pb.AggregateResponse) -> np.ndarray:
    """Where a group has a value, flat [g * T + t]."""
    den = float_array(resp.denominator.count) if p.request.HasField("denominator") else None
    return present_cells(float_array(resp.numerator.count), den)


def _sums_are_exact_enough(p: pb.Partials, shape: tuple[int, int]) -> bool:
    """Bound the error of a plain left-to-right sum, (n - 1) * eps * sum(|x|), against the sum."""
    count = float_array(p.count).reshape(shape)
    total = float_array(p.sum).reshape(shape)
    lo = float_array(p.min).reshape(shape)
    hi = float_array(p.max).reshape(shape)
    has = count > 0
    if not bool(has.any()):
        return True
    count, total, lo, hi = count[has], total[has], lo[has], hi[has]
    with np.errstate(invalid="ignore", over="ignore"):
        same_sign = (lo >= 0) | (hi <= 0)
        abs_sum = np.where(same_sign, np.abs(total), count * np.maximum(np.abs(lo), np.abs(hi)))
        bound = np.maximum(count - 1, 0) * _EPS * abs_sum
        ok = np.isfinite(total) & (bound <= _MAX_REL_ERROR * np.abs(total))
    return bool(ok.all())


def trustworthy(p: PushdownPlan, resp: pb.AggregateResponse) -> bool:
    """Whether the stores' answer equals the engine's (see the module's note); else use the engine."""
    shape = (len(resp.groups), len(resp.timestamps))
    values = float_array(resp.values)
    if not bool(np.isfinite(values[~np.isnan(values)]).all()):
        return False
    present = _present(p, resp)
    if bool(np.isnan(values[present]).any()):
        return False
    if p.request.across not in (pb.ACROSS_SUM, pb.ACROSS_AVG):
        return True
    sides = [resp.numerator] + ([resp.denominator] if p.request.HasField("denominator") else [])
    return all(_sums_are_exact_enough(side, shape) for side in sides)
