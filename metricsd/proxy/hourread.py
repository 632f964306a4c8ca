"""A proxy's read of a closed hour, every sample decoded once: per slot the data of ONE replica,
vouched for by the digests of every replica asked; the quorum read, with its merge and read
repair, only for the slots whose digests differ (or whose replicas did not answer).

The hourly Parquet writer of a cluster (metricsd/onward/hourly.py) reads every series of an hour
that closed minutes before. Through the quorum read each slot's R replicas decoded the whole hour
and the proxy compared and merged their answers: with R = 2 two thirds of the cluster's CPU for
the hour went to decoding every sample twice and merging the copies (perf/RESULTS.md, "The
cluster's Parquet hour, end to end"). Here, in order:

1. every replica a read would ask (quorum.plan_read: R per slot) sends a digest of each of its
   slots over the hour, computed from the sums its chunks keep, nothing decoded
   (metricsd/replica/coverdigest.py: Digest with ``cover_chunks``);
2. a slot whose R digests are equal is read from one of them (quorum.spread_data: the data
   replicas spread evenly over the members), its samples and its rollups, both as columns;
3. any other slot is read as every Read is (R replicas, merged, laggards repaired:
   reads.ReadPath) and its rollups from R replicas, the copy with more hours kept.

Digests come first, so a sample acknowledged before the read began is in the answer: a data
replica that lacked it either still lacks it when it digests (its digest differs: step 3) or got
it before, and then before its data read too. Replicas that agree on the hour but cut their chunks
elsewhere differ here too, and take step 3: slower, never wrong.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from metricsd.cluster.shardmap import ShardMap
from metricsd.columns import SeriesColumns
from metricsd.maths.slotdigest import differing
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.fanout import QuorumFailure, read_fanout, slot_filter
from metricsd.proxy.quorum import ReplicaPlan, spread_data
from metricsd.proxy.reads import ReadPath
from metricsd.rpc.backend import MetricsBackend, Unavailable
from metricsd.rpc.rollupbatch import RollupArrays, rollups_from_response
from metricsd.rpc.wire import columns_from_read

__all__ = ["SLOTS_PER_READ", "HourRead", "most_hours"]

log = logging.getLogger("metricsd.proxy.hourread")

T = TypeVar("T")
_ALL = [pb.Matcher(type=pb.Matcher.RE, name="__name__", value=".+")]

SLOTS_PER_READ = 4
"""Slots read at a time (each from its data replica, the members in parallel): with the default
64 slots and 40,000 series about 2,500 series a read, the size of the single store's reads
(onward/hourly.py PARQUET_SERIES_PER_READ): the answer is held twice for a moment (message and
arrays), and the store's event loop is not held for long."""


def most_hours(parts: Sequence[RollupArrays]) -> RollupArrays:
    """Several replicas' rollups of the same series merged as reads.ReadPath.rollups merges them:
    per series id, the copy with the most hours (the first given on a tie)."""
    cat = RollupArrays.concat(parts)
    if len(cat) == 0:
        return cat
    order = np.lexsort((np.arange(len(cat)), -cat.counts, cat.ids))
    sid = cat.ids[order]
    first = order[np.r_[True, sid[1:] != sid[:-1]]]
    return cat.take(np.sort(first))


async def _digest(b: MetricsBackend, request: pb.DigestRequest) -> pb.DigestResponse:
    digest = getattr(b, "digest", None)
    if digest is None:
        raise Unavailable("this member's client has no Digest")
    got: pb.DigestResponse = await digest(request)
    return got


