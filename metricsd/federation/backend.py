"""FederatedBackend: the metrics API over several clusters' proxies.

It implements :class:`metricsd.rpc.backend.MetricsBackend`, so ``metricsd federate`` serves it
with the same gRPC servicer and HTTP API as a proxy. Each request goes to the clusters its
``cluster`` matchers allow (routing.py), to all of them at once, each under its own deadline
(calls.py); the answers are merged (merge.py) and carry a ``cluster`` label.

A cluster that does not answer is named in the reply's ``missing_clusters`` and reported to the
HTTP request (metricsd/rpc/missing.py), which turns it into a Prometheus warning: a partial sum
never looks whole. When every cluster asked fails, the request fails (Unavailable: gRPC
UNAVAILABLE, HTTP 503) instead of answering an empty success. A cluster that is itself a
federation passes its own missing clusters up as ``NAME/INNER``.

Writes are refused: a federating proxy reads across clusters; each cluster's agents write to
their own cluster's proxies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from metricsd import __version__
from metricsd.federation.calls import ClusterCall, ClusterFailed, FederationMetrics, FederationSettings
from metricsd.federation.merge import (
    MergeError,
    merge_aggregate,
    merge_label_values,
    merge_list_series,
    merge_reads,
    merge_rollups,
)
from metricsd.federation.routing import CLUSTER_LABEL, aggregate_for_clusters, route
from metricsd.federation.spec import ClusterTarget
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest, LimitExceeded, MetricsBackend, Unavailable
from metricsd.rpc.missing import Missing, from_pb, report, to_pb

__all__ = ["FederatedBackend"]

T = TypeVar("T")
Connect = Callable[[str], MetricsBackend]


class FederatedBackend:
    """A MetricsBackend over ``targets``; ``connect(address)`` builds each cluster's client.
    Not thread-safe: use from one event loop."""

    def __init__(self, targets: Sequence[ClusterTarget], settings: FederationSettings, connect: Connect,
                 metrics: FederationMetrics | None = None) -> None:
        self.targets = list(targets)
        self.names = [t.name for t in targets]
        self.settings = settings
        self.clusters = {t.name: ClusterCall(t.name, connect(t.address), settings, metrics) for t in targets}

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        for c in self.clusters.values():
            close = getattr(c.backend, "close", None)
            if close is not None:
                await close()

    async def _fan(self, names: Sequence[str], method: str, call: Callable[[MetricsBackend], Awaitable[T]]
                   ) -> tuple[list[tuple[str, T]], list[Missing]]:
        """Ask ``names`` at once: (answers in ``names``' order, missing clusters). Raises
        Unavailable when every one failed, and the first BadRequest / LimitExceeded a cluster gave."""
        results = await asyncio.gather(*(self.clusters[n](method, call) for n in names), return_exceptions=True)
        answers: list[tuple[str, T]] = []
        missing: list[Missing] = []
        for name, r in zip(names, results, strict=True):
            if isinstance(r, BadRequest | LimitExceeded):
                raise r
            if isinstance(r, ClusterFailed):
                missing.append(Missing(name, r.reason))
            elif isinstance(r, BaseException):
                raise r
            else:
                answers.append((name, r))
                inner = getattr(r, "missing_clusters", None)
                if inner:
                    missing.extend(Missing(f"{name}/{m.cluster}", m.reason) for m in from_pb(inner))
        if names and not answers:
            raise Unavailable("no cluster answered: " + "; ".join(f"cluster {m.cluster} {m.reason}" for m in missing))
        return answers, missing

    @staticmethod
    def _done(resp: Any, missing: list[Missing]) -> Any:
        if missing:
            resp.missing_clusters.extend(to_pb(missing))
            report(missing)
        return resp

    # --- the data path ---------------------------------------------------------------------

    async def write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        raise BadRequest("a federating proxy is read-only: write to the proxies of the series' own cluster")

    def _routed(self, request: pb.ReadRequest) -> tuple[list[str], pb.ReadRequest]:
        """The clusters a Read / Rollups selector picks, and the request without its cluster matchers."""
        names, matchers = route(self.names, request.matchers)
        sub = pb.ReadRequest()
        sub.CopyFrom(request)
        del sub.matchers[:]
        sub.matchers.extend(matchers)
        sub.columnar = False  # merge_reads relabels series one by one; a reader takes either form
        return names, sub

    async def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        names, sub = self._routed(request)
        answers, missing = await self._fan(names, "Read", lambda b: b.read(sub))
        return self._done(merge_reads(answers), missing)

    async def aggregate(self, request: pb.AggregateRequest) -> pb.AggregateResponse:
        names, sub, by_cluster = aggregate_for_clusters(self.names, request)
        answers, missing = await self._fan(names, "Aggregate", lambda b: b.aggregate(sub))
        try:
            merged = merge_aggregate(request, answers, by_cluster)
        except MergeError as e:
            raise Unavailable(f"cannot merge the clusters' aggregates: {e}") from e
        return self._done(merged, missing)

    async def rollups(self, request: pb.ReadRequest) -> pb.RollupsResponse:
        names, sub = self._routed(request)
        answers, missing = await self._fan(names, "Rollups", lambda b: b.rollups(sub))
        return self._done(merge_rollups(answers), missing)

    async def list_series(self, request: pb.ListSeriesRequest) -> pb.ListSeriesResponse:
        names, matchers = route(self.names, request.matchers)
        sub = pb.ListSeriesRequest(matchers=matchers, limit=request.limit)
        answers, missing = await self._fan(names, "ListSeries", lambda b: b.list_series(sub))
        return self._done(merge_list_series(answers, request.limit), missing)

    async def label_values(self, request: pb.LabelValuesRequest) -> pb.LabelValuesResponse:
        names, matchers = route(self.names, request.matchers)
        # for ``cluster``: whether a cluster holds any matching series, from its metric names
        asked = "__name__" if request.name == CLUSTER_LABEL else request.name
        sub = pb.LabelValuesRequest(name=asked, matchers=matchers)
        answers, missing = await self._fan(names, "LabelValues", lambda b: b.label_values(sub))
        return self._done(merge_label_values(request.name, answers), missing)

    # --- health and stats ------------------------------------------------------------------

    async def health(self) -> pb.HealthResponse:
        """SERVING while at least one cluster serves (answers then name the others as missing);
        ``member`` lists every cluster's state."""
        results = await asyncio.gather(*(self.clusters[n]("Health", lambda b: b.health()) for n in self.names),
                                       return_exceptions=True)
        states = []
        serving = 0
        for name, r in zip(self.names, results, strict=True):
            if isinstance(r, pb.HealthResponse):
                states.append(f"{name}={pb.HealthResponse.Status.Name(r.status)}")
                serving += r.status == pb.HealthResponse.SERVING
            else:
                states.append(f"{name}=DOWN ({r})")
        status = pb.HealthResponse.SERVING if serving else pb.HealthResponse.NOT_SERVING
        text = f"federation of {len(self.names)} clusters, {serving} serving: {', '.join(states)}"
        return pb.HealthResponse(status=status, member=text, version=__version__)

    async def stats(self) -> pb.StatsResponse:
        """The clusters' stats summed; ``rejected`` gains ``federation_clusters_unreachable``."""
        results = await asyncio.gather(*(self.clusters[n]("Stats", lambda b: b.stats()) for n in self.names),
                                       return_exceptions=True)
        out = pb.StatsResponse()
        unreachable = 0
        for r in results:
            if not isinstance(r, pb.StatsResponse):
                unreachable += 1
                continue
            for f in ("series", "samples", "chunk_bytes", "chunk_samples", "head_samples", "pods", "rollup_buckets"):
                setattr(out, f, getattr(out, f) + getattr(r, f))
            for k, v in r.rejected.items():
                out.rejected[k] += v
        out.bytes_per_sample = out.chunk_bytes / out.chunk_samples if out.chunk_samples else 0.0
        out.rejected["federation_clusters_unreachable"] = unreachable
        return out


def _check_protocol(f: FederatedBackend) -> MetricsBackend:
    return f
