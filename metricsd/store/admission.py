"""What a store refuses of a live write before it reaches a series, and how it says so.

The pure split is metricsd/rpc/admission.py; here are the store's limits (its clock plus
``max_future_ms``; its newest sample minus what it keeps) and the answer's ``refused`` sentence,
which also explains the samples the engine itself turned away as too old for their series'
out-of-order window (store/engine.py). Refused samples are counted in ``Store.refused`` by reason
(Stats.rejected), never logged to the WAL and never stored.
"""

from __future__ import annotations

import numpy as np

from metricsd.durations import format_duration_ms
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.admission import Refusal, refused_sentence, split_refused
from metricsd.rpc.columns import WriteColumns
from metricsd.store.engine import Store

__all__ = ["admit", "admit_columns", "admits_all", "answer"]

_NO_TS = int(np.iinfo(np.int64).min)


def admit(store: Store, request: pb.WriteRequest, now_ms: int, timestamps: np.ndarray | None = None
          ) -> tuple[pb.WriteRequest, Refusal | None]:
    """``request`` without the samples the store refuses outright, and what they were (``request``
    itself and None when nothing is refused). ``timestamps``: its timestamps as int64, if at hand."""
    s = store.settings
    kept, refusal = split_refused(request, now_ms, s.max_future_ms, _min_ts(store), "the store's clock", s.limits,
                                  timestamps)
    if refusal is not None:
        store.refused["too_far_ahead"] += refusal.too_far_ahead
        store.refused["too_old"] += refusal.too_old
    return kept, refusal


def admit_columns(store: Store, batch: WriteColumns, now_ms: int) -> tuple[WriteColumns, Refusal | None]:
    """admit() of a columnar batch (remote write, a store's write entry). With nothing to refuse,
    the usual case, it costs a min and a max over the timestamps and returns ``batch`` itself;
    otherwise the batch goes through admit() as a message (a sender's clock ahead, data older than
    the store keeps: rare, and the answer is a 400 anyway)."""
    ts = batch.timestamps
    if admits_all(store, ts, now_ms):
        return batch, None
    kept, refusal = admit(store, batch.to_request(), now_ms, ts)
    return (batch, None) if refusal is None else (WriteColumns.of_request(kept), refusal)


def admits_all(store: Store, timestamps: np.ndarray, now_ms: int) -> bool:
    """Whether the store takes every one of ``timestamps`` (none too far ahead of ``now_ms``, none
    older than it keeps): a min and a max, nothing counted."""
    if not len(timestamps):
        return True
    future_ms = store.settings.max_future_ms
    min_ts = _min_ts(store)
    return ((future_ms is None or int(timestamps.max()) <= now_ms + future_ms)
            and (min_ts is None or int(timestamps.min()) >= min_ts))


def _min_ts(store: Store) -> int | None:
    """The oldest timestamp the store keeps (its newest sample minus its retention), if it holds any."""
    s = store.settings
    return None if store.max_ts == _NO_TS else int(store.max_ts) - max(s.retention_ms, s.rollup_retention_ms)


def answer(resp: pb.WriteResponse, refusal: Refusal | None, store: Store) -> pb.WriteResponse:
    """The write's response with the refused samples counted and explained."""
    if resp.rejected_too_old:
        window = format_duration_ms(store.settings.ooo_window_ms)
        resp.refused = refused_sentence(f"{resp.rejected_too_old} too old for their series: older than its newest "
                                        f"sample by more than the out-of-order window ({window})")
    return refusal.add_to(resp) if refusal is not None else resp
