"""The PromQL engine: parse with ``promql-parser``, evaluate the AST over all steps at once,
then finish the result (delayed ``__name__`` removal, duplicate checks, result type).

Parsing notes, where the library needs help:

* A negative ``@`` time (``foo @ -100``) makes the parser's Python binding panic when the time
  is read back. Before parsing, such times are replaced by unique far-future placeholders, and
  the evaluator maps the placeholders back (:func:`_hide_negative_at`).
* Errors from the parser are one generic message; they are reported as ``bad_data`` with the
  parser's text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import promql_parser as pp

from metricsd.promql import aggregations as agg
from metricsd.promql.binops import Matching, scalar_binop, set_binop, vector_binop, vector_scalar_binop
from metricsd.promql.blocks import aggregate_block, scalar_binop_block
from metricsd.promql.selectors import EvalContext, RangeArg, eval_matrix_selector, eval_vector_selector
from metricsd.promql.source import SeriesSource
from metricsd.promql.values import (
    Matrix,
    PromQLError,
    Result,
    Sample,
    Scalar,
    Series,
    StepSeries,
    String,
    Vector,
    VectorBlock,
    drop_name_labels,
)

__all__ = ["DEFAULT_MAX_SAMPLES", "MAX_POINTS", "Engine", "parse", "range_matrix"]

DEFAULT_MAX_SAMPLES = 50_000_000
MAX_POINTS = 11_000  # points per series in a range query, as Prometheus' HTTP API allows
DUPLICATE_LABELSET = "vector cannot contain metrics with the same labelset"

Value = np.ndarray | list[StepSeries] | VectorBlock | RangeArg | str

_NEG_AT_RE = re.compile(r"@\s*-\s*((?:\d+(?:ms|[smhdwy]))+|\d*\.?\d+(?:[eE][+-]?\d+)?)")
_PLACEHOLDER_BASE_S = 9_000_000_000  # year 2255; far beyond any real data


def _hide_negative_at(text: str) -> tuple[str, dict[int, int]]:
    mapping: dict[int, int] = {}

    def repl(m: re.Match[str]) -> str:
        raw = m.group(1)
        is_duration = raw[-1].isalpha()
        ms = int(pp.parse_duration(raw).total_seconds() * 1000) if is_duration else round(float(raw) * 1000)
        placeholder_s = _PLACEHOLDER_BASE_S + len(mapping)
        mapping[placeholder_s * 1000] = -ms
        return f"@ {placeholder_s}"

    return _NEG_AT_RE.sub(repl, text), mapping


def parse(text: str) -> tuple[Any, dict[int, int]]:
    """Parse a query; returns the AST and the negative-@ placeholder map. Raises bad_data."""
    hidden, mapping = _hide_negative_at(text)
    try:
        return pp.parse(hidden), mapping
    except BaseException as e:  # the Rust binding raises ValueError, or a PanicException
        if isinstance(e, KeyboardInterrupt | SystemExit):
            raise
        raise PromQLError("bad_data", f"invalid parameter \"query\": {e}") from None


def prettify(text: str) -> str:
    """The query as Prometheus' ``promql.Prettify`` writes it (the parser's own formatter).
    Raises bad_data as :func:`parse` does."""
    try:
        return str(pp.parse(text).prettify())
    except BaseException as e:  # the Rust binding raises ValueError, or a PanicException
        if isinstance(e, KeyboardInterrupt | SystemExit):
            raise
        raise PromQLError("bad_data", f"invalid parameter \"query\": {e}") from None


def _card(c: Any) -> str:
    return {
        "OneToOne": "one-to-one",
        "ManyToOne": "many-to-one",
        "OneToMany": "one-to-many",
        "ManyToMany": "many-to-many",
    }[str(c).rsplit(".", 1)[-1]]


class Engine:
    """Evaluates PromQL against a :class:`SeriesSource`. Stateless between queries; thread-safe
    as far as the source is."""

    def __init__(
        self, source: SeriesSource, lookback_ms: int = 300_000, max_samples: int = DEFAULT_MAX_SAMPLES,
        deadline: float | None = None,
    ) -> None:
        self.source = source
        self.lookback_ms = lookback_ms
        self.max_samples = max_samples
        self.deadline = deadline  # time.monotonic(); past it evaluation raises PromQLError("timeout")

    def instant(self, expr: str, time_ms: int, parsed: tuple[Any, dict[int, int]] | None = None) -> Result:
        """``parsed``: what :func:`parse` returned for ``expr``, to save parsing twice."""
        ast, neg = parsed or parse(expr)
        ctx = self._ctx(time_ms, time_ms, 1, neg)
        value = _Evaluator(ctx).eval(ast)
        if isinstance(value, str):
            return String(time_ms, value)
        if isinstance(value, np.ndarray):
            return Scalar(time_ms, float(value[0]))
        if isinstance(value, RangeArg):
            return _range_arg_to_matrix(value)
        vec = _finish(_as_list(value), 1)
        return Vector(time_ms, [Sample(s.labels, float(s.values[0])) for s in vec])

    def range(self, expr: str, start_ms: int, end_ms: int, step_ms: int,
              parsed: tuple[Any, dict[int, int]] | None = None) -> Matrix:
        if step_ms <= 0:
            raise PromQLError(
                "bad_data", "zero or negative query resolution step widths are not accepted. "
                "Try a positive integer"
            )
        if end_ms < start_ms:
            raise PromQLError("bad_data", "end timestamp must not be before start time")
        if (end_ms - start_ms) // step_ms + 1 > MAX_POINTS:
            raise PromQLError(
                "bad_data",
                "exceeded maximum resolution of 11,000 points per timeseries. "
                "Try decreasing the query resolution (?step=XX)",
            )
        ast, neg = parsed or parse(expr)
        ctx = self._ctx(start_ms, end_ms, step_ms, neg)
        return range_matrix(_Evaluator(ctx).eval(ast), ctx.steps)

    def _ctx(self, start: int, end: int, step: int, neg: dict[int, int]) -> EvalContext:
        steps = np.arange(start, end + 1, step, dtype=np.int64)
        return EvalContext(self.source, start, end, step, steps, self.lookback_ms, self.max_samples, neg,
                           deadline=self.deadline)


def range_matrix(value: Value, steps: np.ndarray) -> Matrix:
    """A range query's answer from its expression's value over ``steps``: series sorted by labels,
    each with the steps where it is present, after delayed name removal and the duplicate check."""
    if isinstance(value, RangeArg | str):
        kind = "range vector" if isinstance(value, RangeArg) else "string"
        raise PromQLError(
            "bad_data", f'invalid expression type "{kind}" for range query, must be Scalar or instant Vector'
        )
    if isinstance(value, np.ndarray):
        return Matrix([Series((), steps.copy(), value.astype(np.float64))])
    if isinstance(value, VectorBlock) and len(value) == 1:
        # fast path: one series (a panel of one pod) needs no sort, merge or duplicate check
        present = value.present[0]
        if not present.any():
            return Matrix([])
        labels = value.labels.labels_at(0)
        return Matrix([Series(drop_name_labels(labels) if value.drop_name else labels, steps[present],
                              value.values[0][present])])
    out = []
    for s in sorted(_finish(_as_list(value), steps.size), key=lambda s: s.labels):
        out.append(Series(s.labels, steps[s.present], s.values[s.present]))
    return Matrix(out)


def _as_list(v: list[StepSeries] | VectorBlock) -> list[StepSeries]:
    return v.to_series() if isinstance(v, VectorBlock) else v


def _finish(vec: list[StepSeries], n: int) -> list[StepSeries]:
    """Delayed name removal, then merge series that became identical (an error if they overlap)."""
    merged: dict[tuple[tuple[str, str], ...], StepSeries] = {}
    order = []
    for s in vec:
        if not s.present.any():
            continue
        labels = drop_name_labels(s.labels) if s.drop_name else s.labels
        cur = merged.get(labels)
        if cur is None:
            merged[labels] = StepSeries(labels, s.values, s.present)
            order.append(labels)
            continue
        if (cur.present & s.present).any():
            raise PromQLError("execution", DUPLICATE_LABELSET)
        cur.values = np.where(s.present, s.values, cur.values)
        cur.present = cur.present | s.present
    return [merged[k] for k in order]


def _range_arg_to_matrix(arg: RangeArg) -> Matrix:
    out = []
    for labels, ts, vals in arg.series:
        lo, hi = arg.windows(ts)
        if hi[0] > lo[0]:
            out.append(Series(labels, ts[lo[0] : hi[0]], vals[lo[0] : hi[0]]))
    return Matrix(out)


class _Evaluator:
    def __init__(self, ctx: EvalContext) -> None:
        self.ctx = ctx

    def eval(self, node: Any) -> Value:
        self.ctx.check_deadline()
        handler: Callable[[Any], Value] | None = getattr(self, "_eval_" + type(node).__name__, None)
        if handler is None:
            raise PromQLError("execution", f"unsupported expression {type(node).__name__}: {node}")
        return handler(node)

    def scalar(self, node: Any) -> np.ndarray:
        v = self.eval(node)
        if not isinstance(v, np.ndarray):
            raise PromQLError("bad_data", f"expected a scalar, got {node}")
        return v

    def vector(self, node: Any) -> list[StepSeries]:
        """An instant vector as one StepSeries per series (the general operators' form)."""
        return _as_list(self.block_or_list(node))

    def block_or_list(self, node: Any) -> list[StepSeries] | VectorBlock:
        """An instant vector in whichever form it was made (columns stay columns)."""
        v = self.eval(node)
        if not isinstance(v, list | VectorBlock):
            raise PromQLError("bad_data", f"expected an instant vector, got {node}")
        return v

    def _eval_NumberLiteral(self, node: Any) -> Value:
        return np.full(self.ctx.n, float(node.val))

    def _eval_StringLiteral(self, node: Any) -> Value:
        return str(node.val)

    def _eval_ParenExpr(self, node: Any) -> Value:
        return self.eval(node.expr)

    def _eval_UnaryExpr(self, node: Any) -> Value:
        v = self.eval(node.expr)
        if isinstance(v, np.ndarray):
            return -v
        if isinstance(v, VectorBlock):
            return VectorBlock(v.labels, -v.values, v.present, drop_name=True)
        if isinstance(v, list):
            return [StepSeries(s.labels, -s.values, s.present, drop_name=True) for s in v]
        raise PromQLError("bad_data", "unary expression only allowed on expressions of type scalar or instant vector")

    def _eval_VectorSelector(self, node: Any) -> Value:
        return eval_vector_selector(self.ctx, node)

    def _eval_MatrixSelector(self, node: Any) -> Value:
        return eval_matrix_selector(self.ctx, node)

    def _eval_Call(self, node: Any) -> Value:
        from metricsd.promql.calls import eval_call

        return eval_call(self, node)

    def _eval_AggregateExpr(self, node: Any) -> Value:
        op = str(node.op)
        by = node.modifier is None or node.modifier.type == pp.AggModifierType.By
        names = [] if node.modifier is None else list(node.modifier.labels)
        n = self.ctx.n
        if op in ("topk", "bottomk"):
            param = self.scalar(node.param)
            return agg.top_bottom_k(op, self.vector(node.expr), by, names, n, param)
        if op == "count_values":
            label = self.eval(node.param)
            assert isinstance(label, str)
            return agg.count_values(label, self.vector(node.expr), by, names, n)
        if op == "quantile":
            param = self.scalar(node.param)
            return agg.aggregate(op, self.vector(node.expr), by, names, n, param)
        if op in ("sum", "avg", "min", "max", "count", "group", "stddev", "stdvar"):
            vec = self.block_or_list(node.expr)
            if isinstance(vec, VectorBlock):
                fast = aggregate_block(op, vec, by, names)
                if fast is not None:
                    return fast
            return agg.aggregate(op, _as_list(vec), by, names, n)
        raise PromQLError("execution", f"aggregation {op}() is not supported")

    def _eval_BinaryExpr(self, node: Any) -> Value:
        op = str(node.op).strip()
        lhs, rhs = self.eval(node.lhs), self.eval(node.rhs)
        mod = node.modifier
        return_bool = bool(mod is not None and mod.return_bool)
        n = self.ctx.n
        if isinstance(lhs, np.ndarray) and isinstance(rhs, np.ndarray):
            return scalar_binop(op, lhs, rhs)
        if isinstance(lhs, VectorBlock) and isinstance(rhs, np.ndarray):
            return scalar_binop_block(op, lhs, rhs, False, return_bool)
        if isinstance(lhs, np.ndarray) and isinstance(rhs, VectorBlock):
            return scalar_binop_block(op, rhs, lhs, True, return_bool)
        lhs = _as_list(lhs) if isinstance(lhs, VectorBlock) else lhs
        rhs = _as_list(rhs) if isinstance(rhs, VectorBlock) else rhs
        if isinstance(lhs, list) and isinstance(rhs, np.ndarray):
            return vector_scalar_binop(op, lhs, rhs, False, return_bool)
        if isinstance(lhs, np.ndarray) and isinstance(rhs, list):
            return vector_scalar_binop(op, rhs, lhs, True, return_bool)
        if not (isinstance(lhs, list) and isinstance(rhs, list)):
            raise PromQLError(
                "bad_data", f"binary expression must contain only scalar and instant vector types: {node}"
            )
        matching = _matching(op, mod)
        if op in ("and", "or", "unless"):
            return set_binop(op, lhs, rhs, matching, n)
        return vector_binop(op, lhs, rhs, matching, n)


def _matching(op: str, mod: Any) -> Matching:
    if mod is None:
        card = "many-to-many" if op in ("and", "or", "unless") else "one-to-one"
        return Matching(card, False, (), (), False)
    on = mod.matching is not None and mod.matching.type == pp.LabelModifierType.Include
    labels = tuple(mod.matching.labels) if mod.matching is not None else ()
    card = _card(mod.card)
    if op in ("and", "or", "unless"):
        card = "many-to-many"
    return Matching(card, on, labels, tuple(mod.group_labels or ()), bool(mod.return_bool))
