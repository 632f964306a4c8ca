"""A store's whole state keyed by series id (not row), bit-exact, for comparing stores across restarts."""

from __future__ import annotations

import numpy as np

from metricsd.store.engine import Store


def _bits(a: np.ndarray) -> list[int]:
    return np.ascontiguousarray(a, dtype=np.float64).view(np.int64).tolist()


def canonical(store: Store) -> dict[str, object]:
    series: dict[int, object] = {}
    h = store.head
    for row in store.index.live_rows():
        sid = store.index.ids[row]
        c = int(h.count[row])
        t, v = store.series_samples(row, -(2**62), 2**62)
        rp = store.rollups.points(row, -(2**62), 2**62)
        ch = store.chunks[row]
        series[sid] = {
            "labels": store.index.labels[row],
            "samples": (t.tolist(), _bits(v)),
            "head": (c, int(h.sealed[row]), int(h.last_ts[row]), int(h.chunk_max_ts[row]), h.ts[row, :c].tolist(),
                     _bits(h.vals[row, :c])),
            "chunks": (bytes(ch.data), ch.time_index().tolist(), ch.samples),
            "rollups": (rp.hour.tolist(), _bits(rp.min), _bits(rp.max), _bits(rp.sum), _bits(rp.count),
                        _bits(rp.last)),
        }
    return {"series": series, "max_ts": int(store.max_ts), "samples_written": store.samples_written,
            "rejected": {k: v for k, v in store.rejected.items() if v}, "stats": store.stats()}


def assert_same_state(got: Store, want: Store) -> None:
    """Equal state, bit for bit, and every engine invariant holds in both."""
    want._check()
    got._check()
    a, b = canonical(got), canonical(want)
    assert a["series"].keys() == b["series"].keys()  # type: ignore[attr-defined]
    for sid, want_s in b["series"].items():  # type: ignore[attr-defined]
        got_s = a["series"][sid]  # type: ignore[index]
        for key in want_s:
            assert got_s[key] == want_s[key], f"series {sid:#x}: {key} differs"
    assert a == b
