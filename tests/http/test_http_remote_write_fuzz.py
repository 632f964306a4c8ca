"""Remote write bodies, random and mutated: the hand-written scanner only ever answers or raises
DecodeError, and over real HTTP every such body gets 400 (413 for a declared size past the limit,
204 when it still is a valid request) and never changes what is stored unless it was valid."""

from __future__ import annotations

import random
from typing import Any

import cramjam
import pytest
from google.protobuf.message import DecodeError
from http_fixtures import Env
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.http.remote_write_scan import scan
from metricsd.proto import prometheus_remote_pb2 as prom

# Every test on both remote-write paths: the hot path and aiohttp's route (tests/http/conftest.py).
pytestmark = pytest.mark.usefixtures("write_path")

HEADERS = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
           "X-Prometheus-Remote-Write-Version": "0.1.0"}


def _raw() -> bytes:
    req = prom.WriteRequest()
    for i in range(6):
        ts = req.timeseries.add()
        for k, v in sorted({"__name__": "cpu", "namespace": "ns", "pod": f"p{i}", "container": "c"}.items()):
            ts.labels.add(name=k, value=v)
        for t in range(3):
            ts.samples.add(timestamp=1_000 * t + i, value=float(t * i))
    return req.SerializeToString()


RAW = _raw()


def _mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(4)
        if op == 0 and buf:
            buf[rng.randrange(len(buf))] ^= rng.randrange(1, 256)
        elif op == 1 and buf:
            del buf[rng.randrange(len(buf)):]
        elif op == 2:
            at = rng.randrange(len(buf) + 1)
            buf[at:at] = rng.randbytes(rng.randint(1, 16))
        elif buf:
            a = rng.randrange(len(buf))
            buf[a:a] = buf[a: a + rng.randint(1, 32)]  # splice a copy of a run
    return bytes(buf)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=512) | st.builds(lambda s: _mutate(random.Random(s), RAW), st.integers(0, 2**32)))
def test_the_scanner_answers_or_raises_decode_error_only(data: bytes) -> None:
    try:
        found = scan(data)
    except DecodeError:
        return
    if found is not None:
        assert len(found.keys) == len(found.counts) and int(found.counts.sum()) == len(found.timestamps)


def _stored(env: Env) -> tuple[Any, ...]:
    s = env.stats()
    return s["series"], s["samples"]


async def test_mutated_bodies_over_http_are_refused_and_store_nothing(env: Env) -> None:
    rng = random.Random(7)
    bodies = [bytes(cramjam.snappy.compress_raw(_mutate(rng, RAW))) for _ in range(150)]
    bodies += [rng.randbytes(rng.randint(0, 300)) for _ in range(50)]  # not even snappy
    statuses = []
    for body in bodies:
        before = _stored(env)
        async with env.session.post(env.url + "/api/v1/write", data=body, headers=HEADERS) as r:
            statuses.append(r.status)
            doc = await r.json() if r.status != 204 else None
        if r.status == 204:  # a mutation that is still a valid request of valid series
            continue
        # 413: random bytes that read as a snappy header declaring more than the decompressed limit
        assert (r.status, doc["errorType"]) in ((400, "bad_data"), (413, "too_large")), doc
        assert _stored(env) == before
    assert statuses.count(400) > 100
    async with env.session.get(env.url + "/api/v1/status/buildinfo") as r:
        assert r.status == 200  # still answering
