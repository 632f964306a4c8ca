"""Sealed chunks of one series: encoded bytes back to back, with a time index per chunk.

One bytes object and one int64 array per series, rather than an object per chunk, keeps the
per-chunk overhead at 24 bytes (min time, max time, end offset) instead of a few hundred.

The bytes are immutable and exactly as long as the chunks, and the index is replaced by an
exactly sized copy too: sealing a chunk builds new objects (copying at most a day of one series,
~13 KB, once every 20 minutes). A growing bytearray or array over-allocates and leaves freed
blocks of every size behind in the heap; with a day of data that cost 1,640 bytes per series
more RSS (perf/bench_memory.py, perf/RESULTS.md).
"""

from __future__ import annotations

from array import array

import numpy as np

from metricsd.codec import chunk_count, decode_chunk, encode_chunk

__all__ = ["ChunkList"]


class ChunkList:
    __slots__ = ("data", "index", "samples")

    def __init__(self) -> None:
        self.data = b""
        self.index = array("q")  # per chunk: min_ts, max_ts, end offset in data
        self.samples = 0

    def __len__(self) -> int:
        return len(self.index) // 3

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def max_ts(self) -> int | None:
        return self.index[-2] if self.index else None

    def min_ts(self) -> int | None:
        return self.index[0] if self.index else None

    def append(self, ts: np.ndarray, vals: np.ndarray) -> None:
        """Seal samples newer than every sample already sealed into a new chunk."""
        if len(ts) == 0:
            return
        self.append_encoded(encode_chunk(ts, vals), int(ts[0]), int(ts[-1]), len(ts))

    def append_encoded(self, chunk: bytes, min_ts: int, max_ts: int, samples: int) -> None:
        """Add a chunk encoded already (codec.encode_chunks: many series sealed at once)."""
        if self.index and min_ts <= self.index[-2]:
            raise ValueError("chunk must start after the last sealed sample")
        self.data = b"".join((self.data, chunk))
        self.index = self.index + array("q", (min_ts, max_ts, len(self.data)))
        self.samples += samples

    def _chunk(self, i: int) -> memoryview:
        start = self.index[3 * i - 1] if i else 0
        return memoryview(self.data)[start : self.index[3 * i + 2]]

    def read(self, start_ms: int, end_ms: int) -> tuple[np.ndarray, np.ndarray]:
        """Samples in [start_ms, end_ms], decoding only chunks that overlap it."""
        parts_t: list[np.ndarray] = []
        parts_v: list[np.ndarray] = []
        for i in range(len(self)):
            lo, hi = self.index[3 * i], self.index[3 * i + 1]
            if hi < start_ms or lo > end_ms:
                continue
            t, v = decode_chunk(self._chunk(i))
            if lo < start_ms or hi > end_ms:
                keep = (t >= start_ms) & (t <= end_ms)
                t, v = t[keep], v[keep]
            parts_t.append(t)
            parts_v.append(v)
        if not parts_t:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        if len(parts_t) == 1:
            return parts_t[0], parts_v[0]
        return np.concatenate(parts_t), np.concatenate(parts_v)

    def drop_before(self, cutoff_ms: int) -> int:
        """Drop whole chunks whose newest sample is older than cutoff; returns samples dropped."""
        n = 0
        while n < len(self) and self.index[3 * n + 1] < cutoff_ms:
            n += 1
        if n == 0:
            return 0
        end = self.index[3 * n - 1]
        dropped = sum(chunk_count(self._chunk(i)) for i in range(n))
        self.data = self.data[end:]
        rest = self.index[3 * n :]
        for j in range(2, len(rest), 3):
            rest[j] -= end
        self.index = rest
        self.samples -= dropped
        return dropped

    def truncate_from(self, ts_ms: int) -> tuple[np.ndarray, np.ndarray]:
        """Remove every chunk whose newest sample is >= ts_ms; return their samples (rare path)."""
        n = len(self)
        first = n
        while first > 0 and self.index[3 * (first - 1) + 1] >= ts_ms:
            first -= 1
        if first == n:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        parts = [decode_chunk(self._chunk(i)) for i in range(first, n)]
        start = self.index[3 * first - 1] if first else 0
        self.data = self.data[:start]
        self.index = self.index[: 3 * first]
        t = np.concatenate([p[0] for p in parts])
        v = np.concatenate([p[1] for p in parts])
        self.samples -= len(t)
        return t, v

    def _check(self) -> None:
        total, prev_hi, prev_end = 0, None, 0
        for i in range(len(self)):
            lo, hi, end = self.index[3 * i], self.index[3 * i + 1], self.index[3 * i + 2]
            assert lo <= hi and end > prev_end
            if prev_hi is not None:
                assert lo > prev_hi, "chunks must not overlap in time"
            t, _ = decode_chunk(self._chunk(i))
            assert int(t[0]) == lo and int(t[-1]) == hi
            total += len(t)
            prev_hi, prev_end = hi, end
        assert prev_end == len(self.data)
        assert total == self.samples
