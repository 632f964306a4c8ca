"""Remote write 2.0 (io.prometheus.write.v2.Request) into a real store: our own encoder, the
specification's symbols-table shape, content negotiation, the Written headers, created timestamps,
and random and mutated bodies."""

from __future__ import annotations

import random
from typing import Any

import cramjam
import pytest
from google.protobuf.message import DecodeError
from http_fixtures import Env, start_env
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.http import HttpSettings, stop_http
from metricsd.http.remote_write_v2 import CONTENT_TYPE, entries, parse
from metricsd.proto import prometheus_remote_v2_pb2 as v2

# Every test on both remote-write paths: the hot path and aiohttp's route (tests/http/conftest.py).
pytestmark = pytest.mark.usefixtures("write_path")

HEADERS = {"Content-Encoding": "snappy", "Content-Type": CONTENT_TYPE, "X-Prometheus-Remote-Write-Version": "2.0.0"}
Series = tuple[dict[str, str], list[tuple[int, float]]]


def encode(series: list[Series], created: int = 0, counter: bool = False, per_sample_start: bool = False) -> bytes:
    """Our own 2.0 sender: one symbols table, symbols[0] the empty string, as the spec requires."""
    symbols: dict[str, int] = {"": 0}

    def ref(s: str) -> int:
        return symbols.setdefault(s, len(symbols))

    req = v2.Request()
    for labels, samples in series:
        ts = req.timeseries.add()
        for k, v in sorted(labels.items()):
            ts.labels_refs.extend([ref(k), ref(v)])
        for t, x in samples:
            ts.samples.add(timestamp=t, value=x, start_timestamp=created if per_sample_start else 0)
        if counter:
            ts.metadata.type = v2.Metadata.METRIC_TYPE_COUNTER
        if not per_sample_start:
            ts.created_timestamp = created
    req.symbols.extend(symbols)
    return req.SerializeToString()


