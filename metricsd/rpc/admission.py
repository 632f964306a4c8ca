"""Samples a live write may not store, taken out of the batch before it reaches a series.

A sender whose clock runs a day ahead writes samples stamped tomorrow. Stored, one such sample
makes its series refuse every real-time sample after it as too old (older than the series'
newest minus the out-of-order window) until the wall clock catches up, and moves the store's
newest timestamp, from which retention counts, a day on. So a receiver refuses samples more than
``max_future_ms`` (``--max-future``, default 10 minutes, as Prometheus' remote-write receiver)
after its own clock, before anything else looks at the batch; a store also refuses samples older
than anything it keeps (``min_ts_ms``: its newest sample minus its retention), which the next
retention pass would drop. A series left with no sample is left out, labels and all, so a
refused sample never creates a series.

Only live writes go through here: WAL replay and catch-up from peers restore samples that were
acknowledged already, whatever the clock says now.

:func:`split_refused` is pure (the clock is passed in) and costs a min and a max over the batch's
timestamps when it has nothing to refuse (it is returned unchanged); a store passes the timestamps
it converts for the write anyway (perf/bench_admission.py measures it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from metricsd.durations import format_duration_ms
from metricsd.model import Limits
from metricsd.proto import metricsd_pb2 as pb

__all__ = ["DEFAULT_MAX_FUTURE_MS", "PREFIX", "Refusal", "format_ts", "refused_sentence", "split_refused"]

DEFAULT_MAX_FUTURE_MS = 10 * 60 * 1000
_LIMITS = Limits()


@dataclass(frozen=True)
class Refusal:
    """Samples taken out of a batch, by reason, and why (a phrase per reason, with an example)."""

    too_far_ahead: int = 0
    too_old: int = 0
    message: str = ""

    @property
    def samples(self) -> int:
        return self.too_far_ahead + self.too_old

    def add_to(self, resp: pb.WriteResponse) -> pb.WriteResponse:
        """``resp`` (what the store made of the rest) with these samples counted in it."""
        resp.rejected_too_far_ahead += self.too_far_ahead
        resp.rejected_too_old += self.too_old
        resp.refused = refused_sentence(self.message, resp.refused)
        return resp


PREFIX = "samples refused: "


def refused_sentence(*parts: str) -> str:
    """One ``refused`` text from several (each with or without the prefix), empty ones left out."""
    kept = [p.removeprefix(PREFIX) for p in parts if p]
    return PREFIX + "; ".join(kept) if kept else ""


def format_ts(ts_ms: int) -> str:
    """A timestamp as UTC ISO 8601 to the second, or the raw number when out of the calendar."""
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts_ms / 1000))
    except (OverflowError, OSError, ValueError):
        return f"{ts_ms} ms"


def _series_name(request: pb.WriteRequest, sid: int) -> str:
    for s in request.series:
        if s.id == sid:
            return "{" + ", ".join(f'{lab.name}="{lab.value}"' for lab in s.labels) + "}"
    return f"id {sid:#x}"


def split_refused(request: pb.WriteRequest, now_ms: int, max_future_ms: int | None,
                  min_ts_ms: int | None = None, clock_name: str = "the receiver's clock",
                  limits: Limits = _LIMITS, timestamps: np.ndarray | None = None
                  ) -> tuple[pb.WriteRequest, Refusal | None]:
    """``request`` without its samples stamped after ``now_ms + max_future_ms`` (None: no limit) or
    before ``min_ts_ms`` (None: no limit), and what was taken out (None: nothing, and ``request``
    is returned as it came). Series left with no sample lose their entry and their labels.

    A malformed batch (lengths that do not add up) or one with a timestamp outside ``limits``
    (seconds or nanoseconds sent as milliseconds) is returned as it came: validation refuses it
    whole with INVALID_ARGUMENT, which says more than a count of refused samples.

    ``timestamps``: the request's timestamps as int64, when the caller has them already (the
    conversion from the proto field is most of this function's cost)."""
    if not len(request.timestamps):
        return request, None
    ts = np.array(request.timestamps, dtype=np.int64) if timestamps is None else timestamps
    latest = None if max_future_ms is None else now_ms + max_future_ms
    lo, hi = int(ts.min()), int(ts.max())
    if (latest is None or hi <= latest) and (min_ts_ms is None or lo >= min_ts_ms):
        return request, None  # the live path: nothing to refuse
    counts = np.array(request.counts, dtype=np.int64)
    if (lo < limits.min_timestamp_ms or hi > limits.max_timestamp_ms or len(counts) != len(request.ids)
            or len(request.values) != len(ts) or int(counts.sum()) != len(ts) or bool((counts < 0).any())):
        return request, None  # for validation to refuse whole
    ahead = ts > latest if latest is not None else np.zeros(len(ts), dtype=bool)
    old = (ts < min_ts_ms) & ~ahead if min_ts_ms is not None else np.zeros(len(ts), dtype=bool)  # counted once
    keep = ~(ahead | old)
    ids = np.array(request.ids, dtype=np.uint64)
    series_of = np.repeat(np.arange(len(ids)), counts)
    kept = np.bincount(series_of[keep], minlength=len(ids))
    keep_series = (kept > 0) | (counts == 0)
    out = pb.WriteRequest(ids=ids[keep_series].tolist(), counts=kept[keep_series].tolist(),
                          timestamps=ts[keep].tolist(),
                          values=np.array(request.values, dtype=np.float64)[keep].tolist())
    wanted = {int(i) for i in ids[keep_series].tolist()}
    out.series.extend(s for s in request.series if s.id in wanted)
    parts = []
    n_ahead, n_old = int(ahead.sum()), int(old.sum())
    if n_ahead:
        i = int(np.flatnonzero(ahead)[0])
        parts.append(f"{n_ahead} too far ahead: more than {format_duration_ms(max_future_ms or 0)} after "
                     f"{clock_name} ({format_ts(now_ms)}), e.g. {_series_name(request, int(ids[series_of[i]]))} at "
                     f"{format_ts(int(ts[i]))}; is the sender's clock right?")
    if n_old:
        i = int(np.flatnonzero(old)[0])
        parts.append(f"{n_old} too old: before {format_ts(min_ts_ms or 0)}, the oldest time the store keeps (its "
                     f"newest sample minus its retention), e.g. {_series_name(request, int(ids[series_of[i]]))} at "
                     f"{format_ts(int(ts[i]))}")
    return out, Refusal(n_ahead, n_old, "; ".join(parts))
