"""The remote write receiver's series cache and id-only writes, and its NumPy decoder against the
protobuf message path."""

from __future__ import annotations

import math
import struct
from pathlib import Path
from unittest import mock

import cramjam
import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from metricsd.http import remote_write_scan
from metricsd.http.params import ApiError
from metricsd.http.remote_write import RemoteWriteReceiver, SeriesCache, decode_body, prepare_write
from metricsd.http.remote_write_scan import scan, scan_messages, varints
from metricsd.http.selfmetrics import SelfMetrics
from metricsd.http.settings import HttpSettings
from metricsd.model import Labels, make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import prometheus_remote_pb2 as prom
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

Series = tuple[dict[str, str], list[tuple[int, float]]]


def _request(series: list[Series]) -> prom.WriteRequest:
    req = prom.WriteRequest()
    for labels, samples in series:
        ts = req.timeseries.add()
        for k, v in labels.items():
            ts.labels.add(name=k, value=v)
        for t, x in samples:
            ts.samples.add(timestamp=t, value=x)
    return req


def _body(series: list[Series]) -> bytes:
    return bytes(cramjam.snappy.compress_raw(_request(series).SerializeToString()))


class RecordingBackend:
    """A store in this process that keeps every request it was sent; ``restart`` empties it."""

    def __init__(self) -> None:
        self.store = Store()
        self.requests: list[pb.WriteRequest] = []

    def restart(self) -> None:
        self.store = Store()

    async def write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        copy = pb.WriteRequest()
        copy.CopyFrom(request)
        self.requests.append(copy)
        return await LocalBackend(StoreAPI(self.store)).write(request)


def _receiver(backend: RecordingBackend, settings: HttpSettings | None = None,
              cache: int = 1000) -> RemoteWriteReceiver:
    return RemoteWriteReceiver(backend, settings or HttpSettings(access_log=False),  # type: ignore[arg-type]
                               SelfMetrics(CollectorRegistry()), series_cache=cache)


def _pod(pod: str, name: str = "container_memory_rss", **extra: str) -> dict[str, str]:
    return {"__name__": name, "namespace": "shop", "pod": pod, **extra}


def _labelled(req: pb.WriteRequest) -> set[int]:
    return {s.id for s in req.series}


def _stored(store: Store) -> dict[Labels, list[tuple[int, float]]]:
    return {s.labels: list(zip(s.timestamps.tolist(), s.values.tolist(), strict=True))
            for s in store.read([], -(2**62), 2**62)}


# --- the cache and the handshake --------------------------------------------------------------


async def test_a_series_seen_before_is_sent_by_id_only() -> None:
    backend = RecordingBackend()
    rw = _receiver(backend)
    await rw.ingest(_body([(_pod("a"), [(1000, 1.0)]), (_pod("b"), [(1000, 2.0)])]))
    await rw.ingest(_body([(_pod("a"), [(2000, 3.0)]), (_pod("b"), [(2000, 4.0)])]))
    first, second = backend.requests
    ids = {series_id(make_labels(None, _pod(p))) for p in "ab"}
    assert _labelled(first) == ids and set(first.ids) == ids
    assert _labelled(second) == set() and set(second.ids) == ids
    assert len(rw.cache) == 2
    assert _stored(backend.store)[make_labels(None, _pod("a"))] == [(1000, 1.0), (2000, 3.0)]


async def test_a_label_change_makes_a_new_series_sent_with_its_labels() -> None:
    backend = RecordingBackend()
    rw = _receiver(backend)
    await rw.ingest(_body([(_pod("a", container="app"), [(1000, 1.0)])]))
    await rw.ingest(_body([(_pod("a", container="app"), [(2000, 2.0)]), (_pod("a", container="web"), [(2000, 5.0)])]))
    new = series_id(make_labels(None, _pod("a", container="web")))
    assert _labelled(backend.requests[1]) == {new}
    stored = _stored(backend.store)
    assert stored[make_labels(None, _pod("a", container="web"))] == [(2000, 5.0)]
    assert stored[make_labels(None, _pod("a", container="app"))] == [(1000, 1.0), (2000, 2.0)]


