"""A sender's repeated request, recognised as one byte comparison instead of a lookup a series.

A remote-write sender with a steady set of series (vmagent, a Prometheus shard, an exporter
pushing every interval) sends the same series in the same order request after request: the
bodies differ only in their samples. The receiver's series cache (remote_write.py SeriesCache)
still pays a bytes object and a dict lookup a series for such a request (~0.2 us each, ~40% of
a store's CPU on a 2,000-series live request, perf/RESULTS.md issue 24 session 36).

So the scan's shortcut for cached series (remote_write_scan.py ``_known_layout``) records the
request's layout: the decompressed body with its sample runs zeroed, where each series' sample
run lies, and the ids the cache gave. A later body of the same length whose first series has the
same label bytes is compared with it in three NumPy calls (copy, zero its sample runs at the
recorded places, compare); when every byte outside the sample runs is equal and the sample runs
are the usual uniform sample fields (``_uniform_samples``, which checks every field's tag, size
and varint), protobuf would split it into the same series with the same label bytes, so the ids
are the recorded ones: the result equals the scan's, samples decoded from the new body.

A layout is recorded only from a request whose series were all in the cache, so it says no more
than the cache did ("labels checked, the backend had them"); it is forgotten whenever the cache
drops entries. Only a layout seen twice is kept (the first time its key alone is noted): a
backfill sends each request's series once or twice, and keeping those bodies cost a proxy 32 MiB
for nothing. Bounded in entries and bytes (the bodies kept); the oldest recorded goes first.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

from metricsd.http.remote_write_scan import Scanned, TooLarge, first_label_end
from metricsd.http.remote_write_table import uniform_samples
from metricsd.rpc.limits import RequestLimits, check_counts

__all__ = ["DEFAULT_LAYOUTS", "DEFAULT_LAYOUT_BYTES", "LayoutMemo"]

DEFAULT_LAYOUTS = 64
"""Layouts kept: the distinct requests senders repeat (the benchmark's 40,000 series in 2,000-series
requests are 20)."""

DEFAULT_LAYOUT_BYTES = 16 * 1024 * 1024
"""Bytes of recorded layouts kept at most (a 2,000-series live body is ~390 KB decompressed, its
layout ~0.5 MB with the ids and positions)."""


@dataclass(frozen=True)
class _Layout:
    body: np.ndarray  # uint8: the recorded body, its sample runs zeroed
    run: np.ndarray  # int64: 0 .. tail - 1, the bytes of a sample run (every series' is as long)
    label_end: np.ndarray  # int64: where each series' sample run begins in the body
    ends: np.ndarray  # int64: where each series ends
    starts: np.ndarray  # int64: where each series' label bytes begin
    found: list[int]  # each series' id
    found_array: np.ndarray | None  # the same as uint64 when every id is distinct and none dropped


class _Keys(Sequence[bytes]):
    """A recorded layout's label bytes of each series, cut from the body when asked for (only a
    backend that forgot series, or a rule's drop, asks): no bytes object a series on a hit."""

    def __init__(self, layout: _Layout) -> None:
        self._layout = layout

    def __len__(self) -> int:
        return len(self._layout.starts)

    @overload
    def __getitem__(self, i: int) -> bytes: ...
    @overload
    def __getitem__(self, i: slice) -> list[bytes]: ...

    def __getitem__(self, i: int | slice) -> bytes | list[bytes]:
        lay = self._layout
        if isinstance(i, slice):
            return [self[j] for j in range(len(self))[i]]
        s, e = int(lay.starts[i]), int(lay.label_end[i])
        return lay.body[s:e].tobytes()

    def __iter__(self) -> Iterator[bytes]:
        body = self._layout.body
        for s, e in zip(self._layout.starts.tolist(), self._layout.label_end.tolist(), strict=True):
            yield body[s:e].tobytes()


def _key(raw: bytes) -> tuple[int, bytes] | None:
    """(length, the first series' label bytes): which recorded layout a body may repeat."""
    if len(raw) < 3 or raw[0] != 0x0A:
        return None
    n1 = raw[1]
    if n1 < 0x80:
        start, size = 2, n1
    elif raw[2] < 0x80:
        start, size = 3, (n1 & 0x7F) | raw[2] << 7
    else:
        start, size = 4, (n1 & 0x7F) | (raw[2] & 0x7F) << 7 | raw[3] << 14
    if start + size > len(raw):
        return None
    first = raw[start : start + size] + bytes(3)  # a label field's header read past the end reads padding
    end = first_label_end(first, size)
    if end is None or end > size:
        return None
    return len(raw), first[:end]


