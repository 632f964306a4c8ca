"""Digests of a store's samples, for anti-entropy between replicas of a slot (rpc Digest).

Replicas compare per-slot digests first, then per-series digests of the slots that differ, then
copy only the time buckets that differ (rpc CatchUp). Every combination is a sum modulo 2^64, so
a digest does not depend on the order samples arrived in, on how they are split into chunks, or
on which replica computed it; only on the samples themselves.

The hashes (pinned by tests/replica/test_replica_digest.py; change them and every replica of a
mixed-version cluster disagrees with the others until all are upgraded):

- ``mix64`` is the splitmix64 finaliser (Steele, Lea, Flood 2014), on uint64 with wraparound.
- sample hash:  ``mix64(mix64(t XOR C1) XOR bits(v))`` with ``t`` the int64 timestamp as uint64
  and ``bits(v)`` the IEEE 754 bits of the value (so NaN payloads and the stale marker count).
- bucket hash:  the sum of the sample hashes of a series in ``[start + k*bucket, start + (k+1)*bucket)``.
- series hash:  the sum of its bucket hashes (the sum of all its sample hashes in range).
- slot hash:    the sum, over series with at least one sample in range, of
  ``mix64(series hash + mix64(id XOR C2))``; a series' id is in it, so two series with equal
  samples do not cancel out, and its sample count travels next to it.

``C1 = 0x9E3779B97F4A7C15``, ``C2 = 0xD6E8FEB86659FD93``; the code is metricsd/maths/samplehash.py,
so that the store can keep per sealed chunk the sum of its sample hashes (metricsd/store/chunks.py).
A digest adds those sums for the chunks wholly inside its range (and, per series, inside one
bucket) and hashes only the samples of the other chunks and of the heads: the sums being additive,
the result is bit for bit the one of hashing every sample (:func:`store_samples` then
:func:`digest_series`, which the tests keep as the reference).

No I/O; :func:`store_digest` reads an in-memory :class:`~metricsd.store.engine.Store`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from metricsd.maths.samplehash import C1, C2, mix64, sample_hashes
from metricsd.maths.slots import SlotFilter
from metricsd.proto import metricsd_pb2 as pb
from metricsd.store.chunks import split_chunks
from metricsd.store.engine import Store

__all__ = ["C1", "C2", "CachedSums", "SeriesDigests", "SlotDigests", "SlotSamples", "bucket_count", "combine_slots",
           "digest_request", "digest_response", "digest_series", "mix64", "repair_ranges", "sample_hashes",
           "slot_reader", "store_digest", "store_samples"]

MAX_BUCKETS = 100_000


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


@dataclass(frozen=True)
class CachedSums:
    """What the cached sums of whole chunks add to the samples of each series of a digest_series
    call: per series (in the call's order) a sample count and a hash; per (series position, bucket)
    term a hash (a bucket may appear in several terms: they add up)."""

    samples: np.ndarray  # int64, one per series
    hashes: np.ndarray  # uint64, one per series
    bucket_series: np.ndarray  # int64, positions in the call's ids
    bucket_index: np.ndarray  # int64
    bucket_hashes: np.ndarray  # uint64


def digest_series(ids: np.ndarray, counts: np.ndarray, timestamps: np.ndarray, values: np.ndarray, start_ms: int,
                  end_ms: int, bucket_ms: int, with_buckets: bool, cached: CachedSums | None = None
                  ) -> SeriesDigests:
    """Digests of columnar samples (as in a WriteRequest: ``counts[i]`` samples of ``ids[i]``, series
    after series, each in time order, all within [start_ms, end_ms]), plus the ``cached`` sums of
    samples not listed (sealed chunks, see CachedSums). Series without samples are left out.

    O(samples + cached terms). Raises ValueError when more than MAX_BUCKETS buckets are asked for.
    """
    ids = np.asarray(ids, dtype=np.uint64)
    counts = np.asarray(counts, dtype=np.int64)
    n_buckets = bucket_count(start_ms, end_ms, bucket_ms)
    if with_buckets and n_buckets > MAX_BUCKETS:
        raise ValueError(f"{n_buckets} buckets of {bucket_ms} ms exceed {MAX_BUCKETS}")
    n = len(ids)
    ts = np.asarray(timestamps, dtype=np.int64)
    h = sample_hashes(ts, values)
    hashes = np.zeros(n, dtype=np.uint64)
    has = counts > 0
    if len(ts):
        hashes[has] = np.add.reduceat(h, (np.cumsum(counts) - counts)[has])
    buckets: np.ndarray | None = None
    if with_buckets:
        flat = np.zeros(n * n_buckets, dtype=np.uint64)
        if len(ts):
            series_index = np.repeat(np.arange(n, dtype=np.int64), counts)
            b = (ts - start_ms) // bucket_ms if bucket_ms > 0 else np.zeros(len(ts), dtype=np.int64)
            key = series_index * n_buckets + b  # non-decreasing: series after series, each in time order
            first = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
            flat[key[first]] = np.add.reduceat(h, first)
        if cached is not None and len(cached.bucket_hashes):
            np.add.at(flat, cached.bucket_series * n_buckets + cached.bucket_index, cached.bucket_hashes)
        buckets = flat.reshape(n, n_buckets)
    samples = counts
    if cached is not None:
        samples = counts + cached.samples
        hashes += cached.hashes  # modulo 2^64
    keep = samples > 0
    if not bool(keep.all()):
        ids, samples, hashes = ids[keep], samples[keep], hashes[keep]
        if buckets is not None:
            buckets = buckets[keep]
    return SeriesDigests(ids, samples, hashes, buckets)


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
    [start_ms, end_ms]; series without samples there are left out. One read per series, every
    chunk in range decoded: the reference a cached digest must equal."""
    samples = SlotSamples(store, slot_count, slots, start_ms, end_ms)
    samples.read(len(samples.rows))
    return samples.arrays()


class SlotSamples:
    """The samples of a slot set read a slice of series at a time (``read``), so an async caller
    can let other requests run between slices (metricsd/replica/digestloop.py).

    With ``cache_bucket_ms`` (not None) sealed chunks wholly inside the range, and inside one bucket
    of that width when it is > 0, are not decoded: their cached hash sums are kept (``cached()``,
    per bucket too when ``buckets``) and only the other samples are read (``arrays()``). Without it
    every sample is read.
    """

    def __init__(self, store: Store, slot_count: int, slots: list[int], start_ms: int, end_ms: int,
                 cache_bucket_ms: int | None = None, buckets: bool = False) -> None:
        self.store, self.slot_count, self.start_ms, self.end_ms = store, slot_count, start_ms, end_ms
        self.cache_bucket_ms, self.buckets = cache_bucket_ms, buckets
        self.rows = store.select([], SlotFilter(slot_count, tuple(slots)) if slot_count else None).tolist()
        self.next = 0
        self._ids: list[int] = []
        self._counts: list[int] = []
        self._ts: list[np.ndarray] = []
        self._vals: list[np.ndarray] = []
        self._rows: list[int] = []
        self._cached_samples: list[int] = []
        self._cached_hashes: list[int] = []
        self._bucket_series: list[np.ndarray] = []
        self._bucket_index: list[np.ndarray] = []
        self._bucket_hashes: list[np.ndarray] = []

    @property
    def done(self) -> bool:
        return self.next >= len(self.rows)

    def read(self, n: int) -> None:
        """Read the next ``n`` series. A row's id and samples are read together, so a series
        dropped or added meanwhile is seen whole or not at all."""
        if self.cache_bucket_ms is not None:
            self._read_cached(n, self.cache_bucket_ms)
            return
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

    def _read_cached(self, n: int, bucket_ms: int) -> None:
        """read() by cached chunk sums (store.chunks.split_chunks), the slice at once: per series
        the samples of the chunks not taken whole, then the head's samples that are in no chunk
        (all of it when the series has no chunks), as Store.series_samples reads them."""
        store, head, start_ms, end_ms = self.store, self.store.head, self.start_ms, self.end_ms
        rows = np.array(self.rows[self.next : self.next + n], dtype=np.int64)
        self.next += n
        if len(rows) == 0:
            return
        split = split_chunks(store.chunks, rows.tolist(), start_ms, end_ms, bucket_ms)
        # the ring's samples in no chunk yet: its newest ``unsealed``
        u = head.unsealed[rows].astype(np.int64)
        width = max(1, int(u.max()))
        ht, hv, cnt = head.newest(rows, width)
        shift = cnt - u  # columns before the unsealed ones
        cols = np.arange(width)[None, :]
        in_head = (cols >= shift[:, None]) & (cols < cnt[:, None]) & (ht >= start_ms) & (ht <= end_ms)
        head_counts = in_head.sum(axis=1)
        counts = split.counts + head_counts
        keep = (counts > 0) | (split.whole_samples > 0)
        # series after series: the chunks' samples (older), then the head's
        out_start = np.cumsum(counts) - counts
        total = int(counts.sum())
        ts, vals = np.empty(total, dtype=np.int64), np.empty(total, dtype=np.float64)
        pos = np.repeat(out_start - (np.cumsum(split.counts) - split.counts), split.counts)
        pos += np.arange(len(pos))
        ts[pos], vals[pos] = split.timestamps, split.values
        pos = np.repeat(out_start + split.counts - (np.cumsum(head_counts) - head_counts), head_counts)
        pos += np.arange(len(pos))
        ts[pos], vals[pos] = ht[in_head], hv[in_head]
        kept = np.flatnonzero(keep)
        new_pos = len(self._ids) + np.cumsum(keep) - 1  # position of each kept series among all read
        self._ids.extend(store.index.id_column[rows[kept]].tolist())
        self._counts.extend(counts[kept].tolist())
        self._ts.append(ts)
        self._vals.append(vals)
        self._rows.extend(rows[kept].tolist())
        self._cached_samples.extend(split.whole_samples[kept].tolist())
        sums = np.zeros(len(rows), dtype=np.uint64)
        np.add.at(sums, split.whole_series, split.whole_hashes)
        self._cached_hashes.extend(sums[kept].tolist())
        if self.buckets and len(split.whole_hashes):
            self._bucket_series.append(new_pos[split.whole_series])
            self._bucket_index.append((split.whole_min_ts - start_ms) // bucket_ms if bucket_ms > 0
                                      else np.zeros(len(split.whole_hashes), dtype=np.int64))
            self._bucket_hashes.append(split.whole_hashes)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(ids, counts, timestamps, values, slot per series) of the samples read (not the cached ones)."""
        row_arr = np.array(self._rows, dtype=np.int64)
        series_slots = ((self.store.index.pod_hash[row_arr] % np.uint64(self.slot_count)).astype(np.int64)
                        if self.slot_count else np.zeros(len(row_arr), dtype=np.int64))
        return (np.array(self._ids, dtype=np.uint64), np.array(self._counts, dtype=np.int64),
                np.concatenate(self._ts) if self._ts else np.zeros(0, dtype=np.int64),
                np.concatenate(self._vals) if self._vals else np.zeros(0, dtype=np.float64), series_slots)

    def cached(self) -> CachedSums | None:
        """The cached sums per series of arrays() (None when reading every sample)."""
        if self.cache_bucket_ms is None:
            return None

        def cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
            return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)

        return CachedSums(np.array(self._cached_samples, dtype=np.int64),
                          np.array(self._cached_hashes, dtype=np.uint64), cat(self._bucket_series, np.int64),
                          cat(self._bucket_index, np.int64), cat(self._bucket_hashes, np.uint64))


def slot_reader(store: Store, request: pb.DigestRequest, slot_count: int, slots: list[int]) -> SlotSamples:
    """The reader for a DigestRequest: by cached chunk sums, per bucket only when per-series
    buckets are asked for (a slot digest needs no bucket, so no chunk straddling one is decoded)."""
    return SlotSamples(store, slot_count, slots, request.start_ms, request.end_ms,
                       cache_bucket_ms=request.bucket_ms if request.per_series else 0, buckets=request.per_series)


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
    d = digest_series(ids, counts, ts, vals, request.start_ms, request.end_ms, request.bucket_ms, request.per_series,
                      samples.cached())
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
    samples = slot_reader(store, request, slot_count, slots)
    samples.read(len(samples.rows))
    return digest_response(request, slots, samples)