async def test_eviction_keeps_writes_correct_and_resends_labels_of_evicted_series() -> None:
    backend = RecordingBackend()
    rw = _receiver(backend, cache=8)
    pods = [f"p{i}" for i in range(20)]
    for rnd in range(3):
        for p in pods:
            await rw.ingest(_body([(_pod(p), [(1000 * (rnd + 1), float(rnd))])]))
        assert len(rw.cache) <= 8
    assert rw.cache.evicted > 0
    stored = _stored(backend.store)
    assert len(stored) == 20
    assert all(stored[make_labels(None, _pod(p))] == [(1000, 0.0), (2000, 1.0), (3000, 2.0)] for p in pods)
    # 20 series cycling through 8 entries: each was dropped before it came back, so went with labels.
    assert all(len(r.series) == 1 for r in backend.requests)
    await rw.ingest(_body([(_pod("p19"), [(4000, 3.0)])]))  # the newest entry is still there
    assert _labelled(backend.requests[-1]) == set()


async def test_a_store_restarted_empty_gets_the_labels_again() -> None:
    backend = RecordingBackend()
    rw = _receiver(backend)
    await rw.ingest(_body([(_pod("a"), [(1000, 1.0)]), (_pod("b"), [(1000, 2.0)])]))
    backend.restart()
    await rw.ingest(_body([(_pod("a"), [(2000, 3.0)]), (_pod("b"), [(2000, 4.0)]), (_pod("c"), [(2000, 5.0)])]))
    ids = [series_id(make_labels(None, _pod(p))) for p in "abc"]
    by_id, resent = backend.requests[1:]
    assert _labelled(by_id) == {ids[2]}
    assert _labelled(resent) == set(ids)
    assert rw.label_resends == 1
    assert _stored(backend.store) == {make_labels(None, _pod("a")): [(2000, 3.0)],
                                      make_labels(None, _pod("b")): [(2000, 4.0)],
                                      make_labels(None, _pod("c")): [(2000, 5.0)]}


async def test_rejected_series_are_not_cached_and_are_refused_every_time() -> None:
    backend = RecordingBackend()
    rw = _receiver(backend)
    body = _body([(_pod("a"), [(1000, 1.0)]), (_pod("b", **{"bad-name": "x"}), [(1000, 1.0)])])
    no_pod = _body([({"__name__": "up", "namespace": "shop"}, [(1000, 1.0)])])
    for _ in range(2):
        with pytest.raises(Exception, match="bad-name"):
            await rw.ingest(body)
        with pytest.raises(ApiError, match=r"up\{namespace=\"shop\"\} lacks the namespace/pod"):
            await rw.ingest(no_pod)
    assert len(rw.cache) == 0
    assert backend.store.stats()["series"] == 0
    assert all(len(r.series) == 2 for r in backend.requests)


async def test_defaults_are_part_of_what_the_cache_remembers() -> None:
    backend = RecordingBackend()
    rw = _receiver(backend, HttpSettings(default_namespace="scraped", pod_labels=("instance",), access_log=False))
    bare = {"__name__": "up", "instance": "node-a:9100"}
    spelled = {"__name__": "up", "instance": "node-a:9100", "namespace": "scraped", "pod": "node-a:9100"}
    other_ns = {"__name__": "up", "instance": "node-a:9100", "namespace": "infra"}
    await rw.ingest(_body([(bare, [(1000, 1.0)])]))
    # The same series spelt out, and again bare, in one request: one series, samples merged.
    await rw.ingest(_body([(spelled, [(3000, 3.0)]), (bare, [(2000, 2.0)]), (other_ns, [(2000, 7.0)])]))
    assert _stored(backend.store) == {
        make_labels(None, spelled): [(1000, 1.0), (2000, 2.0), (3000, 3.0)],
        make_labels(None, {**other_ns, "pod": "node-a:9100"}): [(2000, 7.0)],
    }
    assert list(backend.requests[1].counts) == [2, 1]


def test_series_cache_is_bounded_and_evicts_the_oldest_in_chunks() -> None:
    cache = SeriesCache(16)
    cache.add((f"k{i}".encode(), i) for i in range(16))
    assert len(cache) == 16 and cache.evicted == 0
    cache.add([(b"k16", 16)])
    assert len(cache) == 14 and cache.evicted == 3
    assert cache.lookup([b"k0", b"k2", b"k3", b"k16"]) == [None, None, 3, 16]
    with pytest.raises(ValueError, match="at least 1"):
        SeriesCache(0)


