"""Digests of a store's samples, for anti-entropy between replicas of a slot (rpc Digest).

Replicas compare per-slot digests first, then per-series digests of the slots that differ, then
copy only the time buckets that differ (rpc CatchUp). Every combination is a sum modulo 2^64, so
a digest does not depend on the order samples arrived in, on how they are split into chunks, or
on which replica computed it; only on the samples themselves.

The hashes (pinned by tests/store/test_store_digest.py; change them and every replica of a
mixed-version cluster disagrees with the others until all are upgraded):

- ``mix64`` is the splitmix64 finaliser (Steele, Lea, Flood 2014), on uint64 with wraparound.
- sample hash:  ``mix64(mix64(t XOR C1) XOR bits(v))`` with ``t`` the int64 timestamp as uint64
  and ``bits(v)`` the IEEE 754 bits of the value (so NaN payloads and the stale marker count).
- bucket hash:  the sum of the sample hashes of a series in ``[start + k*bucket, start + (k+1)*bucket)``.
- series hash:  the sum of its bucket hashes (the sum of all its sample hashes in range).
- slot hash:    the sum, over series with at least one sample in range, of
  ``mix64(series hash + mix64(id XOR C2))``; a series' id is in it, so two series with equal
  samples do not cancel out, and its sample count travels next to it.

``C1 = 0x9E3779B97F4A7C15``, ``C2 = 0xD6E8FEB86659FD93``. No I/O; :func:`store_digest` reads an
in-memory :class:`~metricsd.store.engine.Store`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from metricsd.maths.slots import SlotFilter
from metricsd.proto import metricsd_pb2 as pb
from metricsd.store.engine import Store

__all__ = ["SeriesDigests", "SlotDigests", "SlotSamples", "bucket_count", "combine_slots", "digest_request",
           "digest_response", "digest_series", "mix64", "repair_ranges", "sample_hashes", "store_digest",
           "store_samples"]

C1 = np.uint64(0x9E3779B97F4A7C15)
C2 = np.uint64(0xD6E8FEB86659FD93)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)

MAX_BUCKETS = 100_000


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on a uint64 array (a new array)."""
    x = np.asarray(x, dtype=np.uint64)
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


def sample_hashes(timestamps: np.ndarray, values: np.ndarray) -> np.ndarray:
    """One uint64 per sample over (timestamp, value bits)."""
    t = np.ascontiguousarray(timestamps, dtype=np.int64).view(np.uint64)
    v = np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)
    return mix64(mix64(t ^ C1) ^ v)


def bucket_count(start_ms: int, end_ms: int, bucket_ms: int) -> int:
    """Buckets covering [start_ms, end_ms] (both inclusive); 1 when bucket_ms <= 0."""
    if bucket_ms <= 0 or end_ms < start_ms:
        return 1
    return (end_ms - start_ms) // bucket_ms + 1


@dataclass(frozen=True)
class SeriesDigests:
    """Per series with samples in range: id, sample count, hash, and (optionally) a row of bucket hashes."""

    ids: np.ndarray  # uint64
    samples: np.ndarray  # int64
    hashes: np.ndarray  # uint64
    buckets: np.ndarray | None  # uint64, len(ids) x bucket_count


