"""Sealed chunks of one series: encoded bytes back to back, with a time index per chunk.

One bytes object and one int64 array per series, rather than an object per chunk, keeps the
per-chunk overhead at 32 bytes (min time, max time, end offset, hash sum) instead of a few hundred.

The bytes are immutable and exactly as long as the chunks, and the index is replaced by an
exactly sized copy too: sealing a chunk builds new objects (copying at most a day of one series,
~13 KB, once every 20 minutes). A growing bytearray or array over-allocates and leaves freed
blocks of every size behind in the heap; with a day of data that cost 1,640 bytes per series
more RSS (perf/bench_memory.py, perf/RESULTS.md).

The hash sum of a chunk is the sum modulo 2^64 of its samples' anti-entropy hashes
(metricsd/maths/samplehash.py), computed when it is sealed: a digest of a range adds the sums of
the chunks wholly inside it instead of decoding them (:func:`split_chunks`). Chunks never
change once sealed (merges and retention remove whole chunks and seal new ones), so a sum stays
exact. 0 stands for "not known yet": a snapshot does not store the sums, so restored chunks get
theirs on the first digest that reads them (a chunk whose true sum is 0 is merely decoded every
time, with probability 2^-64).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from metricsd.codec import chunk_count, decode_chunk, encode_chunk
from metricsd.maths.samplehash import hash_sum

__all__ = ["UNKNOWN_HASH", "ChunkList", "ChunkSplit", "split_chunks"]

STRIDE = 4  # index entries per chunk: min_ts, max_ts, end offset in data, hash sum (int64 bits)
UNKNOWN_HASH = 0

_EMPTY_T = np.zeros(0, np.int64)
_EMPTY_V = np.zeros(0, np.float64)


def _as_int64(h: int) -> int:
    """A uint64 as the int64 with the same bits (what array('q') holds)."""
    return h - (1 << 64) if h >= 1 << 63 else h


@dataclass(frozen=True)
class ChunkSplit:
    """The sealed samples in a range of several series (``series`` below: positions in the list
    given to :func:`split_chunks`), split by what a digest must decode.

    Per chunk wholly inside the range (and, with buckets, inside one bucket) with a known sum:
    ``whole_series``, ``whole_min_ts`` (its first timestamp) and ``whole_hashes`` (uint64).
    Per series: ``whole_samples`` in those chunks and ``counts`` of the samples in range of its
    other chunks, which ``timestamps``/``values`` hold series after series, each in time order.
    """

    whole_series: np.ndarray
    whole_min_ts: np.ndarray
    whole_hashes: np.ndarray
    whole_samples: np.ndarray
    counts: np.ndarray
    timestamps: np.ndarray
    values: np.ndarray


class ChunkList:
    __slots__ = ("data", "index", "samples")

    def __init__(self) -> None:
        self.data = b""
        self.index = array("q")  # per chunk: min_ts, max_ts, end offset in data, hash sum
        self.samples = 0

    def __len__(self) -> int:
        return len(self.index) // STRIDE

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def max_ts(self) -> int | None:
        return self.index[-3] if self.index else None

    def min_ts(self) -> int | None:
        return self.index[0] if self.index else None

    def first_max_ts(self) -> int:
        """The newest sample of the oldest chunk (retention drops chunks by it); needs a chunk."""
        return self.index[1]

    def append(self, ts: np.ndarray, vals: np.ndarray) -> None:
        """Seal samples newer than every sample already sealed into a new chunk."""
        if len(ts) == 0:
            return
        self.append_encoded(encode_chunk(ts, vals), int(ts[0]), int(ts[-1]), len(ts), hash_sum(ts, vals))

    def append_encoded(self, chunk: bytes, min_ts: int, max_ts: int, samples: int, hash_sum: int) -> None:
        """Add a chunk encoded already (codec.encode_chunks: many series sealed at once), with the
        sum of its samples' hashes (uint64; UNKNOWN_HASH when not known)."""
        if self.index and min_ts <= self.index[-3]:
            raise ValueError("chunk must start after the last sealed sample")
        self.data = b"".join((self.data, chunk))
        self.index = self.index + array("q", (min_ts, max_ts, len(self.data), _as_int64(hash_sum)))
        self.samples += samples

    def restore(self, time_index: np.ndarray, data: bytes, samples: int) -> None:
        """Set the chunks from a snapshot: ``time_index`` holds min_ts, max_ts, end offset per chunk
        (time_index()'s layout); their hash sums are left unknown. The caller checks the bytes."""
        full = np.zeros((len(time_index) // 3, STRIDE), dtype=np.int64)
        full[:, :3] = np.asarray(time_index, dtype=np.int64).reshape(-1, 3)
        full[:, 3] = UNKNOWN_HASH
        self.index = array("q", full.tobytes())
        self.data = data
        self.samples = samples

    def time_index(self) -> np.ndarray:
        """min_ts, max_ts, end offset per chunk, flat (a snapshot's CIDX layout; a copy)."""
        return np.frombuffer(self.index, dtype=np.int64).reshape(-1, STRIDE)[:, :3].reshape(-1).copy()

    def hash_sums(self) -> np.ndarray:
        """The cached hash sum of each chunk (uint64; UNKNOWN_HASH when not known; a copy)."""
        return np.frombuffer(self.index, dtype=np.uint64)[3::STRIDE].copy()

    def _chunk(self, i: int) -> memoryview:
        start = self.index[STRIDE * i - 2] if i else 0
        return memoryview(self.data)[start : self.index[STRIDE * i + 2]]

    def read(self, start_ms: int, end_ms: int) -> tuple[np.ndarray, np.ndarray]:
        """Samples in [start_ms, end_ms], decoding only chunks that overlap it."""
        parts_t: list[np.ndarray] = []
        parts_v: list[np.ndarray] = []
        for i in range(len(self)):
            lo, hi = self.index[STRIDE * i], self.index[STRIDE * i + 1]
            if hi < start_ms or lo > end_ms:
                continue
            t, v = decode_chunk(self._chunk(i))
            if lo < start_ms or hi > end_ms:
                keep = (t >= start_ms) & (t <= end_ms)
                t, v = t[keep], v[keep]
            parts_t.append(t)
            parts_v.append(v)
        return _joined(parts_t, parts_v)

    def drop_before(self, cutoff_ms: int) -> int:
        """Drop whole chunks whose newest sample is older than cutoff; returns samples dropped."""
        n = 0
        while n < len(self) and self.index[STRIDE * n + 1] < cutoff_ms:
            n += 1
        if n == 0:
            return 0
        end = self.index[STRIDE * n - 2]
        dropped = sum(chunk_count(self._chunk(i)) for i in range(n))
        self.data = self.data[end:]
        rest = self.index[STRIDE * n :]
        for j in range(2, len(rest), STRIDE):
            rest[j] -= end
        self.index = rest
        self.samples -= dropped
        return dropped

    def truncate_from(self, ts_ms: int) -> tuple[np.ndarray, np.ndarray]:
        """Remove every chunk whose newest sample is >= ts_ms; return their samples (rare path)."""
        n = len(self)
        first = n
        while first > 0 and self.index[STRIDE * (first - 1) + 1] >= ts_ms:
            first -= 1
        if first == n:
            return _EMPTY_T.copy(), _EMPTY_V.copy()
        parts = [decode_chunk(self._chunk(i)) for i in range(first, n)]
        start = self.index[STRIDE * first - 2] if first else 0
        self.data = self.data[:start]
        self.index = self.index[: STRIDE * first]
        t = np.concatenate([p[0] for p in parts])
        v = np.concatenate([p[1] for p in parts])
        self.samples -= len(t)
        return t, v

    def _check(self) -> None:
        """Every invariant, the cached hash sums recomputed from the decoded chunks (slow; tests)."""
        assert len(self.index) % STRIDE == 0
        total, prev_hi, prev_end = 0, None, 0
        for i in range(len(self)):
            lo, hi, end, h = (self.index[STRIDE * i + k] for k in range(STRIDE))
            assert lo <= hi and end > prev_end
            if prev_hi is not None:
                assert lo > prev_hi, "chunks must not overlap in time"
            t, v = decode_chunk(self._chunk(i))
            assert int(t[0]) == lo and int(t[-1]) == hi
            assert h == UNKNOWN_HASH or h == _as_int64(hash_sum(t, v)), f"chunk {i}: cached hash sum is stale"
            total += len(t)
            prev_hi, prev_end = hi, end
        assert prev_end == len(self.data)
        assert total == self.samples


def split_chunks(lists: Sequence[ChunkList], start_ms: int, end_ms: int, bucket_ms: int = 0) -> ChunkSplit:
    """The chunks of ``lists`` overlapping [start_ms, end_ms]: those wholly inside it (and, when
    bucket_ms > 0, inside one bucket ``[start_ms + k*bucket_ms, start_ms + (k+1)*bucket_ms)``) by
    their cached sums, the others decoded. A chunk inside whose sum is not known yet is decoded
    and learns its sum, and counts as whole.

    Vectorised over every chunk of every list; a Python step only per chunk not taken whole
    (decoded when it overlaps the range, its header read when not). A digest over whole chunks
    therefore costs O(chunks) NumPy work and no decoding.
    """
    k = len(lists)
    lens = np.fromiter((len(c.index) for c in lists), dtype=np.int64, count=k) // STRIDE
    whole_samples = np.fromiter((c.samples for c in lists), dtype=np.int64, count=k)
    counts = np.zeros(k, dtype=np.int64)
    n = int(lens.sum())
    if n == 0:
        return ChunkSplit(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint64), whole_samples, counts,
                          _EMPTY_T.copy(), _EMPTY_V.copy())
    ix = np.frombuffer(b"".join(c.index for c in lists), dtype=np.int64).reshape(n, STRIDE)
    series = np.repeat(np.arange(k, dtype=np.int64), lens)
    lo, hi, hashes = ix[:, 0], ix[:, 1], ix[:, 3].view(np.uint64)
    overlap = (hi >= start_ms) & (lo <= end_ms)
    inside = overlap & (lo >= start_ms) & (hi <= end_ms)
    if bucket_ms > 0:
        inside &= (lo - start_ms) // bucket_ms == (hi - start_ms) // bucket_ms
    whole = inside & (hashes != UNKNOWN_HASH)
    parts_t: list[np.ndarray] = []
    parts_v: list[np.ndarray] = []
    rest = np.flatnonzero(~whole)
    if len(rest):
        hashes = hashes.copy()  # the sums learnt below join the whole chunks
        first_chunk = np.cumsum(lens) - lens
        edge = (lo < start_ms) | (hi > end_ms)
        for j, s, i, ov, ins, cut in zip(rest.tolist(), series[rest].tolist(),
                                         (rest - first_chunk[series[rest]]).tolist(), overlap[rest].tolist(),
                                         inside[rest].tolist(), edge[rest].tolist(), strict=True):
            c = lists[s]
            if not ov:
                whole_samples[s] -= chunk_count(c._chunk(i))
                continue
            t, v = decode_chunk(c._chunk(i))
            if ins:  # a sum not known yet (restored chunk): learn it; the chunk counts as whole
                h = hash_sum(t, v)
                c.index[STRIDE * i + 3] = _as_int64(h)
                hashes[j] = h
                whole[j] = True
                continue
            whole_samples[s] -= len(t)
            if cut:
                keep = (t >= start_ms) & (t <= end_ms)
                t, v = t[keep], v[keep]
            counts[s] += len(t)
            parts_t.append(t)
            parts_v.append(v)
    t, v = _joined(parts_t, parts_v)
    w = np.flatnonzero(whole)
    return ChunkSplit(series[w], lo[w], hashes[w], whole_samples, counts, t, v)


def _joined(parts_t: list[np.ndarray], parts_v: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    if not parts_t:
        return _EMPTY_T.copy(), _EMPTY_V.copy()
    if len(parts_t) == 1:
        return parts_t[0], parts_v[0]
    return np.concatenate(parts_t), np.concatenate(parts_v)
