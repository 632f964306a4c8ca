"""A sender's repeated remote-write request recognised by one comparison (http/remote_write_layout.py):
whatever changed since the recorded request, decode_body's result equals the scan's, and a hit
comes only when nothing but the samples changed."""

from __future__ import annotations

import cramjam
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from test_http_remote_write_cache import _request

from metricsd.http.remote_write import RemoteWriteReceiver, SeriesCache, decode_body, prepare_write
from metricsd.http.remote_write_layout import LayoutMemo
from metricsd.http.remote_write_scan import Scanned, scan
from metricsd.http.selfmetrics import SelfMetrics
from metricsd.http.settings import HttpSettings
from metricsd.model import make_labels
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

Series = tuple[dict[str, str], list[tuple[int, float]]]
T0 = 1_700_000_000_000
HS = HttpSettings(access_log=False)


def _pod(pod: str, **extra: str) -> dict[str, str]:
    return {"__name__": "m", "namespace": "ns", "pod": pod, **extra}


def _snappy(raw: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(raw))


def _decode(raw: bytes, cache: SeriesCache) -> Scanned:
    return decode_body(_snappy(raw), 1 << 24, None, cache)


def _learnt(series: list[Series]) -> SeriesCache:
    """A cache that learnt ``series`` as the receiver does, and the layout of a request of them recorded."""
    cache = SeriesCache()
    raw = _request(series).SerializeToString()
    cache.add(prepare_write(_decode(raw, cache), cache, HS).learnt)
    _decode(raw, cache)  # every series cached now: the shortcut reads it, and its layout's key is noted
    assert len(cache.layouts) == 0  # seen once: not kept
    _decode(raw, cache)  # seen twice: recorded
    return cache


def _same(a: Scanned, b: Scanned | None) -> None:
    assert b is not None
    assert list(a.keys) == list(b.keys)
    assert a.counts.tolist() == b.counts.tolist()
    assert a.timestamps.tolist() == b.timestamps.tolist()
    assert a.values.view(np.int64).tolist() == b.values.view(np.int64).tolist()


_names = st.sampled_from(["a", "b", "c", "dd", "e" * 130])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_names, min_size=1, max_size=6, unique=True), st.integers(1, 3),
       st.sampled_from(["none", "label", "count", "width", "value0", "series"]),
       st.lists(st.floats(allow_nan=True), min_size=20, max_size=20), st.integers(0, 5))
def test_a_repeated_request_reads_as_the_scan_reads_it(pods: list[str], n: int, change: str, values: list[float],
                                                       which: int) -> None:
    """The recorded request's series again with other samples, or with one thing changed: a label
    byte (same length), one series' sample count, the timestamps' varint width, a value of 0 (the
    field left out), a series more. decode_body equals the scan of the new body, its ids are the
    cache's, and only the unchanged layout is a hit."""
    first: list[Series] = [(_pod(p), [(T0 + k, 1.0) for k in range(n)]) for p in pods]
    cache = _learnt(first)
    assert len(cache.layouts) == 1
    i = which % len(pods)
    vals = iter(values)
    second: list[Series] = [(dict(lab), [(T0 + 10_000 + k, next(vals) or 0.5) for k in range(n)])
                            for lab, _ in first]
    if change == "label":
        second[i][0]["pod"] = chr(ord(pods[i][0]) + 1) + pods[i][1:]  # same length, another byte
    elif change == "count":
        second[i] = (second[i][0], second[i][1][:-1] if n > 1 else [*second[i][1], (T0 + 20_000, 2.0)])
    elif change == "width":
        second = [(lab, [((1 << 20) + k, x) for k, (_, x) in enumerate(s)]) for lab, s in second]
    elif change == "value0":
        second[i] = (second[i][0], [(t, 0.0) for t, _ in second[i][1]])
    elif change == "series":
        second.append((_pod("zz"), [(T0 + 10_000 + k, 1.0) for k in range(n)]))
    raw = _request(second).SerializeToString()
    hits = cache.layouts.hits
    got = _decode(raw, cache)
    _same(got, scan(raw))
    if got.found is not None:
        assert got.found == cache.lookup(list(got.keys))
    if change == "none":
        assert cache.layouts.hits == hits + 1
        assert got.found_array is not None and got.found_array.tolist() == got.found
    else:
        assert cache.layouts.hits == hits  # any other change misses


def test_a_label_changed_within_a_sample_run_place_is_not_taken_for_a_sample() -> None:
    """The body is the recorded one's length and equal outside the recorded sample runs, but one
    series' sample run holds a label field of the same size and no sample: the uniform-sample check
    refuses it, and the scan reads it as it is."""
    first: list[Series] = [(_pod("a"), [(T0, 1.5)]), (_pod("b"), [(T0, 2.5)])]
    cache = _learnt(first)
    raw = bytearray(_request(first).SerializeToString())
    one = _request([first[0]]).SerializeToString()
    tail = len(_request([({}, [(T0, 1.5)])]).SerializeToString()) - 2  # the sample field's bytes
    at = len(one) - tail
    raw[at] = 0x0A  # the sample field's tag turned into a label field's: same length, nothing else moved
    hits = cache.layouts.hits
    try:
        got: Scanned | str = _decode(bytes(raw), cache)
    except Exception as e:  # the outcome, whatever it is, must be the uncached one's
        got = repr(e)
    try:
        plain: Scanned | str = decode_body(_snappy(bytes(raw)), 1 << 24)
    except Exception as e:
        plain = repr(e)
    assert cache.layouts.hits == hits
    if isinstance(got, str) or isinstance(plain, str):
        assert got == plain
    else:
        _same(got, plain)


