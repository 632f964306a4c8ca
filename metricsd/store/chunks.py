"""The compressed samples of every series: an open chunk that grows a block at a time, and closed ones.

Samples are sealed in blocks of ``block`` samples as they arrive (metricsd/codec/blocks.py, one
pass over every series that fills a block in a write), and each block is appended to its
series' open chunk. A chunk is closed once it holds ``chunk_samples`` samples (or when its values
leave its decimal scale); closed chunks sit back to back in one bytes object per series, with
an index entry each. So a series costs its compressed bytes plus three Python objects (its open
chunk, its closed chunks, their index), and everything per series that changes on each block
(the open chunk's time range, count and hash sum, the codec's chain) is a NumPy column, updated
for all series of a block wave at once.

Each closed chunk's index entry is (min_ts, max_ts, end offset, samples, hash sum); the open
chunk's are the columns ``open_min``, ``max_ts``, ``open_count`` and ``open_hash``. The hash sum
of a chunk is the sum modulo 2^64 of its samples' anti-entropy hashes
(metricsd/maths/samplehash.py), added up block by block as they are sealed: a digest of a range
adds the sums of the chunks wholly inside it instead of decoding them (:func:`split_chunks`).

The bytes are kept in two arenas (metricsd/store/arena.py), one region a series in each: the
closed chunks with their index, and the open chunk. A region is exactly sized and never written
twice, as the bytes objects it replaces were (a growing bytearray left freed blocks of every size
in the heap, 1,640 bytes a series of RSS with a day of data; one bytes object a series cost its
header and left holes too: perf/RESULTS.md). Appending a block moves every open chunk a write
grows to one new region at the arena's end (one copy of the open chunks, at most
``chunk_samples`` samples each, ~1 KB); closing one copies the series' closed chunks, once every
``chunk_samples`` samples. The retention pass cleans the arenas (:meth:`Chunks.clean`).

Not safe for concurrent use; the store serialises access.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from metricsd.codec.blockdecode import decode_chunks
from metricsd.codec.blocks import NO_CHUNK, Chain, Encoded
from metricsd.codec.tail import decode_tails
from metricsd.maths.samplehash import sample_hashes
from metricsd.store.arena import Arena
from metricsd.store.head import zero_grown
from metricsd.store.slabfiles import SlabFiles

__all__ = ["STRIDE", "TAIL_MIN_BLOCKS", "ChunkSplit", "Chunks", "split_chunks"]

STRIDE = 5  # index entries per closed chunk: min_ts, max_ts, end offset, samples, hash sum (int64 bits)
NO_TS = np.iinfo(np.int64).min
TAIL_MIN_BLOCKS = 4  # an open chunk of fewer blocks is decoded whole: entering it saves little

_EMPTY_T = np.zeros(0, np.int64)
_EMPTY_V = np.zeros(0, np.float64)
_NO_ENTRIES = np.zeros((0, STRIDE), np.int64)


def _as_int64(h: int) -> int:
    """A uint64 as the int64 with the same bits (what array('q') holds)."""
    return h - (1 << 64) if h >= 1 << 63 else h


@dataclass(frozen=True)
class ChunkSplit:
    """The sealed samples in a range of several series (``series`` below: positions in the rows
    given to :func:`split_chunks`), split by what a digest must decode.

    Per chunk wholly inside the range (and, with buckets, inside one bucket): ``whole_series``,
    ``whole_min_ts`` (its first timestamp) and ``whole_hashes`` (uint64). Per series:
    ``whole_samples`` in those chunks and ``counts`` of the samples in range of its other chunks,
    which ``timestamps``/``values`` hold series after series, each in time order.
    """

    whole_series: np.ndarray
    whole_min_ts: np.ndarray
    whole_hashes: np.ndarray
    whole_samples: np.ndarray
    counts: np.ndarray
    timestamps: np.ndarray
    values: np.ndarray



def split_closed(data: bytes | memoryview, n: int) -> tuple[memoryview, np.ndarray]:
    """A series' closed chunks' bytes and their index (n x STRIDE int64), views of ``data`` (a
    row's ``Chunks.data``; n its ``n_closed``). Snapshots split the bytes they hold with it."""
    if not n:
        return memoryview(b""), _NO_ENTRIES
    at = len(data) - 8 * STRIDE * n
    return memoryview(data)[:at], np.frombuffer(data, dtype="<i8", count=STRIDE * n, offset=at).reshape(n, STRIDE)

class Chunks:
    """Per series (row): closed chunks, an open chunk and the codec chain that continues it."""

    def __init__(self, block: int, chunk_samples: int, rows: int = 64) -> None:
        if not 1 <= block <= 255 or chunk_samples < 1:
            raise ValueError("a block holds 1..255 samples and a chunk at least one")
        self.block = block
        self.chunk_samples = chunk_samples
        # closed chunks back to back, then their index: STRIDE int64 (little-endian) per chunk
        self.data = Arena(rows)
        self.open = Arena(rows)  # the open chunk's bytes (empty: none)
        self.n_closed = np.zeros(rows, np.int32)
        self.max_ts = np.full(rows, NO_TS, np.int64)  # newest sealed sample (NO_TS: none)
        self.samples = np.zeros(rows, np.int32)  # sealed samples, closed and open
        self.open_min = np.zeros(rows, np.int64)
        self.open_count = np.zeros(rows, np.int32)
        self.open_hash = np.zeros(rows, np.uint64)
        # the chain before the next block: t1 is max_ts
        self.t2 = np.zeros(rows, np.int64)
        self.v1 = np.zeros(rows, np.float64)
        self.v2 = np.zeros(rows, np.float64)
        self.shift = np.zeros(rows, np.int8)
        self.family = np.full(rows, NO_CHUNK, np.int16)

    # --- rows --------------------------------------------------------------------------------

    def ensure_rows(self, n: int) -> None:
        have = len(self.max_ts)
        if n <= have:
            self.data.ensure_rows(n, have)
            self.open.ensure_rows(n, have)
            return
        extra = max(n, have + max(1024, have // 4)) - have
        self.max_ts = np.concatenate([self.max_ts, np.full(extra, NO_TS, np.int64)])
        for name in ("samples", "open_min", "open_count", "t2", "open_hash", "v1", "v2", "shift", "n_closed"):
            setattr(self, name, zero_grown(getattr(self, name), have + extra))
        self.family = np.concatenate([self.family, np.full(extra, NO_CHUNK, np.int16)])
        self.data.ensure_rows(n, have + extra)
        self.open.ensure_rows(n, have + extra)

    def reset_row(self, row: int) -> None:
        self.data.clear(row)
        self.n_closed[row] = 0
        self._forget_open(row)
        self.max_ts[row] = NO_TS
        self.samples[row] = 0

    def _forget_open(self, row: int) -> None:
        self.open.clear(row)
        self.open_count[row] = 0
        self.open_hash[row] = 0
        self.family[row] = NO_CHUNK
        self.shift[row] = 0

    # --- sealing -----------------------------------------------------------------------------

    def chain(self, rows: np.ndarray) -> Chain:
        return Chain(self.max_ts[rows], self.t2[rows], self.v1[rows], self.v2[rows], self.shift[rows].astype(np.int64),
                     self.family[rows].astype(np.int64))

    def append(self, rows: np.ndarray, enc: Encoded, t_first: np.ndarray, t_last: np.ndarray, n: int,
               hashes: np.ndarray) -> None:
        """Append the blocks ``enc`` sealed for distinct ``rows`` (``n`` samples each, from
        ``t_first`` to ``t_last``, their hash sums ``hashes``). A block that starts a chunk closes
        the series' open one first. Then every open chunk of ``chunk_samples`` or more is closed."""
        started = enc.started
        for row in rows[started & (self.open.size[rows] > 0)].tolist():
            self._close(row)
        self.open.grow(rows, enc.data.tobytes(), enc.offsets)
        with np.errstate(over="ignore"):
            self.open_min[rows] = np.where(started, t_first, self.open_min[rows])
            self.open_count[rows] = np.where(started, 0, self.open_count[rows]) + n
            self.open_hash[rows] = np.where(started, np.uint64(0), self.open_hash[rows]) + hashes
        self.max_ts[rows] = t_last
        self.samples[rows] += n
        after = enc.after
        self.t2[rows] = after.t2
        self.v1[rows] = after.v1
        self.v2[rows] = after.v2
        self.shift[rows] = after.shift
        self.family[rows] = after.family
        full = rows[self.open_count[rows] >= self.chunk_samples]
        for row in full.tolist():
            self._close(row)

    def _close(self, row: int) -> None:
        """The open chunk becomes the newest closed one; the next block starts a new chunk."""
        payload, index = self.closed(row)
        end = len(payload) + len(self.open[row])
        entry = np.array([int(self.open_min[row]), int(self.max_ts[row]), end, int(self.open_count[row]),
                          _as_int64(int(self.open_hash[row]))], dtype="<i8")
        self.data[row] = b"".join((payload, self.open[row], index.tobytes(), entry.tobytes()))
        self.n_closed[row] += 1
        self._forget_open(row)

    def closed(self, row: int) -> tuple[memoryview, np.ndarray]:
        """(the closed chunks' bytes, their index: chunks x STRIDE int64), views of the row's data."""
        return split_closed(self.data[row], int(self.n_closed[row]))

    def _set_closed(self, row: int, payload: bytes | memoryview, index: np.ndarray) -> None:
        self.data[row] = b"".join((payload, np.ascontiguousarray(index, dtype="<i8").tobytes())) if len(index) else b""
        self.n_closed[row] = len(index)

    def close_all(self, rows: np.ndarray) -> None:
        for row in rows.tolist():
            if self.open_count[row]:
                self._close(row)

    # --- reading -----------------------------------------------------------------------------

    def n_chunks(self, row: int) -> int:
        return int(self.n_closed[row]) + (1 if self.open_count[row] else 0)

    def entries(self, row: int) -> np.ndarray:
        """(chunks x 5) int64: min_ts, max_ts, end offset, samples, hash bits of every chunk, the
        open one last (its end offset counts from the end of the closed ones)."""
        payload, closed = self.closed(row)
        if not self.open_count[row]:
            return closed
        end = len(payload) + len(self.open[row])
        entry = np.array([[self.open_min[row], self.max_ts[row], end, self.open_count[row],
                           self.open_hash[row].view(np.int64)]], dtype=np.int64)
        return np.concatenate([closed, entry])

    def open_tails(self, rows: np.ndarray, start_ms: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The sealed samples from ``start_ms`` on of the ``rows`` whose open chunk began before
        it, decoded from a block near ``start_ms`` instead of the chunk's start (codec/tail.py:
        the chain is solved from the open chunk's two newest samples, the columns ``max_ts``,
        ``t2``, ``v1``, ``v2``). Returns (which of ``rows`` were answered; for those, samples per
        row, then their timestamps and values, row after row, each from its chunk's block at or
        before ``start_ms`` to its newest sample). The other rows are the caller's to read whole."""
        rows = np.asarray(rows, dtype=np.int64)
        answered = np.zeros(len(rows), bool)
        cnt = self.open_count[rows].astype(np.int64)
        lo = self.open_min[rows]
        hi = self.max_ts[rows]
        cand = np.flatnonzero((cnt >= TAIL_MIN_BLOCKS * self.block) & (lo < start_ms) & (hi > lo))
        if len(cand) == 0:
            return answered, np.zeros(0, np.int64), _EMPTY_T.copy(), _EMPTY_V.copy()
        r = rows[cand]
        cnt, lo, hi = cnt[cand], lo[cand], hi[cand]
        # samples after start_ms if they are evenly spaced, and a block more for the spacing's wobble
        want = -((hi - start_ms) * (cnt - 1) // -(hi - lo)) + 1 + self.block
        pieces = [self.open[i] for i in r.tolist()]
        ends = np.cumsum(np.fromiter(map(len, pieces), np.int64, count=len(pieces)))
        tails = decode_tails(b"".join(pieces), ends - np.fromiter(map(len, pieces), np.int64, count=len(pieces)),
                             ends, cnt, want, hi, self.t2[r], self.v1[r], self.v2[r])
        covered = tails.ok & (tails.before < start_ms)
        answered[cand[covered]] = True
        keep = np.repeat(covered[tails.ok], tails.counts[tails.ok])
        return answered, tails.counts[covered], tails.t[keep], tails.v[keep]

    def first_max_ts(self, row: int) -> int:
        """The newest sample of the oldest chunk (retention drops chunks by it); NO_TS: none."""
        if self.n_closed[row]:
            return int(self.closed(row)[1][0, 1])
        return int(self.max_ts[row]) if self.open_count[row] else NO_TS

    def _decode(self, row: int, which: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Samples of the chunks ``which`` (positions in ``entries``, increasing) of ``row``."""
        if not which:
            return _EMPTY_T.copy(), _EMPTY_V.copy()
        e = self.entries(row)
        payload, _ = self.closed(row)
        buf = bytes(payload) + self.open[row] if self.open_count[row] and which[-1] == len(e) - 1 else self.data[row]
        ends = e[which, 2].tolist()
        starts = [int(e[i - 1, 2]) if i else 0 for i in which]
        return decode_chunks(buf, starts, ends, e[which, 3].tolist())

    def read(self, row: int, start_ms: int, end_ms: int) -> tuple[np.ndarray, np.ndarray]:
        """Sealed samples in [start_ms, end_ms], decoding only chunks that overlap it."""
        if not self.samples[row]:
            return _EMPTY_T.copy(), _EMPTY_V.copy()
        e = self.entries(row)
        which = np.flatnonzero((e[:, 1] >= start_ms) & (e[:, 0] <= end_ms)).tolist()
        t, v = self._decode(row, which)
        if which and (int(e[which[0], 0]) < start_ms or int(e[which[-1], 1]) > end_ms):
            keep = (t >= start_ms) & (t <= end_ms)
            t, v = t[keep], v[keep]
        return t, v

    def drop_before(self, row: int, cutoff_ms: int) -> int:
        """Drop whole chunks whose newest sample is older than cutoff; returns samples dropped."""
        if not self.samples[row]:
            return 0
        payload, closed = self.closed(row)
        n = int(np.count_nonzero(closed[:, 1] < cutoff_ms))  # max_ts increases from chunk to chunk
        dropped = int(closed[:n, 3].sum())
        if n:
            end = int(closed[n - 1, 2])
            rest = closed[n:].copy()
            rest[:, 2] -= end
            self._set_closed(row, payload[end:], rest)
        if n == len(closed) and self.open_count[row] and int(self.max_ts[row]) < cutoff_ms:
            dropped += int(self.open_count[row])
            self._forget_open(row)
        self.samples[row] -= dropped
        if not self.samples[row]:
            self.max_ts[row] = NO_TS
        return dropped

    def truncate_from(self, row: int, ts_ms: int) -> tuple[np.ndarray, np.ndarray]:
        """Remove every chunk whose newest sample is >= ts_ms; return their samples (rare path:
        merges). The next block starts a new chunk."""
        if not self.samples[row] or int(self.max_ts[row]) < ts_ms:
            return _EMPTY_T.copy(), _EMPTY_V.copy()
        e = self.entries(row)
        first = int(np.count_nonzero(e[:, 1] < ts_ms))
        t, v = self._decode(row, list(range(first, len(e))))
        if first < int(self.n_closed[row]):
            payload, closed = self.closed(row)
            start = int(e[first - 1, 2]) if first else 0
            self._set_closed(row, payload[:start], closed[:first].copy())
        self._forget_open(row)
        self.samples[row] -= len(t)
        self.max_ts[row] = int(e[first - 1, 1]) if first else NO_TS
        return t, v

    def restore_row(self, row: int, index: np.ndarray, open_min: int, open_count: int, open_hash: int, max_ts: int,
                    chain: tuple[int, float, float, int, int]) -> None:
        """Set a series' columns from a snapshot (the caller has checked the sizes); its bytes come
        after, for every series at once (:meth:`restore_bytes`)."""
        index = np.asarray(index, dtype=np.int64).reshape(-1, STRIDE)
        self.n_closed[row] = len(index)
        self.open_min[row] = open_min
        self.open_count[row] = open_count
        self.open_hash[row] = open_hash
        self.max_ts[row] = max_ts
        self.samples[row] = int(index[:, 3].sum()) + open_count
        self.t2[row], self.v1[row], self.v2[row], self.shift[row], self.family[row] = chain

    def restore_bytes(self, closed: list[bytes | memoryview], closed_sizes: np.ndarray, open_data: bytes | memoryview,
                      open_sizes: np.ndarray) -> None:
        """Rows 0 .. len(sizes) - 1's bytes from a snapshot, each arena in one pass (a Python step a
        row made a restore ~20% slower): ``closed`` the closed chunks' payload then index, row after
        row (none for a row without), ``open_data`` the open chunks back to back."""
        rows = np.arange(len(closed_sizes), dtype=np.int64)
        self.data.put_many(rows, closed, closed_sizes)
        self.open.put_many(rows, [open_data], open_sizes)

    @property
    def nbytes(self) -> int:
        """Compressed bytes held, closed and open chunks (their index left out)."""
        return self.data.live_bytes + self.open.live_bytes - 8 * STRIDE * int(self.n_closed.sum())

    def clean(self, max_dead: float = 0.125) -> int:
        """Both arenas' slabs more than ``max_dead`` dead moved up and dropped (arena.py); bytes moved."""
        return self.data.clean(max_dead) + self.open.clean(max_dead)

    def keep_in(self, files: SlabFiles) -> None:
        """Both arenas' slabs from now on as files in ``files`` (a store with a data directory,
        metricsd/store/slabfiles.py); called before the first byte is stored."""
        if self.data.slabs or self.open.slabs:
            raise ValueError("the chunk arenas already hold slabs")
        self.data.files = self.open.files = files

    def settle(self) -> None:
        """Both arenas' file slabs but the tails out of the resident set (after a snapshot's read)."""
        self.data.settle()
        self.open.settle()

    def _check(self, row: int) -> None:
        """Every invariant of one series, the chunks decoded (slow; tests)."""
        e = self.entries(row)
        assert len(self.closed(row)[1]) == int(self.n_closed[row])
        lo, hi, end, count, h = (e[:, j] for j in range(STRIDE))
        assert bool(np.all(lo <= hi) and np.all(count > 0) and np.all(np.diff(end) > 0) and np.all(lo[1:] > hi[:-1]))
        t, v = self._decode(row, list(range(len(e))))
        assert len(t) == int(count.sum()) == int(self.samples[row])
        first = np.cumsum(count) - count
        if len(e):
            assert t[first].tolist() == lo.tolist() and t[first + count - 1].tolist() == hi.tolist(), "index disagrees"
            sums = np.add.reduceat(sample_hashes(t, v), first)
            assert sums.view(np.int64).tolist() == h.tolist(), "hash sums are stale"
        assert int(self.max_ts[row]) == (int(hi[-1]) if len(e) else NO_TS)
        if self.open_count[row]:
            assert self.family[row] != NO_CHUNK
            n_open = int(self.open_count[row])
            if n_open >= 2:
                assert int(self.t2[row]) == int(t[-2])
                chain = np.array([self.v2[row], self.v1[row]])
                assert v[-2:].view(np.uint64).tolist() == chain.view(np.uint64).tolist()
        else:
            assert self.family[row] == NO_CHUNK and not self.open[row]


def split_chunks(store: Chunks, rows: Sequence[int], start_ms: int, end_ms: int, bucket_ms: int = 0) -> ChunkSplit:
    """The chunks of ``rows`` overlapping [start_ms, end_ms]: those wholly inside it (and, when
    bucket_ms > 0, inside one bucket ``[start_ms + k*bucket_ms, start_ms + (k+1)*bucket_ms)``) by
    their hash sums, the others decoded.

    Vectorised over every chunk of every series; a Python step only per chunk not taken whole
    (decoded when it overlaps the range). A digest over whole chunks therefore costs O(chunks)
    NumPy work and no decoding.
    """
    k = len(rows)
    entries = [store.entries(r) for r in rows]
    lens = np.fromiter((len(e) for e in entries), dtype=np.int64, count=k)
    whole_samples = np.zeros(k, dtype=np.int64)
    counts = np.zeros(k, dtype=np.int64)
    n = int(lens.sum())
    if n == 0:
        return ChunkSplit(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint64), whole_samples, counts,
                          _EMPTY_T.copy(), _EMPTY_V.copy())
    ix = np.concatenate(entries)
    series = np.repeat(np.arange(k, dtype=np.int64), lens)
    lo, hi, samples, hashes = ix[:, 0], ix[:, 1], ix[:, 3], ix[:, 4].view(np.uint64)
    overlap = (hi >= start_ms) & (lo <= end_ms)
    whole = overlap & (lo >= start_ms) & (hi <= end_ms)
    if bucket_ms > 0:
        whole &= (lo - start_ms) // bucket_ms == (hi - start_ms) // bucket_ms
    np.add.at(whole_samples, series[whole], samples[whole])
    parts_t: list[np.ndarray] = []
    parts_v: list[np.ndarray] = []
    cut = np.flatnonzero(overlap & ~whole)
    if len(cut):
        first_chunk = np.cumsum(lens) - lens
        for s in np.unique(series[cut]).tolist():
            mine = cut[series[cut] == s]
            t, v = store._decode(int(rows[s]), (mine - first_chunk[s]).tolist())
            keep = (t >= start_ms) & (t <= end_ms)
            t, v = t[keep], v[keep]
            counts[s] = len(t)
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
