"""ProxyBackend: the metrics API served by fanning out to the stores of a sharded, replicated cluster.

It implements :class:`metricsd.rpc.backend.MetricsBackend`, so the gRPC shell
(``MetricsServicer(ProxyBackend(...))``), the HTTP API and the consumers use a proxy exactly as
they use one store. The parts, one concern per module:

- view.py: the newest shard map (from a MapSource, never blocking on etcd), one connection per
  member, member health learned from call outcomes, timeouts and retries;
- routing.py: series id -> slot, learned from the labels clients send;
- writes.py + handoff.py: quorum writes and hinted hand-off;
- fanout.py + reads.py + repair.py: quorum reads, merges and read repair.

Health is SERVING when every slot has enough reachable replicas for a read quorum; Stats sums the
members' stats (raw: every replica counts, so series and samples are about RF times the distinct
data) and adds the proxy's own counters to ``rejected`` under ``proxy_*`` keys.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from metricsd import __version__
from metricsd.clock import Clock
from metricsd.cluster.mapsource import MapSource
from metricsd.columns import SeriesColumns
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.members import Connect, grpc_connect
from metricsd.proxy.quorum import Op
from metricsd.proxy.reads import ReadPath
from metricsd.proxy.routing import SeriesRouter
from metricsd.proxy.settings import ProxySettings
from metricsd.proxy.view import ClusterView
from metricsd.proxy.wholequery import WholeQueryPath, first_place
from metricsd.proxy.writes import WritePath
from metricsd.rpc.backend import MetricsBackend, Unavailable
from metricsd.rpc.columns import WriteColumns
from metricsd.security.settings import ClientSecurity

__all__ = ["ProxyBackend"]

_UP = (pb.HealthResponse.SERVING, pb.HealthResponse.CATCHING_UP)


class ProxyBackend:
    """A MetricsBackend over the cluster described by ``map_source``.

    ``connect(address)`` builds the backend of one store member; the default dials gRPC with the
    stores' message limits (one channel per address, reused, closed when the map drops the member).
    Not thread-safe: use from one event loop.
    """

    def __init__(self, map_source: MapSource, settings: ProxySettings, clock: Clock, *,
                 connect: Connect | None = None, name: str = "proxy", security: ClientSecurity | None = None) -> None:
        self.settings = settings
        self.name = name
        self.counters: Counter[str] = Counter()
        self.view = ClusterView(map_source, settings, clock, connect or grpc_connect(settings.call_timeout_s, security,
                                                                                    settings.writes_on_read_port),
                                self.counters)
        self.router = SeriesRouter(settings.series_cache)
        self.writes = WritePath(self.view, self.router, clock, self.counters)
        self.reads = ReadPath(self.view, clock, self.counters)
        # a dashboard's PromQL query sent whole to one store; metricsd/http/server.py build_app
        # puts metricsd/http/wholehttp.py in front of the query routes of a backend that has this
        self.whole_queries = WholeQueryPath(self.view, self.reads.latency, self.counters,
                                            first_place(settings.whole_first))

    async def start(self) -> None:
        """Nothing to wait for: connections open on first use and the map is read per request
        (a proxy started before the map answers Unavailable until it arrives)."""
        return None

    async def close(self) -> None:
        """Stop background work (queued hints are lost) and close the member connections."""
        await self.writes.close()
        await self.reads.close()
        await self.view.close()

    # --- the data path ---------------------------------------------------------------------

    async def write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        return await self.writes.write(request)

    async def write_columns(self, batch: WriteColumns) -> pb.WriteResponse:
        return await self.writes.write_columns(batch)

    async def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        return await self.reads.read(request)

    async def read_columns(self, request: pb.ReadRequest) -> SeriesColumns:
        """read() as columns, no message made for this process (the HTTP API's PromQL engine)."""
        return await self.reads.read_columns(request)

    async def aggregate(self, request: pb.AggregateRequest) -> pb.AggregateResponse:
        return await self.reads.aggregate(request)

    async def rollups(self, request: pb.ReadRequest) -> pb.RollupsResponse:
        return await self.reads.rollups(request)

    async def list_series(self, request: pb.ListSeriesRequest) -> pb.ListSeriesResponse:
        return await self.reads.list_series(request)

    async def label_values(self, request: pb.LabelValuesRequest) -> pb.LabelValuesResponse:
        return await self.reads.label_values(request)

    # --- health and stats ------------------------------------------------------------------

    async def _ask_all(self, what: str) -> dict[str, object]:
        """Call Health or Stats on every member of the map at once; member -> reply or error text."""
        shard_map = self.view.current_map()

        async def one(member: str) -> object:
            try:
                if what == "health":
                    return await self.view.call(shard_map, member, lambda b: b.health(), retries=0)
                return await self.view.call(shard_map, member, lambda b: b.stats(), retries=0)
            except Unavailable as e:
                return str(e)

        members = sorted(shard_map.members)
        return dict(zip(members, await asyncio.gather(*(one(m) for m in members)), strict=True))

    async def health(self) -> pb.HealthResponse:
        """SERVING when every slot can reach a read quorum; ``member`` lists the members' states."""
        try:
            shard_map = self.view.current_map()
            q = self.view.quorum(shard_map)
        except Unavailable as e:
            return pb.HealthResponse(status=pb.HealthResponse.NOT_SERVING, member=f"{self.name}: {e}",
                                     version=__version__)
        answers = await self._ask_all("health")
        up = {m for m, r in answers.items() if isinstance(r, pb.HealthResponse) and r.status in _UP}
        states = []
        for m, r in answers.items():
            if isinstance(r, pb.HealthResponse):
                states.append(f"{m}={pb.HealthResponse.Status.Name(r.status)}")
            else:
                states.append(f"{m}=DOWN")
        short = [s for s in range(shard_map.num_slots)
                 if sum(m in up for m in shard_map.replicas(s)) < q.required(Op.READ, len(shard_map.replicas(s)))]
        text = (f"{self.name}: map v{shard_map.version}, {shard_map.num_slots} slots, rf {shard_map.rf}, "
                f"w {q.w}, r {q.r}; members: {', '.join(states) or 'none'}")
        if short:
            listed = ", ".join(map(str, short[:10])) + (f" and {len(short) - 10} more" if len(short) > 10 else "")
            text += f"; no read quorum for {len(short)} slots: {listed}"
        status = pb.HealthResponse.NOT_SERVING if short else pb.HealthResponse.SERVING
        return pb.HealthResponse(status=status, member=text, version=__version__)

    async def stats(self) -> pb.StatsResponse:
        """The members' stats summed (raw: replicas counted RF times) plus ``proxy_*`` counters."""
        answers = await self._ask_all("stats")
        out = pb.StatsResponse()
        rejected: Counter[str] = Counter()
        unreachable = 0
        for r in answers.values():
            if not isinstance(r, pb.StatsResponse):
                unreachable += 1
                continue
            out.series += r.series
            out.samples += r.samples
            out.chunk_bytes += r.chunk_bytes
            out.chunk_samples += r.chunk_samples
            out.head_samples += r.head_samples
            out.pods += r.pods
            out.rollup_buckets += r.rollup_buckets
            rejected.update(dict(r.rejected))
        out.bytes_per_sample = out.chunk_bytes / out.chunk_samples if out.chunk_samples else 0.0
        proxy = self.proxy_counters()
        proxy["members_unreachable"] = unreachable
        rejected.update({f"proxy_{k}": v for k, v in proxy.items()})
        for k, v in rejected.items():
            out.rejected[k] = int(v)
        return out

    def proxy_counters(self) -> dict[str, int]:
        """The proxy's own counters: writes, reads, unavailable answers, hand-off and repair work."""
        out = dict(self.counters)
        pending = self.writes.handoff.pending()
        out["handoff_pending_hints"] = sum(n for n, _ in pending.values())
        out["handoff_pending_bytes"] = sum(b for _, b in pending.values())
        out["series_cached"] = len(self.router)
        out["series_evicted"] = self.router.evicted
        return out


def _check_protocol(p: ProxyBackend) -> MetricsBackend:
    return p
