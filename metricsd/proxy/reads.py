"""The read path: ask R replicas of each slot (fanout.py), merge their replies, repair laggards;
or, for a read of consistency one (metricsd/rpc/consistency.py: PromQL over HTTP by default), one
replica per slot, hedged to the next when it is slow (hedge.py), with no digests and no repair.

Merging, per RPC:

- Read: per series id, the union of the replicas' samples by timestamp (on a timestamp both hold,
  the longer reply's value wins). A replica that lacked samples, or the whole series, gets them
  written back (read repair).
- Aggregate: per slot one replica asked answers with data (group partials over its data slots,
  spread evenly over the members asked: quorum.spread_data) and every replica asked sends a
  digest of what it holds of the query's series (metricsd/maths/slotdigest.py); when every
  slot's digests agree, the data replies' partials are merged (merge.merge_group_partials), no
  per-series values on the wire or in the proxy. When they
  differ, a data replica failed, or a store sends no digests, the question is asked again with
  ``per_series``, so merge.merge_aggregates can keep, per series, the reply with more samples;
  replicas named lagging get those series copied from a replica that answered the same slots.
  ``per_series`` requests and quantiles across series always take that second way.
- An Aggregate's top_k / bottom_k (PromQL's topk pushed down) goes to the data replicas only when
  no group spans two slots (:func:`groups_within_slots`, e.g. ``by (pod)`` within a namespace):
  then each sends its few best groups instead of thousands. Otherwise, and on the exact path,
  every group comes back and the merge selects.
- ListSeries, LabelValues: the union. Rollups: per series, the reply with more hours.

A store answering FAILED_PRECONDITION (it does not hold a slot: the proxy's map is stale) makes the
proxy refresh the map and retry the request once when a quorum was missed; when spares made up for
it, the map is refreshed in the background.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import numpy as np
from google.protobuf.message import Message

from metricsd.clock import Clock
from metricsd.cluster.shardmap import ShardMap
from metricsd.columns import SeriesColumns
from metricsd.maths.slotdigest import differing
from metricsd.maths.slots import slot_of, slot_of_labels
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.batchmerge import merge_read_batches
from metricsd.proxy.fanout import QuorumFailure, ReadPlans, Replies, read_fanout, slot_filter
from metricsd.proxy.hedge import one_fanout
from metricsd.proxy.latency import LatencyTracker
from metricsd.proxy.merge import MergeError, merge_aggregates, merge_group_partials
from metricsd.proxy.quorum import ReplicaPlan, spread_data
from metricsd.proxy.repair import ReadRepair, missing_samples
from metricsd.proxy.view import ClusterView
from metricsd.rpc import consistency
from metricsd.rpc.backend import MetricsBackend, Unavailable
from metricsd.rpc.consistency import Consistency
from metricsd.rpc.rollupbatch import arrays_batch_bytes, rollups_from_response
from metricsd.rpc.wire import batch_bytes, columns_from_read, labels_from_pb, length_delimited, slot_digests_from_pb

__all__ = ["ReadPath", "groups_within_slots", "slots_for"]

log = logging.getLogger("metricsd.proxy.reads")

T = TypeVar("T")


def slots_for(matcher_lists: Iterable[Sequence[pb.Matcher]], num_slots: int) -> list[int]:
    """The slots a query can touch: one per pod when every selector pins ``namespace`` and
    ``pod`` with equality matchers, else all of them."""
    out: set[int] = set()
    for matchers in matcher_lists:
        eq = {m.name: m.value for m in matchers if m.type == pb.Matcher.EQ}
        if "namespace" not in eq or "pod" not in eq:
            return list(range(num_slots))
        out.add(slot_of(f"{eq['namespace']}/{eq['pod']}", num_slots))
    return sorted(out) if out else list(range(num_slots))


def groups_within_slots(request: pb.AggregateRequest) -> bool:
    """Whether each of the request's groups holds the series of one pod key at most, so of one
    slot: it groups by ``pod`` and by ``namespace``, or pins ``namespace`` on every side. Then
    a slot's data replica knows its groups' final values, and can keep only its top_k."""
    by = set(request.group_by)
    if "pod" not in by:
        return False
    return "namespace" in by or all(any(m.name == "namespace" and m.type == pb.Matcher.EQ for m in side)
                                    for side in _sides(request))


class ReadPath:
    """Not thread-safe (one event loop)."""

    def __init__(self, view: ClusterView, clock: Clock, counters: Counter[str]) -> None:
        self.view = view
        self.counters = counters
        self.plans = ReadPlans()
        self.latency = LatencyTracker(view.settings.hedge)
        self.repair = ReadRepair(view.settings.repair, clock, self._read_member, self._write_member, counters)

    async def _read_member(self, member: str, request: pb.ReadRequest) -> pb.ReadResponse:
        return await self.view.call(self.view.current_map(), member, lambda b: b.read(request))

    async def _write_member(self, member: str, request: pb.WriteRequest) -> pb.WriteResponse:
        return await self.view.call(self.view.current_map(), member, lambda b: b.write(request))

    async def _fanout(self, matcher_lists: Sequence[Sequence[pb.Matcher]], call: Callable[..., Awaitable[T]],
                      with_member: bool = False, on_plans: Callable[[list[ReplicaPlan]], None] | None = None
                      ) -> tuple[Replies[T], ShardMap]:
        """read_fanout with the stale-map retry; raises Unavailable naming the slots. ``call`` is
        called with (backend, slots, map), and the member's name too ``with_member``;
        ``on_plans`` with each attempt's plans before its first call."""
        self.counters["reads"] += 1
        one = consistency.current() is Consistency.ONE
        shard_map = self.view.current_map()
        for attempt in (0, 1):
            slots = slots_for(matcher_lists, shard_map.num_slots)
            try:
                if one:
                    replies = await one_fanout(self.view, shard_map, slots, _with_map(call, shard_map, with_member),
                                               self.latency, self.counters)
                else:
                    plans = self.plans.plans(self.view, shard_map, slots)
                    if on_plans is not None:
                        on_plans(plans)
                    replies = await read_fanout(self.view, shard_map, plans, _with_map(call, shard_map, with_member))
            except QuorumFailure as e:
                if not e.stale or attempt == 1:
                    self.counters["read_unavailable"] += 1
                    raise
                self.counters["stale_map_retries"] += 1
                shard_map = await self.view.refresh()
                continue
            if replies.stale:
                self.view.refresh_soon()
            return replies, shard_map
        raise AssertionError("unreachable")

    # --- Read ------------------------------------------------------------------------------

    async def _read_replies(self, request: pb.ReadRequest) -> tuple[Replies[pb.ReadResponse], ShardMap]:
        async def call(b: MetricsBackend, slots: list[int], m: ShardMap) -> pb.ReadResponse:
            sub = pb.ReadRequest()
            sub.CopyFrom(request)
            sub.slots.CopyFrom(slot_filter(m.num_slots, slots))
            return await b.read(sub)

        return await self._fanout([request.matchers], call)

    async def read_columns(self, request: pb.ReadRequest) -> SeriesColumns:
        """A Read as columns, for the PromQL engine (metricsd/rpc/columnar.py read_columns): the
        stores are asked with the columnar flag and their batches merged as read() merges them,
        but the result is not encoded into a message to be parsed again by the caller."""
        columnar = pb.ReadRequest()
        columnar.CopyFrom(request)
        columnar.columnar = True
        replies, shard_map = await self._read_replies(columnar)
        return self._merge_columns(replies, shard_map)

    def _merge_columns(self, replies: Replies[pb.ReadResponse], shard_map: ShardMap) -> SeriesColumns:
        """Columnar replies merged (proxy/batchmerge.py), in label order. Fast path: when no slot was
        answered by two replicas (a read of consistency one: hedge.py's replies are disjoint in
        slots) there is nothing to compare or repair, and a series is of one slot, so the replies
        are only put together."""
        most = max((len(ms) for ms in replies.answered.values()), default=0)
        if most <= 1:
            cols = SeriesColumns.concat([columns_from_read(r.response) for r in replies.replies])
        else:  # series the replicas agree on stay columns
            agreed, differ = merge_read_batches([(r.member, r.response) for r in replies.replies], most)
            cols = SeriesColumns.concat([agreed, columns_from_read(self._merge_reads(differ, most, replies,
                                                                                     shard_map))])
        return cols.take(cols.labels.sort_order()) if len(cols) > 1 else cols

    async def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        replies, shard_map = await self._read_replies(request)
        if request.columnar:  # batches: series the replicas agree on stay columns (proxy/batchmerge.py)
            return pb.ReadResponse.FromString(length_delimited(2, batch_bytes(self._merge_columns(replies,
                                                                                                  shard_map))))
        most = max((len(ms) for ms in replies.answered.values()), default=0)
        found: dict[int, list[tuple[str, pb.SeriesData]]] = {}
        for r in replies.replies:
            for s in r.response.series:
                found.setdefault(s.id, []).append((r.member, s))
        return self._merge_reads(found, most, replies, shard_map)

    def _merge_reads(self, found: dict[int, list[tuple[str, pb.SeriesData]]], most: int,
                     replies: Replies[pb.ReadResponse], shard_map: ShardMap) -> pb.ReadResponse:
        repairs: dict[str, pb.WriteRequest] = {}
        out = pb.ReadResponse()
        for sid in sorted(found, key=lambda i: _label_key(found[i][0][1].labels)):
            copies = found[sid]
            best = max(copies, key=lambda c: len(c[1].timestamps))[1]
            same = all(c[1].timestamps == best.timestamps for c in copies)
            if len(copies) >= most and same:  # the usual case: every replica holds the same
                out.series.append(best)
                continue
            slot = slot_of_labels(labels_from_pb(best.labels), shard_map.num_slots)
            answerers = replies.answered.get(slot, [])
            if len(copies) >= len(answerers) and same:
                out.series.append(best)
                continue
            ts, vals = _union(copies)
            merged = out.series.add(id=sid)
            merged.labels.extend(best.labels)
            merged.timestamps.extend(ts.tolist())
            merged.values.extend(vals.tolist())
            have = {m: np.array(s.timestamps, dtype=np.int64) for m, s in copies}
            for member in answerers:
                req = repairs.setdefault(member, pb.WriteRequest())
                missing_samples(req, merged, have.get(member), ts, vals)
        for member, req in repairs.items():
            if req.ids:
                self.counters["read_repair_series"] += len(req.ids)
                self.repair.write(member, req)
        return out

    # --- Aggregate -------------------------------------------------------------------------

    async def aggregate(self, request: pb.AggregateRequest) -> pb.AggregateResponse:
        if consistency.current() is Consistency.ONE and not request.per_series \
                and request.across != pb.ACROSS_QUANTILE:
            return await self._aggregate_one(request)
        if request.per_series or request.across == pb.ACROSS_QUANTILE or not self.view.settings.digest_reads:
            return await self._aggregate_exact(request)
        try:
            return await self._aggregate_by_digest(request)
        except DigestsDiffer as e:
            self.counters["aggregate_digest_fallbacks"] += 1
            log.debug("aggregate: %s; asking again per series", e)
            return await self._aggregate_exact(request)

    async def _aggregate_one(self, request: pb.AggregateRequest) -> pb.AggregateResponse:
        """One replica per slot answers with data (hedged: hedge.py), no digests: the replies
        cover disjoint slots, so their group partials are merged as the digest read's are."""
        local_groups = groups_within_slots(request)

        async def call(b: MetricsBackend, slots: list[int], m: ShardMap) -> pb.AggregateResponse:
            sub = pb.AggregateRequest()
            sub.CopyFrom(request)
            sub.slots.CopyFrom(slot_filter(m.num_slots, slots))
            if not local_groups:  # a group's partials come from several stores: select after the merge
                sub.top_k = sub.bottom_k = 0
            return await b.aggregate(sub)

        replies, _ = await self._fanout(_sides(request), call)
        try:
            return merge_group_partials(request, [r.response for r in replies.replies])
        except MergeError as e:
            raise Unavailable(f"cannot merge the replicas' aggregates: {e}") from e

    async def _aggregate_by_digest(self, request: pb.AggregateRequest) -> pb.AggregateResponse:
        """Per slot, one replica asked answers with data, every replica asked with a digest;
        raises DigestsDiffer when a slot's digests differ or its data replica did not answer."""
        owners: dict[int, str] = {}
        local_groups = groups_within_slots(request)

        def assign(plans: list[ReplicaPlan]) -> None:
            owners.clear()
            owners.update(spread_data(plans))

        async def call(b: MetricsBackend, slots: list[int], m: ShardMap, member: str) -> pb.AggregateResponse:
            data = [s for s in slots if owners.get(s) == member]  # none for a spare: its slot's owner failed
            sub = pb.AggregateRequest()
            sub.CopyFrom(request)
            sub.slot_digests = True
            sub.slots.CopyFrom(slot_filter(m.num_slots, slots))
            sub.data_slots.extend(data)
            if not local_groups:  # a group's partials come from several stores: select after the merge
                sub.top_k = sub.bottom_k = 0
            return await b.aggregate(sub)

        replies, _ = await self._fanout(_sides(request), call, with_member=True, on_plans=assign)
        digests: dict[int, list[dict[int, tuple[int, int, int]]]] = {}
        data_replies = []
        for r in replies.replies:
            if not r.response.HasField("slot_digests"):
                raise DigestsDiffer(f"{r.member} sent no slot digests (an older store)")
            d = slot_digests_from_pb(r.response.slot_digests)
            for slot in r.slots:
                digests.setdefault(slot, []).append(d)
            if any(owners.get(slot) == r.member for slot in r.slots):
                data_replies.append(r.response)
        for slot, members in replies.answered.items():
            if owners.get(slot) not in members:
                raise DigestsDiffer(f"the data replica of slot {slot} did not answer")
        differ = [slot for slot, ds in digests.items() if differing(ds, [slot])]
        if differ:
            raise DigestsDiffer(f"replicas differ on {len(differ)} slots ({', '.join(map(str, sorted(differ)[:5]))})")
        self.counters["aggregate_digest_reads"] += 1
        try:
            return merge_group_partials(request, data_replies or [r.response for r in replies.replies[:1]])
        except MergeError as e:
            raise Unavailable(f"cannot merge the replicas' aggregates: {e}") from e

    async def _aggregate_exact(self, request: pb.AggregateRequest) -> pb.AggregateResponse:
        async def call(b: MetricsBackend, slots: list[int], m: ShardMap) -> pb.AggregateResponse:
            sub = pb.AggregateRequest()
            sub.CopyFrom(request)
            sub.per_series = True
            sub.top_k = sub.bottom_k = 0  # every series, to compare the replicas; selected after the merge
            sub.slots.CopyFrom(slot_filter(m.num_slots, slots))
            return await b.aggregate(sub)

        replies, shard_map = await self._fanout(_sides(request), call)
        try:
            merged = merge_aggregates(request, [r.response for r in replies.replies])
        except MergeError as e:
            raise Unavailable(f"cannot merge the replicas' aggregates: {e}") from e
        if merged.lagging:
            self._repair_aggregate(request, replies, merged.lagging, shard_map)
        return merged.response

    def _repair_aggregate(self, request: pb.AggregateRequest, replies: Replies[pb.AggregateResponse],
                          lagging: dict[int, set[int]], shard_map: ShardMap) -> None:
        """Copy the lagging series from a replica that answered for the same slots."""
        window = max(request.query.window_ms, request.denominator.window_ms if request.HasField("denominator") else 0)
        start, end = request.start_ms - window, request.end_ms
        for index, ids in lagging.items():
            reply = replies.replies[index]
            by_source: dict[str, list[int]] = {}
            for slot in reply.slots:
                others = [m for m in replies.answered.get(slot, []) if m != reply.member]
                if others:
                    by_source.setdefault(others[0], []).append(slot)
            for source, slots in by_source.items():
                reads = [pb.ReadRequest(matchers=side.matchers, start_ms=start, end_ms=end,
                                        slots=slot_filter(shard_map.num_slots, slots))
                         for side in ([request.query, request.denominator] if request.HasField("denominator")
                                      else [request.query])]
                self.counters["read_repair_series"] += len(ids)
                self.repair.copy(reply.member, source, reads, ids)

    # --- ListSeries, LabelValues, Rollups ---------------------------------------------------

    async def list_series(self, request: pb.ListSeriesRequest) -> pb.ListSeriesResponse:
        replies, _ = await self._fanout([request.matchers], _sliced(request, "list_series"))
        seen: dict[int, pb.SeriesLabels] = {}
        for r in replies.replies:
            for s in r.response.series:
                seen.setdefault(s.id, s)
        ordered = sorted(seen.values(), key=lambda s: _label_key(s.labels))
        if request.limit:
            ordered = ordered[: request.limit]
        return pb.ListSeriesResponse(series=ordered)

    async def label_values(self, request: pb.LabelValuesRequest) -> pb.LabelValuesResponse:
        replies, _ = await self._fanout([request.matchers], _sliced(request, "label_values"))
        values: set[str] = set()
        for r in replies.replies:
            values.update(r.response.values)
        return pb.LabelValuesResponse(values=sorted(values))

    async def rollups(self, request: pb.ReadRequest) -> pb.RollupsResponse:
        """Per series the replica's answer with the most hours. The stores are asked per series
        (the merge is per series); a client that asked for columns gets the merged answer as a
        batch."""
        per_series = request
        if request.columnar:
            per_series = pb.ReadRequest()
            per_series.CopyFrom(request)
            per_series.columnar = False
        replies, _ = await self._fanout([request.matchers], _sliced(per_series, "rollups"))
        best: dict[int, pb.SeriesRollups] = {}
        for r in replies.replies:
            for s in r.response.series:
                have = best.get(s.id)
                if have is None or len(s.hours) > len(have.hours):
                    best[s.id] = s
        ordered: list[pb.SeriesRollups] = sorted(best.values(), key=lambda s: _label_key(s.labels))
        merged = pb.RollupsResponse(series=ordered)
        if not request.columnar:
            return merged
        batch = pb.RollupsResponse()
        batch.MergeFromString(arrays_batch_bytes(rollups_from_response(merged)))
        return batch

    async def close(self) -> None:
        await self.repair.close()


