"""One byte string per row, kept back to back in large mmapped slabs instead of one bytes object each.

The sealed chunks of 200,000 series were 200,000 bytes objects: 33 bytes of object header each
and two lists of pointers (9.4 MiB at 2 h), and every block appended made a new object and freed
the old, leaving holes of every size in the C heap that no trim returns (perf/RESULTS.md, session
39). Here a row's bytes are one region of a slab: an address column (``at``: slab << 32 | offset)
and a length column (``size``) per row, 12 bytes.

Regions are never written twice. A row rewritten or grown gets a new region at the newest slab's
end (a wave of rows at once: :meth:`Arena.put_many`), and its old one is dead. So a view handed
out (a snapshot's capture, a query's buffer) keeps meaning what it meant, as an immutable bytes
object did: it also keeps its slab alive. A slab whose regions are all dead is dropped (a slab is
above glibc's mmap threshold, metricsd/memory.py: its pages go back to the system), and
:meth:`Arena.clean` (the retention pass, once a minute) moves the live regions of slabs more than
a fraction dead to the end, so that dead bytes stay a bounded share of the slabs.

With ``files`` (a store with a data directory, metricsd/store/slabfiles.py) each slab is a shared
mapping of a file, and a slab no longer written to leaves the process's resident set: the tail
slab once a new one is started, and every slab but the tail again at each :meth:`Arena.clean`
(reads fault pages back in; the retention pass bounds how long they stay) and :meth:`settle`.
``madvise(MADV_DONTNEED)`` keeps a shared file mapping's bytes (page cache, then the file), so
every view handed out stays valid. It is never applied to an anonymous slab (a fallback on a full
disk): Python's anonymous mmap is shared memory, whose pages DONTNEED would only hide from the
RSS while they stay in memory (no file to write them to, nothing the kernel can reclaim).

Not safe for concurrent use; the store serialises access.
"""

from __future__ import annotations

import itertools
import mmap
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from metricsd.store.slabfiles import SlabFiles

__all__ = ["SLAB", "Arena", "Frozen"]

SLAB = 4 << 20  # bytes a slab (a longer wave or row gets a slab of its own size)
_POS = (1 << 32) - 1
_EMPTY = memoryview(b"")

Piece = bytes | memoryview