# --- the NumPy decoder against protobuf's message path ----------------------------------------

_names = st.sampled_from(["__name__", "namespace", "pod", "container", "job", "le", "z"])
_values = st.one_of(st.sampled_from(["", "shop", "cart-1", "é✓"]), st.text(max_size=300))
_stamps = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**45), st.just(0),
                    st.integers(1_600_000_000_000, 1_800_000_000_000))
_floats = st.one_of(st.floats(allow_nan=True), st.just(0.0), st.just(-0.0))
_series = st.tuples(st.dictionaries(_names, _values, max_size=6),
                    st.lists(st.tuples(_stamps, _floats), max_size=12))


def _bits(a: np.ndarray) -> list[int]:
    return np.asarray(a, dtype=np.float64).view(np.int64).tolist()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_series, max_size=8))
def test_scan_matches_the_message_path(series: list[Series]) -> None:
    raw = _request(series).SerializeToString()
    fast = scan(raw)
    slow = scan_messages(prom.WriteRequest.FromString(raw))
    assert fast is not None  # what protobuf itself writes always takes the fast path
    assert fast.keys == slow.keys
    assert fast.counts.tolist() == slow.counts.tolist()
    assert fast.timestamps.tolist() == slow.timestamps.tolist()
    assert _bits(fast.values) == _bits(slow.values)


_widths = st.integers(1, 10)  # bytes of the timestamps' varints; 9 and 10 are past the one-table path


def _stamp_of_width(w: int, i: int) -> int:
    """A timestamp whose varint takes exactly ``w`` bytes (10: a negative one)."""
    return -1 - i if w == 10 else (1 << (7 * (w - 1))) + i


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.dictionaries(_names, _values, max_size=6), st.integers(0, 70)), min_size=1, max_size=12),
       _widths, st.sampled_from(["none", "zero value", "other width", "zero stamp"]), st.data())
def test_a_body_of_one_sample_size_is_read_as_one_table_and_anything_else_as_before(
        shape: list[tuple[dict[str, str], int]], width: int, odd: str, data: st.DataObject) -> None:
    """Every sample of one size (the usual body) takes the one-table path, and so does a 0 value
    (which protobuf leaves out) when every series has one sample, as a real Prometheus sends; one
    sample of another shape anywhere else (a 0 value among series of several samples, a 0
    timestamp left out, a timestamp of another width) sends the body down the step-by-step path.
    Either way the result equals protobuf's."""
    series: list[Series] = [(labels, [(_stamp_of_width(width, k), 0.5 + k) for k in range(n)]) for labels, n in shape]
    with_samples = [i for i, (_, samples) in enumerate(series) if samples]
    if odd != "none" and with_samples:
        i = data.draw(st.sampled_from(with_samples))
        k = data.draw(st.integers(0, len(series[i][1]) - 1))
        t, v = series[i][1][k]
        series[i][1][k] = {"zero value": (t, 0.0), "zero stamp": (0, v),
                           "other width": (_stamp_of_width(width % 8 + 1, k), v)}[odd]
    raw = _request(series).SerializeToString()
    slow = scan_messages(prom.WriteRequest.FromString(raw))
    with mock.patch.object(remote_write_scan, "_walk_samples", return_value=None):  # the one-table path only
        uniform = scan(raw)
    samples = [x for _, ss in series for x in ss]
    widths = {len(_varint(t)) if t > 0 else 10 for t, _ in samples}
    one_each = all(len(ss) == 1 for _, ss in series)
    one_size = (bool(samples) and len(widths) == 1 and widths <= set(range(1, 9)) and all(t for t, _ in samples)
                and (one_each or all(v for _, v in samples)))
    assert (uniform is not None) == one_size
    for fast in (scan(raw), uniform):
        if fast is None:
            continue
        assert fast.keys == slow.keys
        assert fast.counts.tolist() == slow.counts.tolist()
        assert fast.timestamps.tolist() == slow.timestamps.tolist()
        assert _bits(fast.values) == _bits(slow.values)
        given = fast.stamp_varints
        if given is not None:
            as_bytes = given.tobytes() if isinstance(given, np.ndarray) else given
            assert as_bytes == varints(fast.timestamps.view(np.uint64))


