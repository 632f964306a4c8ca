"""Read consistency per request, on real processes: 3 stores (RF 3), a config server and a proxy
(W 2, R 2) with its HTTP API, on a real etcd, with mutual TLS and tokens as ``metricsd cluster up``
runs them. PromQL over HTTP asks one replica, hedged to the next when it is slow; ``quorum`` is a
query parameter or a header away, and the gRPC API keeps the quorum."""

from __future__ import annotations

import signal
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from cluster_procs import Proc, Procs, free_port, wait_listening, wait_map
from polling import wait_until
from test_cluster_proxies import SLOTS, T0, _serving, tick, workload_series

from metricsd.cluster.etcd_kv import EtcdKV
from metricsd.cluster.etcd_server import EtcdServer
from metricsd.cluster.shardmap import KeyLayout
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.rpc.backend import Unavailable
from metricsd.rpc.channel import open_channel
from metricsd.rpc.client import GrpcBackend

pytestmark = pytest.mark.slow

CALL_TIMEOUT_S = 2.0
QUERY = "sum(load)"


@dataclass
class Cluster:
    procs: Procs
    stores: dict[str, Proc]
    proxy: Proc
    grpc: GrpcBackend
    http: aiohttp.ClientSession
    url: str

    async def query(self, params: dict[str, str] | None = None, headers: dict[str, str] | None = None
                    ) -> tuple[int, dict[str, Any], float]:
        t0 = time.monotonic()
        async with self.http.get(self.url + "/api/v1/query", params={"query": QUERY, "time": str(T0 / 1000 + 30),
                                                                     **(params or {})}, headers=headers) as r:
            return r.status, await r.json(), time.monotonic() - t0

    async def counter(self, name: str) -> int:
        return int((await self.grpc.stats()).rejected.get(f"proxy_{name}", 0))

    async def wait_level(self, samples: int) -> None:
        """Wait until every one of the 3 replicas holds ``samples``: the proxy acknowledges at W = 2 and
        the third replica's part follows in the background (its Stats sum the stores: RF copies)."""
        async def level() -> bool:
            return (await self.grpc.stats()).samples == 3 * samples

        await wait_until("every replica holding every sample", level)


@pytest.fixture
async def cluster(etcd_server: EtcdServer, etcd_client: Callable[[EtcdServer], EtcdKV],
                  tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    """The cluster; ``indirect`` parametrization adds flags to the proxy's command line."""
    layout = KeyLayout(root=f"/consistency-test-{uuid.uuid4().hex[:8]}", cluster="c1")
    kv = etcd_client(etcd_server)
    procs = Procs(tmp_path, etcd_server.endpoint, layout)
    sec = procs.security
    channel = None
    try:
        # a lease long enough that the frozen stores stay in the map while the test runs
        stores = {f"store-{i}": procs.store(f"store-{i}", ttl=60) for i in (1, 2, 3)}
        procs.config_server("cs-1", slots=SLOTS, rf=3, ttl=2, min_members=3)
        grpc_port, http_port = free_port(), free_port()
        proxy = procs.start("proxy", "proxy", ["--grpc-port", str(grpc_port), "--http-port", str(http_port),
                                               "--w", "2", "--r", "2", "--call-timeout", str(CALL_TIMEOUT_S),
                                               # whole queries start from store-1, which the tests freeze
                                               "--whole-first", "0", *getattr(request, "param", [])],
                            grpc_port)
        await wait_map(kv, layout, lambda m: len(m.members) == 3)
        for p in [*stores.values(), proxy]:
            await wait_listening(p)
        channel = open_channel(f"127.0.0.1:{grpc_port}", procs.client())
        grpc = GrpcBackend(pb_grpc.MetricsStub(channel), timeout_s=10.0)
        await wait_until("the proxy serving", lambda: _serving(grpc))
        tls = ssl.create_default_context(cafile=str(sec.ca))
        tls.load_cert_chain(str(sec.cert), str(sec.key))
        token = sec.token_file("ops").read_text().strip()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls),
                                         headers={"Authorization": f"Bearer {token}"}) as http:
            yield Cluster(procs, stores, proxy, grpc, http, f"https://127.0.0.1:{http_port}")
    except BaseException:
        print(procs.logs())
        raise
    finally:
        for p in procs.procs:
            if p.alive:
                p.popen.send_signal(signal.SIGCONT)
        if channel is not None:
            await channel.close(None)
        procs.close()


