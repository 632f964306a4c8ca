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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from metricsd.cluster.mapsource import MapSource
from metricsd.cluster.member import describe_slots
from metricsd.cluster.shardmap import ShardMap
from metricsd.columns import SeriesColumns
from metricsd.maths.slots import slot_of_labels
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import MetricsBackend, NotOwner, Unavailable
from metricsd.rpc.columnar import list_columns, read_columns
from metricsd.rpc.wire import labels_from_pb
from metricsd.store.engine import Store

__all__ = ["OwnershipBackend", "WriteSlots", "store_write_slots"]

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


class OwnershipBackend:
    """:class:`MetricsBackend` that serves ``inner`` only for the slots ``member_id`` holds in ``maps``."""

    def __init__(self, inner: MetricsBackend, member_id: str, maps: MapSource, write_slots: WriteSlots,
                 on_refused: Callable[[], None] | None = None) -> None:
        self.inner = inner
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
        """Raise NotOwner unless every slot of the filter is held (an empty filter passes)."""
        shard_map, held = self._map()
        if f.slot_count == 0:
            return
        if f.slot_count != shard_map.num_slots:
            self.refused += 1
            raise NotOwner(f"member {self.member_id}: slot filter has slot_count {f.slot_count} but shard map "
                           f"version {shard_map.version} has {shard_map.num_slots} slots; {what} refused")
        if self._holds_all:  # every slot (3 stores at RF 3): nothing to refuse, as check_write
            return
        slots = np.array(f.slots, dtype=np.int64)
        slots = slots[(slots >= 0) & (slots < len(held))]  # out-of-range slots are the store's BadRequest
        missing = slots[~held[slots]]
        if len(missing):
            raise self._refuse(shard_map, what, missing.tolist())

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

    async def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        self.check_filter(request.slots, "read")
        return await self.inner.read(request)

    async def aggregate(self, request: pb.AggregateRequest) -> pb.AggregateResponse:
        self.check_filter(request.slots, "aggregate")
        return await self.inner.aggregate(request)

    async def read_columns(self, request: pb.ReadRequest) -> SeriesColumns:
        """A read as columns, for the store's own PromQL engine (a whole query sent by a proxy,
        metricsd/http/wholequery.py): without it the engine's reads took the protobuf way in process."""
        self.check_filter(request.slots, "read")
        return await read_columns(self.inner, request)

    async def list_columns(self, request: pb.ListSeriesRequest) -> SeriesColumns:
        self.check_filter(request.slots, "list series")
        return await list_columns(self.inner, request)

    async def rollups(self, request: pb.ReadRequest) -> pb.RollupsResponse:
        self.check_filter(request.slots, "rollups")
        return await self.inner.rollups(request)

    async def list_series(self, request: pb.ListSeriesRequest) -> pb.ListSeriesResponse:
        self.check_filter(request.slots, "list series")
        return await self.inner.list_series(request)

    async def label_values(self, request: pb.LabelValuesRequest) -> pb.LabelValuesResponse:
        self.check_filter(request.slots, "label values")
        return await self.inner.label_values(request)

    async def health(self) -> pb.HealthResponse:
        resp = await self.inner.health()
        if self.maps.current() is None:
            resp.status = pb.HealthResponse.NOT_SERVING
        return resp

    async def stats(self) -> pb.StatsResponse:
        return await self.inner.stats()
