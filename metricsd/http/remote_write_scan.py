"""Reading a decompressed ``prometheus.WriteRequest`` without a Python object per label or sample.

Remote write 1.0 repeats every series' labels in every request, so the receiver keys its series
cache on the bytes of a series' label fields as they arrive, and only parses the labels of series
it has not seen. :func:`scan` finds those bytes and decodes all samples with a few NumPy calls per
request (proto/prometheus_remote.proto, protobuf wire format):

    WriteRequest  = { 0x0a len TimeSeries }             (other top-level fields, metadata, skipped)
    TimeSeries    = { 0x0a len Label }  { 0x12 len Sample }   labels first, as Prometheus writes them
    Sample        = [ 0x09 <8-byte little-endian double> ] [ 0x10 <varint int64> ]   (proto3 leaves
                    a 0 value or timestamp out)

The top level is split by protobuf (a ``repeated bytes`` view of field 1); the label fields of all
series are then walked in lock step with NumPy, one step per label. In the usual body every sample
field has one size (a value and a timestamp of one varint width): the series' sample runs, laid
end to end, are one table read through strided views, a few whole-array steps in all
(:func:`uniform_samples`). Otherwise the sample fields are walked too: one check of every sample
at its series' stride when a series' samples have one length, field by field when not.
Anything else (another field order, exemplars or histograms, a sample of uneven length in a long
series, a malformed field) makes :func:`scan` return None and the caller takes the message path,
:func:`scan_messages`, which gives the same result for every body protobuf accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from metricsd.http.remote_write_table import VALUE_LEFT_OUT, uniform_samples
from metricsd.proto import prometheus_remote_pb2 as prom
from metricsd.rpc.columns import varints
from metricsd.rpc.limits import Refusal, RequestLimits, check_counts

__all__ = ["MAX_LABELS_PER_SERIES", "SPLIT_SPARE", "Scanned", "TooLarge", "bound_entries", "count_fields",
           "first_label_end", "labels_key", "scan", "scan_messages", "uniform_samples", "varints"]

MAX_LABELS_PER_SERIES = 256
"""Label fields a series may carry in a remote-write body, before any relabel rule (a store keeps at
most 32 after them, model.Limits): past it the body is refused, before its labels are read."""

_PAD = bytes(16)  # lets a gather read a whole varint or double past the last byte
_MAX_SAMPLE_STEPS = 256  # samples of uneven length a series may have on the fast path


@dataclass(frozen=True)
class Scanned:
    """The series entries of a request in arrival order: entry i's label bytes ``keys[i]`` and its
    ``counts[i]`` samples, entry after entry, in ``timestamps`` / ``values`` as sent (not merged,
    not sorted)."""

    keys: Sequence[bytes]
    counts: np.ndarray  # int64, per entry
    timestamps: np.ndarray  # int64
    values: np.ndarray  # float64
    # The timestamps' varints as sent, every one of the same width, when all came in the usual
    # form (bytes, back to back, or an (n, width) uint8 view of them): a request passed on
    # unchanged reuses them instead of encoding the timestamps again.
    stamp_varints: bytes | np.ndarray | None = None
    # Every entry's series id, when scan found them all in the receiver's cache (see scan).
    found: list[int] | None = None
    # ``found`` as uint64, when its ids are distinct and none is a rule's drop (remote_write_layout.py)
    found_array: np.ndarray | None = None


class TooLarge(ValueError):
    """A body past a stated bound: too many series or samples (``refusal`` from rpc/limits.py), or a
    series with more than MAX_LABELS_PER_SERIES labels. Raised before the body is decoded further."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def _labels_refusal(series: int) -> TooLarge:
    return TooLarge(Refusal("labels_per_series", f"timeseries {series} has more than {MAX_LABELS_PER_SERIES} labels "
                                                 "(the most a remote-write series may carry)"))


def count_fields(raw: bytes, field: int, limit: int) -> int:
    """How many top-level fields numbered ``field`` the message ``raw`` holds, counting no further
    than ``limit + 1``: a walk of the field headers alone, one Python step per field. Stops early
    (the count so far) at anything malformed; the parse that follows raises for it."""
    tag = field << 3 | 2
    n = p = 0
    end = len(raw) - 1
    while p < end:
        if raw[p] == tag and raw[p + 1] < 0x80:  # the usual field: its key and length one byte each
            p += 2 + raw[p + 1]
        else:
            key, p = _varint_at(raw, p)
            wire = key & 7
            if wire == 0:
                p = _varint_at(raw, p)[1]
            elif wire == 2:
                size, p = _varint_at(raw, p)
                p += size
            elif wire in (1, 5):
                p += 8 if wire == 1 else 4
            else:
                return n
            if key != tag:
                continue
        n += 1
        if n > limit:
            break
    return n