def digest_series(ids: np.ndarray, counts: np.ndarray, timestamps: np.ndarray, values: np.ndarray, start_ms: int,
                  end_ms: int, bucket_ms: int, with_buckets: bool) -> SeriesDigests:
    """Digests of columnar samples (as in a WriteRequest: ``counts[i]`` samples of ``ids[i]``, series
    after series, each in time order, all within [start_ms, end_ms]). Series without samples are left out.

    O(samples). Raises ValueError when more than MAX_BUCKETS buckets are asked for.
    """
    ids = np.asarray(ids, dtype=np.uint64)
    counts = np.asarray(counts, dtype=np.int64)
    keep = counts > 0
    ids, counts = ids[keep], counts[keep]
    n_buckets = bucket_count(start_ms, end_ms, bucket_ms)
    if with_buckets and n_buckets > MAX_BUCKETS:
        raise ValueError(f"{n_buckets} buckets of {bucket_ms} ms exceed {MAX_BUCKETS}")
    if len(ids) == 0:
        empty = np.zeros(0, dtype=np.uint64)
        return SeriesDigests(empty, np.zeros(0, dtype=np.int64), empty,
                             np.zeros((0, n_buckets), dtype=np.uint64) if with_buckets else None)
    ts = np.asarray(timestamps, dtype=np.int64)
    h = sample_hashes(ts, values)
    starts = np.cumsum(counts) - counts
    hashes = np.add.reduceat(h, starts).astype(np.uint64)
    buckets: np.ndarray | None = None
    if with_buckets:
        series_index = np.repeat(np.arange(len(ids), dtype=np.int64), counts)
        b = (ts - start_ms) // bucket_ms if bucket_ms > 0 else np.zeros(len(ts), dtype=np.int64)
        key = series_index * n_buckets + b  # non-decreasing: series after series, each in time order
        first = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
        flat = np.zeros(len(ids) * n_buckets, dtype=np.uint64)
        flat[key[first]] = np.add.reduceat(h, first)
        buckets = flat.reshape(len(ids), n_buckets)
    return SeriesDigests(ids, counts, hashes, buckets)


@dataclass(frozen=True)
class SlotDigests:
    slots: np.ndarray  # int64, the slots asked for, ascending
    series: np.ndarray  # int64
    samples: np.ndarray  # int64
    hashes: np.ndarray  # uint64


def combine_slots(slots: np.ndarray, series_slots: np.ndarray, d: SeriesDigests) -> SlotDigests:
    """Per slot of ``slots``: series count, sample count and the order-independent slot hash.
    ``series_slots[i]`` is the slot of ``d.ids[i]``."""
    slots = np.unique(np.asarray(slots, dtype=np.int64))
    pos = np.searchsorted(slots, series_slots)
    if len(series_slots) and not bool((slots[np.minimum(pos, len(slots) - 1)] == series_slots).all()):
        raise ValueError("a series' slot is not among the slots")
    contrib = mix64(d.hashes + mix64(d.ids ^ C2))
    hashes = np.zeros(len(slots), dtype=np.uint64)
    np.add.at(hashes, pos, contrib)
    series = np.bincount(pos, minlength=len(slots)).astype(np.int64)
    samples = np.zeros(len(slots), dtype=np.int64)
    np.add.at(samples, pos, d.samples)
    return SlotDigests(slots, series, samples, hashes)


def repair_ranges(local: SeriesDigests, remote: SeriesDigests, start_ms: int, end_ms: int, bucket_ms: int
                  ) -> list[tuple[int, int]]:
    """The time ranges (inclusive, merged where adjacent) of the buckets in which the remote side
    holds samples that the local side's digests do not match: what to copy from the remote.

    Buckets the remote holds nothing in are skipped (there is nothing to copy from it); the local
    side's extra samples are the remote's to fetch when it runs the same comparison.
    """
    if remote.buckets is None or local.buckets is None:
        raise ValueError("repair_ranges needs per-bucket digests on both sides")
    n_buckets = remote.buckets.shape[1]
    local_rows = np.full(len(remote.ids), -1, dtype=np.int64)
    if len(local.ids):
        order = np.argsort(local.ids)
        pos = np.minimum(np.searchsorted(local.ids[order], remote.ids), len(order) - 1)
        found = local.ids[order][pos] == remote.ids
        local_rows[found] = order[pos][found]
    mine = np.zeros_like(remote.buckets)
    have = local_rows >= 0
    if local.buckets.shape[1] != n_buckets:
        raise ValueError("the two sides used different buckets")
    mine[have] = local.buckets[local_rows[have]]
    differ = ((mine != remote.buckets) & (remote.buckets != 0)).any(axis=0)
    out: list[tuple[int, int]] = []
    for k in np.flatnonzero(differ).tolist():
        lo = start_ms + k * bucket_ms if bucket_ms > 0 else start_ms
        hi = min(end_ms, lo + bucket_ms - 1) if bucket_ms > 0 else end_ms
        if out and out[-1][1] + 1 == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


# --- reading a store ---------------------------------------------------------------------------


