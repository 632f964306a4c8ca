"""Writes over one long-lived gRPC stream (rpc WriteStream): both ends.

Why a stream: in gRPC's Python runtime a unary call costs 200-550 us of CPU at each end on this
project's 2-core benchmark machine, a message on an open stream 100-130 us
(perf/bench_grpc_calls.py, perf/RESULTS.md).
A proxy receives one call per agent batch and makes one or more per store, so the call itself
was most of what a sample cost it. The stream keeps WriteParts' meaning: each message is a
WritePartsRequest answered by one WritePartsResponse, in order.

The receiving end works on up to ``STREAM_IN_FLIGHT`` messages of a stream at once (a proxy's
write waits for its stores, and an agent's next batch should not wait for that), started in the
order they arrived and answered in that order; gRPC's flow control holds the sender back beyond
that. The sending end serializes its writes, matches answers to messages by order, and gives every
message its own deadline: when one passes, the stream is cut and every message still waiting
fails as Unavailable (its outcome unknown, as for a unary call that timed out).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import Unavailable
from metricsd.rpc.status import error_of

__all__ = ["STREAM_IN_FLIGHT", "StreamUnsupported", "WriteStreamClient", "answer_in_order"]

log = logging.getLogger("metricsd.rpc")

STREAM_IN_FLIGHT = 8
"""Messages of one stream a receiver works on at once."""

_METHOD = "/metricsd.v1.Metrics/WriteStream"


class StreamUnsupported(Exception):
    """The receiver does not serve WriteStream (UNIMPLEMENTED): an older version."""


async def answer_in_order(requests: AsyncIterator[pb.WritePartsRequest],
                          handle: Callable[[pb.WritePartsRequest], Awaitable[pb.WritePartsResponse]],
                          in_flight: int = STREAM_IN_FLIGHT) -> AsyncIterator[pb.WritePartsResponse]:
    """``handle`` of each request, up to ``in_flight`` at once, yielded in the requests' order. An
    exception from ``handle`` (or from reading) ends the stream: the requests after it are cancelled."""
    slots = asyncio.Semaphore(in_flight)
    queue: asyncio.Queue[asyncio.Future[pb.WritePartsResponse] | None] = asyncio.Queue()
    started: list[asyncio.Future[pb.WritePartsResponse]] = []

    async def read() -> None:
        try:
            async for request in requests:
                await slots.acquire()
                task = asyncio.ensure_future(handle(request))
                started.append(task)
                queue.put_nowait(task)
        finally:
            queue.put_nowait(None)

    reader = asyncio.ensure_future(read())
    try:
        while (task := await queue.get()) is not None:
            try:
                yield await task
            finally:
                started.remove(task)
                slots.release()
        await reader  # its error, if reading failed
    finally:
        reader.cancel()
        for task in started:
            task.cancel()


class WriteStreamClient:
    """The sending end of WriteStream on ``channel``: opened at the first ``send`` and again after
    a failure. Not thread-safe (one event loop)."""

    def __init__(self, channel: grpc.aio.Channel, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._open = channel.stream_stream(_METHOD, request_serializer=None,
                                           response_deserializer=pb.WritePartsResponse.FromString)
        self._call: grpc.aio.StreamStreamCall | None = None
        self._reader: asyncio.Task[None] | None = None
        self._waiting: collections.deque[asyncio.Future[pb.WritePartsResponse]] = collections.deque()
        self._write_lock = asyncio.Lock()
        self.supported = True  # until the receiver answers UNIMPLEMENTED
        self.opened = 0  # streams opened, for tests and stats

    async def send(self, body: bytes) -> pb.WritePartsResponse:
        """Send one serialized WritePartsRequest; its answer. Raises Unavailable (the stream failed,
        or no answer within ``timeout_s``), StreamUnsupported, or the error the stream ended with
        (as rpc/status.py's ``error_of`` maps it)."""
        if not self.supported:
            raise StreamUnsupported(_METHOD)
        answer: asyncio.Future[pb.WritePartsResponse] = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self._write_lock:
                    call = self._call if self._call is not None else self._start()
                    self._waiting.append(answer)
                    try:
                        await call.write(body)
                    except asyncio.CancelledError:
                        # Sent or not, nobody can tell: answers could no longer be matched by order.
                        self._end(call, Unavailable("WriteStream: a message's send was cut off"))
                        raise
                    except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as e:
                        # The reader sees the same end and fails ``answer`` with the stream's status.
                        log.debug("WriteStream write failed: %s", e)
                return await asyncio.shield(answer)
        except TimeoutError:
            self._cut(f"no answer within {self.timeout_s:g} s")
            if answer.done() and not answer.cancelled() and answer.exception() is None:
                return answer.result()
            raise Unavailable(f"WriteStream: no answer within {self.timeout_s:g} s") from None

    def _start(self) -> grpc.aio.StreamStreamCall:
        call = self._open()
        self._call = call
        self.opened += 1
        self._reader = asyncio.get_running_loop().create_task(self._read(call))
        return call

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        """Answers to the waiting messages, in order, until the stream ends; then the end's error to
        the rest."""
        error: Exception
        try:
            while True:
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    error = Unavailable("WriteStream: the receiver ended the stream")
                    break
                if not self._waiting:
                    error = Unavailable("WriteStream: an answer to no message")
                    break
                answer = self._waiting.popleft()
                if not answer.done():
                    answer.set_result(resp)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                self.supported = False
                error = StreamUnsupported(_METHOD)
            else:
                error = error_of("WriteStream", e.code(), e.details() or "")
        except asyncio.CancelledError:
            error = Unavailable("WriteStream: stream closed")
        self._end(call, error)

    def _end(self, call: grpc.aio.StreamStreamCall, error: Exception) -> None:
        if self._call is call:
            self._call = None
            self._reader = None
            waiting, self._waiting = self._waiting, collections.deque()
            if len(waiting) > 1 and not isinstance(error, (Unavailable, StreamUnsupported)):
                # A status about one message (a refusal, a size limit) cannot be pinned on any of
                # several: each gets "outcome unknown", which its sender retries or hands off.
                error = Unavailable(f"WriteStream: the stream ended with {type(error).__name__}: {error}")
            for answer in waiting:
                if not answer.done():
                    answer.set_exception(error)
                    answer.exception()  # its sender may be gone (cancelled): no "never retrieved" log
        call.cancel()

    def _cut(self, why: str) -> None:
        call = self._call
        if call is not None:
            log.warning("WriteStream: %s; closing the stream", why)
            self._end(call, Unavailable(f"WriteStream: {why}"))

    async def close(self) -> None:
        call, reader = self._call, self._reader
        if call is not None:
            self._end(call, Unavailable("WriteStream: stream closed"))
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