def _varint_at(raw: bytes, p: int) -> tuple[int, int]:
    """The varint at ``p`` and the position after it (at most ten bytes read)."""
    value = shift = 0
    for q in range(p, min(p + 10, len(raw))):
        b = raw[q]
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, q + 1
    return value, len(raw)


SPLIT_SPARE = 16
"""How many times the limit a body may hold of a field's key byte and still be split by protobuf
before its fields are counted (see bound_entries)."""


def bound_entries(raw: bytes, field: int, limit: int, what: str = "series", reason: str = "request_series",
                  spare: int = SPLIT_SPARE) -> None:
    """Raises TooLarge when ``raw`` holds more than ``limit`` fields numbered ``field`` (a
    remote-write body's series; 0: no limit) and splitting it could cost much: protobuf takes
    about 32 bytes a field, and a body of tiny fields (two bytes each: 64 M in 128 MiB) gigabytes.
    Each such field begins with its key byte, so a body holding that byte no more than ``spare``
    times the limit is let through with one ``bytes.count`` (split, it costs a few tens of MB at
    most, and its fields are counted exactly after); only one holding it more is walked, up to
    ``limit + 1`` fields (12 ms per 100,000). A body of no more than ``2 * spare * limit`` bytes
    cannot hold more than ``spare * limit`` fields (two bytes each at least) and is not looked at."""
    if not limit or len(raw) <= 2 * spare * limit or raw.count(bytes([field << 3 | 2])) <= spare * limit:
        return
    if count_fields(raw, field, limit) > limit:
        raise TooLarge(Refusal(reason, f"write request has more than {limit} {what}, the limit per request; split it"))


def _top_level_type() -> type[Message]:
    """``prometheus.WriteRequest`` with field 1 seen as ``repeated bytes``: protobuf splits the
    series in C, and nothing below the top level is parsed. A private pool keeps the name out of
    the default one."""
    fdp = descriptor_pb2.FileDescriptorProto(name="metricsd_remote_write_scan.proto",
                                             package="metricsd.scan", syntax="proto3")
    msg = fdp.message_type.add(name="SeriesBytes")
    msg.field.add(name="timeseries", number=1, label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
                  type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("metricsd.scan.SeriesBytes"))


_SeriesBytes = _top_level_type()


def labels_key(labels: object) -> bytes:
    """The label fields of a TimeSeries, re-encoded: the cache key of a series that came through
    the message path (``labels`` a repeated ``prometheus.Label``)."""
    return prom.TimeSeries(labels=labels).SerializeToString()  # type: ignore[arg-type]


def scan_messages(req: prom.WriteRequest, limits: RequestLimits | None = None) -> Scanned:
    """The message path: a Python loop per series and per sample, for any body protobuf accepts.
    Raises TooLarge for a series of too many labels, and for samples past ``limits`` before one is
    read."""
    for i, ts in enumerate(req.timeseries):
        if len(ts.labels) > MAX_LABELS_PER_SERIES:
            raise _labels_refusal(i)
    counts = np.array([len(ts.samples) for ts in req.timeseries], dtype=np.int64)
    refusal = check_counts(0, int(counts.sum()), limits) if limits is not None else None
    if refusal is not None:
        raise TooLarge(refusal)
    keys = [labels_key(ts.labels) for ts in req.timeseries]
    ts_list = [s.timestamp for ts in req.timeseries for s in ts.samples]
    v_list = [s.value for ts in req.timeseries for s in ts.samples]
    return Scanned(keys, counts, np.array(ts_list, dtype=np.int64), np.array(v_list, dtype=np.float64))


Known = Callable[[np.ndarray, np.ndarray, np.ndarray, list[int]], None]
"""Told of a request read by the shortcut for cached series: where each series' label bytes start and
end and where it ends (in the series laid end to end), and the ids found (remote_write_layout.py)."""