class HourRead:
    """``read(start_ms, end_ms)``: every series' samples in the range and its rollups of the hours
    starting in it, through ``path`` (a ProxyBackend's ReadPath). Not thread-safe (one event loop)."""

    def __init__(self, path: ReadPath, slots_per_read: int = SLOTS_PER_READ) -> None:
        self.path = path
        self.view = path.view
        self.counters = path.counters
        self.slots_per_read = slots_per_read

    async def read(self, start_ms: int, end_ms: int, rollups_start_ms: int | None = None,
                   rollups_end_ms: int | None = None) -> tuple[SeriesColumns, RollupArrays]:
        """(samples in [start_ms, end_ms], rollups of the hours starting in [rollups_start_ms,
        rollups_end_ms], by default start_ms alone). Raises Unavailable (QuorumFailure) when a
        slot that must be read by quorum cannot be. A store saying it no longer holds a slot (the
        proxy's map is stale: slots moved since) makes the proxy refresh its map and read the hour
        again once, as any Read does (reads.ReadPath), rather than fail until the writer's next try."""
        try:
            return await self._read(self.view.current_map(), start_ms, end_ms, rollups_start_ms, rollups_end_ms)
        except QuorumFailure as e:
            if not e.stale:
                raise
            self.counters["stale_map_retries"] += 1
            log.info("hour read: a store no longer holds slots %s; map refreshed, reading the hour again", e.slots)
            shard_map = await self.view.refresh()
        return await self._read(shard_map, start_ms, end_ms, rollups_start_ms, rollups_end_ms)

    async def _read(self, shard_map: ShardMap, start_ms: int, end_ms: int, rollups_start_ms: int | None,
                    rollups_end_ms: int | None) -> tuple[SeriesColumns, RollupArrays]:
        slots = list(range(shard_map.num_slots))
        plans = self.path.plans.plans(self.view, shard_map, slots)
        owners = spread_data(plans)
        agreed = await self._agreed(shard_map, plans, owners, start_ms, end_ms)
        self.counters["hour_read_digest_slots"] += len(agreed)
        self.counters["hour_read_quorum_slots"] += len(slots) - len(agreed)
        parts = []
        for i in range(0, len(slots), self.slots_per_read):
            group = slots[i : i + self.slots_per_read]
            req = pb.ReadRequest(matchers=_ALL, start_ms=start_ms, end_ms=end_ms, columnar=True)
            data, rest = await self._from_owners(shard_map, group, agreed, owners, req, "read", columns_from_read)
            parts += data
            if rest:
                parts.append(await self._quorum_samples(shard_map, rest, req))
        hour = start_ms if rollups_start_ms is None else rollups_start_ms
        req = pb.ReadRequest(matchers=_ALL, start_ms=hour, end_ms=hour if rollups_end_ms is None else rollups_end_ms,
                             columnar=True)
        roll, rest = await self._from_owners(shard_map, slots, agreed, owners, req, "rollups", rollups_from_response)
        if rest:
            roll.append(await self._quorum_rollups(shard_map, rest, req))
        return SeriesColumns.concat(parts), RollupArrays.concat(roll)

    async def _agreed(self, shard_map: ShardMap, plans: Sequence[ReplicaPlan], owners: dict[int, str],
                      start_ms: int, end_ms: int) -> set[int]:
        """The slots whose replicas asked all sent equal digests (their data replica among them)."""
        asks: dict[str, list[int]] = {}
        for p in plans:
            for m in p.targets:
                asks.setdefault(m, []).append(p.slot)

        async def one(member: str, member_slots: list[int]) -> dict[int, tuple[int, int, int]]:
            req = pb.DigestRequest(slots=slot_filter(shard_map.num_slots, member_slots), start_ms=start_ms,
                                   end_ms=end_ms, cover_chunks=True)
            resp = await self.view.call(shard_map, member, lambda b: _digest(b, req))
            return {d.slot: (d.series, d.samples, d.hash) for d in resp.slots}

        members = list(asks)
        got = await asyncio.gather(*(one(m, asks[m]) for m in members), return_exceptions=True)
        digests = {m: d for m, d in zip(members, got, strict=True) if isinstance(d, dict)}
        for m, d in zip(members, got, strict=True):
            if not isinstance(d, dict):
                log.info("hour read: no digest from %s (%s); its slots are read by quorum", m, d)
        out = set()
        for p in plans:
            ds = [digests[m] for m in p.targets if m in digests]
            if (len(ds) == len(p.targets) >= p.required and owners.get(p.slot) in p.targets
                    and not differing(ds, [p.slot])):
                out.add(p.slot)
        return out

    async def _from_owners(self, shard_map: ShardMap, slots: Sequence[int], agreed: set[int], owners: dict[int, str],
                           request: pb.ReadRequest, method: str, decode: Callable[[Any], T]
                           ) -> tuple[list[T], list[int]]:
        """``method`` asked of each agreed slot's data replica, the members at once: (their answers
        decoded, the slots left for a quorum read: not agreed, or their data replica failed)."""
        asks: dict[str, list[int]] = {}
        rest = []
        for s in slots:
            if s in agreed:
                asks.setdefault(owners[s], []).append(s)
            else:
                rest.append(s)

        async def one(member: str, member_slots: list[int]) -> T:
            sub = pb.ReadRequest()
            sub.CopyFrom(request)
            sub.slots.CopyFrom(slot_filter(shard_map.num_slots, member_slots))
            call: Callable[[MetricsBackend], Awaitable[Any]] = lambda b: getattr(b, method)(sub)  # noqa: E731
            return decode(await self.view.call(shard_map, member, call))

        members = list(asks)
        got = await asyncio.gather(*(one(m, asks[m]) for m in members), return_exceptions=True)
        out = []
        for m, g in zip(members, got, strict=True):
            if isinstance(g, BaseException):
                log.info("hour read: %s of %s failed (%s); read by quorum", method, m, g)
                rest += asks[m]
            else:
                out.append(g)
        return out, sorted(rest)

    async def _quorum_samples(self, shard_map: ShardMap, slots: list[int], request: pb.ReadRequest) -> SeriesColumns:
        """The slots read as any Read is: R replicas, merged, laggards repaired (ReadPath)."""
        replies = await read_fanout(self.view, shard_map, self.path.plans.plans(self.view, shard_map, slots),
                                    _restricted(request, shard_map, "read"))
        return self.path._merge_columns(replies, shard_map)  # the same merge and repair as any columnar Read

    async def _quorum_rollups(self, shard_map: ShardMap, slots: list[int], request: pb.ReadRequest) -> RollupArrays:
        replies = await read_fanout(self.view, shard_map, self.path.plans.plans(self.view, shard_map, slots),
                                    _restricted(request, shard_map, "rollups"))
        return most_hours([rollups_from_response(r.response) for r in replies.replies])


def _restricted(request: pb.ReadRequest, shard_map: ShardMap, method: str
                ) -> Callable[[MetricsBackend, list[int], str], Awaitable[Any]]:
    async def call(b: MetricsBackend, member_slots: list[int], member: str) -> Any:
        sub = pb.ReadRequest()
        sub.CopyFrom(request)
        sub.slots.CopyFrom(slot_filter(shard_map.num_slots, member_slots))
        return await getattr(b, method)(sub)

    return call
