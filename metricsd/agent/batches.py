"""Columnar Write batches from a block of samples: what an agent sends over gRPC each interval.

A block is T ticks of S series (``values[T, S]``, one shared timestamp per tick, as a scrape or a
simulator tick produces). The proto wants samples series after series, so a batch takes a slice of
the columns and transposes it; ids and values, the bulk of a batch, go in as packed bytes straight
from NumPy, so nothing loops per sample in Python.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import numpy as np

from metricsd.model import Labels
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import length_delimited, varint

__all__ = ["SeriesSource", "write_requests"]


class SeriesSource(Protocol):
    """Anything with a fixed list of series and their ids, index i = column i (a Simulator)."""

    @property
    def series(self) -> Sequence[Labels]: ...

    @property
    def series_ids(self) -> np.ndarray: ...


def write_requests(
    sim: SeriesSource,
    ts: int | np.ndarray,
    values: np.ndarray,
    max_samples: int = 1000,
    send_labels_for: Iterable[int] | None = None,
) -> list[pb.WriteRequest]:
    """Split a tick (``ts`` an int, ``values[S]``) or a block (``ts[T]``, ``values[T, S]``) into
    WriteRequests of at most ``max_samples`` samples each (at least one series each).

    ``send_labels_for`` holds the series indices whose labels go with them (a first send, or the
    ids a receiver reported unknown); None sends every series' labels, an empty set none (the
    live path). Requests come in time order, so each series' timestamps increase across them.
    Raises ValueError when the shapes do not agree."""
    if max_samples < 1:
        raise ValueError(f"max_samples must be at least 1, got {max_samples}")
    stamps = np.atleast_1d(np.asarray(ts, dtype=np.int64))
    block = np.asarray(values, dtype=np.float64)
    if block.ndim == 1:
        block = block[np.newaxis, :]
    ids = np.asarray(sim.series_ids, dtype="<u8")
    if block.ndim != 2 or block.shape != (len(stamps), len(ids)):
        raise ValueError(f"values of shape {block.shape} do not match {len(stamps)} timestamps x {len(ids)} series")
    n_ticks, n_series = block.shape
    labelled = (
        np.arange(n_series) if send_labels_for is None else np.unique(np.fromiter(send_labels_for, dtype=np.int64))
    )
    per_time = max(1, min(n_ticks, max_samples))
    per_batch = max(1, max_samples // per_time)
    out: list[pb.WriteRequest] = []
    cache: dict[tuple[str, str], bytes] = {}
    for t0 in range(0, n_ticks, per_time):
        chunk = block[t0 : t0 + per_time]
        span = stamps[t0 : t0 + per_time].tolist()
        # Every series of the chunk repeats the same counts entry and timestamps: encode them once.
        count_bytes = varint(len(span))
        span_bytes = b"".join(varint(t & 0xFFFFFFFFFFFFFFFF) for t in span)
        for s0 in range(0, n_series, per_batch):
            s1 = min(s0 + per_batch, n_series)
            cols = np.ascontiguousarray(chunk[:, s0:s1].T, dtype="<f8")
            wire = [  # WriteRequest fields 1-4 of proto/metricsd.proto, packed
                length_delimited(1, ids[s0:s1].tobytes()),
                length_delimited(2, count_bytes * (s1 - s0)),
                length_delimited(3, span_bytes * (s1 - s0)),
                length_delimited(4, cols.tobytes()),
            ]
            lo, hi = np.searchsorted(labelled, [s0, s1])
            wire.extend(_series_labels(int(ids[i]), sim.series[i], cache) for i in labelled[lo:hi].tolist())
            out.append(pb.WriteRequest.FromString(b"".join(wire)))
    return out


def _series_labels(sid: int, labels: Labels, cache: dict[tuple[str, str], bytes]) -> bytes:
    """WriteRequest.series entry (field 5): SeriesLabels{id = 1 fixed64, labels = 2 Label{name, value}}.

    Label pairs repeat across series (names, namespaces, nodes, a pod's several metrics), so their
    encodings are cached for the call."""
    body = [b"\x09", sid.to_bytes(8, "little")]
    for pair in labels:
        enc = cache.get(pair)
        if enc is None:
            label = length_delimited(1, pair[0].encode()) + length_delimited(2, pair[1].encode())
            enc = cache[pair] = length_delimited(2, label)
        body.append(enc)
    return length_delimited(5, b"".join(body))
