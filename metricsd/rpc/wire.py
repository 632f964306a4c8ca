"""Conversions between the gRPC messages (proto/metricsd.proto) and metricsd's own types.

Shared by the store's servicer, the proxy and the clients so each message is read one way.
Bulk fields go through ``np.array(repeated_field)``, which copies packed scalars in C.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from metricsd.columns import LabelColumns, SeriesColumns
from metricsd.maths.partials import AcrossFn, Partials
from metricsd.maths.slotdigest import SlotDigestArrays
from metricsd.maths.slots import SlotFilter
from metricsd.maths.spec import AggregateResult, AggregateSpec, InvalidAggregate, SideQuery, SideResult
from metricsd.maths.window import SeriesFn
from metricsd.model import InvalidSeries, Labels
from metricsd.proto import metricsd_pb2 as pb
from metricsd.selector import InvalidSelector, Matcher, MatchOp

__all__ = [
    "ACROSS_FNS",
    "SERIES_FNS",
    "aggregate_result_to_pb",
    "aggregate_spec_from_pb",
    "batch_bytes",
    "columns_from_batch",
    "columns_from_list",
    "columns_from_read",
    "float_array",
    "groups_field",
    "labels_from_pb",
    "labels_to_pb",
    "length_delimited",
    "matchers_from_pb",
    "matchers_to_pb",
    "slot_digests_from_pb",
    "slot_digests_to_pb",
    "varint",
]

# The names of the wire enums, as the CLI and the native HTTP API spell them.
SERIES_FNS = {"avg": pb.SERIES_AVG, "min": pb.SERIES_MIN, "max": pb.SERIES_MAX, "last": pb.SERIES_LAST,
              "sum": pb.SERIES_SUM, "count": pb.SERIES_COUNT, "rate": pb.SERIES_RATE, "increase": pb.SERIES_INCREASE}
ACROSS_FNS = {"avg": pb.ACROSS_AVG, "sum": pb.ACROSS_SUM, "min": pb.ACROSS_MIN, "max": pb.ACROSS_MAX,
              "count": pb.ACROSS_COUNT, "quantile": pb.ACROSS_QUANTILE}

_OPS = {pb.Matcher.EQ: MatchOp.EQ, pb.Matcher.NEQ: MatchOp.NEQ, pb.Matcher.RE: MatchOp.RE, pb.Matcher.NRE: MatchOp.NRE}
_OPS_BACK = {v: k for k, v in _OPS.items()}


_ONE_BYTE = tuple(bytes([i]) for i in range(128))


def varint(n: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative int (< 2**64)."""
    if n < 128:
        return _ONE_BYTE[n]  # tags and short lengths, the most common by far
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def length_delimited(field: int, data: bytes) -> bytes:
    """A wire-type-2 field (packed repeated scalars, bytes, an embedded message) as raw bytes.

    The hot write paths build messages from NumPy buffers and pre-encoded parts this way, then
    parse once, instead of filling message objects per series.
    """
    return varint(field << 3 | 2) + varint(len(data)) + data


def labels_from_pb(labels: Iterable[pb.Label]) -> Labels:
    items = [(lab.name, lab.value) for lab in labels]
    out = tuple(sorted(items))
    if len({k for k, _ in out}) != len(out):
        raise InvalidSeries(f"duplicate label name in {out}")
    return out


def labels_to_pb(labels: Labels) -> list[pb.Label]:
    return [pb.Label(name=k, value=v) for k, v in labels]


def groups_field(field: int, groups: Sequence[Labels]) -> bytes:
    """Repeated ``Group`` messages (one per label set) as raw bytes: an answer grouped by pod and
    container has tens of thousands, and filling message objects per group and label cost more
    than the aggregate itself. Each distinct label pair is encoded once."""
    cache: dict[tuple[str, str], bytes] = {}
    tag = varint(field << 3 | 2)
    parts = []
    for g in groups:
        body = []
        for pair in g:
            enc = cache.get(pair)
            if enc is None:
                name, value = (x.encode("utf-8") for x in pair)
                inner = (length_delimited(1, name) if name else b"") + (length_delimited(2, value) if value else b"")
                enc = cache[pair] = length_delimited(1, inner)
            body.append(enc)
        data = b"".join(body)
        parts.append(tag + varint(len(data)) + data)
    return b"".join(parts)


