"""Hostile remote-write bodies over a real aiohttp server: each hits a stated limit with a 400 (or
413) naming it, before the body is split or its labels and samples are read; nothing is stored, and
other requests are answered meanwhile."""

from __future__ import annotations

import io
import resource
import struct
from typing import Any

import cramjam
import pytest
from http_fixtures import Env, running_env

from metricsd.http.remote_write_scan import MAX_LABELS_PER_SERIES, TooLarge, count_fields, scan_messages
from metricsd.http.remote_write_v2 import CONTENT_TYPE, SYMBOLS_PER_SERIES
from metricsd.proto import prometheus_remote_pb2 as prom
from metricsd.rpc.limits import DEFAULT_MAX_SAMPLES_PER_REQUEST, DEFAULT_MAX_SERIES_PER_REQUEST, RequestLimits
from metricsd.rpc.wire import varint

# Every test on both remote-write paths: the hot path and aiohttp's route (tests/http/conftest.py).
pytestmark = pytest.mark.usefixtures("write_path")

V1 = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"}
V2 = {"Content-Encoding": "snappy", "Content-Type": CONTENT_TYPE}


def _field(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + varint(len(payload)) + payload


def _label(name: str, value: str) -> bytes:
    return _field(0x0A, prom.Label(name=name, value=value).SerializeToString())


POD = b"".join(_label(k, v) for k, v in (("__name__", "cpu"), ("namespace", "ns"), ("pod", "p")))


def _snappy(raw: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(raw))


@pytest.fixture
async def env() -> Any:
    async with running_env() as e:
        yield e


async def _refused(env: Env, body: bytes, status: int, message: str, headers: dict[str, str] = V1) -> None:
    before = env.stats()
    async with env.session.post(env.url + "/api/v1/write", data=io.BytesIO(body), headers=headers) as r:
        assert r.status == status, await r.text()
        doc = await r.json()
    assert message in doc["error"], doc
    assert env.stats() == before
    async with env.session.get(env.url + "/api/v1/status/buildinfo") as r:
        assert r.status == 200  # still answering


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def test_millions_of_empty_series_are_refused_before_the_body_is_split(env: Env) -> None:
    """10 M empty series are 20 MB decompressed; split by protobuf they cost about 1.4 GB."""
    peak = _peak_rss_mib()
    await _refused(env, _snappy(b"\x0a\x00" * 10_000_000), 400,
                   f"more than {DEFAULT_MAX_SERIES_PER_REQUEST} series, the limit per request")
    assert _peak_rss_mib() - peak < 400  # the body and its decompressed copy, not a split of it


async def test_a_series_of_a_million_labels_is_refused_before_its_labels_are_read(env: Env) -> None:
    labels = _label("a", "b") * 1_000_000
    await _refused(env, _snappy(_field(0x0A, POD + labels)), 400,
                   f"timeseries 0 has more than {MAX_LABELS_PER_SERIES} labels")


async def test_samples_past_the_limit_in_a_body_of_uneven_samples_are_refused_before_one_is_read(env: Env) -> None:
    """Samples alternating between a value and a 0 (left out) are not one table: the body takes
    protobuf's message path, which counts them before a Python object is made for one."""
    one = _field(0x12, b"\x09" + struct.pack("<d", 1.0) + b"\x10\x01")
    zero = _field(0x12, b"\x10\x02")
    n = DEFAULT_MAX_SAMPLES_PER_REQUEST // 2 + 1
    await _refused(env, _snappy(_field(0x0A, POD + (one + zero) * n)), 400,
                   f"write request has {2 * n} samples, more than the limit of {DEFAULT_MAX_SAMPLES_PER_REQUEST}")


async def test_truncated_bodies_are_refused(env: Env) -> None:
    sample = _field(0x12, b"\x09" + struct.pack("<d", 1.0) + b"\x10" + varint(1_700_000_000_000))
    raw = _field(0x0A, POD + sample * 3)
    await _refused(env, _snappy(raw)[:-3], 400, "snappy")  # the compressed block cut short
    await _refused(env, _snappy(raw[:-5]), 400, "protobuf")  # a whole block of a cut message
    await _refused(env, _snappy(raw[:-5] + _field(0x0A, POD)), 400, "protobuf")  # cut, then more series


async def test_a_2_0_body_of_millions_of_symbols_or_a_series_of_too_many_labels_is_refused(env: Env) -> None:
    limit = DEFAULT_MAX_SERIES_PER_REQUEST * SYMBOLS_PER_SERIES
    await _refused(env, _snappy(_field(0x22, b"") * (limit + 1)), 400, f"more than {limit} symbols", V2)
    symbols = b"".join(_field(0x22, s) for s in (b"", b"__name__", b"cpu", b"namespace", b"ns", b"pod", b"p"))
    refs = bytes([1, 2, 3, 4, 5, 6]) + bytes([1, 2]) * MAX_LABELS_PER_SERIES
    series = _field(0x2A, _field(0x0A, refs) + _field(0x12, b"\x09" + struct.pack("<d", 1.0) + b"\x10\x05"))
    await _refused(env, _snappy(symbols + series), 400, f"timeseries 0 has more than {MAX_LABELS_PER_SERIES} labels",
                   V2)


def test_counting_fields_matches_protobuf_and_stops_past_the_limit() -> None:
    req = prom.WriteRequest()
    for i in range(300):
        ts = req.timeseries.add()
        ts.labels.add(name="a" * (i % 200), value="b" * (i * 3))  # lengths of one, two and three bytes
        ts.samples.add(value=1.0, timestamp=i)
    raw = req.SerializeToString() + b"\x18\x96\x01" + b"\x21" + bytes(8) + b"\x1a\x03abc"  # other fields, wire types
    assert count_fields(raw, 1, 10**9) == 300
    assert count_fields(raw, 3, 10) == 1
    assert count_fields(raw, 1, 5) == 6


def test_the_message_path_counts_samples_and_labels_before_reading_them() -> None:
    req = prom.WriteRequest()
    ts = req.timeseries.add()
    ts.labels.add(name="pod", value="p")
    ts.samples.extend(prom.Sample(value=float(i), timestamp=i) for i in range(6))
    with pytest.raises(TooLarge, match="write request has 6 samples, more than the limit of 5"):
        scan_messages(req, RequestLimits(max_samples=5))
    assert len(scan_messages(req, RequestLimits(max_samples=6)).timestamps) == 6
    ts.labels.extend(prom.Label(name=f"l{i}", value="v") for i in range(MAX_LABELS_PER_SERIES))
    with pytest.raises(TooLarge, match=f"timeseries 0 has more than {MAX_LABELS_PER_SERIES} labels"):
        scan_messages(req)