def _varint_sizes(n: np.ndarray) -> np.ndarray:
    """Bytes of the shortest varint of each (non-negative) ``n``."""
    size = np.ones(len(n), dtype=np.int64)
    for bits in (7, 14, 21, 28, 35, 42, 49, 56, 63):
        size += n >= (1 << bits)
    return size


class LayoutMemo:
    """Not safe for concurrent use (the event loop thread, as the cache it belongs to)."""

    def __init__(self, max_layouts: int = DEFAULT_LAYOUTS, max_bytes: int = DEFAULT_LAYOUT_BYTES) -> None:
        self.max_layouts = max_layouts
        self.max_bytes = max_bytes
        self.hits = 0  # requests recognised as a recorded layout
        self.misses = 0  # requests of a warm cache looked up and not recognised (no layout, or one that differs)
        self._bytes = 0
        self._layouts: dict[tuple[int, bytes], _Layout] = {}
        self._seen: dict[tuple[int, bytes], None] = {}  # keys noted once, not yet recorded

    def __len__(self) -> int:
        return len(self._layouts)

    @property
    def size_bytes(self) -> int:
        """About the bytes the recorded layouts hold (what ``max_bytes`` bounds)."""
        return self._bytes

    def clear(self) -> None:
        self._layouts.clear()
        self._seen.clear()
        self._bytes = 0

    def match(self, raw: bytes, limits: RequestLimits | None = None) -> Scanned | None:
        """The scan of ``raw`` when it repeats a recorded layout (see the module docstring), else
        None. Raises TooLarge for more series than ``limits`` allow, as the scan does."""
        found = self._match(raw, limits)
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found

    def _match(self, raw: bytes, limits: RequestLimits | None) -> Scanned | None:
        if not self._layouts:
            return None
        key = _key(raw)
        lay = self._layouts.get(key) if key is not None else None
        if lay is None:
            return None
        cur = np.frombuffer(raw, dtype=np.uint8)
        masked = cur.copy()
        masked[lay.label_end[:, None] + lay.run] = 0
        if not np.array_equal(masked, lay.body):
            return None
        refusal = check_counts(len(lay.ends), 0, limits) if limits is not None else None
        if refusal is not None:
            raise TooLarge(refusal)
        uniform = uniform_samples(cur, lay.label_end, lay.ends)
        if uniform is None:
            return None
        return Scanned(_Keys(lay), *uniform, found=lay.found, found_array=lay.found_array)

    def record(self, raw: bytes, starts: np.ndarray, label_end: np.ndarray, ends: np.ndarray, found: list[int]) -> None:
        """Remember the layout of ``raw`` as the scan found it: series i's label bytes at
        [starts[i], label_end[i]) and its sample run up to ends[i] of the series laid end to end
        (the scan's ``joined``), every run ``tail`` bytes. Recorded only when the body is nothing
        but its series, each framed by a shortest-form length (then positions in the body follow
        from the lengths alone)."""
        if 2 * len(raw) > self.max_bytes or self.max_layouts < 1:
            return
        key = _key(raw)
        if key is None or key in self._layouts:
            return
        if key not in self._seen:  # the first time: the key alone
            if len(self._seen) >= 4 * self.max_layouts:
                self._seen.clear()
            self._seen[key] = None
            return
        del self._seen[key]
        size = ends - starts
        raw_end = np.cumsum(1 + _varint_sizes(size) + size)
        if int(raw_end[-1]) != len(raw):  # another top-level field, or a length not in its shortest form
            return
        raw_start = raw_end - size
        tail = int(ends[0] - label_end[0])
        if tail <= 0 or bool(((ends - label_end) != tail).any()):
            return
        body = np.frombuffer(raw, dtype=np.uint8).copy()
        if bool((body[raw_start - _varint_sizes(size) - 1] != 0x0A).any()):
            return
        lab_end = raw_start + (label_end - starts)
        run = np.arange(tail)
        body[lab_end[:, None] + run] = 0
        distinct = min(found) >= 0 and len(set(found)) == len(found)
        lay = _Layout(body, run, lab_end, raw_end, raw_start, list(found),
                      np.array(found, dtype=np.uint64) if distinct else None)
        self._layouts[key] = lay
        self._bytes += _size(lay)
        while self._layouts and (len(self._layouts) > self.max_layouts or self._bytes > self.max_bytes):
            self._bytes -= _size(self._layouts.pop(next(iter(self._layouts))))


def _size(lay: _Layout) -> int:
    """About the bytes a layout holds: its body, its arrays and its ids (an int object each)."""
    arrays = lay.label_end.nbytes + lay.ends.nbytes + lay.starts.nbytes
    return len(lay.body) + arrays + 40 * len(lay.found) + (lay.found_array.nbytes if lay.found_array is not None else 0)