def matchers_from_pb(matchers: Iterable[pb.Matcher]) -> list[Matcher]:
    out = []
    for m in matchers:
        if m.type not in _OPS:
            raise InvalidSelector(f"unknown matcher type {m.type}")
        if not m.name:
            raise InvalidSelector("matcher with an empty label name")
        out.append(Matcher(_OPS[m.type], m.name, m.value))
    return out


def matchers_to_pb(matchers: Sequence[Matcher]) -> list[pb.Matcher]:
    return [pb.Matcher(type=_OPS_BACK[m.op], name=m.name, value=m.value) for m in matchers]


def slot_filter_from_pb(f: pb.SlotFilter) -> SlotFilter | None:
    """None when the request does not restrict slots; raises InvalidSelector for a bad filter."""
    if f.slot_count == 0:
        if len(f.slots):
            raise InvalidSelector("slot filter lists slots but has slot_count 0")
        return None
    bad = [s for s in f.slots if s >= f.slot_count]
    if bad:
        raise InvalidSelector(f"slot {bad[0]} is out of range for slot_count {f.slot_count}")
    return SlotFilter(f.slot_count, tuple(f.slots))


def _side_from_pb(q: pb.AggregateQuery) -> SideQuery:
    if q.series_fn not in {int(f) for f in SeriesFn}:
        raise InvalidAggregate(f"unknown or missing series_fn {q.series_fn}")
    return SideQuery(matchers_from_pb(q.matchers), SeriesFn(q.series_fn), q.window_ms)


def aggregate_spec_from_pb(req: pb.AggregateRequest) -> AggregateSpec:
    if not req.HasField("query"):
        raise InvalidAggregate("aggregate request without a query")
    if req.across not in {int(f) for f in AcrossFn}:
        raise InvalidAggregate(f"unknown or missing across function {req.across}")
    if req.across == pb.ACROSS_QUANTILE and not 0.0 <= req.quantile <= 1.0:
        raise InvalidAggregate(f"quantile {req.quantile} is outside [0, 1]")
    if req.top_k and req.bottom_k:
        raise InvalidAggregate("top_k and bottom_k cannot both be set")
    return AggregateSpec(
        query=_side_from_pb(req.query),
        denominator=_side_from_pb(req.denominator) if req.HasField("denominator") else None,
        across=AcrossFn(req.across),
        quantile=req.quantile,
        group_by=list(req.group_by),
        start_ms=req.start_ms,
        end_ms=req.end_ms,
        step_ms=req.step_ms,
        per_series=req.per_series,
        slots=slot_filter_from_pb(req.slots),
        slot_digests=req.slot_digests,
        data_slots=tuple(req.data_slots),
        top_k=req.top_k,
        bottom_k=req.bottom_k,
    )


SHORT_FIELD = 32
"""Repeated fields up to this length are read through a list (float_array)."""


def float_array(field: Sequence[float]) -> np.ndarray:
    """A repeated double field as a float64 array. np.array probes a protobuf container's array
    protocols before reading it, about 6 us whatever its length; a list costs a Python float per
    element instead, so short fields (an aggregate's few groups) go through a list and long ones
    straight to np.array."""
    return np.array(list(field) if len(field) <= SHORT_FIELD else field, dtype=np.float64)


def packed_fixed(field: int, arr: np.ndarray, dtype: str) -> bytes:
    """A packed repeated double / fixed64 field straight from a NumPy buffer: its wire form is the
    little-endian array itself, so no Python float or int is made per element."""
    a = np.ascontiguousarray(arr, dtype=dtype).ravel()
    return length_delimited(field, a.tobytes()) if a.size else b""


def packed_small_uints(field: int, arr: np.ndarray) -> bytes | None:
    """A packed repeated uint32 field when every element is below 128 (one varint byte each: sample
    counts and group indexes nearly always are), else None."""
    a = np.asarray(arr).ravel()
    if a.size == 0:
        return b""
    if int(a.max()) >= 128 or int(a.min()) < 0:
        return None
    return length_delimited(field, a.astype(np.uint8).tobytes())