def scan(raw: bytes, limits: RequestLimits | None = None,
         cached: Callable[[list[bytes]], list[int | None]] | None = None, on_known: Known | None = None
         ) -> Scanned | None:
    """The fast path over a decompressed body, or None when it is not in the usual shape (see the
    module docstring). Raises google.protobuf.message.DecodeError when the top level is corrupt,
    TooLarge for more series than ``limits`` allow (counted before one is looked at) or a series of
    more than MAX_LABELS_PER_SERIES labels.

    ``cached``: the receiver's series cache lookup (SeriesCache.lookup); a request whose series it
    all knows (a sender's live traffic) is read without the label walk (:func:`_known_layout`), and
    ``on_known`` is told its layout."""
    series = _SeriesBytes.FromString(raw).timeseries  # type: ignore[attr-defined]
    n = len(series)
    refusal = check_counts(n, 0, limits) if limits is not None else None
    if refusal is not None:
        raise TooLarge(refusal)
    if n == 0:
        return Scanned([], np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64))
    joined = b"".join([*series, _PAD])
    buf = np.frombuffer(joined, dtype=np.uint8)
    ends = np.cumsum(np.fromiter(map(len, series), dtype=np.int64, count=n))
    starts = np.empty(n, dtype=np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1]
    if cached is not None:
        known = _known_layout(joined, buf, starts, ends, cached, on_known)
        if known is not None:
            return known
    label_end = _walk_labels(buf, starts, ends)
    if label_end is None:
        return None
    keys = [joined[s:e] for s, e in zip(starts.tolist(), label_end.tolist(), strict=True)]
    samples = _samples(buf, label_end, ends)
    return None if samples is None else Scanned(keys, *samples)


def _samples(buf: np.ndarray, label_end: np.ndarray, ends: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, bytes | np.ndarray | None] | None:
    """Counts, timestamps, values and timestamp varints of the sample runs [label_end, ends): as
    one table when every field is of one size (uniform_samples), else field by field; None when
    the runs are not sample fields in the usual form."""
    uniform = uniform_samples(buf, label_end, ends)
    if uniform is not None:
        return uniform
    found = _walk_samples(buf, label_end, ends)
    if found is None:
        return None
    counts, payload, size = found
    decoded = _decode_samples(buf, payload, size)
    return None if decoded is None else (counts, *decoded)


def first_label_end(joined: bytes, end: int) -> int | None:
    """_walk_labels of the first series alone, a Python step a label (the NumPy walk costs the same
    for one series as for thousands); None past the usual (a length of more than two bytes, more
    than MAX_LABELS_PER_SERIES labels, an overrun)."""
    pos = 0
    for _ in range(MAX_LABELS_PER_SERIES):
        if pos >= end or joined[pos] != 0x0A:
            return pos
        n1 = joined[pos + 1]
        if n1 < 0x80:
            pos += 2 + n1
        elif joined[pos + 2] < 0x80:
            pos += 3 + ((n1 & 0x7F) | joined[pos + 2] << 7)
        else:
            return None
        if pos > end:
            return None
    return None


def _known_layout(joined: bytes, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                  cached: Callable[[list[bytes]], list[int | None]], on_known: Known | None = None
                  ) -> Scanned | None:
    """The usual live request without the label walk: every series laid out as the first (its
    label run the same number of bytes short of its end, where a sample field, 0x12, starts), or
    VALUE_LEFT_OUT bytes more or less (a sample of value 0, which proto3 leaves out: a real
    Prometheus sends a few in most requests), and the label bytes so placed of every series in
    the cache; None when that fails for some series.

    The result is the walk's: a cache key is a whole run of label fields (0x0a), as the walk (or
    protobuf) found it when the series was learnt, and a dict hit compares the bytes in full; so
    the walk over them would step field by field to their end, where the sample field's tag stops
    it: the same label end (so of the places tried, at most one can pass). Costs a bytes object a
    series, as the walk's keys do."""
    first = first_label_end(joined, int(ends[0]))
    if first is None:
        return None
    tail = int(ends[0]) - first
    if not tail or cached([joined[:first]])[0] is None:  # a new sender's first requests: no key a series for nothing
        return None
    label_end = ends - tail
    placed = (label_end >= starts) & (buf[np.maximum(label_end, 0)] == 0x12)
    keys = [joined[s:e] for s, e in zip(starts.tolist(), label_end.tolist(), strict=True)]
    found = cached(keys)
    if not bool(placed.all()):
        for i in np.flatnonzero(~placed).tolist():  # no sample tag after the cut: a hit would be another series'
            found[i] = None
    if None in found and not _place_the_others(joined, buf, starts, ends, tail, label_end, keys, found, cached):
        return None
    samples = _samples(buf, label_end, ends)
    if samples is None:
        return None
    if on_known is not None:
        on_known(starts, label_end, ends, cast(list[int], found))
    return Scanned(keys, *samples, found=cast(list[int], found))


