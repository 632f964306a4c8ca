"""The gRPC shell: decode, call the backend, map errors. No logic of its own.

Every store handler runs to completion on the event loop without awaiting between reading and
writing the engine, so the engine (not thread-safe) needs no lock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError

from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.rpc.backend import BadRequest, LimitExceeded, MetricsBackend, NotOwner, Unavailable
from metricsd.rpc.refusals import SenderRefusals, peer_host
from metricsd.rpc.stream import answer_in_order

__all__ = ["MAX_WRITE_PARTS", "MetricsServicer"]

T = TypeVar("T")

log = logging.getLogger("metricsd.rpc")


MAX_WRITE_PARTS = 256
"""Parts in one WriteParts call; each part also meets the per-request limits of a Write."""


def _status_of(e: Exception) -> grpc.StatusCode:
    if isinstance(e, BadRequest):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(e, LimitExceeded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(e, NotOwner):  # before Unavailable: it is a kind of it
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.UNAVAILABLE


def _refused(what: str, e: Exception) -> grpc.StatusCode:
    """Logs a refused call or part (a warning when the store is unavailable) and returns its code."""
    code = _status_of(e)
    if code == grpc.StatusCode.UNAVAILABLE:
        log.warning("%s unavailable: %s", what, e)
    else:
        log.info("%s %s: %s", what, "rejected" if isinstance(e, BadRequest) else "refused", e)
    return code


class MetricsServicer(pb_grpc.MetricsServicer):
    """Serves a MetricsBackend over gRPC: BadRequest becomes INVALID_ARGUMENT, Unavailable UNAVAILABLE,
    NotOwner (a cluster store asked for a slot it does not hold) FAILED_PRECONDITION, LimitExceeded
    (a store's series limits) RESOURCE_EXHAUSTED.

    A store serves its LocalBackend through it; a proxy serves its fan-out backend the same way,
    so clients cannot tell them apart.
    """

    def __init__(self, backend: MetricsBackend, *, writes_in_turn: bool = False) -> None:
        self.backend = backend
        self.refusals = SenderRefusals("gRPC write")  # samples not stored, per peer (rpc/refusals.py)
        # A store's (cmd/store.py): the parts of all its write messages are written one at a time,
        # in the order they asked, each a turn of the event loop of its own. A part's write holds
        # the loop (the engine needs no lock: nothing awaits inside it); eight messages of tens of
        # merging parts each, started together, took it in turns part by part, so that one turn of
        # the loop was eight writes long, and the store's lease keep-alive (a few turns) went
        # unanswered for the lease's whole TTL (perf/RESULTS.md issue 24 session 39). Not a
        # proxy's: its writes wait on its stores, and must overlap.
        self._turn: asyncio.Lock | None = asyncio.Lock() if writes_in_turn else None

    async def _run(self, context: grpc.aio.ServicerContext, method: str, call: Awaitable[T]) -> T:
        try:
            return await call
        except (BadRequest, LimitExceeded, NotOwner, Unavailable) as e:
            await context.abort(_refused(method, e), str(e))
        raise AssertionError("unreachable: abort raises")

    async def Write(self, request: pb.WriteRequest, context: grpc.aio.ServicerContext) -> pb.WriteResponse:
        resp = await self._run(context, "Write", self.backend.write(request))
        self.refusals.record(peer_host(context.peer()), resp)
        return resp

    async def WriteParts(self, request: pb.WritePartsRequest, context: grpc.aio.ServicerContext
                         ) -> pb.WritePartsResponse:
        return await self._run(context, "WriteParts", self._write_parts(request, peer_host(context.peer())))

    async def WriteStream(self, request_iterator: AsyncIterator[pb.WritePartsRequest],
                          context: grpc.aio.ServicerContext) -> AsyncIterator[pb.WritePartsResponse]:
        """WriteParts for each message, up to STREAM_IN_FLIGHT at once, answered in order."""
        try:
            sender = peer_host(context.peer())
            async for response in answer_in_order(request_iterator, lambda r: self._write_parts(r, sender)):
                yield response
        except BadRequest as e:
            await context.abort(_refused("WriteStream", e), str(e))

    async def write_parts_body(self, body: bytes, sender: str = "") -> bytes:
        """A serialized WritePartsRequest written as WriteParts writes it, its serialized response:
        a proxy's writes over the store's read port (rpc/readport.py WRITE_PARTS). Raises
        BadRequest for a malformed message or too many parts (nothing written)."""
        try:
            request = pb.WritePartsRequest.FromString(body)
        except DecodeError as e:
            raise BadRequest(f"WriteParts: a malformed request: {e}") from None
        return (await self._write_parts(request, sender)).SerializeToString()

    def _deadline(self, request: pb.WritePartsRequest) -> float | None:
        """When (on the event loop's clock) the sender gives up on ``request``: its timeout_ms from
        now, the message having just arrived. None: no limit."""
        if not request.timeout_ms:
            return None
        return asyncio.get_running_loop().time() + request.timeout_ms / 1000

    async def _write_parts(self, request: pb.WritePartsRequest, sender: str = "") -> pb.WritePartsResponse:
        """Each part as a Write of its own, in order, yielding to the event loop between parts so that a
        call of many parts does not hold it for all of them at once. Raises BadRequest for too many
        parts; a part's own error goes into its result, and samples it did not store into its
        response (rejected_*, refused), counted against ``sender``. A part whose turn comes after
        the message's deadline (its timeout_ms) is not written: DEADLINE_EXCEEDED.

        A backend with ``write_together`` (a store: store/api.py) may write several consecutive
        parts as one write, answering each as its own Write would have; the parts it does not
        take are written one by one."""
        parts = request.parts
        if len(parts) > MAX_WRITE_PARTS:
            raise BadRequest(f"{len(parts)} parts in one WriteParts message; at most {MAX_WRITE_PARTS}")
        deadline = self._deadline(request)
        out = pb.WritePartsResponse()
        i = 0
        while i < len(parts):
            if i:
                await asyncio.sleep(0)
            if self._turn is None:
                i = await self._write_from(parts, i, out, sender, deadline)
                continue
            async with self._turn:
                i = await self._write_from(parts, i, out, sender, deadline)
        return out

    async def _write_from(self, parts: Sequence[pb.WriteRequest], i: int, out: pb.WritePartsResponse, sender: str,
                          deadline: float | None) -> int:
        """Write part ``i`` (or, with the backend's write_together, it and those after it) into
        ``out``, or every part from ``i`` on as DEADLINE_EXCEEDED once ``deadline`` has passed;
        the index of the next part to write."""
        if deadline is not None and asyncio.get_running_loop().time() > deadline:
            for j in range(i, len(parts)):
                result = out.results.add()
                result.code = grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
                result.message = (f"WriteParts: the sender's deadline passed before part {j + 1} of {len(parts)} "
                                  "was written; nothing of it stored")
            log.info("WriteParts from %s: %d of %d parts not written, the sender's deadline passed", sender or "?",
                     len(parts) - i, len(parts))
            return len(parts)
        together = getattr(self.backend, "write_together", None)
        if together is not None and len(parts) - i > 1:
            answers = await together(parts[i:])
            for resp in answers:
                out.results.add().response.CopyFrom(resp)
                self.refusals.record(sender, resp)
            if answers:
                return i + len(answers)
        result = out.results.add()
        try:
            result.response.CopyFrom(await self.backend.write(parts[i]))
            self.refusals.record(sender, result.response)
        except (BadRequest, LimitExceeded, NotOwner, Unavailable) as e:
            code = _refused(f"WriteParts part {i + 1} of {len(parts)}", e)
            result.code = code.value[0]
            result.message = str(e)
        return i + 1

    async def Read(self, request: pb.ReadRequest, context: grpc.aio.ServicerContext) -> pb.ReadResponse:
        return await self._run(context, "Read", self.backend.read(request))

    async def Aggregate(self, request: pb.AggregateRequest, context: grpc.aio.ServicerContext) -> pb.AggregateResponse:
        return await self._run(context, "Aggregate", self.backend.aggregate(request))

    async def Rollups(self, request: pb.ReadRequest, context: grpc.aio.ServicerContext) -> pb.RollupsResponse:
        return await self._run(context, "Rollups", self.backend.rollups(request))

    async def ListSeries(self, request: pb.ListSeriesRequest, context: grpc.aio.ServicerContext
                         ) -> pb.ListSeriesResponse:
        return await self._run(context, "ListSeries", self.backend.list_series(request))

    async def LabelValues(self, request: pb.LabelValuesRequest, context: grpc.aio.ServicerContext
                          ) -> pb.LabelValuesResponse:
        return await self._run(context, "LabelValues", self.backend.label_values(request))

    async def Health(self, request: pb.HealthRequest, context: grpc.aio.ServicerContext) -> pb.HealthResponse:
        return await self._run(context, "Health", self.backend.health())

    async def Stats(self, request: pb.StatsRequest, context: grpc.aio.ServicerContext) -> pb.StatsResponse:
        return await self._run(context, "Stats", self.backend.stats())
