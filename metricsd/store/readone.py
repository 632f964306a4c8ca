"""Reading ONE series for a query: a dashboard panel of one pod (``rate(cpu{pod="x"}[1m])``).

scan.read_rows reads any number of rows in batches (readmany.py: the rings in one NumPy pass, the
chunks of every row joined and decoded together), whose fixed cost per call is most of the work
when the selector names one series. ``Store.series_samples`` is the one-row read that
series_samples_many is specified against (tests/store/test_store_readmany.py); here it answers in
read_rows' shape, with the same sample limit.

A dashboard asks the same panels again every refresh, and decoding the pod's chunks was half of
the store's work on such a panel (perf/RESULTS.md, "Issue 23 session 37"). So the one-row read
keeps the chunks it decoded (:class:`DecodedChunks`), bounded in bytes. A chunk is keyed by its
row and its index entry: first and last timestamp, sample count and hash sum (the sum of its
samples' anti-entropy hashes, metricsd/maths/samplehash.py). A closed chunk never changes; the
open one only grows a sealed block at a time, which changes its count and sum, so a kept decode
is never served for other bytes: the samples of the next block, like every sample the ring still
holds unsealed, are read fresh (the ring is not kept here). Reads of many rows (read_rows) do not
use or fill it, so a wide query cannot push a dashboard's panels out or grow it past its bound.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from metricsd.store.scan import SampleLimitReached, Samples

if TYPE_CHECKING:
    from metricsd.store.chunks import Chunks
    from metricsd.store.engine import Store

__all__ = ["DECODED_BYTES", "DecodedChunks", "read_one"]

DECODED_BYTES = 4 << 20  # decoded samples kept (16 bytes a sample): ~260,000 samples, ~360 full chunks

_Key = tuple[int, int, int, int, int]  # row, min_ts, max_ts, samples, hash sum


class DecodedChunks:
    """Decoded chunks of the rows read one at a time, least recently used dropped past ``max_bytes``.

    Not safe for concurrent use; the store serialises access (as it does for the chunks)."""

    def __init__(self, max_bytes: int = DECODED_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._kept: OrderedDict[_Key, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def clear(self) -> None:
        self._kept.clear()
        self.bytes = 0

    def read(self, chunks: Chunks, row: int, start_ms: int, end_ms: int) -> tuple[np.ndarray, np.ndarray]:
        """``chunks.read(row, start_ms, end_ms)``'s answer (fresh arrays), each chunk overlapping
        the range decoded once while it is kept."""
        if not chunks.samples[row]:
            return chunks.read(row, start_ms, end_ms)
        # a series has a few chunks (a day: 12 of 720 samples, and the open one): Python's loop over
        # the index is cheaper than NumPy's calls on it
        keys = [(row, lo, hi, n, h) for lo, hi, _, n, h in chunks.entries(row).tolist()
                if hi >= start_ms and lo <= end_ms]
        if not keys:
            return chunks.read(row, start_ms, end_ms)
        parts = []
        for key in keys:
            got = self._chunk(chunks, key)
            if got is None:  # not the samples its entry counts: read as Chunks does, keep nothing
                return chunks.read(row, start_ms, end_ms)
            parts.append(got)
        if len(parts) == 1:
            t, v = parts[0]
        else:
            t, v = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        lo = 0 if keys[0][1] >= start_ms else int(np.searchsorted(t, start_ms, side="left"))
        hi = len(t) if keys[-1][2] <= end_ms else int(np.searchsorted(t, end_ms, side="right"))
        return t[lo:hi].copy(), v[lo:hi].copy()

    def _chunk(self, chunks: Chunks, key: _Key) -> tuple[np.ndarray, np.ndarray] | None:
        """The chunk's samples, decoded once while kept; None if reading its time range did not
        give the samples its entry counts (chunks overlapping in time: not kept, not trusted)."""
        kept = self._kept.get(key)
        if kept is not None:
            self._kept.move_to_end(key)
            self.hits += 1
            return kept
        self.misses += 1
        row, min_ts, max_ts = key[0], key[1], key[2]
        t, v = chunks.read(row, min_ts, max_ts)  # chunks do not overlap in time: this one alone
        if len(t) != key[3]:
            return None
        size = t.nbytes + v.nbytes
        if size * 4 > self.max_bytes:
            return t, v
        t.flags.writeable = False
        v.flags.writeable = False
        self._kept[key] = (t, v)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (ot, ov) = self._kept.popitem(last=False)
            self.bytes -= ot.nbytes + ov.nbytes
        return t, v


def read_one(store: Store, row: int, start_ms: int, end_ms: int, max_samples: int = 0,
             decoded: DecodedChunks | None = None) -> Samples:
    """read_rows of the one row ``row``: its samples in [start_ms, end_ms], stale markers included,
    its chunks from ``decoded`` when given. Raises SampleLimitReached past ``max_samples`` (0: none)."""
    if decoded is None:
        t, v = store.series_samples(row, start_ms, end_ms)
    else:
        chunks = store.chunks
        t, v = store.series_samples(row, start_ms, end_ms,
                                    lambda r, lo, hi: decoded.read(chunks, r, lo, hi))
    if max_samples and len(t) > max_samples:
        raise SampleLimitReached(max_samples)
    return Samples(np.array([0, len(t)], dtype=np.int64), t, v)
