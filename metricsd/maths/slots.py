"""Which slot a pod's series live in: a stable hash of the pod key, modulo the slot count.

The hash is fixed and documented because every proxy, store and tool must agree on it, in any
process and any Python version (Python's ``hash()`` is salted per process, so it cannot be used)::

    pod_hash(key) = int.from_bytes(blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")
    slot_of(key, S) = pod_hash(key) % S

where ``key`` is the pod key ``"namespace/pod"`` (:func:`metricsd.model.pod_key`). Hashing the pod
key rather than the series keeps all of a pod's series (CPU, memory, requests, limits) on the same
replicas, so a store can divide a pod's usage by its request without asking anyone else.

Changing S moves almost every pod to another slot; S is fixed when a cluster is created.

Example::

    >>> slot_of("default/web-0", 64)
    28
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from metricsd.model import Labels, pod_key

__all__ = ["DEFAULT_SLOTS", "SlotFilter", "pod_hash", "pod_hashes", "slot_of", "slot_of_labels", "slots_of"]

DEFAULT_SLOTS = 64


@dataclass(frozen=True)
class SlotFilter:
    """Only series whose slot (pod hash mod slot_count) is in ``slots``; slot_count 0: all."""

    slot_count: int
    slots: tuple[int, ...]


def pod_hash(key: str) -> int:
    """The unsigned 64-bit hash of a pod key (BLAKE2b-64, little-endian). O(len(key))."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")


def slot_of(key: str, slots: int = DEFAULT_SLOTS) -> int:
    """The slot of pod key ``"namespace/pod"``. Raises ValueError when ``slots`` < 1."""
    if slots < 1:
        raise ValueError(f"the slot count must be at least 1, got {slots}")
    return pod_hash(key) % slots


def slot_of_labels(labels: Labels | Mapping[str, str], slots: int = DEFAULT_SLOTS) -> int:
    """The slot of the pod a series belongs to."""
    return slot_of(pod_key(labels), slots)


def pod_hashes(keys: Iterable[str]) -> npt.NDArray[np.uint64]:
    """:func:`pod_hash` of many keys as one uint64 array.

    The digests are concatenated and reinterpreted in one step instead of building a Python int
    per key; the modulo and any grouping by slot then stay in NumPy.
    """
    digests = b"".join(hashlib.blake2b(k.encode("utf-8"), digest_size=8).digest() for k in keys)
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64, copy=False)


def slots_of(keys: Iterable[str], slots: int = DEFAULT_SLOTS) -> npt.NDArray[np.int64]:
    """:func:`slot_of` of many keys, as an int64 array in the keys' order."""
    if slots < 1:
        raise ValueError(f"the slot count must be at least 1, got {slots}")
    return (pod_hashes(keys) % np.uint64(slots)).astype(np.int64)
