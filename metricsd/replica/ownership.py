"""A cluster store serves only the slots its shard map gives it.

:class:`OwnershipBackend` wraps the store's backend and refuses, with :class:`NotOwner`
(FAILED_PRECONDITION over gRPC), a write holding series of a slot this member does not hold and a
read, aggregate, rollup, series list or label-value request whose slot filter names such a slot.
A proxy routing on an older map than the store's learns from the message (the slot and the map
version) to refresh its map and retry; accepting the data instead would leave it on a store no
reader asks. Until the first map arrives, every data request is refused as Unavailable ("no shard
map yet"). Requests without a slot filter (an operator reading one store directly) are served
from whatever the store holds. Health and Stats are always answered; Health says NOT_SERVING
while there is no map.

Reads (not writes) of a slot that a map change has just given this member wait for its catch-up
(up to ``catch_up_wait_s``) and are refused the same way if it is not done by then
(:mod:`metricsd.replica.readiness`): until then the member holds nothing of the slot, and a quorum
read counting it could miss an acknowledged sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from metricsd.cluster.mapsource import MapSource
from metricsd.cluster.member import describe_slots
from metricsd.cluster.shardmap import ShardMap
from metricsd.columns import SeriesColumns
from metricsd.maths.slots import SlotFilter, slot_of_labels
from metricsd.proto import metricsd_pb2 as pb
from metricsd.replica.readiness import SlotReadiness
from metricsd.rpc.backend import MetricsBackend, NotOwner, Unavailable
from metricsd.rpc.columnar import list_columns, read_columns
from metricsd.rpc.wire import labels_from_pb, matchers_to_pb
from metricsd.selector import Matcher
from metricsd.store.engine import Store

__all__ = ["CATCH_UP_WAIT_S", "CatchingUp", "OwnershipBackend", "WriteSlots", "store_write_slots"]

# How long a read of a slot still being caught up waits before it is refused: below the proxy's
# call timeout (ProxySettings.call_timeout_s, 5 s), so the proxy still has time to ask another.
CATCH_UP_WAIT_S = 3.0


class CatchingUp(NotOwner):
    """A read of slots this member was given by a map change and has not caught up yet."""

    def __init__(self, message: str, slots: np.ndarray) -> None:
        super().__init__(message)
        self.slots = slots

WriteSlots = Callable[[pb.WriteRequest, int], np.ndarray]
"""(request, slot_count) -> the slot of each series of the request, -1 where it cannot be known."""


def store_write_slots(store: Store) -> WriteSlots:
    """Slots of a write's series: from the labels the request carries, else from the store's index.

    A series the store does not know and whose labels are missing gets -1: the store answers
    unknown_ids without storing anything, and the resend carries the labels that are checked then.
    """

    def slots(request: pb.WriteRequest, slot_count: int) -> np.ndarray:
        ids = np.array(request.ids, dtype=np.uint64)
        rows = store.index.rows_of(ids)
        known = rows >= 0
        out = np.full(len(ids), -1, dtype=np.int64)
        out[known] = (store.index.pod_hash[rows[known]] % np.uint64(slot_count)).astype(np.int64)
        if len(request.series):
            position = {int(sid): i for i, sid in enumerate(request.ids)}
            for s in request.series:
                i = position.get(int(s.id))
                if i is not None and out[i] < 0:
                    out[i] = slot_of_labels(labels_from_pb(s.labels), slot_count)
        return out

    return slots


_NO_SLOTS = pb.SlotFilter()  # a read of every slot (read only: never changed)


class OwnershipBackend:
    """:class:`MetricsBackend` that serves ``inner`` only for the slots ``member_id`` holds in ``maps``."""

    def __init__(self, inner: MetricsBackend, member_id: str, maps: MapSource, write_slots: WriteSlots,
                 on_refused: Callable[[], None] | None = None, readiness: SlotReadiness | None = None,
                 catch_up_wait_s: float = CATCH_UP_WAIT_S) -> None:
        self.inner = inner
        self.catch_up_wait_s = catch_up_wait_s
        self.readiness = readiness or SlotReadiness(member_id)
        self.member_id = member_id
        self.maps = maps
        self.write_slots = write_slots
        self.on_refused = on_refused  # e.g. ask the map source to re-read: the store may be the stale one
        self.refused = 0
        self._held_version = -1
        self._held_map: ShardMap | None = None
        self._held = np.zeros(0, dtype=bool)
        self._holds_all = False

    def _map(self) -> tuple[ShardMap, np.ndarray]:
        current = self.maps.current()
        if current is None:
            raise Unavailable(f"member {self.member_id}: no shard map yet")
        if current is not self._held_map:
            self.readiness.observe(current)
            held = np.zeros(current.num_slots, dtype=bool)
            held[current.slots_of(self.member_id)] = True
            self._held_map, self._held, self._holds_all = current, held, bool(held.all())
        return current, self._held

    def _refuse(self, shard_map: ShardMap, what: str, slots: Iterable[int]) -> NotOwner:
        self.refused += 1
        if self.on_refused is not None:
            self.on_refused()
        bad = sorted(set(slots))
        noun = "slot" if len(bad) == 1 else "slots"
        held = int(self._held.sum())
        return NotOwner(f"member {self.member_id} does not hold {noun} {describe_slots(bad)} in shard map version "
                        f"{shard_map.version} (it holds {held} of {shard_map.num_slots}); {what} refused")

    def check_filter(self, f: pb.SlotFilter, what: str) -> None:
        """Raise NotOwner unless every slot of the filter is held and, for a read, not still being
        caught up after a map gave it (an empty filter passes: an operator reading one store)."""
        shard_map, held = self._map()
        if f.slot_count == 0:
            return
        if f.slot_count != shard_map.num_slots:
            self.refused += 1
            raise NotOwner(f"member {self.member_id}: slot filter has slot_count {f.slot_count} but shard map "
                           f"version {shard_map.version} has {shard_map.num_slots} slots; {what} refused")
        if self._holds_all and not self.readiness.any:  # every slot, all caught up (3 stores at RF 3):
            return                                       # nothing to refuse, as check_write
        slots = np.array(f.slots, dtype=np.int64)
        slots = slots[(slots >= 0) & (slots < len(held))]  # out-of-range slots are the store's BadRequest
        missing = slots[~held[slots]]
        if len(missing):
            raise self._refuse(shard_map, what, missing.tolist())
        gaining = self.readiness.refused(slots)
        if len(gaining):
            bad = sorted(set(gaining.tolist()))
            since = min(self.readiness.since.get(s, shard_map.version) for s in bad)
            raise CatchingUp(f"member {self.member_id} is still catching up {'slot' if len(bad) == 1 else 'slots'} "
                             f"{describe_slots(bad)}, given to it in shard map version {since}; {what} refused "
                             "until it is level (writes are taken)", gaining)

    async def check_read(self, f: pb.SlotFilter, what: str) -> None:
        """check_filter, waiting up to ``catch_up_wait_s`` for slots still being caught up."""
        try:
            self.check_filter(f, what)
        except CatchingUp as e:
            if not await self.readiness.wait(e.slots, self.catch_up_wait_s):
                self.refused += 1
                raise
            self.check_filter(f, what)

    def check_write(self, request: pb.WriteRequest) -> None:
        shard_map, held = self._map()
        if self._holds_all:  # every slot (RF = stores, as `cluster up` runs 3 stores at RF 3): nothing to
            return           # refuse, so no slot is worked out (4-13% of a store's write CPU, perf/RESULTS.md)
        slots = self.write_slots(request, shard_map.num_slots)
        slots = slots[slots >= 0]
        missing = slots[~held[slots]]
        if len(missing):
            raise self._refuse(shard_map, "write", missing.tolist())

    async def write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        self.check_write(request)
        return await self.inner.write(request)

    async def write_together(self, parts: Sequence[pb.WriteRequest]) -> list[pb.WriteResponse]:
        """The inner backend's write_together (store/api.py) when this member holds every slot (no
        part can be refused); otherwise none taken, and each part goes through write()."""
        together = getattr(self.inner, "write_together", None)
        if together is None or self.maps.current() is None:
            return []
        self._map()
        if not self._holds_all:
            return []
        answers: list[pb.WriteResponse] = await together(parts)
        return answers

    async def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        await self.check_read(request.slots, "read")
        return await self.inner.read(request)

    async def aggregate(self, request: pb.AggregateRequest) -> pb.AggregateResponse:
        await self.check_read(request.slots, "aggregate")
        return await self.inner.aggregate(request)

    async def read_columns(self, request: pb.ReadRequest) -> SeriesColumns:
        """A read as columns, for the store's own PromQL engine (a whole query sent by a proxy,
        metricsd/http/wholequery.py): without it the engine's reads took the protobuf way in process."""
        await self.check_read(request.slots, "read")
        return await read_columns(self.inner, request)

    async def read_selection(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, max_series: int = 0,
                             max_samples: int = 0, slots: SlotFilter | None = None) -> SeriesColumns:
        """read_columns of parsed matchers (LocalBackend.read_selection), checked as a read of
        ``slots`` is: a whole query's PromQL prefetch in a cluster store (metricsd/http/wholequery.py
        SlotScoped) reads here without a ReadRequest built, checked and parsed back (8.7% of a
        cluster store's (b) frame went to that detour, perf/RESULTS.md issue 23 session 38).
        Without an inner read_selection: the ReadRequest it stands for, through read_columns."""
        f = _NO_SLOTS if slots is None else pb.SlotFilter(slot_count=slots.slot_count, slots=slots.slots)
        direct = getattr(self.inner, "read_selection", None)
        if direct is None:
            return await self.read_columns(pb.ReadRequest(matchers=matchers_to_pb(matchers), start_ms=start_ms,
                                                          end_ms=end_ms, max_series=max_series,
                                                          max_samples=max_samples, slots=f))
        await self.check_read(f, "read")
        got: SeriesColumns = await direct(matchers, start_ms, end_ms, max_series, max_samples, slots)
        return got

    async def list_columns(self, request: pb.ListSeriesRequest) -> SeriesColumns:
        await self.check_read(request.slots, "list series")
        return await list_columns(self.inner, request)

    async def rollups(self, request: pb.ReadRequest) -> pb.RollupsResponse:
        await self.check_read(request.slots, "rollups")
        return await self.inner.rollups(request)

    async def list_series(self, request: pb.ListSeriesRequest) -> pb.ListSeriesResponse:
        await self.check_read(request.slots, "list series")
        return await self.inner.list_series(request)

    async def label_values(self, request: pb.LabelValuesRequest) -> pb.LabelValuesResponse:
        await self.check_read(request.slots, "label values")
        return await self.inner.label_values(request)

    async def health(self) -> pb.HealthResponse:
        resp = await self.inner.health()
        if self.maps.current() is None:
            resp.status = pb.HealthResponse.NOT_SERVING
        return resp

    async def stats(self) -> pb.StatsResponse:
        return await self.inner.stats()
