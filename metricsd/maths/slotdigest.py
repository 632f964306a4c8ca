"""Per-slot digests of a query's series: how a proxy learns, cheaply, that the replicas it read agree.

A proxy reading a slot at R replicas used to take every replica's per-series values and keep, per
series, the one with more samples: R times the values on the wire and a per-series merge in the
proxy on every query. Instead one replica per slot answers with data (group partials) and every
replica asked also sends, per slot, a digest of what it holds of the query's series; when all
digests of a slot agree, the data replica's partials stand for the slot. When they differ, the
proxy asks again the old way (per series, keeping the more complete replica, repairing the other).

Per series the digest covers its id, which side of the query it is on, the number of samples in
the query's span (``lo``, ``hi``] (the first evaluation time's window start to the last
evaluation time) and its newest timestamp at or before ``hi``. Two replicas holding the same
samples in the span give equal digests. A replica that lacks a sample in the span, or a series, or
holds one more, gives another count or hash (the hash is a sum of 64-bit mixes, so two differences
cancel with probability about 2^-64). Not covered: a sample with the same timestamp but another
value on two replicas; stores keep the first write of a timestamp, and the per-series merge could
not tell which is right either.

Pure: arrays in, arrays out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SlotDigestArrays", "differing", "series_hashes", "slot_digests"]

_K1 = np.uint64(0x9E3779B97F4A7C15)
_K2 = np.uint64(0xC2B2AE3D27D4EB4F)
_K3 = np.uint64(0x165667B19E3779F9)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@dataclass(frozen=True)
class SlotDigestArrays:
    """Parallel arrays, one entry per slot with at least one matched series, slots ascending."""

    slots: np.ndarray  # uint32
    series: np.ndarray  # uint64
    samples: np.ndarray  # uint64
    hash: np.ndarray  # uint64

    def as_dict(self) -> dict[int, tuple[int, int, int]]:
        return {int(s): (int(n), int(c), int(h))
                for s, n, c, h in zip(self.slots, self.series, self.samples, self.hash, strict=True)}


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise (uint64 arithmetic wraps, as intended)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def series_hashes(ids: np.ndarray, side: int, counts: np.ndarray, newest: np.ndarray) -> np.ndarray:
    """One 64-bit hash per series of (id, side, samples in the span, newest timestamp in it;
    any negative newest for none)."""
    with np.errstate(over="ignore"):
        x = (np.asarray(ids, dtype=np.uint64) * _K1
             + np.asarray(counts, dtype=np.int64).astype(np.uint64) * _K2
             + np.asarray(newest, dtype=np.int64).astype(np.uint64) * _K3
             + np.uint64(side + 1))
        return _mix(_mix(x))


def slot_digests(slots: np.ndarray, counts: np.ndarray, hashes: np.ndarray) -> SlotDigestArrays:
    """Fold per-series (slot, samples, hash) into per-slot (series, samples, sum of hashes mod 2^64)."""
    slots = np.asarray(slots, dtype=np.int64)
    if len(slots) == 0:
        z = np.zeros(0, dtype=np.uint64)
        return SlotDigestArrays(np.zeros(0, dtype=np.uint32), z, z.copy(), z.copy())
    uniq, inverse = np.unique(slots, return_inverse=True)
    series = np.bincount(inverse, minlength=len(uniq)).astype(np.uint64)
    samples = np.zeros(len(uniq), dtype=np.uint64)
    np.add.at(samples, inverse, np.asarray(counts, dtype=np.uint64))
    h = np.zeros(len(uniq), dtype=np.uint64)
    with np.errstate(over="ignore"):
        np.add.at(h, inverse, np.asarray(hashes, dtype=np.uint64))
    return SlotDigestArrays(uniq.astype(np.uint32), series, samples, h)


def differing(digests: list[dict[int, tuple[int, int, int]]], slots: list[int]) -> list[int]:
    """The slots (of ``slots``) on which the given replicas' digests differ; a slot a digest lacks
    counts as holding nothing there."""
    none = (0, 0, 0)
    return [s for s in slots if len({d.get(s, none) for d in digests}) > 1]