def _field(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + _varint(len(payload)) + payload


def test_a_sample_of_the_usual_size_holding_two_timestamp_fields_is_read_as_protobuf_reads_it() -> None:
    """[0x09 double][0x10 1-byte varint][0x10 4-byte varint] is as long as a value and a 6-byte
    timestamp: only the continuation bits tell it apart. protobuf keeps the last timestamp."""
    t = 1_700_000_000_000
    usual = prom.Sample(value=1.5, timestamp=t).SerializeToString()
    odd = b"\x09" + struct.pack("<d", 2.5) + b"\x10\x05" + b"\x10" + _varint(1 << 21)
    assert len(odd) == len(usual) == 16
    labels = b"".join(_field(0x0A, prom.Label(name=k, value=v).SerializeToString()) for k, v in _pod("a").items())
    raw = _field(0x0A, labels + _field(0x12, usual) + _field(0x12, odd) + _field(0x12, usual))
    slow = scan_messages(prom.WriteRequest.FromString(raw))
    assert slow.timestamps.tolist() == [t, 1 << 21, t]
    fast = scan(raw)
    assert fast is None or (fast.timestamps.tolist(), fast.values.tolist()) == ([t, 1 << 21, t], [1.5, 2.5, 1.5])


def test_the_usual_shapes_take_the_fast_path_with_uneven_samples() -> None:
    stamps = [1_700_000_000_000 + 10_000 * i for i in range(300)]
    even = [(_pod("a"), [(t, 1.5) for t in stamps])]
    zeros = [(_pod("a"), [(t, 0.0 if i % 3 else 2.0) for i, t in enumerate(stamps[:200])]), (_pod("b"), [])]
    for series in (even, zeros):
        raw = _request(series).SerializeToString()
        fast = scan(raw)
        assert fast is not None
        assert fast.timestamps.tolist() == [t for _, s in series for t, _ in s]
        assert fast.values.tolist() == [v for _, s in series for _, v in s]
    long_uneven = [(_pod("a"), [(t, 0.0 if i % 3 else 2.0) for i, t in enumerate(stamps)])]
    assert scan(_request(long_uneven).SerializeToString()) is None  # taken by the message path instead


def _reference(series: list[Series], settings: HttpSettings) -> dict[int, list[tuple[int, int]]]:
    """What the receiver must send: per series id, (timestamp, value bits) sorted, first value kept."""
    merged: dict[int, dict[int, int]] = {}
    for labels, samples in series:
        d = {k: v for k, v in labels.items() if v}
        if "namespace" not in d and settings.default_namespace:
            d["namespace"] = settings.default_namespace
        if "pod" not in d:
            found = [d[name] for name in settings.pod_labels if d.get(name)]
            if found:
                d["pod"] = found[0]
        got = merged.setdefault(series_id(tuple(sorted(d.items()))), {})
        for t, v in samples:
            got.setdefault(t, struct.unpack("<q", struct.pack("<d", v))[0])
    return {sid: sorted(s.items()) for sid, s in merged.items()}


_pod_series = st.tuples(
    st.builds(lambda pod, c: {"__name__": "m", "namespace": "ns", "pod": pod, "container": c},
              st.sampled_from(["a", "b"]), st.sampled_from(["", "x", "y"])),
    # Timestamps that collide, of one varint size or several (10 bytes for a negative one).
    st.lists(st.tuples(st.builds(lambda i, base: base + 1_000 * i, st.integers(0, 20),
                                 st.sampled_from([0, -5_000_000, 1_700_000_000_000])), _floats), max_size=6))


@settings(max_examples=150, deadline=None)
@given(st.lists(_pod_series, min_size=1, max_size=8), st.integers(1, 3))
def test_prepare_write_merges_sorts_and_keeps_the_first_value(series: list[Series], warm: int) -> None:
    hs = HttpSettings(access_log=False)
    cache = SeriesCache()
    for _ in range(warm):  # cold, then warm: the same columns whether or not labels are sent
        prepared = prepare_write(decode_body(_body(series), 1 << 20), cache, hs)
        assert prepared is not None
        assert prepared.batch is not None
        req = prepared.batch.to_request()  # through the wire form: the sender's timestamp bytes reused
        starts = np.cumsum(req.counts) - np.array(req.counts)
        got = {sid: list(zip(req.timestamps[s : s + c], _bits(np.array(req.values[s : s + c])), strict=True))
               for sid, s, c in zip(req.ids, starts.tolist(), req.counts, strict=True)}
        assert got == _reference(series, hs)
        assert len(req.ids) == len(set(req.ids))
        cache.add(prepared.learnt)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_corrupt_bodies_are_refused_or_read_as_protobuf_reads_them(data: st.DataObject) -> None:
    series = [(_pod("a"), [(1_700_000_000_000, 1.0), (1_700_000_010_000, 0.0)]),
              ({**_pod("b"), "le": "x" * 140}, [(5, 2.5)])]
    raw = bytearray(_request(series).SerializeToString())
    for _ in range(data.draw(st.integers(1, 3))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        i = data.draw(st.integers(0, len(raw) - 1))
        if op == "flip":
            raw[i] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del raw[i : i + data.draw(st.integers(1, 4))]
        else:
            raw[i:i] = bytes(data.draw(st.lists(st.integers(0, 255), min_size=1, max_size=3)))
    body = bytes(cramjam.snappy.compress_raw(bytes(raw)))
    hs = HttpSettings(access_log=False)
    try:
        expected = scan_messages(prom.WriteRequest.FromString(bytes(raw)))
    except DecodeError:
        with pytest.raises(ApiError, match="protobuf"):
            prepare_write(decode_body(body, 1 << 20), SeriesCache(), hs)
        return
    got = decode_body(body, 1 << 20)
    assert [prom.TimeSeries.FromString(k) for k in got.keys] == [prom.TimeSeries.FromString(k) for k in expected.keys]
    assert got.counts.tolist() == expected.counts.tolist()
    assert got.timestamps.tolist() == expected.timestamps.tolist()
    assert _bits(got.values) == _bits(expected.values)


@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40))
def test_varints_match_protobuf(xs: list[int]) -> None:
    packed = varints(np.array(xs, dtype=np.int64).view(np.uint64))
    framed = b"\x1a" + _varint(len(packed)) + packed if xs else b""  # field 3, as protobuf packs it
    assert framed == pb.WriteRequest(timestamps=xs).SerializeToString()


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def test_nan_and_stale_markers_survive_the_fast_path() -> None:
    stale = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
    raw = _request([(_pod("a"), [(1000, math.nan), (2000, stale), (3000, -0.0)])]).SerializeToString()
    fast = scan(raw)
    assert fast is not None
    assert _bits(fast.values)[1] == 0x7FF0000000000002
    assert math.isnan(fast.values[0]) and math.copysign(1.0, fast.values[2]) == -1.0