def partials_to_pb(p: Partials, out: pb.Partials) -> None:
    """Fill a Partials message from NumPy arrays (four packed double fields, parsed once)."""
    out.MergeFromString(b"".join(packed_fixed(i, a, "<f8") for i, a in enumerate((p.sum, p.count, p.min, p.max), 1)))


def series_partials_to_pb(ids: np.ndarray, group: np.ndarray, values: np.ndarray, samples: np.ndarray,
                          out: pb.SeriesPartials) -> None:
    """Fill a SeriesPartials message from NumPy arrays: per-series aggregate replies carry a value
    per series and time, thousands of them, so they are built as packed fields, not element by element."""
    parts = [packed_fixed(1, ids, "<u8"), packed_fixed(3, values, "<f8")]
    for field, arr, repeated in ((2, group, out.group), (4, samples, out.samples)):
        small = packed_small_uints(field, arr)
        if small is None:
            repeated.extend(np.asarray(arr).ravel().tolist())
        else:
            parts.append(small)
    out.MergeFromString(b"".join(parts))


def _series_to_pb(side: SideResult, out: pb.SeriesPartials) -> None:
    series_partials_to_pb(side.ids, side.group, side.values, side.samples, out)


def aggregate_result_to_pb(res: AggregateResult, spec: AggregateSpec) -> pb.AggregateResponse:
    resp = pb.AggregateResponse(series_scanned=res.series_scanned, samples_scanned=res.samples_scanned)
    resp.timestamps.extend(res.times.tolist())
    resp.MergeFromString(groups_field(2, res.groups))  # AggregateResponse.groups
    partials_to_pb(res.numerator.partials, resp.numerator)
    if res.denominator is not None:
        partials_to_pb(res.denominator.partials, resp.denominator)
    resp.MergeFromString(packed_fixed(5, res.values, "<f8"))  # AggregateResponse.values
    if spec.per_series or spec.across is AcrossFn.QUANTILE:
        _series_to_pb(res.numerator, resp.numerator_series)
        if res.denominator is not None:
            _series_to_pb(res.denominator, resp.denominator_series)
    if res.digests is not None:
        slot_digests_to_pb(res.digests, resp.slot_digests)
    return resp


def slot_digests_to_pb(d: SlotDigestArrays, out: pb.SlotDigests) -> None:
    out.SetInParent()  # present even when empty: a reply without it comes from an older store
    out.slots.extend(d.slots.tolist())
    out.series.extend(d.series.tolist())
    out.samples.extend(d.samples.tolist())
    out.MergeFromString(packed_fixed(4, d.hash, "<u8"))


def slot_digests_from_pb(d: pb.SlotDigests) -> dict[int, tuple[int, int, int]]:
    return {s: (n, c, h) for s, n, c, h in zip(d.slots, d.series, d.samples, d.hash, strict=True)}


def values_matrix(resp: pb.AggregateResponse) -> np.ndarray:
    """The response's final values as groups x times."""
    return np.array(resp.values, dtype=np.float64).reshape(len(resp.groups), len(resp.timestamps))


# --- SeriesBatch: many series as columns (rpc/FORMAT.md) -----------------------------------------


def _label_column_bytes(name: str, codes: np.ndarray, values: Sequence[str]) -> bytes:
    """A LabelColumn with only the values the codes use, renumbered densely (a store's table holds
    every value it ever saw: a batch carries those of its own series)."""
    if len(codes) == 1:  # one series (a panel of one pod): np.unique's sort costs more than the column
        code = int(codes[0])
        used: list[int] = [code] if code >= 0 else []
        dense = np.array([0 if code >= 0 else -1])
    else:
        distinct, dense = np.unique(codes, return_inverse=True)
        if len(distinct) and distinct[0] < 0:
            dense = dense - 1  # -1 (absent) stays -1
            distinct = distinct[1:]
        used = distinct.tolist()
    tag = varint(2 << 3 | 2)
    vals = b"".join(tag + varint(len(e)) + e for e in (values[int(u)].encode() for u in used))
    body = length_delimited(1, name.encode()) + vals + length_delimited(3, dense.astype("<i4").tobytes())
    return length_delimited(2, body)


