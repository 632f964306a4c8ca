"""Binary operators: arithmetic and comparisons between scalars and vectors, vector matching
(``on``/``ignoring``, ``group_left``/``group_right``), and the set operators and/or/unless.

Matching is decided once from label signatures; whether a pair exists at a step, and whether
matching is ambiguous there, is decided per step, as Prometheus evaluates each step on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from metricsd.model import METRIC_NAME, Labels
from metricsd.promql.values import NAME_LABELS, PromQLError, StepSeries, format_labels

__all__ = ["Matching", "scalar_binop", "set_binop", "vector_binop", "vector_scalar_binop"]

COMPARISONS = ("==", "!=", ">", "<", ">=", "<=")


@dataclass(frozen=True)
class Matching:
    card: str  # "one-to-one" | "many-to-one" | "one-to-many" | "many-to-many"
    on: bool
    labels: tuple[str, ...]
    include: tuple[str, ...]
    return_bool: bool


def arith(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Apply ``op`` elementwise; comparisons return 1.0/0.0. Go's float rules (x % 0 is NaN)."""
    with np.errstate(all="ignore"):
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op == "/":
            return a / b
        if op == "%":
            return np.fmod(a, b)
        if op == "^":
            return np.power(a, b)
        if op == "atan2":
            return np.arctan2(a, b)
        res = {
            "==": a == b,
            "!=": a != b,
            ">": a > b,
            "<": a < b,
            ">=": a >= b,
            "<=": a <= b,
        }[op]
        return res.astype(np.float64)


