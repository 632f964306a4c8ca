"""The script runner's HTTP backend: a real store behind the real HTTP API on loopback.

Data goes in through the store API's write path (the columnar WriteRequest, as agents send it);
queries go out as HTTP requests to ``/api/v1/query`` and ``/api/v1/query_range``, so parameter
parsing, pushdown, prefetching and JSON encoding are all on the path. The server runs on an event
loop in a background thread because the runner itself is synchronous.

The scripts' series have no namespace/pod labels, so this store is made with
``require_pod_labels=False``; ``clear`` swaps in a fresh store behind the same server.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Coroutine
from typing import Any, TypeVar

import grpc
from prometheus_client import CollectorRegistry
from promql_script_backend import LoadSeries

from metricsd.clock import ManualClock
from metricsd.http import HttpSettings, build_app, start_http, stop_http
from metricsd.model import series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.rpc.backend import BadRequest
from metricsd.rpc.client import GrpcBackend
from metricsd.rpc.server import start_grpc_server
from metricsd.rpc.servicer import MetricsServicer
from metricsd.rpc.wire import labels_to_pb
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings

__all__ = ["HttpBackend"]


async def _channel(address: str) -> Any:
    return grpc.aio.insecure_channel(address)

T = TypeVar("T")

# Scripts load history out of order across load commands; accept any of it.
STORE_SETTINGS = StoreSettings(require_pod_labels=False, ooo_window_ms=10**15)


def _request(series: list[LoadSeries]) -> pb.WriteRequest:
    req = pb.WriteRequest()
    for labels, ts, vals in series:
        labels = tuple((k, v) for k, v in labels if v != "")  # an empty label is no label, as in Prometheus
        sid = series_id(labels)
        req.ids.append(sid)
        req.counts.append(len(ts))
        req.timestamps.extend(ts.tolist())
        req.values.extend(vals.tolist())
        req.series.add(id=sid).labels.extend(labels_to_pb(labels))
    return req


class HttpBackend:
    """``over_grpc``: the HTTP API reads through a GrpcBackend from a real gRPC server of the store
    (the columnar Read, one SeriesBatch message a selector), not from the store in its process."""

    def __init__(self, over_grpc: bool = False) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="promql-http", daemon=True)
        self.thread.start()
        self.backend = LocalBackend(StoreAPI(Store(STORE_SETTINGS)))
        self.skipped: list[str] = []  # series the store refused (e.g. without a metric name)
        self.grpc: tuple[Any, Any] | None = None
        served: Any = self.backend
        if over_grpc:
            server, grpc_port = self._call(start_grpc_server(MetricsServicer(self.backend), "127.0.0.1", 0))
            channel = self._call(_channel(f"127.0.0.1:{grpc_port}"))
            self.grpc = (server, channel)
            served = GrpcBackend(pb_grpc.MetricsStub(channel))
        app = build_app(served, settings=HttpSettings(access_log=False), registry=CollectorRegistry(),
                        clock=ManualClock(0))
        self.runner, port = self._call(start_http(app, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{port}"

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def clear(self) -> None:
        async def fresh() -> None:
            self.backend.api = StoreAPI(Store(STORE_SETTINGS))

        self._call(fresh())

    def load(self, series: list[LoadSeries]) -> None:
        try:
            self._write(series)
        except BadRequest:
            for one in series:  # store what can be stored; the evals needing the rest fail visibly
                try:
                    self._write([one])
                except BadRequest as e:
                    self.skipped.append(str(e))

    def _write(self, series: list[LoadSeries]) -> None:
        async def write(req: pb.WriteRequest) -> pb.WriteResponse:
            return await self.backend.write(req)

        resp = self._call(write(_request(series)))
        if resp.unknown_ids:
            raise RuntimeError(f"store reported unknown ids {list(resp.unknown_ids)[:3]}")

    def _get(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        body = urllib.parse.urlencode(params).encode()
        req = urllib.request.Request(self.url + path, data=body, method="POST",
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return dict(json.load(r))
        except urllib.error.HTTPError as e:
            with e:
                return dict(json.load(e))

    def instant(self, expr: str, time_ms: int) -> dict[str, Any]:
        return self._get("/api/v1/query", {"query": expr, "time": f"{time_ms / 1000:.3f}"})

    def range(self, expr: str, start_ms: int, end_ms: int, step_ms: int) -> dict[str, Any]:
        return self._get("/api/v1/query_range", {"query": expr, "start": f"{start_ms / 1000:.3f}",
                                                 "end": f"{end_ms / 1000:.3f}", "step": f"{step_ms / 1000:.3f}"})

    def close(self) -> None:
        try:
            self._call(stop_http(self.runner))
            if self.grpc is not None:
                self._call(self.grpc[1].close())
                self._call(self.grpc[0].stop(None))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self.loop.close()
