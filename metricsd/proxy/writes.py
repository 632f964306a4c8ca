"""The write path: split a batch by slot, send each member one sub-request, acknowledge at W.

Per slot, plan_write names the healthy replicas; each member gets ONE sub-request holding the
series of every slot it replicates in the batch, all members concurrently. A member's
acknowledgement counts for each of its slots (acks.py, QuorumTracker); the client is acknowledged once every
slot has W, and the calls still running finish in the background. What a replica missed (failed,
timed out, skipped as unhealthy) goes to hinted hand-off. Without W acks for some slot the write
fails with Unavailable naming the slots; the client retries the batch, which is idempotent.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter
from collections.abc import Sequence

import numpy as np

from metricsd.clock import Clock
from metricsd.cluster.shardmap import ShardMap
from metricsd.model import InvalidSeries
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.acks import acks_for
from metricsd.proxy.coalesce import WriteCoalescer
from metricsd.proxy.fanout import QuorumFailure, consume
from metricsd.proxy.handoff import HintedHandoff, MemberGone
from metricsd.proxy.members import SlotNotHeld, is_slot_not_held
from metricsd.proxy.quorum import ReplicaPlan, plan_write
from metricsd.proxy.routing import Batch, SeriesRouter
from metricsd.proxy.view import ClusterView
from metricsd.rpc.backend import BadRequest, LimitExceeded, MetricsBackend, Unavailable
from metricsd.rpc.client import StreamingBackend, write_each
from metricsd.rpc.columns import WriteColumns
from metricsd.rpc.limits import check_counts, check_write_request

__all__ = ["WritePath"]

log = logging.getLogger("metricsd.proxy.writes")


class WritePath:
    """Not thread-safe (one event loop)."""

    def __init__(self, view: ClusterView, router: SeriesRouter, clock: Clock, counters: Counter[str]) -> None:
        self.view = view
        self.router = router
        self.counters = counters
        self.handoff = HintedHandoff(view.settings.handoff, clock, self._deliver_hint, counters)
        view.on_back(self.handoff.wake)
        self.coalescer = WriteCoalescer(self._send_parts, view.settings.coalesce, counters)
        self._background: set[asyncio.Task[pb.WriteResponse]] = set()
        self._plan_cache: tuple[tuple[int, int, frozenset[str]], list[ReplicaPlan]] | None = None

    async def write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        """write_columns() of a client's message (an agent's gRPC Write)."""
        refusal = check_write_request(request, self.view.settings.request_limits)
        if refusal is not None:
            self.counters[f"write_rejected_{refusal.reason}"] += 1
            raise BadRequest(refusal.message)
        try:
            columns = WriteColumns.of_request(request)
        except InvalidSeries as e:
            raise BadRequest(str(e)) from e
        return await self._write(columns)

    async def write_columns(self, columns: WriteColumns) -> pb.WriteResponse:
        """Raises BadRequest (malformed batch, or past the per-request limits), LimitExceeded (a store's
        series limits refused its part: not handed off, as a retry would be refused too; the other
        stores' parts may be stored) or Unavailable (no W acks for some slot, naming them)."""
        refusal = check_counts(max(len(columns.ids), len(columns.counts), len(columns.labels)),
                               max(len(columns.timestamps), len(columns.values)), self.view.settings.request_limits)
        if refusal is not None:
            self.counters[f"write_rejected_{refusal.reason}"] += 1
            raise BadRequest(refusal.message)
        return await self._write(columns)

    async def _write(self, columns: WriteColumns) -> pb.WriteResponse:
        local = self.router.learn(columns.labels) if columns.labels else {}
        ids = columns.id_list if columns.id_list is not None else columns.ids
        hashes, unknown = self.router.resolve(ids, local, columns.ids.tobytes())
        if unknown:
            self.counters["write_unknown_ids"] += len(unknown)
            return pb.WriteResponse(unknown_ids=unknown)
        shard_map = self.view.current_map()
        self.counters["writes"] += 1
        try:
            resp, stale = await self._write_once(shard_map, columns, local, hashes)
        except QuorumFailure as e:
            if not e.stale:
                self.counters["write_unavailable"] += 1
                raise
            self.counters["stale_map_retries"] += 1
            resp, _ = await self._write_once(await self.view.refresh(), columns, local, hashes)
            return resp
        if stale:  # acknowledged, but a replica said the map moved: write to the new owners too
            self.counters["stale_map_retries"] += 1
            new_map = await self.view.refresh()
            if new_map.version != shard_map.version:
                try:
                    await self._write_once(new_map, columns, local, hashes)
                except Unavailable as e:
                    log.warning("write already acknowledged on map v%d; resend on v%d failed: %s",
                                shard_map.version, new_map.version, e)
        return resp

    async def _write_once(self, shard_map: ShardMap, columns: WriteColumns, local: dict[int, tuple[int, bytes]],
                          hashes: np.ndarray) -> tuple[pb.WriteResponse, bool]:
        batch = Batch.of(columns, self.router, local, hashes, shard_map.num_slots)
        all_plans = self._plans(shard_map)
        plans = [all_plans[slot] for slot in batch.slot_set()]
        tracker = acks_for(plans)
        tasks: dict[asyncio.Task[pb.WriteResponse], tuple[str, list[int]]] = {}
        for member, slots in tracker.asks().items():
            task = asyncio.ensure_future(self._send(shard_map, member, batch, slots))
            task.add_done_callback(consume)
            tasks[task] = (member, slots)
        acks: list[pb.WriteResponse] = []
        missed: dict[str, list[int]] = {}
        stale = False
        try:
            while tasks and not tracker.done and not tracker.failed:
                finished, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    member, slots = tasks.pop(task)
                    exc = task.exception()
                    if exc is None:
                        tracker.record_success(member)
                        acks.append(task.result())
                    elif isinstance(exc, (BadRequest, LimitExceeded)):
                        raise exc
                    else:
                        stale = stale or isinstance(exc, SlotNotHeld)
                        tracker.record_failure(member, _why(exc, shard_map))
                        if not isinstance(exc, SlotNotHeld):
                            missed[member] = slots
        except BaseException:
            for task in tasks:
                task.cancel()
            raise
        if not tracker.done:
            for task in tasks:
                task.cancel()
            err = tracker.error()
            assert err is not None
            raise QuorumFailure(str(err), err.slots, stale)
        for task, (member, slots) in tasks.items():  # still running: hand off if it fails
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            task.add_done_callback(functools.partial(self._hand_off_if_failed, member=member, batch=batch,
                                                     slots=slots))
        for plan in plans:
            for member in plan.unhealthy:
                missed.setdefault(member, []).append(plan.slot)
        for member, slots in missed.items():
            self._hand_off(member, batch, slots)
        return _response(batch.samples, acks), stale

    def _plans(self, shard_map: ShardMap) -> list[ReplicaPlan]:
        """Every slot's write plan under the current health, cached while map and health stay
        the same (they do between failures, so the live path plans nothing)."""
        healthy = frozenset(self.view.health.healthy(shard_map.members))
        key = (id(shard_map), shard_map.version, healthy)
        if self._plan_cache is not None and self._plan_cache[0] == key:
            return self._plan_cache[1]
        q = self.view.quorum(shard_map)
        plans = []
        for slot in range(shard_map.num_slots):
            replicas = shard_map.replicas(slot)
            plan = plan_write(slot, replicas, healthy, q)
            if len(plan.targets) < plan.required:  # too few look healthy: try them all
                plan = plan_write(slot, replicas, set(replicas), q)
            plans.append(plan)
        self._plan_cache = (key, plans)
        return plans

    async def _send(self, shard_map: ShardMap, member: str, batch: Batch, slots: Sequence[int]) -> pb.WriteResponse:
        part, ids = batch.part_bytes(slots)
        id_list = batch.columns.id_list if ids is batch.columns.ids else None  # the whole batch: ints at hand
        known = self.view.known
        missing = known.missing(member, ids, batch.sub_key(slots) if known.wants_key() else None, id_list)
        if missing:  # appended wire bytes merge into the message: its series gain these labels
            part += batch.labels_of(missing)
        labelled = missing
        resp = await self.coalescer.write(member, shard_map, part)
        if resp.unknown_ids:  # the member forgot these series (a restart): resend with labels
            self.view.known.discard(member, resp.unknown_ids)
            part += batch.labels_of(resp.unknown_ids)
            labelled = [*missing, *resp.unknown_ids]
            resp = await self.coalescer.write(member, shard_map, part)
            if resp.unknown_ids:
                raise Unavailable(f"{member} reports {len(resp.unknown_ids)} series unknown even with their labels")
        if labelled:
            self.view.known.add(member, labelled)
        return resp

    async def _send_parts(self, member: str, shard_map: ShardMap, parts: list[bytes]
                          ) -> Sequence[pb.WriteResponse | Exception]:
        """One message to ``member`` for ``parts`` (WriteCoalescer's sender), on the member's
        WriteStream. A part refused as unavailable marks the member down, as a failed call does."""
        results = await self.view.call(shard_map, member, lambda b: write_parts(b, parts))
        for r in results:
            if isinstance(r, Unavailable) and not is_slot_not_held(r):
                self.view.health.failure(member, str(r))
                break
        return results

    def _hand_off_if_failed(self, task: asyncio.Task[pb.WriteResponse], *, member: str, batch: Batch,
                            slots: list[int]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not isinstance(exc, (BadRequest, SlotNotHeld, LimitExceeded)):
            self._hand_off(member, batch, slots)

    def _hand_off(self, member: str, batch: Batch, slots: Sequence[int]) -> None:
        """Queue a member's part of the batch, with every series' labels: it may come back empty."""
        sub, ids = batch.sub_request(slots)
        sub.MergeFromString(batch.labels_of(ids))
        self.handoff.add(member, sub)

    async def _deliver_hint(self, member: str, request: pb.WriteRequest) -> None:
        shard_map = self.view.current_map()
        if member not in shard_map.members:
            raise MemberGone(member)
        try:
            resp = await self.view.call(shard_map, member, lambda b: b.write(request), retries=0)
        except SlotNotHeld:
            self.counters["handoff_obsolete"] += 1  # the slot moved away: its new owners catch up
            return
        if resp.unknown_ids:
            raise Unavailable(f"{member} reports {len(resp.unknown_ids)} hinted series unknown")

    async def wait_idle(self) -> None:
        """Wait for the sub-requests still running after their batches were acknowledged (tests,
        benchmarks); hints queued meanwhile are not waited for."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    async def close(self) -> None:
        await self.handoff.close()
        tasks = list(self._background)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.coalescer.close()


def _why(exc: BaseException, shard_map: ShardMap) -> str:
    if isinstance(exc, SlotNotHeld):
        return f"does not hold the slot (stale map v{shard_map.version})"
    return str(exc) if isinstance(exc, Unavailable) else f"{type(exc).__name__}: {exc}"


def _response(samples: int, acks: Sequence[pb.WriteResponse]) -> pb.WriteResponse:
    """The client's answer: rejections are the most any acknowledging replica reported (exact when
    every member holds every slot of the batch, an estimate otherwise), with the first replica's
    reason; the rest counts as written."""
    too_old = max((r.rejected_too_old for r in acks), default=0)
    dup = max((r.rejected_duplicate for r in acks), default=0)
    ahead = max((r.rejected_too_far_ahead for r in acks), default=0)
    return pb.WriteResponse(samples_written=max(0, samples - too_old - dup - ahead), rejected_too_old=too_old,
                            rejected_duplicate=dup, rejected_too_far_ahead=ahead,
                            refused=next((r.refused for r in acks if r.refused), ""))


async def write_parts(backend: MetricsBackend, parts: list[bytes]) -> Sequence[pb.WriteResponse | Exception]:
    """Serialized WriteRequests in one WriteStream message to a member over gRPC; each parsed and
    written on its own to a backend in this process (tests)."""
    if isinstance(backend, StreamingBackend):
        return await backend.write_parts(parts)
    return await write_each(lambda p: backend.write(pb.WriteRequest.FromString(p)), parts)