def _nones(found: list[int | None]) -> list[int]:
    """Where ``found`` holds None, by list.index (a scan in C; a step in Python a None, few)."""
    out: list[int] = []
    at = -1
    try:
        while True:
            at = found.index(None, at + 1)
            out.append(at)
    except ValueError:
        return out


def _place_the_others(joined: bytes, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, tail: int,
                      label_end: np.ndarray, keys: list[bytes], found: list[int | None],
                      cached: Callable[[list[bytes]], list[int | None]]) -> bool:
    """_known_layout for the series the first's layout did not place (``found`` None): their
    label run VALUE_LEFT_OUT bytes longer (the usual: its value left out, the first's not), then
    shorter, looked up where a sample field's tag follows the cut (few but the right one pass that
    check). Fills ``label_end``, ``keys`` and ``found`` in; False when some series is still not
    placed."""
    for other in (tail - VALUE_LEFT_OUT, tail + VALUE_LEFT_OUT):
        left = np.array(_nones(found), dtype=np.int64)
        if not left.size:
            break
        at = ends[left] - other
        ok = (other > 0) & (at >= starts[left]) & (buf[np.maximum(at, 0)] == 0x12)
        tried, at = left[ok], at[ok].tolist()
        tried_keys = [joined[s:a] for s, a in zip(starts[tried].tolist(), at, strict=True)]
        tried = tried.tolist()
        for i, a, key, sid in zip(tried, at, tried_keys, cached(tried_keys), strict=True):
            if sid is not None:
                label_end[i], keys[i], found[i] = a, key, sid
    return None not in found