def batch_bytes(cols: SeriesColumns, samples: bool = True) -> bytes:
    """A SeriesBatch message, serialised: the bytes fields straight from the arrays, one LabelColumn
    per label name some series has. ``samples``: include counts, timestamps and values."""
    ids = cols.ids if cols.ids is not None else np.zeros(len(cols), dtype=np.uint64)
    parts = [length_delimited(1, np.ascontiguousarray(ids, dtype="<u8").tobytes())]
    for name, codes, values in zip(cols.labels.names, cols.labels.codes, cols.labels.values, strict=True):
        if len(codes) and bool((codes >= 0).any()):
            parts.append(_label_column_bytes(name, codes, values))
    if samples:
        parts += [length_delimited(3, np.diff(cols.offsets).astype("<u4").tobytes()),
                  length_delimited(4, np.ascontiguousarray(cols.timestamps, dtype="<i8").tobytes()),
                  length_delimited(5, np.ascontiguousarray(cols.values, dtype="<f8").tobytes())]
    return b"".join(parts)


def columns_from_batch(b: pb.SeriesBatch) -> SeriesColumns:
    """Raises InvalidSeries when the batch's arrays do not agree in length."""
    ids = np.frombuffer(b.ids, dtype="<u8").astype(np.uint64)
    n = len(ids)
    names, codes, values = [], [], []
    for col in sorted(b.labels, key=lambda c: c.name):
        c = np.frombuffer(col.codes, dtype="<i4").astype(np.int32)
        if len(c) != n or (n and (int(c.max()) >= len(col.values) or int(c.min()) < -1)):
            raise InvalidSeries(f"label column {col.name!r} has {len(c)} codes for {n} series or a code out of range")
        names.append(col.name)
        codes.append(c)
        values.append(list(col.values))
    if len(set(names)) != len(names):
        raise InvalidSeries("a label column appears twice in the batch")
    counts = np.frombuffer(b.counts, dtype="<u4").astype(np.int64)
    ts = np.frombuffer(b.timestamps, dtype="<i8").astype(np.int64)
    vals = np.frombuffer(b.values, dtype="<f8").astype(np.float64)
    if b.counts and len(counts) != n:
        raise InvalidSeries(f"batch has {len(counts)} counts for {n} series")
    if int(counts.sum()) != len(ts) or len(ts) != len(vals):
        raise InvalidSeries(f"batch counts add up to {int(counts.sum())}, with {len(ts)} timestamps and "
                            f"{len(vals)} values")
    offsets = np.zeros(n + 1, dtype=np.int64)
    if len(counts):
        np.cumsum(counts, out=offsets[1:])
    return SeriesColumns(LabelColumns(names, codes, values, n), offsets, ts, vals, ids)


def columns_from_read(resp: pb.ReadResponse) -> SeriesColumns:
    """A Read reply as columns, whichever form it came in (batch, or a SeriesData per series)."""
    if resp.HasField("batch"):
        return columns_from_batch(resp.batch)
    return SeriesColumns.from_arrays([labels_from_pb(s.labels) for s in resp.series],
                                     [np.array(s.timestamps, dtype=np.int64) for s in resp.series],
                                     [np.array(s.values, dtype=np.float64) for s in resp.series],
                                     np.array([s.id for s in resp.series], dtype=np.uint64))


def columns_from_list(resp: pb.ListSeriesResponse) -> SeriesColumns:
    """A ListSeries reply as columns (no samples), whichever form it came in."""
    if resp.HasField("batch"):
        return columns_from_batch(resp.batch)
    n = len(resp.series)
    return SeriesColumns(LabelColumns.from_labels([labels_from_pb(s.labels) for s in resp.series]),
                         np.zeros(n + 1, np.int64), np.zeros(0, np.int64), np.zeros(0),
                         np.array([s.id for s in resp.series], dtype=np.uint64))
