"""The data model: what a series is, and the validation every write path shares.

A series is a metric name plus labels. The name travels as the label ``__name__`` (as in
Prometheus), so a series *is* its label set. ``namespace`` and ``pod`` are required because the
store's index is keyed by the pod key ``namespace/pod``; a prefix scan of that key lists a
namespace. Labels are kept as a tuple of ``(name, value)`` pairs sorted by name: hashable,
comparable, cheap to build once per series and never per sample.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "METRIC_NAME",
    "OPTIONAL_LABELS",
    "REQUIRED_LABELS",
    "STALE_NAN_BITS",
    "InvalidSeries",
    "Labels",
    "Limits",
    "is_stale",
    "labels_dict",
    "make_labels",
    "metric_name",
    "pod_key",
    "series_id",
    "stale_marker",
    "validate_labels",
    "validate_samples",
]

Labels = tuple[tuple[str, str], ...]

METRIC_NAME = "__name__"
REQUIRED_LABELS = ("namespace", "pod")
OPTIONAL_LABELS = ("container", "node", "workload", "cluster")

# Prometheus' stale marker: a signalling NaN with this exact bit pattern ends a series.
STALE_NAN_BITS = 0x7FF0000000000002

_LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_METRIC_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


class InvalidSeries(ValueError):
    """A series or sample that fails validation; the message names the series and the fault, and
    ``reason`` the counter it is counted under (``invalid``, or the label limit it broke)."""

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Limits:
    """Validation limits. Defaults are generous for pod metrics and block abuse.

    Lengths are UTF-8 bytes, what a series costs in memory. Kubernetes caps label values at 63
    characters and object names (pods, namespaces) at 253; the longest values pod metrics carry
    are image references with a digest (about 100 - 300 bytes). A 1 KiB value and a 256-byte name
    take all of them with room to spare, and bound a series' labels to about 42 KiB
    (32 x (256 + 1024) bytes) however a sender misbehaves.

    Timestamps may be as old as the Unix epoch (PromQL test data lives in 1970) and up to
    ``max_timestamp_ms`` (year 2200): anything else is a unit mistake (seconds or nanoseconds).
    """

    max_labels: int = 32
    max_name_length: int = 256
    max_value_length: int = 1024
    min_timestamp_ms: int = -(2**62)
    max_timestamp_ms: int = 7_258_118_400_000  # 2200-01-01T00:00:00Z


DEFAULT_LIMITS = Limits()


def make_labels(name: str | None = None, labels: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> Labels:
    """Build the canonical sorted label tuple; ``name`` becomes ``__name__``. No validation."""
    items = dict(labels.items() if isinstance(labels, Mapping) else labels)
    if name is not None:
        items[METRIC_NAME] = name
    return tuple(sorted(items.items()))


def labels_dict(labels: Labels) -> dict[str, str]:
    return dict(labels)


def metric_name(labels: Labels) -> str:
    for k, v in labels:
        if k == METRIC_NAME:
            return v
    return ""


def pod_key(labels: Labels | Mapping[str, str]) -> str:
    """The index key ``namespace/pod``; sorts by namespace first, so a prefix lists a namespace."""
    d = labels if isinstance(labels, Mapping) else dict(labels)
    return f"{d.get('namespace', '')}/{d.get('pod', '')}"


def describe(labels: Labels) -> str:
    """A series in PromQL notation, for error messages and logs."""
    name = metric_name(labels)
    inner = ",".join(f'{k}="{v}"' for k, v in labels if k != METRIC_NAME)
    return f"{name}{{{inner}}}"


def series_id(labels: Labels) -> int:
    """A stable 64-bit id of a label set: the first 8 bytes of BLAKE2b over the canonical form.

    Agents send a series' labels once and then refer to it by this id; it is content-derived, so
    every store and proxy computes the same id and a restart forgets nothing that matters.
    Python's ``hash()`` is salted per process and so unusable here.
    """
    data = "\xff".join(f"{k}\xfe{v}" for k, v in labels).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _utf8_len(s: str) -> int:
    """Bytes of ``s`` in UTF-8, encoding only when it is not ASCII."""
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))


def _short(labels: Labels, limit: int = 200) -> str:
    """describe(), cut to ``limit`` characters: an error about an oversized series stays readable."""
    text = describe(labels)
    return text if len(text) <= limit else text[:limit] + "...}"


def validate_labels(labels: Labels, limits: Limits = DEFAULT_LIMITS, *, require_pod: bool = True) -> None:
    """Raise InvalidSeries naming the series and what is wrong with it."""
    names = [k for k, _ in labels]
    if len(set(names)) != len(names):
        raise InvalidSeries(f"series {describe(labels)}: duplicate label name")
    if list(labels) != sorted(labels):
        raise InvalidSeries(f"series {describe(labels)}: labels not in canonical (sorted) order")
    if len(labels) > limits.max_labels + 1:  # +1 for __name__
        raise InvalidSeries(
            f"series {_short(labels)}: {len(labels) - 1} labels, more than the limit of {limits.max_labels} "
            "labels per series", "labels_per_series")
    d = dict(labels)
    name = d.get(METRIC_NAME, "")
    if not name:
        raise InvalidSeries(f"series {describe(labels)}: empty metric name")
    if _utf8_len(name) > limits.max_name_length:
        raise InvalidSeries(
            f"series {_short(labels)}: metric name is {_utf8_len(name)} bytes, more than the limit of "
            f"{limits.max_name_length} bytes", "label_name_length")
    if not _METRIC_NAME_RE.match(name):
        raise InvalidSeries(f"series {_short(labels)}: metric name {name!r} is not [a-zA-Z_:][a-zA-Z0-9_:]*")
    for k, v in labels:
        if k == METRIC_NAME:
            continue
        if _utf8_len(k) > limits.max_name_length:
            raise InvalidSeries(
                f"series {_short(labels)}: label name {k[:40]!r}... is {_utf8_len(k)} bytes, more than the limit of "
                f"{limits.max_name_length} bytes", "label_name_length")
        if not k or not _LABEL_NAME_RE.match(k):
            raise InvalidSeries(f"series {_short(labels)}: label name {k!r} is not [a-zA-Z_][a-zA-Z0-9_]*")
        if k.startswith("__"):
            raise InvalidSeries(f"series {_short(labels)}: label name {k!r} is reserved (starts with __)")
        if _utf8_len(v) > limits.max_value_length:
            raise InvalidSeries(
                f"series {_short(labels)}: value of label {k} is {_utf8_len(v)} bytes, more than the limit of "
                f"{limits.max_value_length} bytes", "label_value_length")
    if require_pod:
        for req in REQUIRED_LABELS:
            if not d.get(req):
                raise InvalidSeries(f"series {describe(labels)}: required label {req!r} is missing or empty")


def validate_samples(labels: Labels, timestamps: object, limits: Limits = DEFAULT_LIMITS) -> None:
    """Check a series' timestamps (a NumPy int64 array): in range and strictly increasing."""
    import numpy as np

    ts = np.asarray(timestamps)
    if ts.size == 0:
        return
    lo, hi = int(ts.min()), int(ts.max())
    if lo < limits.min_timestamp_ms or hi > limits.max_timestamp_ms:
        bad = lo if lo < limits.min_timestamp_ms else hi
        raise InvalidSeries(
            f"series {describe(labels)}: timestamp {bad} ms out of range "
            f"[{limits.min_timestamp_ms}, {limits.max_timestamp_ms}] (milliseconds since the epoch?)"
        )
    if ts.size > 1 and not bool(np.all(np.diff(ts) > 0)):
        raise InvalidSeries(f"series {describe(labels)}: timestamps within one write must strictly increase")


def stale_marker() -> float:
    import struct

    return float(struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0])


def is_stale(value: float) -> bool:
    import struct

    return math.isnan(value) and struct.unpack("<Q", struct.pack("<d", value))[0] == STALE_NAN_BITS