def scalar_binop(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return arith(op, a, b)


def vector_scalar_binop(
    op: str, vec: list[StepSeries], scalar: np.ndarray, scalar_left: bool, return_bool: bool
) -> list[StepSeries]:
    out = []
    for s in vec:
        lhs, rhs = (scalar, s.values) if scalar_left else (s.values, scalar)
        res = arith(op, lhs, rhs)
        if op in COMPARISONS:
            if return_bool:
                out.append(StepSeries(s.labels, res, s.present, drop_name=True))
                continue
            keep = s.present & (res == 1.0)
            if keep.any():
                out.append(StepSeries(s.labels, s.values, keep, drop_name=s.drop_name))
            continue
        out.append(StepSeries(s.labels, res, s.present, drop_name=True))
    return out


def signature(labels: Labels, on: bool, names: Sequence[str]) -> Labels:
    if on:
        keep = set(names)
        return tuple(kv for kv in labels if kv[0] in keep)
    drop = set(names) | {METRIC_NAME}
    return tuple(kv for kv in labels if kv[0] not in drop)


def _result_labels(many: Labels, one: Labels, op: str, m: Matching) -> Labels:
    d = dict(many)
    if m.card == "one-to-one":
        if m.on:
            d = {k: v for k, v in d.items() if k in m.labels or (k == METRIC_NAME and k in m.labels)}
        else:
            for k in m.labels:
                d.pop(k, None)
    if m.include:
        od = dict(one)
        for k in m.include:
            if od.get(k, ""):
                d[k] = od[k]
            else:
                d.pop(k, None)
    return tuple(sorted(d.items()))


def _any_present(vec: list[StepSeries], n: int) -> np.ndarray:
    out = np.zeros(n, dtype=bool)
    for s in vec:
        out |= s.present
    return out


def vector_binop(op: str, lhs: list[StepSeries], rhs: list[StepSeries], m: Matching, n: int) -> list[StepSeries]:
    swapped = m.card == "one-to-many"
    many, one = (rhs, lhs) if swapped else (lhs, rhs)
    active = _any_present(lhs, n) & _any_present(rhs, n)  # Prometheus skips steps with an empty side
    one_by_sig: dict[Labels, list[StepSeries]] = {}
    for s in one:
        one_by_sig.setdefault(signature(s.labels, m.on, m.labels), []).append(s)
    for sig, ones in one_by_sig.items():
        if len(ones) < 2:
            continue
        cnt = sum(s.present.astype(np.int64) for s in ones) * active
        if (cnt > 1).any():
            i = int(np.argmax(cnt > 1))
            a, b = sorted([s.labels for s in ones if s.present[i]])[:2]
            side = "left" if swapped else "right"
            raise PromQLError(
                "execution",
                f"found duplicate series for the match group {format_labels(sig)} on the {side} hand-side "
                f"of the operation: [{format_labels(a)}, {format_labels(b)}];many-to-many matching not "
                "allowed: matching labels must be unique on one side",
            )
    is_cmp = op in COMPARISONS
    drops = op not in COMPARISONS or m.return_bool
    out: list[StepSeries] = []
    matched_many: dict[Labels, np.ndarray] = {}
    inserted: dict[tuple[Labels, Labels], np.ndarray] = {}
    for s in many:
        sig = signature(s.labels, m.on, m.labels)
        group = one_by_sig.get(sig)
        if not group:
            continue
        for o in group:
            both = s.present & o.present & active
            if not both.any():
                continue
            if m.card == "one-to-one":
                seen = matched_many.setdefault(sig, np.zeros(n, dtype=bool))
                if (seen & both).any():
                    raise PromQLError(
                        "execution",
                        "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)",
                    )
                seen |= both
            fl, fr = (o.values, s.values) if swapped else (s.values, o.values)
            res = arith(op, fl, fr)
            if is_cmp and not m.return_bool:
                keep = both & (res == 1.0)
                res = fl
            else:
                keep = both
            labels = _result_labels(s.labels, o.labels, op, m)
            if m.card != "one-to-one":
                ins = inserted.setdefault((sig, labels), np.zeros(n, dtype=bool))
                if (ins & keep).any():
                    raise PromQLError(
                        "execution", "multiple matches for labels: grouping labels must ensure unique matches"
                    )
                ins |= keep
            if keep.any():
                out.append(StepSeries(labels, res, keep, drop_name=drops or s.drop_name))
    return _merge_same_labels(out, n)


def _merge_same_labels(vec: list[StepSeries], n: int) -> list[StepSeries]:
    """Series of one output label set that come from different pairs at different steps are one."""
    merged: dict[tuple[Labels, bool], StepSeries] = {}
    for s in vec:
        key = (s.labels, s.drop_name)
        cur = merged.get(key)
        if cur is None:
            merged[key] = StepSeries(s.labels, s.values.copy(), s.present.copy(), s.drop_name)
            continue
        if (cur.present & s.present).any():
            raise PromQLError("execution", "vector cannot contain metrics with the same labelset")
        cur.values = np.where(s.present, s.values, cur.values)
        cur.present |= s.present
    return list(merged.values())


def set_binop(op: str, lhs: list[StepSeries], rhs: list[StepSeries], m: Matching, n: int) -> list[StepSeries]:
    def sigs(vec: list[StepSeries]) -> dict[Labels, np.ndarray]:
        d: dict[Labels, np.ndarray] = {}
        for s in vec:
            sig = signature(s.labels, m.on, m.labels)
            d[sig] = d.get(sig, np.zeros(n, dtype=bool)) | s.present
        return d

    out: list[StepSeries] = []
    if op == "and":
        rs = sigs(rhs)
        for s in lhs:
            keep = s.present & rs.get(signature(s.labels, m.on, m.labels), np.zeros(n, dtype=bool))
            if keep.any():
                out.append(StepSeries(s.labels, s.values, keep, s.drop_name))
    elif op == "unless":
        rs = sigs(rhs)
        for s in lhs:
            keep = s.present & ~rs.get(signature(s.labels, m.on, m.labels), np.zeros(n, dtype=bool))
            if keep.any():
                out.append(StepSeries(s.labels, s.values, keep, s.drop_name))
    else:  # or
        ls = sigs(lhs)
        out.extend(lhs)
        for s in rhs:
            keep = s.present & ~ls.get(signature(s.labels, m.on, m.labels), np.zeros(n, dtype=bool))
            if keep.any():
                out.append(StepSeries(s.labels, s.values, keep, s.drop_name))
    return out


def name_dropped(labels: Labels) -> Labels:
    return tuple(kv for kv in labels if kv[0] not in NAME_LABELS)
