"""The one question the PromQL engine asks of storage: "which series match, and their samples in a range".

The engine never sees shards, chunks or replicas. The store (and the proxy that fans out to a
quorum of stores) implements :class:`SeriesSource`; tests and the script runner use
:class:`MemorySource`. Stale markers are ordinary samples here (their NaN payload is
``STALE_NAN_BITS``); the engine decides what they mean.

The answer is columnar (metricsd/columns.py: label codes and flat sample arrays), so a selection
of 50,000 series reaches the evaluator without an object per series.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from metricsd.columns import SeriesColumns
from metricsd.model import Labels
from metricsd.selector import Matcher, matches_all

__all__ = ["MemorySource", "SeriesData", "SeriesSource", "stale_mask"]

_STALE_BITS = np.uint64(0x7FF0000000000002)


@dataclass(frozen=True)
class SeriesData:
    labels: Labels  # includes "__name__"
    timestamps: np.ndarray  # int64 ms, strictly increasing
    values: np.ndarray  # float64; stale markers included as samples


class SeriesSource(Protocol):
    def select_columns(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> SeriesColumns:
        """Series matching every matcher, with their samples in ``[start_ms, end_ms]`` (inclusive),
        in any order.

        Series with no sample in the range may be left out.
        """
        ...


def stale_mask(values: np.ndarray) -> np.ndarray:
    """Which values are stale markers (exact bit pattern, not just any NaN)."""
    return np.asarray(values, dtype=np.float64).view(np.uint64) == _STALE_BITS


class MemorySource:
    """A dict of series held in memory; a reference oracle for the real store and the test runner.

    Not safe to use concurrently with writes.
    """

    def __init__(self) -> None:
        self._series: dict[Labels, tuple[np.ndarray, np.ndarray]] = {}

    def add(self, labels: Labels, timestamps: Iterable[int], values: Iterable[float]) -> None:
        """Merge samples into a series; a sample at an existing timestamp replaces the old one."""
        ts = np.asarray(list(timestamps) if not isinstance(timestamps, np.ndarray) else timestamps, dtype=np.int64)
        vs = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=np.float64)
        if ts.shape != vs.shape:
            raise ValueError(f"{len(ts)} timestamps but {len(vs)} values")
        old = self._series.get(labels)
        if old is not None:
            ts = np.concatenate([old[0], ts])
            vs = np.concatenate([old[1], vs])
        # Keep the last write per timestamp: stable sort, then take the last of each run.
        order = np.argsort(ts, kind="stable")
        ts, vs = ts[order], vs[order]
        if ts.size > 1:
            keep = np.ones(ts.size, dtype=bool)
            keep[:-1] = ts[1:] != ts[:-1]
            ts, vs = ts[keep], vs[keep]
        self._series[labels] = (ts, vs)

    def clear(self) -> None:
        self._series.clear()

    def __len__(self) -> int:
        return len(self._series)

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        out: list[SeriesData] = []
        for labels, (ts, vs) in self._series.items():
            if not matches_all(matchers, labels):
                continue
            lo = int(np.searchsorted(ts, start_ms, side="left"))
            hi = int(np.searchsorted(ts, end_ms, side="right"))
            if hi > lo:
                out.append(SeriesData(labels, ts[lo:hi], vs[lo:hi]))
        return out

    def select_columns(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> SeriesColumns:
        found = self.select(matchers, start_ms, end_ms)
        return SeriesColumns.from_arrays([s.labels for s in found], [s.timestamps for s in found],
                                         [s.values for s in found])
