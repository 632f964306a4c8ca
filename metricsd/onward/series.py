"""The series one sender may send, by id: whether each goes out (``write_relabel_configs`` may drop
it) and the bytes every request repeats for it, encoded once.

A series' 1.0 label fields, or its 2.0 label strings, are the same in every request that carries
it; encoding them per request was most of the send path's CPU (perf/RESULTS.md). Here they are
encoded once, when the sender first reads the series' labels in the buffer, into append-only
Arrow binary columns, and a request gathers its entries' bytes with one ``take``
(encode.py builds the rest of the request around them).

Bounded: a segment of the onward buffer declares every series it refers to before referring to it
(buffer.py), so a sender reading segment ``n`` may forget every series not declared in it: those
it meets again are declared again. It forgets only those not declared in ``n - 1`` either
(``forget_before``), so that the series in use, which each new segment declares again as they come,
are not decoded and encoded again at every segment. The table holds about the series of two
segments, however many series the process has seen. Not thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from metricsd.model import Labels
from metricsd.onward.encode import BINARY, binary_column, label_bytes_v1, one_sample_prefix
from metricsd.onward.idtable import IdTable

__all__ = ["BytesColumn", "SeriesTable"]

_NO_SLOT = -1
_MEMO_MIN = 256  # batches of at least this many ids have slots_sendable's answer kept ...
_MEMO_BATCHES = 512  # ... this many batches at most (about 9 MB at 2,000 ids a batch)


class BytesColumn:
    """An append-only column of byte strings: one NumPy buffer grown by doubling, and offsets.
    ``array()`` is an Arrow view of it (no copy), valid after later appends too."""

    def __init__(self) -> None:
        self._data = np.zeros(4096, np.uint8)
        self._offsets = np.zeros(1024, np.int64)
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def extend(self, items: Sequence[bytes]) -> None:
        if not items:
            return
        blob = b"".join(items)
        start = int(self._offsets[self.n])
        if start + len(blob) > len(self._data):
            grown = np.zeros(max(2 * len(self._data), start + len(blob)), np.uint8)
            grown[:start] = self._data[:start]
            self._data = grown
        if self.n + len(items) + 1 > len(self._offsets):
            grown_o = np.zeros(max(2 * len(self._offsets), self.n + len(items) + 1), np.int64)
            grown_o[: self.n + 1] = self._offsets[: self.n + 1]
            self._offsets = grown_o
        self._data[start:start + len(blob)] = np.frombuffer(blob, np.uint8)
        lengths = np.fromiter(map(len, items), np.int64, len(items))
        self._offsets[self.n + 1:self.n + 1 + len(items)] = start + np.cumsum(lengths)
        self.n += len(items)

    def array(self) -> pa.Array:
        end = int(self._offsets[self.n])
        return binary_column(self._data[:end], self._offsets[: self.n + 1])

    def take(self, rows: np.ndarray) -> pa.Array:
        arr = self.array()
        if len(rows) and int(rows[-1]) - int(rows[0]) == len(rows) - 1 and bool((np.diff(rows) == 1).all()):
            return arr.slice(int(rows[0]), len(rows))  # fast path: consecutive rows (a live request), no copy
        return arr.take(pa.array(rows, pa.int64()))

    @staticmethod
    def of(arr: pa.Array) -> BytesColumn:
        """A column holding the elements of a binary array."""
        col = BytesColumn()
        if len(arr):
            arr = arr.cast(BINARY)
            offsets = np.frombuffer(arr.buffers()[1], np.int64, len(arr) + 1, arr.offset * 8)
            data = np.frombuffer(arr.buffers()[2], np.uint8, int(offsets[-1]))
            col._data = data[int(offsets[0]):].copy()
            col._offsets = offsets - offsets[0]
            col.n = len(arr)
        return col


class SeriesTable:
    """Rows (slots) are appended as series are learned; ``ids`` maps a series id to its slot and
    the segment that last declared it."""

    def __init__(self, relabel: Callable[[Labels], Labels | None]) -> None:
        self.relabel = relabel
        self.ids = IdTable(slot=_NO_SLOT, declared=-1)
        self._labels: list[Labels | None] = []  # per slot, after relabelling; None: not sent
        self._send = np.zeros(0, bool)
        self._v1 = BytesColumn()  # per slot: label_bytes_v1, encoded up to len(self._v1)
        self._v1_one = BytesColumn()  # per slot: encode.one_sample_prefix of its _v1, up to len(self._v1_one)
        self._pairs: dict[tuple[str, str], bytes] = {}
        self._refs = BytesColumn()  # per slot: its symbols' indices, uint32 little-endian
        self._symbols: dict[str, int] = {"": 0}
        self._symbol_bytes = BytesColumn()
        self._symbol_bytes.extend([b""])
        self.learned = 0  # series decoded and encoded so far (a series forgotten and met again: twice)
        self._memo: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}  # slots_sendable's answers, by the ids' bytes

    def __len__(self) -> int:
        return len(self.ids)

    def learn(self, ids: np.ndarray, labels_at: Callable[[int], Labels], segment: int) -> int:
        """The series of one SERIES record of ``segment``: ``ids[i]``'s labels are ``labels_at(i)``,
        decoded and relabelled only for series not known yet. Returns how many were new."""
        rows = self.ids.add(ids)
        slot, declared = self.ids.cols["slot"], self.ids.cols["declared"]
        declared[rows] = np.maximum(declared[rows], segment)
        fresh = np.flatnonzero(slot[rows] == _NO_SLOT)
        if not len(fresh):
            return 0
        fresh = fresh[np.sort(np.unique(rows[fresh], return_index=True)[1])]  # an id twice in a record: once
        first = len(self._labels)
        self._labels += [self.relabel(labels_at(int(i))) for i in fresh]
        self._send = np.concatenate([self._send, np.array([lab is not None for lab in self._labels[first:]], bool)])
        slot[rows[fresh]] = np.arange(first, len(self._labels))
        self.learned += len(fresh)
        return len(fresh)

    def slots(self, ids: np.ndarray) -> np.ndarray:
        """Each id's slot; -1 for a series not learned."""
        rows = self.ids.find(ids)
        return np.where(rows >= 0, self.ids.cols["slot"][np.maximum(rows, 0)], _NO_SLOT) if len(self.ids) else rows

    def slots_sendable(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``slots(ids)`` and ``sendable`` of them, both read-only. A client sends each series in
        the same batch every interval, so the answer for a batch whose every series is learned is
        kept, keyed by the ids' bytes, until slots are renumbered (``forget_before``): the two
        gathers over the table (a cache miss an id) were half of reading a round back."""
        key = ids.tobytes() if len(ids) >= _MEMO_MIN else None
        got = self._memo.get(key) if key is not None else None
        if got is not None:
            return got
        slots = self.slots(ids)
        out = slots, self.sendable(slots)
        if key is not None and bool((slots >= 0).all()):  # a series learned later would change it
            for a in out:
                a.setflags(write=False)
            if len(self._memo) >= _MEMO_BATCHES:
                self._memo.clear()
            self._memo[key] = out
        return out

    def sendable(self, slots: np.ndarray) -> np.ndarray:
        """A bool per slot: learned, and not dropped by relabelling."""
        return (slots >= 0) & self._send[np.maximum(slots, 0)] if len(self._send) else np.zeros(len(slots), bool)

    def labels(self, slot: int) -> Labels | None:
        return self._labels[slot]

    def v1(self, slots: np.ndarray) -> pa.Array:
        """Each slot's 1.0 label fields (encode.label_bytes_v1), as a binary array."""
        todo = self._labels[len(self._v1):]
        if todo:
            pairs = self._pairs
            self._v1.extend([b"" if lab is None else b"".join([pairs.get(p) or self._pair(p) for p in lab])
                             for lab in todo])
        return self._v1.take(slots)

    def v1_one(self, slots: np.ndarray) -> pa.Array:
        """Each slot's encode.one_sample_prefix (the live shape's requests: one sample a series)."""
        if len(self._v1_one) < len(self._labels):
            self.v1(np.zeros(0, np.int64))  # the label bytes of every slot first
            arr = self._v1.array()
            self._v1_one.extend([one_sample_prefix(arr[i].as_py()) for i in range(len(self._v1_one), len(arr))])
        return self._v1_one.take(slots)

    def _pair(self, pair: tuple[str, str]) -> bytes:
        """One label's 1.0 field, kept: series share most of their labels (namespace, node, ...)."""
        b = self._pairs[pair] = label_bytes_v1((pair,))
        return b

    def v2(self, slots: np.ndarray) -> tuple[pa.Array, np.ndarray, np.ndarray]:
        """For encode.encode_v2: the symbols table, and each slot's symbol indices with their counts."""
        todo = self._labels[len(self._refs):]
        if todo:
            known = len(self._symbols)
            refs = [np.array([self._symbols.setdefault(s, len(self._symbols)) for pair in (lab or ()) for s in pair],
                             "<u4").tobytes() for lab in todo]
            self._symbol_bytes.extend([s.encode() for s in list(self._symbols)[known:]])
            self._refs.extend(refs)
        got = self._refs.take(slots)
        offsets = np.frombuffer(got.buffers()[1], np.int64, len(got) + 1, got.offset * 8)
        flat = np.frombuffer(got.buffers()[2], "<u4", int(offsets[-1] - offsets[0]) // 4, int(offsets[0])) \
            if len(got) and offsets[-1] > offsets[0] else np.zeros(0, "<u4")
        return self._symbol_bytes.array(), flat.astype(np.int64), np.diff(offsets) // 4

    def forget_before(self, segment: int) -> int:
        """Forget the series no segment from ``segment`` on has declared; returns how many. The
        slots of the others are renumbered (their encoded bytes kept)."""
        keep = self.ids.cols["declared"] >= segment
        dropped = len(self.ids.keep(keep))
        if not dropped:
            return 0
        self._memo.clear()  # slots are renumbered below
        live = self.ids.rows()
        old = self.ids.cols["slot"][live]
        order = np.argsort(old, kind="stable")
        kept_slots = old[order]
        new_slot = np.empty(len(old), np.int64)
        new_slot[order] = np.arange(len(old))
        self.ids.cols["slot"][live] = new_slot
        self._labels = [self._labels[i] for i in kept_slots.tolist()]
        self._send = self._send[kept_slots]
        encoded = kept_slots[kept_slots < len(self._v1)]
        self._v1 = BytesColumn.of(self._v1.take(encoded))
        self._v1_one = BytesColumn.of(self._v1_one.take(kept_slots[kept_slots < len(self._v1_one)]))
        self._pairs = {}
        # 2.0 symbols are renumbered from scratch (strings of forgotten series go with them).
        self._refs, self._symbols, self._symbol_bytes = BytesColumn(), {"": 0}, BytesColumn()
        self._symbol_bytes.extend([b""])
        return dropped
