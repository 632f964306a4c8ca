"""The head's ring values as 4-byte decimal offsets where that is exact (pure functions, no state).

A pod metric's value is almost always a decimal of few digits (bytes, millicores, a counter of
seconds with microseconds): ``m / 10**k`` for an integer ``m``. Over the 32 samples a ring holds,
the ``m`` of one series stay close together, so the ring stores ``m - ref`` as an int32 with a
per-row ``scale`` k and ``ref`` (int64) instead of the float64: 4 bytes a slot instead of 8. A
row whose values are not all such decimals within 2^31 of a common ``ref`` (NaN, a stale
marker, -0.0, an arbitrary float) keeps float64 values (the head's wide rows).

Exact by construction: a value is stored narrow only when :func:`decode` of what is stored gives
back its very bits, and :func:`decode` is the one expression every reader evaluates. It is exact
arithmetic with one rounding: ``ref + mant`` is an integer below 2^53 (so its float64 is exact)
and IEEE division by the exact float64 ``10**k`` (k <= 22) rounds once, the same way every time.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MAX_SCALE", "POW10", "choose", "decode", "encode"]

MAX_SCALE = 12  # decimals tried for a row (the codec's decimal chunks allow as many)
POW10 = 10.0 ** np.arange(MAX_SCALE + 1)
_REF_MAX = 2.0**52  # |ref| below this keeps ref + mant an exact float64


def decode(mant: np.ndarray, unit: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """The float64 values of stored offsets ``mant`` (int32) with their rows' ``unit`` (10**scale)
    and ``ref`` (an integer below 2^52 as a float64), broadcast together: ``mant + ref`` is an
    integer below 2^53, so exact, and the division rounds once."""
    out = mant.astype(np.float64)  # then in place: cheaper than int32 + float64 in one step
    out += ref
    out /= unit
    return out


def encode(v: np.ndarray, unit: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ok, int32 offsets): where ``ok``, the offset whose :func:`decode` with ``unit`` and ``ref``
    is ``v`` bit for bit; elsewhere ``v`` needs another encoding (the offset is then anything).

    The check is decode itself on the int32 that would be stored, so it holds whatever the
    rounding or the cast did: an offset out of int32's range, a NaN or an infinity casts to
    something that does not decode to ``v``; a -0.0 comes back as 0.0 and is not ok. ``unit``
    must be a power of ten: with a NaN one, a NaN ``v`` can decode to its own bits."""
    v = np.asarray(v, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        m = v * unit
        np.rint(m, out=m)
        m -= ref
        mant = m.astype(np.int32)
    ok = decode(mant, unit, ref).view(np.uint64) == v.view(np.uint64)
    return ok, mant


def choose(v: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of the k x n values ``v``, the smallest scale at which every value where ``mask``
    is stored exactly: (unit 10**scale, NaN where none; ref; k x n int32 offsets, 0 outside the
    mask and in rows without a unit). ``ref`` centres the row's integers so that the values that
    follow can drift 2^31 - span/2 either way before the row is encoded again."""
    k, _ = v.shape
    unit = np.full(k, np.nan)
    ref = np.zeros(k)
    mant = np.zeros(v.shape, np.int32)
    vals = np.where(mask, v, 0.0)  # slots outside the mask hold anything: 0.0 fits every scale
    todo = np.arange(k)
    for p in POW10.tolist():
        if len(todo) == 0:
            break
        x = vals[todo]
        with np.errstate(invalid="ignore", over="ignore"):
            m = np.rint(x * p)
            lo = np.where(mask[todo], m, np.inf).min(axis=1)
            hi = np.where(mask[todo], m, -np.inf).max(axis=1)
            # nothing to store, or a NaN or infinity (not a decimal: caught by encode below)
            centre = np.floor((lo + hi) / 2)
            centre = np.where(np.isfinite(centre) & (np.abs(centre) < _REF_MAX), centre, 0.0) + 0.0  # no -0.0
        ok, d = encode(x, np.full((len(todo), 1), p), centre[:, None])
        good = (ok | ~mask[todo]).all(axis=1)
        hit = todo[good]
        unit[hit] = p
        ref[hit] = centre[good]
        mant[hit] = np.where(mask[hit], d[good], 0)
        todo = todo[~good]
    return unit, ref, mant