class Arena:
    """Rows of bytes: ``arena[row]`` is a read-only view (empty: none), ``arena[row] = data`` replaces
    it. ``len(arena)`` is the number of rows."""

    def __init__(self, capacity: int = 64, files: SlabFiles | None = None) -> None:
        self.at = np.zeros(capacity, np.int64)
        self.size = np.zeros(capacity, np.int32)
        self.slabs: list[mmap.mmap | None] = []  # a dropped slab's place is taken by the next new one
        self.views: list[memoryview | None] = []  # each slab's bytes, for slicing without NumPy
        self.used: list[int] = []  # bytes handed out of each slab
        self.live: list[int] = []  # bytes of each slab still some row's
        self.tail = -1  # the slab new regions go to
        self.spare: mmap.mmap | None = None  # the last slab dropped, kept for reuse until the next clean
        self.n = 0
        self.files = files  # None: anonymous slabs; set before the first slab is made

    # --- rows --------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.n

    def ensure_rows(self, n: int, capacity: int) -> None:
        """At least ``n`` rows, the columns sized for ``capacity`` (the caller's growth policy)."""
        if capacity > len(self.at):
            self.at = np.concatenate([self.at, np.zeros(capacity - len(self.at), np.int64)])
            self.size = np.concatenate([self.size, np.zeros(capacity - len(self.size), np.int32)])
        self.n = max(self.n, n)

    def __getitem__(self, row: int) -> memoryview:
        n = self.size.item(row)  # Python ints, no NumPy scalars: reads ask series by series
        if not n:
            return _EMPTY
        a = self.at.item(row)
        view = self.views[a >> 32]
        assert view is not None
        pos = a & _POS
        return view[pos : pos + n]

    def take(self, rows: np.ndarray) -> list[bytes]:
        """Copies of many rows' bytes, for a scan that joins them next. An mmap's slice is a bytes
        object, made in a third of a memoryview slice's time (a memoryview is tracked by the
        collector): 200,000 rows in ~50 ms against ~130-180 ms as views."""
        slabs = self.slabs
        return [slabs[a >> 32][(a & _POS) : (a & _POS) + n] if n else b""
                for a, n in zip(self.at[rows].tolist(), self.size[rows].tolist(), strict=True)]

    def __setitem__(self, row: int, data: Piece) -> None:
        """One row (Python scalars only: a chunk closed, a snapshot's row restored)."""
        n = len(data)
        self.clear(row)
        if not n:
            return
        s, base = self._room(n)
        self._write(s, base, data)
        self.at[row] = (s << 32) + base
        self.size[row] = n
        self.used[s] += n
        self.live[s] += n

    def clear(self, row: int) -> None:
        n = int(self.size[row])
        if n:
            s = int(self.at[row]) >> 32
            self.size[row] = 0
            self.live[s] -= n
            if self.live[s] == 0 and s != self.tail:
                self._drop(s)

    def _drop(self, s: int) -> None:
        """Give slab ``s`` up. A standard-sized one is kept as the spare: taking a new mapping's pages
        (the kernel zeroing each on first write) was a third of what the arena added to ingest."""
        view, slab = self.views[s], self.slabs[s]
        assert view is not None and slab is not None
        view.release()  # views handed out are slices of it and keep their own hold on the mapping
        if len(slab) == SLAB:
            self._set_spare(slab)
        else:
            self._let_go(slab)
        self.slabs[s] = self.views[s] = None
        self.used[s] = self.live[s] = 0

    def _new_slab(self, n: int) -> mmap.mmap:
        """Its own mapping, not the C heap (which serves even 4 MiB from its top): pages never written
        stay unallocated, and all go back to the system once it is dropped and no view is left. The
        spare is reused only when no view of it is left anywhere (a snapshot being written holds
        some): a mapping with buffers exported refuses a resize."""
        spare, self.spare = self.spare, None
        if spare is not None:
            if n <= len(spare):
                try:
                    spare.resize(len(spare))
                    return spare
                except BufferError:
                    pass
            self._let_go(spare)
        size = max(SLAB, n)
        made = self.files.map(size) if self.files is not None else None
        return made if made is not None else mmap.mmap(-1, size)

    def _set_spare(self, slab: mmap.mmap | None) -> None:
        if self.spare is not None:
            self._let_go(self.spare)
        self.spare = slab

    def _let_go(self, slab: mmap.mmap) -> None:
        """A slab the arena no longer holds: its file (if any) removed; the mapping itself goes
        when the last view of it does."""
        if self.files is not None:
            self.files.give_up(slab)

    def _evict(self, slab: mmap.mmap | None) -> None:
        """``slab``'s pages out of the resident set if it is a file's (its bytes stay: page cache)."""
        if slab is not None and self.files is not None and self.files.owns(slab):
            slab.madvise(mmap.MADV_DONTNEED)

    def settle(self) -> None:
        """Every file slab but the tail out of the resident set (pages reads faulted back in)."""
        for s, slab in enumerate(self.slabs):
            if s != self.tail:
                self._evict(slab)
        self._evict(self.spare)

    def _room(self, n: int) -> tuple[int, int]:
        """(slab, offset) of ``n`` free bytes at the end, a new slab started if the newest is short."""
        s = self.tail
        slab = self.slabs[s] if s >= 0 else None
        if slab is None or self.used[s] + n > len(slab):
            if s >= 0 and self.live[s] == 0:
                self._drop(s)
            else:
                self._evict(slab)  # full: no longer written to
            new = self._new_slab(n)
            s = next((i for i, x in enumerate(self.slabs) if x is None), len(self.slabs))
            if s == len(self.slabs):
                self.slabs.append(None)
                self.views.append(None)
                self.used.append(0)
                self.live.append(0)
            self.slabs[s] = new
            self.views[s] = memoryview(new).toreadonly()
            self.tail = s
        return s, self.used[s]

    def _write(self, s: int, base: int, data: Piece) -> None:
        slab = self.slabs[s]
        assert slab is not None
        slab[base : base + len(data)] = data

    # --- writing -----------------------------------------------------------------------------

    def put_many(self, rows: Sequence[int] | np.ndarray, pieces: Sequence[Piece],
                 sizes: np.ndarray | None = None) -> None:
        """Row ``rows[i]`` (distinct rows) becomes ``pieces[i]``, or with ``sizes`` the next pieces
        joined whose lengths add up to ``sizes[i]``: all in one new region at the end."""
        r = np.asarray(rows, np.int64)
        if sizes is None:
            sizes = np.fromiter(map(len, pieces), np.int64, count=len(pieces))
        total = int(sizes.sum())
        blob = b"".join(pieces)  # before the old regions are given up: pieces may be views of them
        if len(blob) != total:
            raise ValueError("the pieces do not add up to the sizes")
        self._forget(r)
        if not total:
            return
        s, base = self._room(total)
        self._write(s, base, blob)
        keep = sizes > 0
        self.at[r[keep]] = (s << 32) + base + (np.cumsum(sizes) - sizes)[keep]
        self.size[r] = sizes
        self.used[s] += total
        self.live[s] += total

    def _forget(self, rows: np.ndarray) -> None:
        """The regions of ``rows`` are dead; a slab left with none live is dropped."""
        had = rows[self.size[rows] > 0]
        if not len(had):
            return
        slab = self.at[had] >> 32
        dead = np.bincount(slab, weights=self.size[had]).astype(np.int64)
        self.size[had] = 0
        for s in np.flatnonzero(dead).tolist():
            self.live[s] -= int(dead[s])
            if self.live[s] == 0 and s != self.tail:
                self._drop(s)

    def grow(self, rows: np.ndarray, blob: Piece, offsets: np.ndarray) -> None:
        """Row ``rows[i]`` (distinct rows) becomes its bytes then ``blob[offsets[i]:offsets[i + 1]]``
        (a write's blocks appended to the open chunks it grows), all in one new region."""
        off = offsets.tolist()
        views = self.views
        pieces: list[Piece] = []
        add = pieces.append
        for a, n, o0, o1 in zip(self.at[rows].tolist(), self.size[rows].tolist(), off[:-1], off[1:], strict=True):
            if n:
                pos = a & _POS
                add(views[a >> 32][pos : pos + n])
            add(blob[o0:o1])
        self.put_many(rows, pieces, self.size[rows] + np.diff(offsets))

    def clean(self, max_dead: float = 0.125) -> int:
        """Move the live regions of every slab (but the newest) more than ``max_dead`` dead to the end,
        in row order; returns bytes moved. Their old slabs are then dropped, and with files the
        slabs but the tail leave the resident set (the moves read them)."""
        worn = [s for s in range(len(self.slabs)) if s != self.tail and self.slabs[s] is not None and
                self.used[s] - self.live[s] > max_dead * self.used[s]]
        self._set_spare(None)  # once a pass: a quiet store keeps no slab it does not use
        rows = np.flatnonzero((self.size[: self.n] > 0) & np.isin(self.at[: self.n] >> 32, worn))
        for k in range(0, len(rows), 4096):  # a few MiB at a time
            part = rows[k : k + 4096]
            self.grow(part, b"", np.zeros(len(part) + 1, np.int64))
        self.settle()
        return int(self.size[rows].sum())

    def freeze(self, rows: np.ndarray) -> Frozen:
        """``rows``' bytes as they are now, for a snapshot written later on another thread: their
        addresses and lengths copied and every slab held by a view of its own (regions are never
        written twice, so what they address stays). O(slabs) here, not a view a row: a row's view
        costs ~1 us and is tracked by the collector (200,000 rows were ~0.6 s of the owner's turn)."""
        return Frozen(self.at[rows].copy(), self.size[rows].astype(np.int64),
                      [v[:] if v is not None else None for v in self.views])

    # --- accounting --------------------------------------------------------------------------

    @property
    def live_bytes(self) -> int:
        return sum(self.live)

    @property
    def held_bytes(self) -> int:
        """Bytes of the slabs still held (handed out, live or dead, and the newest slab's rest)."""
        return sum(len(s) for s in self.slabs if s is not None)

    def _check(self) -> None:
        """Every region inside its slab, no two live ones overlapping, the per-slab counts right."""
        live = [0] * len(self.slabs)
        spans: dict[int, list[tuple[int, int]]] = {}
        for row in np.flatnonzero(self.size[: self.n]).tolist():
            a, n = int(self.at[row]), int(self.size[row])
            s, pos = a >> 32, a & _POS
            assert self.slabs[s] is not None and pos + n <= self.used[s], f"row {row} outside its slab"
            live[s] += n
            spans.setdefault(s, []).append((pos, pos + n))
        assert live == self.live, f"live counts {self.live} != {live}"
        for sp in spans.values():
            sp.sort()
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(sp)), "regions overlap"