def _outcome(raw: bytes, cache: SeriesCache | None) -> object:
    try:
        got = decode_body(_snappy(raw), 1 << 24, None, cache)
    except Exception as e:
        return repr(e)
    return (list(got.keys), got.counts.tolist(), got.timestamps.tolist(), got.values.view(np.int64).tolist())


def test_malformed_bodies_are_answered_as_without_layouts() -> None:
    """Whatever a body holds, looking it up among the layouts neither raises nor changes the answer:
    a first series cut inside a label header, a length past the end, a 4-byte length, nothing."""
    cache = _learnt([(_pod("a"), [(T0, 1.0)]), (_pod("b"), [(T0, 2.0)])])
    good = _request([(_pod("a"), [(T0, 1.0)])]).SerializeToString()
    for raw in (b"\x0a\x01\x0a", b"\x0a\x02\x0a\x85", b"\x0a\x7f\x0a", b"\x0a\x80\x80\x80\x01\x0a",
                b"\x0a", good[:-1], good + b"\x0a"):
        assert _outcome(raw, cache) == _outcome(raw, None)


def test_a_body_with_another_top_level_field_is_not_recorded() -> None:
    """Positions follow from the series' lengths only when the body is nothing but its series."""
    series: list[Series] = [(_pod("a"), [(T0, 1.0)]), (_pod("b"), [(T0, 2.0)])]
    cache = SeriesCache()
    raw = _request(series).SerializeToString() + bytes([0x1A, 2, 0x08, 1])  # field 3 (metadata), skipped
    cache.add(prepare_write(_decode(raw, cache), cache, HS).learnt)
    _decode(raw, cache)
    got = _decode(raw, cache)
    assert len(cache.layouts) == 0
    _same(got, scan(raw))


def test_layouts_are_bounded_and_forgotten_with_the_cache_entries() -> None:
    memo = LayoutMemo(max_layouts=2)
    cache = SeriesCache(max_entries=8)
    cache.layouts = memo
    for p in ("a", "b", "c"):
        series: list[Series] = [(_pod(p), [(T0, 1.0)]), (_pod(p + "2"), [(T0, 1.0)])]
        raw = _request(series).SerializeToString()
        cache.add(prepare_write(_decode(raw, cache), cache, HS).learnt)
        _decode(raw, cache)
        _decode(raw, cache)
    assert len(memo) == 2  # the oldest went
    small = SeriesCache()
    small.layouts = LayoutMemo(max_bytes=100)
    raw = _request([(_pod("a"), [(T0, 1.0)])]).SerializeToString()
    small.add(prepare_write(_decode(raw, small), small, HS).learnt)
    for _ in range(3):
        _decode(raw, small)
    assert len(small.layouts) == 0  # a body of more than half the bytes allowed is not kept
    cache.add([(b"k%d" % i, i) for i in range(8)])  # past 8 entries: some dropped
    assert cache.evicted and len(memo) == 0


async def test_repeated_requests_store_every_sample_and_a_forgetful_backend_gets_the_labels() -> None:
    """Through the receiver into a store: repeated requests hit the memo and store every sample;
    then a new, empty store behind the same receiver reports every id unknown, and the labels it
    gets are cut from the recorded layout."""
    pods = [_pod(f"p{i}", container="c" * (i % 3)) for i in range(40)]

    def body(tick: int) -> bytes:
        return _snappy(_request([(lab, [(T0 + tick * 10_000, float(tick + i))]) for i, lab in enumerate(pods)])
                       .SerializeToString())

    store = Store()
    rx = RemoteWriteReceiver(LocalBackend(StoreAPI(store)), HS, SelfMetrics(CollectorRegistry()))
    for tick in range(5):
        assert await rx.ingest(body(tick)) == 40
    assert rx.cache.layouts.hits == 2  # tick 0 learns, tick 1 notes the layout, tick 2 records it, 3-4 hit

    def stored(s: Store) -> dict[object, list[tuple[int, float]]]:
        return {x.labels: list(zip(x.timestamps.tolist(), x.values.tolist(), strict=True))
                for x in s.read([], -(2**62), 2**62)}

    expect = {make_labels(None, {k: v for k, v in lab.items() if v}): [(T0 + t * 10_000, float(t + i))
                                                                        for t in range(5)]
              for i, lab in enumerate(pods)}
    assert stored(store) == expect
    fresh = Store()
    rx.backend = LocalBackend(StoreAPI(fresh))
    assert await rx.ingest(body(5)) == 40
    assert rx.label_resends == 1 and rx.cache.layouts.hits == 3
    assert stored(fresh) == {k: [(T0 + 50_000, float(5 + i))] for i, k in enumerate(expect)}
