"""The per-sample hash of anti-entropy digests, shared by the store and the digests.

The store keeps, per sealed chunk, the sum of its samples' hashes (metricsd/store/chunks.py), so
a digest adds cached sums instead of decoding chunks; metricsd/replica/digest.py states and pins
the definitions. They live here, below both, so the store does not import the replica package.
Changing them makes every replica of a mixed-version cluster disagree with the others.

Pure: arrays in, arrays out.
"""

from __future__ import annotations

import numpy as np

__all__ = ["C1", "C2", "hash_sum", "mix64", "sample_hashes"]

C1 = np.uint64(0x9E3779B97F4A7C15)
C2 = np.uint64(0xD6E8FEB86659FD93)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on a uint64 array (a new array)."""
    x = np.asarray(x, dtype=np.uint64)
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


def sample_hashes(timestamps: np.ndarray, values: np.ndarray) -> np.ndarray:
    """One uint64 per sample over (timestamp, value bits); any shape, element-wise."""
    t = np.ascontiguousarray(timestamps, dtype=np.int64).view(np.uint64)
    v = np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)
    return mix64(mix64(t ^ C1) ^ v)


def hash_sum(timestamps: np.ndarray, values: np.ndarray) -> int:
    """The sum modulo 2^64 of the samples' hashes (0 for no samples)."""
    return int(sample_hashes(timestamps, values).sum(dtype=np.uint64))
