"""What a PromQL query returns, the error it raises, and Prometheus' JSON shape for both.

Also the engine's internal per-step representations: every expression is evaluated for all steps
of a query at once, so an instant query is a range query of one step and NumPy does the work
across steps. An instant vector is either a :class:`VectorBlock` (many series as columns: label
codes and a values matrix, what selectors, range functions and the common aggregations produce)
or a list of :class:`StepSeries` (one object per series, what the other operators work on).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import orjson

from metricsd.columns import LabelColumns
from metricsd.model import METRIC_NAME, Labels

__all__ = [
    "Matrix",
    "PromQLError",
    "Result",
    "Sample",
    "Scalar",
    "Series",
    "StepSeries",
    "String",
    "Vector",
    "VectorBlock",
    "format_float",
    "format_floats",
    "format_labels",
    "format_times",
    "to_prometheus_body",
    "to_prometheus_data",
    "to_prometheus_json",
]

ErrorKind = Literal["bad_data", "execution", "timeout", "unavailable"]

# Labels that describe a metric's identity; dropped together with the name (Prometheus 3).
NAME_LABELS = (METRIC_NAME, "__type__", "__unit__")


class PromQLError(Exception):
    """A query that cannot be parsed (``bad_data``, HTTP 400) or evaluated (``execution``, HTTP 422),
    that ran out of time (``timeout``, 503) or found no slot to run in (``unavailable``, 503)."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message


@dataclass(frozen=True)
class Sample:
    labels: Labels
    value: float


@dataclass(frozen=True)
class Series:
    labels: Labels
    timestamps: np.ndarray  # int64 ms
    values: np.ndarray  # float64


@dataclass(frozen=True)
class Scalar:
    time_ms: int
    value: float


@dataclass(frozen=True)
class String:
    time_ms: int
    value: str


@dataclass(frozen=True)
class Vector:
    time_ms: int
    samples: list[Sample]


@dataclass(frozen=True)
class Matrix:
    series: list[Series]


Result = Scalar | Vector | Matrix | String


@dataclass
class StepSeries:
    """One series of an instant vector across all query steps; ``present`` says where it exists."""

    labels: Labels
    values: np.ndarray  # float64, one per step
    present: np.ndarray  # bool, one per step
    drop_name: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class VectorBlock:
    """An instant vector across all query steps as columns: series i has labels
    ``labels.labels_at(i)``, ``values[i]`` and ``present[i]`` (series x steps). ``drop_name``
    marks every series for delayed ``__name__`` removal, as StepSeries.drop_name does one."""

    labels: LabelColumns
    values: np.ndarray  # float64, series x steps
    present: np.ndarray  # bool, series x steps
    drop_name: bool = False

    def __len__(self) -> int:
        return len(self.labels)

    def to_series(self) -> list[StepSeries]:
        """One StepSeries per series present at some step, in label order (as selectors list them)."""
        keep = np.flatnonzero(self.present.any(axis=1))
        labels = self.labels.take(keep)
        order = labels.sort_order()
        tuples = labels.take(order).to_list()
        rows = keep[order]
        return [StepSeries(lab, self.values[r], self.present[r], drop_name=self.drop_name)
                for lab, r in zip(tuples, rows.tolist(), strict=True)]


def drop_name_labels(labels: Labels) -> Labels:
    return tuple(kv for kv in labels if kv[0] not in NAME_LABELS)


def format_labels(labels: Labels) -> str:
    """Prometheus' ``labels.String()``: ``{__name__="x", a="b"}``; used in error messages."""
    inner = ", ".join(f"{k}={_go_quote(v)}" for k, v in labels)
    return "{" + inner + "}"


