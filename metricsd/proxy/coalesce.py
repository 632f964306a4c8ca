"""Write parts bound for one member, sent together: at most a few calls per member at a time.

A proxy's clients write concurrently (every node agent, every ten seconds). Each client batch
becomes a sub-request per member, and sent as it comes that is one gRPC message per member per
batch: in Python each costs tens to hundreds of microseconds of CPU at both ends, more than
routing the batch (perf/RESULTS.md, "Through a proxy"). So each member gets a queue. A part that
finds its member idle waits ``linger_s`` (2 ms by default; 0: to the end of the event-loop
iteration it arrived in) for others to join it; while ``calls_per_member`` calls to the member
are under way, parts queue behind them and leave together as soon as one ends. A call is one
message on the member's WriteStream (rpc/stream.py), up to ``max_parts`` parts and
``max_bytes`` bytes. Every part keeps its own result, so acknowledgement, hinted hand-off and
rejections stay per client batch, exactly as with a call each.

Parts are serialized WriteRequests: a batch whose members replicate the same slots is encoded
once for all of them (routing.Batch.part_bytes), a member's missing labels are appended as
bytes (protobuf concatenation is a merge), and a WriteParts request is the parts framed as
field 1, without copying them into a message (perf/RESULTS.md: copying a 2,000-series part
into a WritePartsRequest costs more than its gRPC call).

Parts are grouped only with parts planned on the same shard map, so a call never mixes map
versions. A queue longer than ``max_queued`` parts (a member slower than its clients) refuses new
parts with Unavailable: the write path hands them off as it does for a failed call, so memory
stays bounded and nothing acknowledged is lost.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from metricsd.cluster.shardmap import ShardMap
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import Unavailable

__all__ = ["CoalesceSettings", "SendParts", "WriteCoalescer"]

SendParts = Callable[[str, ShardMap, list[bytes]], Awaitable[Sequence[pb.WriteResponse | Exception]]]
"""Sends parts (serialized WriteRequests) to a member in one call: a response or an error per
part; raises for the whole call."""


@dataclass(frozen=True)
class CoalesceSettings:
    """calls_per_member: calls under way to one member before parts queue (0: no coalescing, a
    call per part as they come). max_parts / max_bytes: per call (the stores' WriteParts takes
    at most 256 parts, and messages of 64 MiB). max_queued: parts waiting per member. linger_s:
    how long a part that finds its member idle waits for others to join it (0: to the end of
    the event-loop iteration); parts queued behind a call leave when it ends, without waiting."""

    calls_per_member: int = 1
    max_parts: int = 64
    max_bytes: int = 16 * 1024 * 1024
    max_queued: int = 4096
    linger_s: float = 0.002

    def __post_init__(self) -> None:
        if self.calls_per_member < 0 or not 1 <= self.max_parts <= 256 or self.max_bytes < 1 or self.max_queued < 1:
            raise ValueError("calls_per_member must be >= 0, max_parts in [1, 256], max_bytes and max_queued >= 1")
        if not 0 <= self.linger_s <= 1:
            raise ValueError("linger_s must be in [0, 1] seconds")


@dataclass
class _Part:
    shard_map: ShardMap
    request: bytes
    future: asyncio.Future[pb.WriteResponse]


class WriteCoalescer:
    """Not thread-safe (one event loop)."""

    def __init__(self, send: SendParts, settings: CoalesceSettings, counters: Counter[str]) -> None:
        self._send = send
        self.settings = settings
        self.counters = counters
        self._queues: dict[str, deque[_Part]] = {}
        self._in_flight: Counter[str] = Counter()
        self._tasks: dict[asyncio.Task[None], list[_Part]] = {}
        self._scheduled: set[str] = set()

    async def write(self, member: str, shard_map: ShardMap, request: bytes) -> pb.WriteResponse:
        """The member's response to ``request`` (a serialized WriteRequest), sent alone or with other
        queued parts. Raises what the send raises for the call or for this part; Unavailable when
        the queue is full."""
        queue = self._queues.setdefault(member, deque())
        if len(queue) >= self.settings.max_queued:
            self.counters["write_parts_queue_full"] += 1
            raise Unavailable(f"{member}: {len(queue)} write parts already queued behind its calls")
        future: asyncio.Future[pb.WriteResponse] = asyncio.get_running_loop().create_future()
        queue.append(_Part(shard_map, request, future))
        if member not in self._scheduled:  # at the end of this loop iteration (or the linger):
            self._scheduled.add(member)    # the batches read meanwhile leave together
            loop = asyncio.get_running_loop()
            if self.settings.linger_s and self._in_flight[member] < self._call_limit:
                loop.call_later(self.settings.linger_s, self._flush_scheduled, member)
            else:
                loop.call_soon(self._flush_scheduled, member)
        return await future  # cancelled while queued: _take skips it

    @property
    def _call_limit(self) -> float:
        """Calls under way to one member before parts queue; calls_per_member 0: every part its own
        call, at once."""
        return self.settings.calls_per_member or math.inf

    def queued(self, member: str) -> int:
        return len(self._queues.get(member, ()))

    def _flush_scheduled(self, member: str) -> None:
        self._scheduled.discard(member)
        self._flush(member)

    def _flush(self, member: str) -> None:
        queue = self._queues.get(member)
        while queue and self._in_flight[member] < self._call_limit:
            batch = self._take(queue)
            if not batch:
                break
            self._in_flight[member] += 1
            self.counters["member_write_calls"] += 1
            self.counters["member_write_parts"] += len(batch)
            task = asyncio.get_running_loop().create_task(self._call(member, batch))
            self._tasks[task] = batch
            task.add_done_callback(self._done)
        if queue is not None and not queue and self._in_flight[member] == 0:
            del self._queues[member]
            del self._in_flight[member]

    def _take(self, queue: deque[_Part]) -> list[_Part]:
        """The next call's parts: the oldest live part, then those after it on the same map, within
        the limits (one part over max_bytes still goes, alone)."""
        s = self.settings
        max_parts = s.max_parts if s.calls_per_member else 1
        batch: list[_Part] = []
        size = 0
        while queue and len(batch) < max_parts:
            part = queue[0]
            if part.future.done():  # its writer gave up (cancelled) while it waited
                queue.popleft()
                continue
            if batch and (part.shard_map is not batch[0].shard_map or size + len(part.request) > s.max_bytes):
                break
            batch.append(queue.popleft())
            size += len(part.request)
        return batch

    async def _call(self, member: str, batch: list[_Part]) -> None:
        try:
            try:
                results: Sequence[pb.WriteResponse | Exception] = await self._send(
                    member, batch[0].shard_map, [p.request for p in batch])
                if len(results) != len(batch):
                    raise Unavailable(f"{member}: {len(results)} results for {len(batch)} write parts")
            except asyncio.CancelledError:
                for p in batch:
                    p.future.cancel()
                raise
            except Exception as e:  # the whole call failed: every part with it
                results = [e] * len(batch)
            for part, result in zip(batch, results, strict=True):
                if part.future.done():
                    continue
                if isinstance(result, Exception):
                    part.future.set_exception(result)
                else:
                    part.future.set_result(result)
        finally:
            self._in_flight[member] -= 1
            self._flush(member)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)

    async def close(self) -> None:
        """Cancel the calls under way and every queued part's writer."""
        for queue in self._queues.values():
            for part in queue:
                part.future.cancel()
        self._queues.clear()
        tasks = list(self._tasks)
        for task, batch in self._tasks.items():
            task.cancel()
            for part in batch:  # a task cancelled before it ran never reaches its own clean-up
                part.future.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
