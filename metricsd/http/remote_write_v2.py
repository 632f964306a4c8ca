"""Reading a decompressed ``io.prometheus.write.v2.Request`` (remote write 2.0) into the entries
the 1.0 path uses (:class:`~metricsd.http.remote_write_scan.Scanned`), so that the series cache,
the relabel rules, the fallbacks and the write itself are one code path for both versions.

2.0 sends every string once per request in ``symbols`` and a series' labels as pairs of
references into it (``labels_refs``). References are request-local, so a series' cache key cannot
be the bytes as sent: it is the series' labels spelt as 1.0 label fields, built from per-symbol
pieces (one join per series, no label parsing), which :func:`remote_write._raw_labels` reads
like any 1.0 key. protobuf's C parser splits the message; samples are gathered with one Python
step each (a sender's live traffic is one sample per series, so about one step per series).

Hostile input: the body is bounded before this runs (snappy's declared length), the caller
checks series and sample counts (:func:`counts`) before anything is built, and a reference past
the symbols table, an odd number of references or a series with samples but no labels raise
DecodeError naming the series; nothing here loops longer than the message is big.

Created timestamps (``TimeSeries.created_timestamp`` of specification 2.0-rc.4, and
``Sample.start_timestamp`` of later senders) are read; with ``created_zero`` a counter's creation
is stored as a 0 sample at that time before its first sample (Prometheus' created-timestamp
zero ingestion), so ``increase()`` over a counter born inside the window counts from zero.
Histograms and exemplars are counted, not stored (metricsd holds float samples).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from google.protobuf.message import DecodeError

from metricsd.http.remote_write_scan import MAX_LABELS_PER_SERIES, Scanned
from metricsd.proto import prometheus_remote_v2_pb2 as v2

__all__ = ["CONTENT_TYPE", "PROTO", "SERIES_FIELD", "SYMBOLS_FIELD", "SYMBOLS_PER_SERIES", "ScannedV2", "counts",
           "entries", "parse"]

PROTO = "io.prometheus.write.v2.Request"
CONTENT_TYPE = f"application/x-protobuf;proto={PROTO}"
SYMBOLS_FIELD = 4  # Request.symbols
SERIES_FIELD = 5  # Request.timeseries


SYMBOLS_PER_SERIES = 16
"""Distinct strings a request may hold for each series it may hold (RequestLimits.max_series):
names repeat across series, so a series brings a few new ones (its pod, its container). The bound
keeps a body of millions of tiny symbols from being split at all (remote_write_scan.bound_entries)."""


@dataclass(frozen=True)
class ScannedV2:
    """A 2.0 request as 1.0-style entries, plus what is counted but not stored."""

    scanned: Scanned
    histograms: int  # histogram samples sent (not stored)
    exemplars: int  # exemplars sent (not stored)
    created_zeros: int  # 0 samples added at created timestamps (part of ``scanned``)


def parse(raw: bytes) -> v2.Request:
    """Raises DecodeError for bytes that are not a Request, including a 1.0 WriteRequest sent
    under 2.0's Content-Type (its series are field 1, reserved in 2.0, which protobuf would skip:
    the request would be taken as empty)."""
    if raw[:1] in (b"\x0a", b"\x12", b"\x1a"):
        raise DecodeError(f"field {raw[0] >> 3} is reserved in 2.0 (a 1.0 prometheus.WriteRequest sent as 2.0?)")
    return v2.Request.FromString(raw)


def counts(req: v2.Request) -> tuple[int, int]:
    """Series and float samples of a request, without building anything: for the request limits."""
    return len(req.timeseries), sum(len(ts.samples) for ts in req.timeseries)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def entries(req: v2.Request, created_zero: bool = False) -> ScannedV2:
    """The request's series as 1.0-style entries (keys are 1.0 label bytes). Raises DecodeError
    naming the series for references the symbols table does not hold."""
    symbols = req.symbols
    n_sym = len(symbols)
    names: dict[int, bytes] = {}  # ref -> 1.0 Label.name field
    values: dict[int, bytes] = {}  # ref -> 1.0 Label.value field (empty: left out, as proto3 does)
    keys: list[bytes] = []
    per_series: list[int] = []
    stamps: list[int] = []
    vals: list[float] = []
    histograms = exemplars = zeros = 0
    for i, ts in enumerate(req.timeseries):
        refs = ts.labels_refs
        if len(refs) > 2 * MAX_LABELS_PER_SERIES:
            raise DecodeError(f"timeseries {i} has more than {MAX_LABELS_PER_SERIES} labels (the most a remote-write "
                              "series may carry)")
        if len(refs) % 2:
            raise DecodeError(f"timeseries {i}: odd number of labels_refs ({len(refs)}): they come in name, value "
                              "pairs")
        if refs and max(refs) >= n_sym:
            raise DecodeError(f"timeseries {i}: labels_refs {max(refs)} is past the symbols table ({n_sym} symbols)")
        parts = []
        for j in range(0, len(refs), 2):
            nr, vr = refs[j], refs[j + 1]
            name = names.get(nr)
            if name is None:
                b = symbols[nr].encode()
                name = names[nr] = b"\x0a" + _varint(len(b)) + b
            value = values.get(vr)
            if value is None:
                b = symbols[vr].encode()
                value = values[vr] = b"\x12" + _varint(len(b)) + b if b else b""
            label = name + value
            parts.append(b"\x0a" + _varint(len(label)) + label)
        histograms += len(ts.histograms)
        exemplars += len(ts.exemplars)
        samples = ts.samples
        if not samples:
            continue  # a histogram-only series: nothing metricsd stores
        if not parts:
            raise DecodeError(f"timeseries {i}: samples without labels_refs")
        keys.append(b"".join(parts))
        before = len(stamps)
        series_ct = ts.created_timestamp
        for s in samples:
            t = s.timestamp
            if created_zero:
                ct = s.start_timestamp or series_ct
                if ct and t and ct < t:
                    stamps.append(ct)
                    vals.append(0.0)
                    zeros += 1
            stamps.append(t)
            vals.append(s.value)
        per_series.append(len(stamps) - before)
    scanned = Scanned(keys, np.array(per_series, dtype=np.int64), np.array(stamps, dtype=np.int64),
                      np.array(vals, dtype=np.float64))
    return ScannedV2(scanned, histograms, exemplars, zeros)