def _go_quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def format_float(v: float) -> str:
    """Go's ``strconv.FormatFloat(v, 'f', -1, 64)``: shortest round-trip digits, no exponent."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    r = repr(v)  # shortest round-trip digits too, 20x cheaper, but with an exponent past 1e16 / below 1e-4
    if "e" in r:
        return str(np.format_float_positional(v, trim="-"))
    return r[:-2] if r.endswith(".0") else r


# format_float's positional digits are repr's, which uses them exactly for magnitudes in
# [1e-4, 1e16) (Python's float repr: an exponent below -4 or from 16 on). orjson writes the same
# shortest round-trip digits there (its writer and repr both give the shortest string that reads
# back, the nearest one on a tie; tests/promql/test_promql_values_format.py checks them against
# each other), at a fraction of the cost of a repr call per value.
_PLAIN_LO, _PLAIN_HI = 1e-4, 1e16


def format_floats(values: np.ndarray) -> list[str]:
    """:func:`format_float` of each value, for a whole series at once (the body of a range query):
    one orjson call over the array, the ``.0`` of whole numbers cut, and only the values outside
    the positional range (zero, NaN, infinities, below 1e-4 or from 1e16 on) through
    format_float one by one."""
    vals = np.asarray(values, dtype=np.float64)
    if vals.size == 0:
        return []
    text = orjson.dumps(vals, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    # a whole number is the only value written with a ".0" before its comma; cut them all at once
    out = (text[1:-1] + ",").replace(".0,", ",").split(",")[:-1]
    if "e" not in text and "n" not in text:
        # no exponent and no null (NaN, infinities): every value in positional shortest digits,
        # which are format_float's (zero too: "0", "-0"), so no magnitude to check (~5 us of 121)
        return out
    with np.errstate(invalid="ignore"):
        mag = np.abs(vals)
        if mag.min() >= _PLAIN_LO and mag.max() < _PLAIN_HI:  # all positional (NaN compares False): usual
            plain = None
            odd = []
        else:
            plain = (mag >= _PLAIN_LO) & (mag < _PLAIN_HI)
            odd = np.flatnonzero(~plain).tolist()
    if "e" in text:  # an exponent where repr has none would be a writer's choice: take repr's
        odd = [i for i, r in enumerate(out) if "e" in r or (plain is not None and not plain[i])]
    for i in odd:
        out[i] = format_float(float(vals[i]))
    return out


def _ts(ms: int) -> float | int:
    return ms // 1000 if ms % 1000 == 0 else ms / 1000


def format_times(timestamps_ms: np.ndarray) -> list[float | int]:
    """:func:`_ts` of each timestamp: whole seconds as ints, the others as float seconds."""
    ts = np.asarray(timestamps_ms, dtype=np.int64)
    if not bool((ts % 1000).any()):
        return (ts // 1000).tolist()
    return [_ts(t) for t in ts.tolist()]


def to_prometheus_body(result: Result) -> bytes:
    """A successful query's whole response body, ``{"status": "success", "data": ...}`` with
    :func:`to_prometheus_json`'s ``data``, as UTF-8 JSON: the same bytes as jsonbody.dumps of it,
    with a range query's points handed to orjson as the tuples zip makes (orjson writes a tuple
    as an array) instead of a list made per point (~10 us of (b)'s 121 points, issue 23 session 38)."""
    return _encoded({"status": "success", "data": to_prometheus_json(result, pairs=_as_tuples)})


def to_prometheus_data(result: Result) -> bytes:
    """:func:`to_prometheus_json`'s ``data`` alone as UTF-8 JSON, the bytes jsonbody.dumps writes
    of it, the points handed to orjson as tuples like :func:`to_prometheus_body`: a store's answer
    to a whole query (metricsd/http/wholequery.py), which the proxy wraps as the body."""
    return _encoded(to_prometheus_json(result, pairs=_as_tuples))


def _encoded(doc: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(doc)
    except orjson.JSONEncodeError:  # what orjson refuses (a lone surrogate in a label): jsonbody's fallback
        return json.dumps(doc).encode()


def _as_lists(pairs: Iterator[tuple[Any, str]]) -> list[Any]:
    return [list(p) for p in pairs]


def _as_tuples(pairs: Iterator[tuple[Any, str]]) -> list[Any]:
    return list(pairs)


def to_prometheus_json(result: Result, *, pairs: Callable[[Iterator[tuple[Any, str]]], list[Any]] = _as_lists
                       ) -> dict[str, Any]:
    """The ``data`` member of a Prometheus query response: ``{"resultType": ..., "result": ...}``.
    ``pairs``: how a matrix series' (time, value) points are listed (lists, as JSON decodes them,
    unless a body is encoded at once: to_prometheus_body)."""
    if isinstance(result, Scalar):
        return {"resultType": "scalar", "result": [_ts(result.time_ms), format_float(result.value)]}
    if isinstance(result, String):
        return {"resultType": "string", "result": [_ts(result.time_ms), result.value]}
    if isinstance(result, Vector):
        return {
            "resultType": "vector",
            "result": [
                {"metric": dict(s.labels), "value": [_ts(result.time_ms), format_float(s.value)]}
                for s in result.samples
            ],
        }
    return {
        "resultType": "matrix",
        "result": [
            {
                "metric": dict(s.labels),
                "values": pairs(zip(format_times(s.timestamps), format_floats(s.values), strict=True)),
            }
            for s in result.series
        ],
    }
