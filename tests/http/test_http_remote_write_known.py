"""The remote-write scan's shortcut for a request of cached series (http/remote_write_scan.py
``_known_layout``): every series' label end placed as the first series', accepted only when every
key so cut is a cache hit, and then equal to what the label walk finds."""

from __future__ import annotations

import cramjam
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from test_http_remote_write_cache import _request

from metricsd.http.remote_write import RemoteWriteReceiver, SeriesCache, decode_body, prepare_write
from metricsd.http.remote_write_scan import scan
from metricsd.http.selfmetrics import SelfMetrics
from metricsd.http.settings import HttpSettings
from metricsd.model import make_labels
from metricsd.proto import prometheus_remote_pb2 as prom
from metricsd.rpc.columns import varints
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

Series = tuple[dict[str, str], list[tuple[int, float]]]
T0 = 1_700_000_000_000


def _raw(series: list[Series]) -> bytes:
    return _request(series).SerializeToString()


def _warm(series: list[Series]) -> SeriesCache:
    """A cache that has learnt ``series`` as the receiver does: prepare_write, then add."""
    hs = HttpSettings(access_log=False)
    cache = SeriesCache()
    raw = _raw(series)
    cache.add(prepare_write(decode_body(bytes(cramjam.snappy.compress_raw(raw)), 1 << 20), cache, hs).learnt)
    return cache


def _same(a: object, b: object) -> None:
    assert a is not None and b is not None
    assert a.keys == b.keys  # type: ignore[attr-defined]
    assert a.counts.tolist() == b.counts.tolist()  # type: ignore[attr-defined]
    assert a.timestamps.tolist() == b.timestamps.tolist()  # type: ignore[attr-defined]
    assert a.values.view(np.int64).tolist() == b.values.view(np.int64).tolist()  # type: ignore[attr-defined]


def _pod(pod: str, **extra: str) -> dict[str, str]:
    return {"__name__": "m", "namespace": "ns", "pod": pod, **extra}


_labels = st.builds(lambda pod, c, pad: _pod(pod, container=c, **({"le": pad} if pad else {})),
                    st.sampled_from(["a", "b", "c"]), st.sampled_from(["", "x", "y"]),
                    st.sampled_from(["", "1", "22", "é✓", "z" * 140]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_labels, st.integers(0, 3)), min_size=1, max_size=8),
       st.lists(st.tuples(_labels, st.integers(0, 3)), max_size=4), st.sampled_from([1, 3, 9]))
def test_a_request_of_cached_series_reads_as_the_walk_reads_it(
        shape: list[tuple[dict[str, str], int]], learnt: list[tuple[dict[str, str], int]], width: int) -> None:
    """Whatever the cache holds and however the request's series differ from its first (other
    sample counts, other label lengths, none), the result equals the label walk's; with every
    series cached and laid out as the first, it comes with their ids."""
    stamp = (1 << (7 * (width - 1))) if width < 9 else T0
    series: list[Series] = [(labels, [(stamp + k, 0.5 + k) for k in range(n)]) for labels, n in shape]
    cache = _warm([(labels, [(stamp, 1.0)]) for labels, _ in [*shape[: len(shape) // 2], *learnt]])
    raw = _raw(series)
    walked = scan(raw)
    known = scan(raw, None, cache.lookup)
    _same(known, walked)
    assert known is not None
    if known.found is not None:
        assert known.found == cache.lookup(known.keys)
        assert None not in known.found
    counts = {n for _, n in shape}
    if counts == {1} and all(cache.lookup([k])[0] is not None for k in walked.keys):  # type: ignore[union-attr]
        assert known.found is not None  # the live shape takes the shortcut


def _field(tag: int, payload: bytes) -> bytes:
    return bytes([tag, len(payload)]) + payload


def test_a_cached_key_followed_by_a_label_the_size_of_a_sample_is_not_taken_for_it() -> None:
    """Series 1 is a cached series' labels plus one more label field exactly as long as series 0's
    sample field, and no sample: cut where series 0's samples begin, its key is the cached one,
    but a label field (0x0a), not a sample (0x12), follows. It must be read as the walk reads it:
    a new series with both labels."""
    one = prom.TimeSeries(labels=[prom.Label(name="namespace", value="ns"), prom.Label(name="pod", value="a")],
                          samples=[prom.Sample(value=1.5, timestamp=T0)])
    sample = one.SerializeToString()[-(2 + len(one.samples[0].SerializeToString())):]
    cached = _field(0x0A, _field(0x0A, b"namespace") + _field(0x12, b"ns")) + \
        _field(0x0A, _field(0x0A, b"pod") + _field(0x12, b"b"))
    # a label field of len(sample) bytes: its header (2), the name field (2 + 1), the value field (2 + value)
    name = b"z"
    value = b"v" * (len(sample) - 6 - len(name))
    extra = _field(0x0A, _field(0x0A, name) + _field(0x12, value))
    assert len(extra) == len(sample)
    raw = _field(0x0A, one.SerializeToString()) + _field(0x0A, cached + extra)
    cache = _warm([({"namespace": "ns", "pod": "b"}, [(T0, 1.0)])])
    assert cache.lookup([cached])[0] is not None
    walked = scan(raw)
    known = scan(raw, None, cache.lookup)
    _same(known, walked)
    assert known is not None and known.found is None
    assert known.keys[1] == cached + extra


def test_a_cached_key_followed_by_two_samples_is_not_cut_after_the_first() -> None:
    """Series 0 holds one sample, series 1 (cached) two: cut at series 0's tail, series 1's key
    would end inside its samples. Not a cache hit, so the walk reads it."""
    series: list[Series] = [(_pod("a"), [(T0, 1.0)]), (_pod("b"), [(T0, 2.0), (T0 + 10_000, 3.0)])]
    cache = _warm([(_pod("a"), [(T0, 1.0)]), (_pod("b"), [(T0, 1.0)])])
    raw = _raw(series)
    known = scan(raw, None, cache.lookup)
    _same(known, scan(raw))
    assert known is not None and known.found is None


async def test_live_requests_of_cached_series_store_every_sample() -> None:
    """Through the receiver into a store: the first request learns the series, the next ones take
    the shortcut (ids only), and every sample is stored under its series."""
    store = Store()
    rx = RemoteWriteReceiver(LocalBackend(StoreAPI(store)), HttpSettings(access_log=False),
                             SelfMetrics(CollectorRegistry()))
    pods = [_pod(f"p{i}", container="c" * (i % 3)) for i in range(50)]
    for tick in range(4):
        body = bytes(cramjam.snappy.compress_raw(_raw([(lab, [(T0 + tick * 10_000, float(tick + i))])
                                                       for i, lab in enumerate(pods)])))
        assert await rx.ingest(body) == 50
    stored = {s.labels: list(zip(s.timestamps.tolist(), s.values.tolist(), strict=True))
              for s in store.read([], -(2**62), 2**62)}
    assert stored == {make_labels(None, {k: v for k, v in lab.items() if v}):
                      [(T0 + t * 10_000, float(t + i)) for t in range(4)] for i, lab in enumerate(pods)}
    assert rx.label_resends == 0


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 2), st.integers(0, 3)),
                min_size=1, max_size=8))