def _label_key(labels: Iterable[pb.Label]) -> tuple[tuple[str, str], ...]:
    return tuple((lab.name, lab.value) for lab in labels)


def _with_map(call: Callable[..., Awaitable[T]], shard_map: ShardMap, with_member: bool
              ) -> Callable[[MetricsBackend, list[int], str], Awaitable[T]]:
    if with_member:
        return lambda backend, slots, member: call(backend, slots, shard_map, member)
    return lambda backend, slots, member: call(backend, slots, shard_map)


def _sides(request: pb.AggregateRequest) -> list[Sequence[pb.Matcher]]:
    sides: list[Sequence[pb.Matcher]] = [request.query.matchers]
    if request.HasField("denominator"):
        sides.append(request.denominator.matchers)
    return sides


class DigestsDiffer(Exception):
    """The digest read cannot stand for the answer; the exact per-series read must be made."""


def _union(copies: Sequence[tuple[str, pb.SeriesData]]) -> tuple[np.ndarray, np.ndarray]:
    """Samples of several replicas of one series, by timestamp; on a shared timestamp the value of
    the copy with more samples wins (stores keep the first write, so they agree unless one lost it)."""
    ordered = sorted(copies, key=lambda c: -len(c[1].timestamps))
    ts = np.concatenate([np.array(s.timestamps, dtype=np.int64) for _, s in ordered])
    vals = np.concatenate([np.array(s.values, dtype=np.float64) for _, s in ordered])
    uniq, first = np.unique(ts, return_index=True)
    return uniq, vals[first]


def _sliced(request: Message, method: str) -> Callable[[MetricsBackend, list[int], ShardMap], Awaitable[Any]]:
    """A fan-out call that asks a member ``method`` with ``request`` restricted to its slots."""

    async def call(b: MetricsBackend, slots: list[int], m: ShardMap) -> Any:
        sub = type(request)()
        sub.CopyFrom(request)
        sub.slots.CopyFrom(slot_filter(m.num_slots, slots))  # type: ignore[attr-defined]
        return await getattr(b, method)(sub)

    return call
