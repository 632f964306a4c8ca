"""Compare a Prometheus HTTP API response with an eval command's expectations (README section 9).

Annotation expectations (``expect warn``/``info``/``no_warn``/``no_info``) are not checked:
metricsd's engine produces no annotations yet.
"""

from __future__ import annotations

import math
import re
from typing import Any

from promql_script_format import HISTOGRAM, EvalCmd, ExpectedSeries, is_stale_value

from metricsd.model import Labels

__all__ = ["check_eval", "check_range_cross", "float_equal", "wants_range_cross"]

_MIN_NORMAL = 2.2250738585072014e-308
_MAX_FLOAT = 1.7976931348623157e308


def float_equal(a: float, b: float, eps: float = 1e-6) -> bool:
    """Prometheus' ``almost.Equal`` with its stale-marker and NaN rules."""
    if is_stale_value(a) or is_stale_value(b):
        return is_stale_value(a) and is_stale_value(b)
    if math.isnan(a) and math.isnan(b):
        return True
    if a == b:
        return True
    diff = abs(a - b)
    if a == 0 or b == 0 or abs(a) + abs(b) < _MIN_NORMAL:
        return diff < eps * _MIN_NORMAL
    return diff / min(abs(a) + abs(b), _MAX_FLOAT) < eps


def _labels(metric: dict[str, str]) -> Labels:
    return tuple(sorted(metric.items()))


def _fmt(labels: Labels) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels) + "}"


def _ms(ts: float) -> int:
    return round(ts * 1000)


def _check_vector(cmd: EvalCmd, result: list[dict[str, Any]]) -> str | None:
    got = [(_labels(r["metric"]), float(r["value"][1])) for r in result]
    want = {s.labels: s for s in cmd.series}
    if len(got) != len(want):
        return f"expected {len(want)} series, got {len(got)}: {[_fmt(g[0]) for g in got]}"
    for pos, (labels, value) in enumerate(got):
        exp = want.get(labels)
        if exp is None:
            return f"unexpected series {_fmt(labels)} {value}"
        if len(exp.values) != 1 or exp.values[0] is HISTOGRAM or exp.values[0] is None:
            return f"bad expectation for {_fmt(labels)}: {exp.values}"
        ev = exp.values[0]
        assert isinstance(ev, float)
        if not float_equal(ev, value):
            return f"{_fmt(labels)}: expected {ev}, got {value}"
        if cmd.ordered and cmd.series[pos].labels != labels:
            return f"order: expected {_fmt(cmd.series[pos].labels)} at position {pos}, got {_fmt(labels)}"
    return None


def _check_matrix(
    series: list[ExpectedSeries], result: list[dict[str, Any]], start: int, step: int, end: int | None
) -> str | None:
    want = {s.labels: s for s in series}
    got = {_labels(r["metric"]): r["values"] for r in result}
    if len(got) != len(result):
        return "result has duplicate series"
    if set(got) != set(want):
        missing = [_fmt(x) for x in set(want) - set(got)]
        extra = [_fmt(x) for x in set(got) - set(want)]
        return f"series differ: missing {missing}, unexpected {extra}"
    for labels, exp in want.items():
        points = [(start + i * step, v) for i, v in enumerate(exp.values) if v is not None]
        if end is not None and points and points[-1][0] > end:
            return f"{_fmt(labels)}: more expected points than steps"
        actual = [(_ms(float(t)), float(v)) for t, v in got[labels]]
        if len(points) != len(actual):
            return f"{_fmt(labels)}: expected {len(points)} points {points}, got {len(actual)} {actual}"
        for (et, ev), (at, av) in zip(points, actual, strict=True):
            if ev is HISTOGRAM:
                return f"{_fmt(labels)}: histogram expectations are not supported"
            assert isinstance(ev, float)
            if et != at or not float_equal(ev, av):
                return f"{_fmt(labels)}: expected {ev}@{et}, got {av}@{at}"
    return None


def check_eval(cmd: EvalCmd, resp: dict[str, Any]) -> str | None:
    """None when the response meets the expectations, else a one-line reason."""
    if cmd.fail:
        if resp.get("status") != "error":
            return "expected the query to fail, it succeeded"
        msg = str(resp.get("error", ""))
        if cmd.fail_msg is not None and msg != cmd.fail_msg:
            return f"error message {msg!r} != {cmd.fail_msg!r}"
        if cmd.fail_regex is not None and not re.search(cmd.fail_regex, msg):
            return f"error message {msg!r} does not match {cmd.fail_regex!r}"
        return None
    if resp.get("status") != "success":
        return f"query failed: {resp.get('errorType')}: {resp.get('error')}"
    data = resp["data"]
    rtype, result = data["resultType"], data["result"]
    if cmd.range:
        if rtype != "matrix":
            return f"expected a matrix, got {rtype}"
        return _check_matrix(cmd.series, result, cmd.start_ms, cmd.step_ms, cmd.end_ms)
    if cmd.string is not None:
        if rtype != "string" or result[1] != cmd.string:
            return f"expected string {cmd.string!r}, got {rtype} {result}"
        return None
    if cmd.range_vector is not None:
        if rtype != "matrix":
            return f"expected a range vector, got {rtype}"
        start, end, step = cmd.range_vector
        return _check_matrix(cmd.series, result, start, step, end)
    if cmd.scalar is not None:
        if rtype != "scalar":
            return f"expected scalar {cmd.scalar}, got {rtype}"
        value = float(result[1])
        return None if float_equal(cmd.scalar, value) else f"expected scalar {cmd.scalar}, got {value}"
    if rtype != "vector":
        return f"expected a vector, got {rtype}"
    return _check_vector(cmd, result)


def wants_range_cross(cmd: EvalCmd) -> bool:
    """README section 10.1: which instant evals are re-run as a range query around their time."""
    if cmd.range or cmd.fail or cmd.ordered or cmd.range_vector is not None or cmd.string is not None:
        return False
    return not re.search(r"\b(start|end|range|step)\s*\(", cmd.expr)


def check_range_cross(cmd: EvalCmd, resp: dict[str, Any]) -> str | None:
    """The points at the eval time of a range query from t-1m to t+1m must equal the expectations."""
    if resp.get("status") != "success":
        return f"range cross-check failed: {resp.get('errorType')}: {resp.get('error')}"
    data = resp["data"]
    if data["resultType"] != "matrix":
        return f"range cross-check: expected a matrix, got {data['resultType']}"
    at_t = []
    for r in data["result"]:
        pts = [v for t, v in r["values"] if _ms(float(t)) == cmd.time_ms]
        if pts:
            at_t.append({"metric": r["metric"], "value": [cmd.time_ms / 1000, pts[0]]})
    if cmd.scalar is not None:
        if len(at_t) != 1:
            return f"range cross-check: expected one series for a scalar, got {len(at_t)}"
        value = float(at_t[0]["value"][1])
        return None if float_equal(cmd.scalar, value) else f"range cross-check: expected {cmd.scalar}, got {value}"
    reason = _check_vector(cmd, at_t)
    return None if reason is None else f"range cross-check: {reason}"