def test_the_ids_given_as_ints_are_the_batchs_ids(entries: list[tuple[str, int, int]]) -> None:
    """prepare_write hands the proxy its ids as ints (WriteColumns.id_list) only when they are the
    batch's ids entry for entry: a series sent twice, or samples out of order, merge into other
    columns, and then none are given."""
    hs = HttpSettings(access_log=False)
    series: list[Series] = [(_pod(pod), [(T0 + shift * 1000 + k, float(k)) for k in range(n + 1)][::-1 if n > 1 else 1])
                            for pod, n, shift in entries]
    raw = _raw(series)
    cache = SeriesCache()
    for _ in range(2):  # the first time the series are new, then cached
        prepared = prepare_write(decode_body(bytes(cramjam.snappy.compress_raw(raw)), 1 << 20, None, cache), cache, hs)
        cache.add(prepared.learnt)
        assert prepared.batch is not None
        given_ids = prepared.batch.id_list
        if given_ids is not None:
            assert given_ids == prepared.batch.ids.tolist()
    if len({pod for pod, _, _ in entries}) == len(entries) and all(n < 2 for _, n, _ in entries):
        assert given_ids is not None  # each series once, in time order: passed on


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.booleans(), min_size=1, max_size=40), st.sampled_from(["", "x", "yy" * 40]))
def test_samples_of_value_0_among_cached_series_still_take_the_shortcut(zero: list[bool], pad: str) -> None:
    """proto3 leaves a 0 value out, so such a sample field is 9 bytes shorter: a real Prometheus
    sends a few in most requests (a counter still at 0). Wherever they are (the first series too),
    a request of cached series with one sample each comes with its ids, and reads as the walk
    reads it."""
    pods = [_pod(f"p{i}", container=pad * (i % 2)) for i in range(len(zero))]
    series: list[Series] = [(lab, [(T0, 0.0 if z else 1.5 + i)])
                            for i, (lab, z) in enumerate(zip(pods, zero, strict=True))]
    cache = _warm([(lab, [(T0 - 1000, 1.0)]) for lab in pods])
    raw = _raw(series)
    known = scan(raw, None, cache.lookup)
    _same(known, scan(raw))
    assert known is not None and known.found == cache.lookup(known.keys)
    assert None not in known.found
    # read as one table (uniform_samples: the digits as an array), the sender's varints kept
    assert isinstance(known.stamp_varints, np.ndarray)
    assert known.stamp_varints.tobytes() == varints(known.timestamps.view(np.uint64))