async def _post(env: Env, raw: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
    async with env.session.post(env.url + "/api/v1/write", data=bytes(cramjam.snappy.compress_raw(raw)),
                                headers=headers or HEADERS) as r:
        return r.status, r.headers, (await r.json() if r.status != 204 else None)


async def _query(env: Env, q: str, t: int) -> Any:
    async with env.session.get(env.url + "/api/v1/query", params={"query": q, "time": str(t)}) as r:
        assert r.status == 200
        return (await r.json())["data"]["result"]


POD = {"__name__": "container_cpu_usage_seconds_total", "namespace": "shop", "pod": "cart-1", "container": "app"}


async def test_a_2_0_request_is_stored_and_answered_with_the_written_headers(env: Env) -> None:
    other = {**POD, "pod": "cart-2"}
    status, headers, _ = await _post(env, encode([(POD, [(1000, 1.0), (2000, 2.0)]), (other, [(2000, 5.0)])]))
    assert status == 204
    assert headers["X-Prometheus-Remote-Write-Samples-Written"] == "3"
    assert headers["X-Prometheus-Remote-Write-Histograms-Written"] == "0"
    assert headers["X-Prometheus-Remote-Write-Exemplars-Written"] == "0"
    got = await _query(env, "container_cpu_usage_seconds_total", 2)
    assert sorted((r["metric"]["pod"], r["value"][1]) for r in got) == [("cart-1", "2"), ("cart-2", "5")]
    # The same series again, now known to the cache; a retry of the same samples counts as written.
    status, headers, _ = await _post(env, encode([(POD, [(1000, 1.0), (2000, 2.0), (3000, 3.0)])]))
    assert status == 204 and headers["X-Prometheus-Remote-Write-Samples-Written"] == "3"
    assert env.stats()["samples"] == 4


def test_the_specifications_symbols_example_decodes() -> None:
    # The shape the specification describes: symbols[0] is "", and a series' labels_refs are
    # name/value pairs of indexes into symbols ([1, 2, 3, 4] -> __name__="my_metric", job="my_job").
    req = v2.Request(symbols=["", "__name__", "my_metric", "job", "my_job"])
    ts = req.timeseries.add(labels_refs=[1, 2, 3, 4])
    ts.samples.add(value=1.5, timestamp=1_700_000_000_000)
    found = entries(parse(req.SerializeToString()))
    assert found.scanned.timestamps.tolist() == [1_700_000_000_000] and found.scanned.values.tolist() == [1.5]
    from metricsd.proto import prometheus_remote_pb2 as prom  # the key is the series' 1.0 label fields
    labels = prom.TimeSeries.FromString(found.scanned.keys[0]).labels
    assert [(lab.name, lab.value) for lab in labels] == [("__name__", "my_metric"), ("job", "my_job")]


async def test_series_without_namespace_and_pod_and_relabelling_work_as_in_1_0(env: Env) -> None:
    up = {"__name__": "up", "job": "prometheus", "instance": "localhost:9090"}
    status, headers, _ = await _post(env, encode([(up, [(1000, 1.0)])]))
    assert status == 204 and headers["X-Prometheus-Remote-Write-Samples-Written"] == "1"
    got = await _query(env, "up", 1)
    assert got[0]["metric"] == {**up, "namespace": "_cluster", "pod": "localhost:9090"}


async def test_bad_references_are_400_naming_the_series_and_store_nothing(env: Env) -> None:
    def bad(refs: list[int]) -> bytes:
        req = v2.Request(symbols=["", "__name__", "up"])
        req.timeseries.add(labels_refs=refs).samples.add(value=1.0, timestamp=1000)
        return req.SerializeToString()

    for raw, message in [(bad([1, 2, 1]), "timeseries 0: odd number of labels_refs"),
                         (bad([1, 7]), "timeseries 0: labels_refs 7 is past the symbols table (3 symbols)"),
                         (bad([]), "timeseries 0: samples without labels_refs")]:
        status, _, err = await _post(env, raw)
        assert status == 400 and message in err["error"], err
    assert env.stats()["series"] == 0


async def test_created_timestamps_become_a_zero_sample_when_asked() -> None:
    env = await start_env(HttpSettings(created_timestamp_zero=True, access_log=False))
    try:
        for per_sample in (False, True):
            pod = {**POD, "pod": f"p-{per_sample}"}
            status, headers, _ = await _post(env, encode([(pod, [(60_000, 30.0)])], created=30_000, counter=True,
                                                          per_sample_start=per_sample))
            assert status == 204 and headers["X-Prometheus-Remote-Write-Samples-Written"] == "2"
        got = await _query(env, "sum(count_over_time(container_cpu_usage_seconds_total[2m]))", 60)
        assert got[0]["value"][1] == "4"  # two series, each a zero at 30 s and the sample at 60 s
    finally:
        await env.session.close()
        await stop_http(env.runner)  # type: ignore[arg-type]


async def test_created_timestamps_are_ignored_by_default(env: Env) -> None:
    status, headers, _ = await _post(env, encode([(POD, [(60_000, 30.0)])], created=30_000, counter=True))
    assert status == 204 and headers["X-Prometheus-Remote-Write-Samples-Written"] == "1"


def _raw() -> bytes:
    return encode([({"__name__": "cpu", "namespace": "ns", "pod": f"p{i}", "container": "c"},
                    [(1_000 * t + i, float(t * i)) for t in range(3)]) for i in range(6)], created=500)


RAW = _raw()


def _mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(3)
        if op == 0 and buf:
            buf[rng.randrange(len(buf))] ^= rng.randrange(1, 256)
        elif op == 1 and buf:
            del buf[rng.randrange(len(buf)):]
        else:
            at = rng.randrange(len(buf) + 1)
            buf[at:at] = rng.randbytes(rng.randint(1, 16))
    return bytes(buf)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=512) | st.builds(lambda s: _mutate(random.Random(s), RAW), st.integers(0, 2**32)),
       st.booleans())
def test_the_2_0_decoder_answers_or_raises_decode_error_only(data: bytes, created_zero: bool) -> None:
    try:
        found = entries(parse(data), created_zero).scanned
    except DecodeError:
        return
    assert len(found.keys) == len(found.counts) and int(found.counts.sum()) == len(found.timestamps)


async def test_mutated_2_0_bodies_over_http_are_refused_or_valid_and_store_nothing_when_refused(env: Env) -> None:
    rng = random.Random(11)
    statuses = []
    for _ in range(150):
        before = (env.stats()["series"], env.stats()["samples"])
        status, _, doc = await _post(env, _mutate(rng, RAW))
        statuses.append(status)
        if status == 204:
            continue
        assert (status, doc["errorType"]) == (400, "bad_data"), doc
        assert (env.stats()["series"], env.stats()["samples"]) == before
    assert statuses.count(400) > 50