def _walk_labels(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray | None:
    """Where each series' leading run of label fields (tag 0x0a) ends; None if one overruns.
    Raises TooLarge for a series of more than MAX_LABELS_PER_SERIES labels (a step per label)."""
    pos = starts.copy()
    last = len(buf) - 3  # a corrupt length may point past the end: read there as padding
    for step in range(MAX_LABELS_PER_SERIES + 1):
        at = np.minimum(pos, last)
        walking = (buf[at] == 0x0A) & (pos < ends)
        if not bool(walking.any()):
            break
        if step == MAX_LABELS_PER_SERIES:
            raise _labels_refusal(int(np.flatnonzero(walking)[0]))
        n1 = buf[at + 1].astype(np.int64)
        long = (n1 >= 0x80) & walking
        if bool(long.any()):  # a label of 128 bytes or more: a two-byte length
            n2 = buf[at + 2].astype(np.int64)
            if bool((n2[long] >= 0x80).any()):
                return None
            pos += np.where(walking, np.where(long, 3 + ((n1 & 0x7F) | (n2 << 7)), 2 + n1), 0)
        else:
            pos += np.where(walking, 2 + n1, 0)
    if bool((pos > ends).any()):
        return None
    return pos


def _walk_samples(buf: np.ndarray, begin: np.ndarray, ends: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per series its sample count, and per sample (series after series) its payload's offset and
    size; None unless the rest of every series is sample fields (tag 0x12, one-byte length)."""
    n = len(begin)
    pos = begin.copy()
    counts = np.zeros(n, dtype=np.int64)
    steps: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # series, index, offset, size
    active = _stride(buf, pos, ends, counts, np.flatnonzero(pos < ends), steps)
    for _ in range(_MAX_SAMPLE_STEPS):  # series whose samples differ in length: one field a step
        if not active.size:
            break
        p = pos[active]
        size = buf[p + 1].astype(np.int64)
        if bool((buf[p] != 0x12).any()) or bool((size >= 0x80).any()):
            return None
        steps.append((active, counts[active], p + 2, size))
        counts[active] += 1
        pos[active] = p + 2 + size
        active = active[pos[active] < ends[active]]
    if active.size or bool((pos != ends).any()):
        return None
    if not steps:
        return counts, np.zeros(0, np.int64), np.zeros(0, np.int64)
    if len(steps) == 1:  # one stride pass: already series after series
        return counts, steps[0][2], steps[0][3]
    series = np.concatenate([s[0] for s in steps])
    index = np.concatenate([s[1] for s in steps])
    offset = np.concatenate([s[2] for s in steps])
    size = np.concatenate([s[3] for s in steps])
    slot = (np.cumsum(counts) - counts)[series] + index  # where each sample goes: series after series
    out_offset, out_size = np.empty_like(offset), np.empty_like(size)
    out_offset[slot], out_size[slot] = offset, size
    return counts, out_offset, out_size


def _stride(buf: np.ndarray, pos: np.ndarray, ends: np.ndarray, counts: np.ndarray, active: np.ndarray,
            steps: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]) -> np.ndarray:
    """Finish, in one go, every active series whose remaining samples all have the length of its
    next one: the k-th sample field starts k strides on, which one check of each field's tag and
    length proves. Returns the series left for the step-by-step walk."""
    p = pos[active]
    entry = 2 + buf[p + 1].astype(np.int64)
    left = ends[active] - p
    even = (buf[p] == 0x12) & (entry < 0x82) & (left % entry == 0)
    cand, p, entry = active[even], p[even], entry[even]
    if not cand.size:
        return active
    k = left[even] // entry
    if int(k.max()) == 1:  # one sample a series (a sender's live traffic): nothing to check
        rep, within = np.arange(cand.size), np.zeros(cand.size, dtype=np.int64)
    else:
        rep = np.repeat(np.arange(cand.size), k)
        within = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
    at = p[rep] + within * entry[rep]
    bad = (buf[at] != 0x12) | (buf[at + 1].astype(np.int64) != entry[rep] - 2)
    ok = np.ones(cand.size, dtype=bool)
    ok[rep[bad]] = False
    keep = ok[rep]
    done = cand[ok]
    steps.append((cand[rep[keep]], counts[cand[rep[keep]]] + within[keep], at[keep] + 2, entry[rep[keep]] - 2))
    counts[done] += k[ok]
    pos[done] = ends[done]
    left_over = np.ones(active.size, dtype=bool)
    left_over[np.flatnonzero(even)[ok]] = False
    return active[left_over]


def _decode_samples(buf: np.ndarray, at: np.ndarray, size: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, bytes | None] | None:
    """Timestamps, values and (see Scanned) timestamp varints of the Sample payloads at ``at``
    (``size`` bytes each); None unless each is [0x09 double] [0x10 varint] in that order."""
    if not at.size:
        return np.zeros(0, np.int64), np.zeros(0, np.float64), b""
    s0 = int(size[0])
    if s0 >= 11 and bool((size == s0).all()):
        # Fast path: every sample has a value and a timestamp of one varint size (same-era times).
        rows = np.lib.stride_tricks.as_strided(buf, shape=(len(buf) - s0, s0), strides=(1, 1))[at]
        w = s0 - 10
        if bool((rows[:, 0] == 0x09).all()) and bool((rows[:, 9] == 0x10).all()):
            digits = rows[:, 10:]
            if bool((digits[:, : w - 1] >= 0x80).all()) and bool((digits[:, w - 1] < 0x80).all()):
                values = np.ascontiguousarray(rows[:, 1:9]).view("<f8").ravel()
                stamps = digits[:, 0].astype(np.uint64) & np.uint64(0x7F)
                for k in range(1, w):
                    stamps |= (digits[:, k].astype(np.uint64) & np.uint64(0x7F)) << np.uint64(7 * k)
                # Ten bytes may carry bits past 64 that a parser would refuse: encode those afresh.
                return stamps.view(np.int64), values, (np.ascontiguousarray(digits).tobytes() if w < 10 else None)
    found = _decode_any(buf, at, size)
    return None if found is None else (*found, None)


def _decode_any(buf: np.ndarray, at: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """_decode_samples for payloads of several shapes (a 0 left out, timestamps of several sizes)."""
    has_v = buf[at] == 0x09
    if bool((has_v & (size < 9)).any()):
        return None
    t_at = at + 9 * has_v
    end = at + size
    has_t = t_at < end
    if bool((buf[t_at[has_t]] != 0x10).any()):
        return None
    vlen = np.where(has_t, end - t_at - 1, 0)
    if bool(((vlen < 1) & has_t).any()) or bool((vlen > 10).any()):
        return None
    values = np.zeros(at.size, dtype=np.float64)
    if bool(has_v.any()):
        v_at = at[has_v] + 1
        values[has_v] = np.ascontiguousarray(buf[v_at[:, None] + np.arange(8)]).view("<f8").ravel()
    stamps = np.zeros(at.size, dtype=np.uint64)
    for k in range(int(vlen.max())):
        inside = k < vlen
        digit = buf[np.where(inside, t_at + 1 + k, 0)]
        if bool((((digit >= 0x80) & inside) != (k < vlen - 1)).any()):
            return None  # a continuation bit out of place: not one varint of exactly this size
        stamps |= np.where(inside, digit & 0x7F, 0).astype(np.uint64) << np.uint64(7 * k)
    return stamps.view(np.int64), values
