"""A store's whole state keyed by series id (not row), bit-exact, for comparing stores across restarts."""

from __future__ import annotations

import numpy as np

from metricsd.store.engine import Store


def _bits(a: np.ndarray) -> list[int]:
    return np.ascontiguousarray(a, dtype=np.float64).view(np.int64).tolist()


def canonical(store: Store) -> dict[str, object]:
    series: dict[int, object] = {}
    h, c = store.head, store.chunks
    for row in store.index.live_rows():
        sid = store.index.ids[row]
        t, v = store.series_samples(row, -(2**62), 2**62)
        rp = store.rollups.points(row, -(2**62), 2**62)
        ht, hv = h.samples(row)
        series[sid] = {
            "labels": store.index.labels[row],
            "samples": (t.tolist(), _bits(v)),
            "head": (int(h.filled[row]), int(h.unsealed[row]), int(h.last_ts[row]), ht.tolist(), _bits(hv)),
            "chunks": (c.data[row], c.open[row], c.entries(row).tolist(), int(c.samples[row]), int(c.max_ts[row])),
            "chain": (int(c.t2[row]), _bits(np.array([c.v1[row], c.v2[row]])), int(c.shift[row]),
                      int(c.family[row])),
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
