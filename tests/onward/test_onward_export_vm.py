"""metricsd's /api/v1/export imported into a real VictoriaMetrics (its /api/v1/import) round-trips
every sample exactly: VictoriaMetrics' own /api/v1/export gives back the same series, timestamps
and float64 bits; and VictoriaMetrics' export imported into metricsd does too."""

from __future__ import annotations

import io
import json
import urllib.parse
import urllib.request
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from onward_peers import VICTORIA_METRICS, running, victoria_metrics, vm_flush
from prometheus_client import CollectorRegistry
from writes import write_request

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.clock import ManualClock
from metricsd.http import HttpSettings, build_app, start_http, stop_http
from metricsd.model import make_labels
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(VICTORIA_METRICS is None, reason="victoria-metrics is not installed: run `make "
                                                        "victoria-metrics-deps` (apt-get, as root)"),
]

ALL = '{__name__=~".+"}'


def pod_labels(name: str, pod: str) -> tuple[tuple[str, str], ...]:
    return make_labels(name, {"namespace": "default", "pod": pod})


def _by_series(body: bytes) -> dict[tuple[tuple[str, str], ...], tuple[list[int], bytes]]:
    """Lines grouped per series (a series may take several lines), samples sorted by time."""
    acc: dict[tuple[tuple[str, str], ...], list[tuple[int, float]]] = {}
    for raw in body.splitlines():
        doc = json.loads(raw)
        key = tuple(sorted(doc["metric"].items()))
        vals = [float("nan") if v is None else float(v) for v in doc["values"]]
        acc.setdefault(key, []).extend(zip(doc["timestamps"], vals, strict=True))
    out = {}
    for key, pairs in acc.items():
        pairs.sort(key=lambda p: p[0])
        out[key] = ([t for t, _ in pairs], np.array([v for _, v in pairs]).tobytes())
    return out


async def test_export_into_victoria_metrics_and_back_round_trips_every_sample(tmp_path: Path) -> None:
    now = 1_790_000_000_000
    store = Store()
    backend = LocalBackend(StoreAPI(store, "t", ManualClock(now)))
    sim = Simulator(SimConfig(pods=30, containers=2), now - 3_600_000)
    written = 0
    while sim.next_timestamp_ms < now:
        ts, values = sim.block(60)
        for req in write_requests(sim, ts, values, max_samples=50_000, send_labels_for=None):
            await backend.write(req)
            written += len(req.timestamps)
    # Values of 12 significant digits, as many as VictoriaMetrics keeps (its decimal storage rounds past 12), and
    # not +-Inf: VictoriaMetrics 1.79 refuses the "Infinity" strings its later versions write and read.
    rng = np.random.default_rng(7)
    odd = np.round(rng.uniform(1000, 9999, 300), 8)
    stamps = list(range(now - len(odd) * 1000, now, 1000))
    await backend.write(write_request({pod_labels("odd_values", "p-odd"): (stamps, odd.tolist())}))
    written += len(odd)
    app = build_app(backend, settings=HttpSettings(access_log=False), registry=CollectorRegistry(),
                    clock=ManualClock(now))
    runner, port = await start_http(app, "127.0.0.1", 0)
    vm = victoria_metrics(tmp_path / "vm")
    try:
        with running(vm):
            async with aiohttp.ClientSession() as s:
                async with s.get(f"http://127.0.0.1:{port}/api/v1/export", params={"match[]": ALL}) as r:
                    ours = await r.read()
                async with s.post(vm.url + "/api/v1/import", data=io.BytesIO(ours)) as r:
                    assert r.status == 204, await r.text()
                vm_flush(vm)
                with urllib.request.urlopen(vm.url + "/api/v1/export?match[]=" + urllib.parse.quote(ALL)
                                            + "&start=0", timeout=60) as r:
                    theirs = r.read()
            mine, back = _by_series(ours), _by_series(theirs)
            assert sum(len(t) for t, _ in mine.values()) == written
            assert len(mine) == len(sim.series) + 1
            assert back == mine

            # And the other way: VictoriaMetrics' export imported into an empty metricsd.
            other = LocalBackend(StoreAPI(Store(), "o", ManualClock(now)))
            app2 = build_app(other, settings=HttpSettings(access_log=False),
                             registry=CollectorRegistry(), clock=ManualClock(now))
            runner2, port2 = await start_http(app2, "127.0.0.1", 0)
            try:
                async with aiohttp.ClientSession() as s:
                    async with s.post(f"http://127.0.0.1:{port2}/api/v1/import", data=io.BytesIO(theirs)) as r:
                        assert r.status == 204, await r.text()
                    async with s.get(f"http://127.0.0.1:{port2}/api/v1/export", params={"match[]": ALL}) as r:
                        assert _by_series(await r.read()) == mine
            finally:
                await stop_http(runner2)
    finally:
        await stop_http(runner)