async def test_promql_over_http_reads_one_replica_hedged_while_quorum_stays_a_parameter_or_header_away(
        cluster: Cluster) -> None:
    series = workload_series()
    for i in range(4):
        resp = await cluster.grpc.write(tick(series, T0 + i * 10_000, np.arange(len(series), dtype=np.float64)))
        assert resp.samples_written == len(series)
    # PromQL over HTTP reads one replica, and store-3 alone answers below: it may be the replica
    # whose part was still on its way when the write was acknowledged.
    await cluster.wait_level(4 * len(series))
    want = float(sum(range(len(series))))
    status, body, _ = await cluster.query()
    assert status == 200 and float(body["data"]["result"][0]["value"][1]) == want
    status, body, _ = await cluster.query({"consistency": "quorum"})
    assert status == 200 and float(body["data"]["result"][0]["value"][1]) == want

    # An unknown level is refused, naming the values that are accepted.
    status, body, _ = await cluster.query({"consistency": "all"})
    assert status == 400 and body["errorType"] == "bad_data"
    assert "unknown read consistency 'all': use one or quorum" in body["error"]

    # Two of three stores frozen (not dead: their connections stay open and nothing answers). A
    # dashboard's read asks one replica and hedges to the next after that store's recent p99, so
    # every answer comes from store-3, in much less than the call timeout.
    frozen = [cluster.stores["store-1"], cluster.stores["store-2"]]
    hedges = await cluster.counter("read_one_hedges") + await cluster.counter("whole_query_hedges")
    for p in frozen:
        p.popen.send_signal(signal.SIGSTOP)
    try:
        took = []
        for _ in range(6):
            status, body, secs = await cluster.query()
            assert status == 200, body
            assert float(body["data"]["result"][0]["value"][1]) == want
            took.append(secs)
        assert max(took) < CALL_TIMEOUT_S / 2, took
        # hedged as one-replica reads, or as a whole query (sent to one store: the proxy's default)
        assert await cluster.counter("read_one_hedges") + await cluster.counter("whole_query_hedges") > hedges

        # The same question with a quorum, asked by parameter or by header: one reply per slot
        # cannot make R = 2, so it fails once the frozen stores' calls time out.
        for how in ({"params": {"consistency": "quorum"}}, {"headers": {"X-Metricsd-Consistency": "quorum"}}):
            status, body, secs = await cluster.query(**how)  # type: ignore[arg-type]
            assert status == 503 and body["errorType"] == "unavailable", body
            assert "read quorum not reached" in body["error"] and secs >= CALL_TIMEOUT_S * 0.9
        # ... and the gRPC API, the autoscalers' way in, reads a quorum without being asked.
        with pytest.raises(Unavailable, match="read quorum not reached"):
            await cluster.grpc.aggregate(pb.AggregateRequest(
                query=pb.AggregateQuery(matchers=[pb.Matcher(name="__name__", value="load")], series_fn=pb.SERIES_LAST,
                                        window_ms=300_000),
                across=pb.ACROSS_SUM, start_ms=T0 + 30_000, end_ms=T0 + 30_000))
    finally:
        for p in frozen:
            p.popen.send_signal(signal.SIGCONT)
    await wait_until("the quorum read answers again", lambda: _quorum_answers(cluster, want), timeout_s=30)


async def _quorum_answers(cluster: Cluster, want: float) -> bool:
    status, body, _ = await cluster.query({"consistency": "quorum"})
    return status == 200 and float(body["data"]["result"][0]["value"][1]) == want


@pytest.mark.parametrize("cluster", [["--query.max-samples", "100"]], indirect=True)
async def test_a_query_over_the_sample_limit_is_refused_with_422_at_either_consistency(cluster: Cluster) -> None:
    """A selection a store refuses under the proxy's --query.max-samples (each store holds more than
    the limit of the selected samples) is the query's fault, not the cluster's: 422, whichever way
    the proxy reads (one replica or a quorum), and at once, without asking every replica."""
    series = workload_series()
    for i in range(4):
        assert (await cluster.grpc.write(tick(series, T0 + i * 10_000, np.ones(len(series))))).samples_written
    expr = "count_over_time(load[1m])"  # 96 pods x 4 samples, more than 100 on any store asked
    for params in ({}, {"consistency": "quorum"}, {"consistency": "one"}):
        for path in ("/api/v1/query", "/api/v1/query_range"):
            t0 = time.monotonic()
            query = {"query": expr, "time": str(T0 / 1000 + 30), "start": str(T0 / 1000), "end": str(T0 / 1000 + 30),
                     "step": "10", **params}
            async with cluster.http.get(cluster.url + path, params=query) as r:
                status, body = r.status, await r.json()
            assert status == 422 and body["errorType"] == "execution", (path, params, body)
            assert "max-samples" in body["error"] and time.monotonic() - t0 < CALL_TIMEOUT_S, (path, params, body)