def store_samples(store: Store, slot_count: int, slots: list[int], start_ms: int, end_ms: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ids, counts, timestamps, values, slot per series) of the store's series in ``slots``, in
    [start_ms, end_ms]; series without samples there are left out. One read per series."""
    samples = SlotSamples(store, slot_count, slots, start_ms, end_ms)
    samples.read(len(samples.rows))
    return samples.arrays()


class SlotSamples:
    """The samples of a slot set read a slice of series at a time (``read``), so an async caller
    can let other requests run between slices: a digest of a day of data decodes every chunk of
    its series, seconds of work on a large store (metricsd/replica/digestloop.py)."""

    def __init__(self, store: Store, slot_count: int, slots: list[int], start_ms: int, end_ms: int) -> None:
        self.store, self.slot_count, self.start_ms, self.end_ms = store, slot_count, start_ms, end_ms
        self.rows = store.select([], SlotFilter(slot_count, tuple(slots)) if slot_count else None).tolist()
        self.next = 0
        self._ids: list[int] = []
        self._counts: list[int] = []
        self._ts: list[np.ndarray] = []
        self._vals: list[np.ndarray] = []
        self._rows: list[int] = []

    @property
    def done(self) -> bool:
        return self.next >= len(self.rows)

    def read(self, n: int) -> None:
        """Read the next ``n`` series. A row's id and samples are read together, so a series
        dropped or added meanwhile is seen whole or not at all."""
        store = self.store
        for row in self.rows[self.next : self.next + n]:
            t, v = store.series_samples(row, self.start_ms, self.end_ms)
            if len(t) == 0:
                continue
            self._ids.append(store.index.ids[row])
            self._counts.append(len(t))
            self._ts.append(t)
            self._vals.append(v)
            self._rows.append(row)
        self.next += n

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        row_arr = np.array(self._rows, dtype=np.int64)
        series_slots = ((self.store.index.pod_hash[row_arr] % np.uint64(self.slot_count)).astype(np.int64)
                        if self.slot_count else np.zeros(len(row_arr), dtype=np.int64))
        return (np.array(self._ids, dtype=np.uint64), np.array(self._counts, dtype=np.int64),
                np.concatenate(self._ts) if self._ts else np.zeros(0, dtype=np.int64),
                np.concatenate(self._vals) if self._vals else np.zeros(0, dtype=np.float64), series_slots)


def digest_request(request: pb.DigestRequest) -> tuple[int, list[int]]:
    """(slot count, slots) of a DigestRequest. Raises ValueError for a bad slot filter or range."""
    f = request.slots
    if f.slot_count == 0:
        slot_count, slots = 0, [0]
    else:
        slots = sorted(set(f.slots))
        if any(s >= f.slot_count for s in slots):
            raise ValueError(f"slot out of range 0..{f.slot_count - 1}")
        slot_count = f.slot_count
    if request.end_ms < request.start_ms:
        raise ValueError(f"end_ms {request.end_ms} is before start_ms {request.start_ms}")
    return slot_count, slots


def digest_response(request: pb.DigestRequest, slots: list[int], samples: SlotSamples) -> pb.DigestResponse:
    ids, counts, ts, vals, series_slots = samples.arrays()
    d = digest_series(ids, counts, ts, vals, request.start_ms, request.end_ms, request.bucket_ms, request.per_series)
    per_slot = combine_slots(np.array(slots, dtype=np.int64), series_slots, d)
    resp = pb.DigestResponse()
    for i, slot in enumerate(per_slot.slots.tolist()):
        resp.slots.add(slot=slot, series=int(per_slot.series[i]), samples=int(per_slot.samples[i]),
                       hash=int(per_slot.hashes[i]))
    if request.per_series:
        assert d.buckets is not None
        for i in np.argsort(d.ids, kind="stable").tolist():  # by id: replicas list them alike
            resp.series.add(id=int(d.ids[i]), slot=int(series_slots[i]), samples=int(d.samples[i]),
                            hash=int(d.hashes[i]), bucket_hashes=d.buckets[i].tolist())
    return resp


def store_digest(store: Store, request: pb.DigestRequest) -> pb.DigestResponse:
    """Answer a DigestRequest from the store at once. Raises ValueError for a bad slot filter or range."""
    slot_count, slots = digest_request(request)
    samples = SlotSamples(store, slot_count, slots, request.start_ms, request.end_ms)
    samples.read(len(samples.rows))
    return digest_response(request, slots, samples)