async def test_remote_write_into_a_durable_store_replays_from_its_wal_to_the_same_samples(tmp_path: Path) -> None:
    """The WAL record of a remote-write batch is built from its columns, with the sender's own
    timestamp bytes: a store reopened from the WAL alone holds exactly what was acknowledged."""
    from metricsd.store.durable import DurabilitySettings, open_store
    from metricsd.store.wal import FsyncPolicy

    dset = DurabilitySettings(fsync=FsyncPolicy.NEVER)
    store, durability = open_store(tmp_path, durability=dset)
    rw = RemoteWriteReceiver(LocalBackend(durability.api()), HttpSettings(access_log=False),
                             SelfMetrics(CollectorRegistry()))
    t0 = 1_700_000_000_000
    for block in range(3):  # new series, then known ones by id, then one more series
        series = [(_pod(p), [(t0 + 10_000 * (3 * block + k), block + k / 4) for k in range(3)]) for p in "abc"]
        if block == 2:
            series.append((_pod("d"), [(t0, 0.5), (t0 + 7, 1.5)]))  # timestamps of another varint width too
        await rw.ingest(_body(series))
    want = _stored(store)
    assert len(want) == 4 and len(want[make_labels(None, _pod("a"))]) == 9
    durability.close(snapshot=False)
    again, d2 = open_store(tmp_path, durability=dset)
    try:
        assert d2.recovery.wal_records == 3
        assert _stored(again) == want
    finally:
        d2.close(snapshot=False)