class Frozen:
    """Rows' bytes frozen by :meth:`Arena.freeze`, read in row order. The slabs are held until
    :meth:`rows` with ``release`` has passed each one's last row, so a slab the store has since
    given up goes back to the system as soon as the writer is past it, not at the end."""

    def __init__(self, at: np.ndarray, size: np.ndarray, views: list[memoryview | None]) -> None:
        self.at = at
        self.size = size  # int64, the rows' lengths
        self._views = views

    def __len__(self) -> int:
        return len(self.size)

    def rows(self, release: bool = False) -> Iterator[memoryview]:
        """Each row's bytes (a view; empty for none), in order. With ``release``, each slab's hold
        is dropped after its last row (readable once then)."""
        views = self._views
        at, size = self.at.tolist(), self.size.tolist()
        last: dict[int, int] = {}
        if release:
            for i, (a, n) in enumerate(zip(at, size, strict=True)):
                if n:
                    last[a >> 32] = i  # rows in order: the last assignment is the last use
        for i, (a, n) in enumerate(zip(at, size, strict=True)):
            if not n:
                yield _EMPTY
                continue
            s = a >> 32
            view = views[s]
            assert view is not None, "a frozen row read after its slab was released"
            pos = a & _POS
            yield view[pos : pos + n]
            if release and last[s] == i:
                view.release()
                views[s] = None
        if release:
            self.release()

    def release(self) -> None:
        """Drop every slab still held (a snapshot abandoned, or written)."""
        for s, view in enumerate(self._views):
            if view is not None:
                view.release()
                self._views[s] = None
