"""VictoriaMetrics' JSON-lines format, the body of ``/api/v1/export`` and ``/api/v1/import``.

One line per series (a series may take several lines), as VictoriaMetrics writes it
(app/vmselect/prometheus/export.qtpl, ExportJSONLine) and reads it (lib/protoparser/vmimport):

    {"metric":{"__name__":"up","job":"node"},"values":[1,0.5,null],"timestamps":[1549891472010,1549891487724,...]}

- ``metric``: the labels, ``__name__`` first; then the others (metricsd: sorted by name).
- ``values``: a number as Go's strconv writes it with the shortest digits that read back to the
  same float64 (an integral value as an integer); ``"Infinity"`` / ``"-Infinity"``; NaN as
  ``null``. VictoriaMetrics writes every NaN as ``null``; metricsd writes Prometheus' stale
  marker as ``null`` and any other NaN as ``"NaN"``, and reads them back so, so that an export
  imported into metricsd is bit-for-bit the same; VictoriaMetrics reads both as NaN.
- ``timestamps``: integer milliseconds, as many as values.

Pure: series in, bytes out; bytes in, columns out. Parse errors name the line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from metricsd.model import METRIC_NAME, STALE_NAN_BITS, Labels, stale_marker

__all__ = ["ImportError_", "Line", "format_line", "parse_line"]

_STALE = stale_marker()
_SPECIAL = {"infinity": math.inf, "inf": math.inf, "-infinity": -math.inf, "-inf": -math.inf,
            "nan": math.nan, "null": math.nan}


class ImportError_(ValueError):
    """A line that does not parse; the message names the line and the fault."""


@dataclass(frozen=True, slots=True)
class Line:
    labels: Labels
    timestamps: np.ndarray  # int64
    values: np.ndarray  # float64


def _numbers(values: np.ndarray) -> list[str]:
    """Each value as export.qtpl's convertValueToSpecialJSON writes it (see the module doc)."""
    out: list[str] = []
    finite = np.isfinite(values)
    integral = finite & (np.abs(values) < 2.0**63)
    integral[integral] = values[integral] == np.trunc(values[integral])
    as_int = np.where(integral, values, 0).astype(np.int64).tolist()
    bits = values.view(np.uint64).tolist()
    for v, whole, n, b in zip(values.tolist(), integral.tolist(), as_int, bits, strict=True):
        if whole:
            out.append(str(n) if n or b >> 63 == 0 else "-0.0")  # keeps the sign bit ("-0" reads as integer 0)
        elif v != v:
            out.append("null" if b == STALE_NAN_BITS else '"NaN"')
        elif v == math.inf:
            out.append('"Infinity"')
        elif v == -math.inf:
            out.append('"-Infinity"')
        else:
            r = repr(v)
            out.append(r if "e" not in r else np.format_float_positional(v, unique=True, trim="-"))
    return out


def format_line(labels: Labels, timestamps: np.ndarray, values: np.ndarray) -> bytes:
    """One series' samples as a JSON line (with its newline); empty bytes for no samples."""
    if not len(timestamps):
        return b""
    d = dict(labels)
    metric = {METRIC_NAME: d.pop(METRIC_NAME)} if METRIC_NAME in d else {}
    metric.update(d)
    head = json.dumps(metric, ensure_ascii=False, separators=(",", ":"))
    stamps = ",".join(map(str, timestamps.tolist()))
    return f'{{"metric":{head},"values":[{",".join(_numbers(values))}],"timestamps":[{stamps}]}}\n'.encode()


def _value(v: object, line: int, i: int) -> float:
    if isinstance(v, bool):
        raise ImportError_(f"line {line}: value {i + 1} is {v!r}, not a number")
    if isinstance(v, int | float):
        return float(v)
    if v is None:
        return _STALE
    if isinstance(v, str) and v.lower() in _SPECIAL:
        x = _SPECIAL[v.lower()]
        return x
    raise ImportError_(f"line {line}: value {i + 1} is {v!r}, not a number, null, \"Infinity\" or \"NaN\"")


def parse_line(text: str | bytes, line: int) -> Line | None:
    """A line of an import body (None for a blank line). Raises ImportError_."""
    if not text.strip():
        return None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ImportError_(f"line {line}: not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ImportError_(f"line {line}: expected an object with metric, values and timestamps")
    metric, values, stamps = doc.get("metric"), doc.get("values"), doc.get("timestamps")
    if not isinstance(metric, dict) or not metric:
        raise ImportError_(f"line {line}: missing `metric` object")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items()):
        raise ImportError_(f"line {line}: `metric` must map label names to string values")
    if not isinstance(values, list) or not values:
        raise ImportError_(f"line {line}: missing `values` array")
    if not isinstance(stamps, list) or not stamps:
        raise ImportError_(f"line {line}: missing `timestamps` array")
    if len(values) != len(stamps):
        raise ImportError_(f"line {line}: `timestamps` array size must match `values` array size; got "
                           f"{len(stamps)}; want {len(values)}")
    for i, t in enumerate(stamps):
        if isinstance(t, bool) or not isinstance(t, int) or not -(2**63) <= t < 2**63:
            raise ImportError_(f"line {line}: timestamp {i + 1} is {t!r}, not an integer of milliseconds")
    labels = tuple(sorted((k, v) for k, v in metric.items() if k and v))
    return Line(labels, np.array(stamps, dtype=np.int64),
                np.array([_value(v, line, i) for i, v in enumerate(values)], dtype=np.float64))


def lines_of(body: bytes) -> Iterable[tuple[int, bytes]]:
    """(1-based line number, line) of a body, ``\\r\\n`` or ``\\n``."""
    for i, raw in enumerate(body.split(b"\n")):
        yield i + 1, raw.rstrip(b"\r")
