"""The read port: a store's reads (Read, Aggregate, ListSeries, LabelValues, Rollups) served as
length-prefixed protobuf frames over one TLS connection per client, multiplexed by request id
(frames.py; layout in FORMAT.md). The same TLS as the store's gRPC port and the same tokens and
roles (metricsd/security/policy.py): the client's first frame carries its bearer token, checked
once per connection; each request is checked against the role its method needs.

:class:`ReadPortServer` serves a MetricsBackend (a store's, with its ownership checks); the
proxy's end is rpc/readport_client.py's ReadPortClient; :class:`AdvertisedReadPort` puts the port in the
store's Health answer, where a proxy finds it (HealthResponse.read_port). A proxy's writes to a store
(WRITE_PARTS: a WritePartsRequest, answered by its WritePartsResponse) may come here too when the
store serves them (``write_parts``): a WriteStream message costs each end 100-250 us of grpc.aio,
a frame a fraction (perf/RESULTS.md issue 24 session 38); checked against the write role. Agents'
writes, Health and the rest stay on gRPC.

Limits: a body over 64 MiB (as gRPC's) or a header out of format closes the connection; a client
has ``max_in_flight`` requests served at once, and ``max_writes_in_flight`` write messages (as
a WriteStream's receiver: rpc/stream.py STREAM_IN_FLIGHT), past which its frames are not read (TCP
pushes back); a connection that sends no hello within ``hello_timeout_s`` is closed. Other connections
keep being served.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

import grpc
from google.protobuf.message import DecodeError, Message

from metricsd.columns import SeriesColumns
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest, LimitExceeded, MetricsBackend, NotOwner, Unavailable
from metricsd.rpc.corked import Corked
from metricsd.rpc.eager import start_eagerly
from metricsd.rpc.frames import METHODS, FrameError, Kind, Method, encode, take_frames
from metricsd.rpc.servicer import _status_of
from metricsd.rpc.stream import STREAM_IN_FLIGHT
from metricsd.rpc.wire import batch_bytes, length_delimited
from metricsd.security.auth import Authenticator, Identity, PermissionDenied, Unauthenticated
from metricsd.security.policy import grpc_role
from metricsd.security.settings import ServerSecurity

__all__ = ["AdvertisedReadPort", "ReadPortServer"]

log = logging.getLogger("metricsd.rpc.readport")


class ReadPortServer:
    """Serves ``backend``'s reads on a port of its own. Start with :meth:`start`, stop with :meth:`stop`."""

    def __init__(self, backend: MetricsBackend, security: ServerSecurity | None = None, *, max_in_flight: int = 64,
                 max_writes_in_flight: int = STREAM_IN_FLIGHT,
                 hello_timeout_s: float = 10.0, query: Callable[[bytes], Awaitable[bytes]] | None = None,
                 write_parts: Callable[[bytes, str], Awaitable[bytes]] | None = None) -> None:
        self.backend = backend
        self.query = query  # answers a QUERY frame's body (http/wholequery.py); None: UNIMPLEMENTED
        # answers a WRITE_PARTS frame's body, given the sender's host (rpc/servicer.py
        # MetricsServicer.write_parts_body); None: UNIMPLEMENTED, the proxy writes over gRPC
        self.write_parts = write_parts
        self.security = security
        self.max_in_flight = max_in_flight
        self.max_writes_in_flight = max_writes_in_flight
        self.hello_timeout_s = hello_timeout_s
        self._server: asyncio.Server | None = None
        self._conns: set[_ServerConnection] = set()
        direct = getattr(backend, "read_columns", None)  # a store's (OwnershipBackend: its checks first)
        self._read_columns: Callable[[pb.ReadRequest], Awaitable[SeriesColumns]] | None = (
            direct if callable(direct) else None)

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: any free port); returns the bound port. Raises OSError."""
        tls = self.security.tls if self.security is not None else None
        ctx = tls.ssl_context() if tls is not None else None
        self._server = await asyncio.get_running_loop().create_server(lambda: _ServerConnection(self), host, port,
                                                                      ssl=ctx)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [t for conn in list(self._conns) for t in conn.abort()]
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _answer(self, conn: _ServerConnection, request_id: int, method: int, body: bytes) -> None:
        try:
            frame = encode(Kind.RESPONSE, request_id, method,
                           await self._call(method, body, conn.identity, conn.host))
        except _Refused as e:
            frame = encode(Kind.ERROR, request_id, e.code.value[0], e.message.encode())
        except FrameError as e:  # an answer over the size limit
            frame = encode(Kind.ERROR, request_id, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], str(e).encode())
        except Exception as e:  # a bug: answered, so that the client does not wait for its timeout
            log.exception("read port: method %d failed", method)
            frame = encode(Kind.ERROR, request_id, grpc.StatusCode.INTERNAL.value[0],
                           f"internal error: {type(e).__name__}".encode())
        conn.corked.write(frame)
        if conn.writable is not None:  # the transport's buffer past its high-water mark: wait (TCP pushes back)
            await conn.writable

    async def _call(self, method: int, body: bytes, identity: Identity | None, host: str = "") -> bytes:
        if method == Method.WRITE_PARTS and self.write_parts is not None:
            self._authorize("WriteParts", "WriteParts", identity)  # the write role, as over gRPC
            try:
                return await self.write_parts(body, host)
            except (BadRequest, LimitExceeded, NotOwner, Unavailable) as e:
                raise _Refused(_status_of(e), str(e)) from None
        if method == Method.QUERY and self.query is not None:
            self._authorize("Read", "Query", identity)  # a query reads, as Read does: the read role
            try:
                return await self.query(body)
            except (BadRequest, LimitExceeded, NotOwner, Unavailable) as e:
                raise _Refused(_status_of(e), str(e)) from None
        spec = METHODS.get(method)
        if spec is None:
            raise _Refused(grpc.StatusCode.UNIMPLEMENTED, f"unknown read port method {method}")
        name, request_type, _, attr = spec
        self._authorize(name, name, identity)
        try:
            request = request_type.FromString(body)
        except DecodeError as e:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: a malformed request: {e}") from None
        try:
            if method == Method.READ and isinstance(request, pb.ReadRequest) and request.columnar \
                    and self._read_columns is not None:
                # the bytes StoreAPI.read's columnar answer serialises to, without the message between
                return length_delimited(2, batch_bytes(await self._read_columns(request)))
            response: Message = await getattr(self.backend, attr)(request)
        except (BadRequest, LimitExceeded, NotOwner, Unavailable) as e:
            raise _Refused(_status_of(e), str(e)) from None
        return response.SerializeToString()

    def _authorize(self, rpc: str, name: str, identity: Identity | None) -> None:
        """Raise _Refused(PERMISSION_DENIED) unless the identity has the role gRPC method ``rpc`` needs."""
        auth = self.security.auth if self.security is not None else None
        role = grpc_role(f"/metricsd.v1.Metrics/{rpc}")
        if auth is not None and identity is not None and role is not None:
            try:
                auth.authorize(identity, role, name)
            except PermissionDenied as e:
                raise _Refused(grpc.StatusCode.PERMISSION_DENIED, str(e)) from None


class _ServerConnection(asyncio.Protocol):
    """One client's connection to a read port, as an asyncio Protocol: frames are taken off the
    bytes as they arrive and each request's task started there, without a reader task woken per
    frame and a second loop turn to start the request (StreamReader's way: ~2 loop turns and a
    future a frame; perf/RESULTS.md, issue 23 session 38); a WRITE_PARTS frame is written and
    answered there, a task only if it must wait (the store's write turn held), and at most
    ``max_writes_in_flight`` of them a turn. The first frame must be HELLO within
    ``hello_timeout_s``; past ``max_in_flight`` requests (or ``max_writes_in_flight`` writes) under
    way, reading pauses until one is answered (TCP pushes back); a client that does not read its
    answers pauses the requests (``writable``) once the transport's buffer is past its high-water
    mark."""

    def __init__(self, server: ReadPortServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.corked: Corked
        self.buf = bytearray()
        self.peer = "?"
        self.host = ""  # the client's address, for a write's sender (WRITE_PARTS)
        self.identity: Identity | None = None
        self.greeted = False  # the HELLO came (its token may still be being checked)
        self.ready = False  # the hello was answered: requests are taken
        self.hello: asyncio.Task[None] | None = None  # the token being checked
        self.tasks: set[asyncio.Task[None]] = set()
        self.writes: set[asyncio.Task[None]] = set()  # those of tasks answering WRITE_PARTS
        self.reading_paused = False
        self.writable: asyncio.Future[None] | None = None  # while writing is paused: done when it resumes
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.corked = Corked(self.transport)
        peername = transport.get_extra_info("peername")
        self.peer = str(peername)
        self.host = str(peername[0]) if isinstance(peername, tuple) and peername else ""
        self.server._conns.add(self)
        self.timer = asyncio.get_running_loop().call_later(self.server.hello_timeout_s, self._no_hello)

    def _no_hello(self) -> None:
        if not self.greeted and self.transport is not None:
            self.transport.close()  # a client that never said hello

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._take()

    def _take(self) -> None:
        """Serve the whole frames received, while requests may be started."""
        if self.transport is None or self.reading_paused or (self.greeted and not self.ready):
            return  # closed, at max_in_flight, or the token still being checked
        now = 0  # write messages answered in this call, without a task
        try:
            for request_id, kind, method, body in take_frames(self.buf):
                if not self.ready:
                    if kind is not Kind.HELLO:
                        raise FrameError(f"the first frame is {kind.name}, not HELLO")
                    self.greeted = True
                    self._hello(request_id, body)
                    if not self.ready:
                        return  # the token is being checked: the rest waits for it
                    continue
                if kind is not Kind.REQUEST:
                    raise FrameError(f"a {kind.name} frame after the hello")
                answer = self.server._answer(self, request_id, method, body)
                if method == Method.WRITE_PARTS:  # the engine's write does not wait: answered in this turn
                    t = start_eagerly(answer)     # (metricsd/rpc/eager.py), a task only if it must wait
                    if t is None:
                        now += 1
                        if now >= self.server.max_writes_in_flight:  # a turn's worth: the rest next turn
                            self._pause()
                            asyncio.get_running_loop().call_soon(self._resume)
                            return
                        continue
                    self.writes.add(t)
                else:
                    t = asyncio.get_running_loop().create_task(answer)
                self.tasks.add(t)
                t.add_done_callback(self._finished)
                if self._full():
                    self._pause()
                    return
        except FrameError as e:
            log.warning("read port: closing the connection from %s: %s", self.peer, e)
            self.corked.flush()
            if self.transport is not None:
                self.transport.write(encode(Kind.ERROR, 0, grpc.StatusCode.INVALID_ARGUMENT.value[0], str(e).encode()))
                self.transport.close()
            self.transport = None  # nothing more is taken
            self.buf.clear()

    def _hello(self, request_id: int, body: bytes) -> None:
        auth = self.server.security.auth if self.server.security is not None else None
        if auth is None:
            self._welcome(request_id, None)
            return
        token = body.decode(errors="replace").strip()
        self.hello = asyncio.get_running_loop().create_task(self._identify(auth, request_id, token))

    async def _identify(self, auth: Authenticator, request_id: int, token: str) -> None:
        try:
            identity = await auth.identify(f"Bearer {token}" if token else None)
        except Unauthenticated as e:
            log.warning("read port: denied a connection from %s: unauthenticated: %s", self.peer, e)
            if self.transport is not None:
                self.transport.write(encode(Kind.ERROR, request_id, grpc.StatusCode.UNAUTHENTICATED.value[0],
                                            str(e).encode()))
                self.transport.close()
            return
        self._welcome(request_id, identity)
        self._take()

    def _welcome(self, request_id: int, identity: Identity | None) -> None:
        self.identity = identity
        self.ready = True
        if self.transport is not None:
            self.transport.write(encode(Kind.RESPONSE, request_id, 0, b""))

    def _full(self) -> bool:
        """As many requests, or write messages, under way as may be: read no more frames."""
        return len(self.tasks) >= self.server.max_in_flight or len(self.writes) >= self.server.max_writes_in_flight

    def _pause(self) -> None:
        if not self.reading_paused and self.transport is not None:
            self.transport.pause_reading()
            self.reading_paused = True

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self.writes.discard(task)
        self._resume()

    def _resume(self) -> None:
        """Read and take frames again, unless still full."""
        if self.reading_paused and not self._full() and self.transport is not None:
            self.reading_paused = False
            self.transport.resume_reading()
            self._take()

    def pause_writing(self) -> None:
        if self.writable is None:
            self.writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        writable, self.writable = self.writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.server._conns.discard(self)
        if self.timer is not None:
            self.timer.cancel()
        self.abort()
        self.resume_writing()

    def abort(self) -> list[asyncio.Task[None]]:
        """Cancel the requests under way and close the connection; the tasks to await."""
        tasks = [t for t in self.tasks if not t.done()]
        if isinstance(self.hello, asyncio.Task) and not self.hello.done():
            tasks.append(self.hello)
        for t in tasks:
            t.cancel()
        if self.transport is not None:
            self.transport.close()
        return tasks


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class AdvertisedReadPort:
    """``backend`` with ``read_port`` in its Health answers, where a proxy learns of the port."""

    def __init__(self, backend: MetricsBackend, read_port: int) -> None:
        self.backend = backend
        self.read_port = read_port

    async def write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        return await self.backend.write(request)

    async def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        return await self.backend.read(request)

    async def aggregate(self, request: pb.AggregateRequest) -> pb.AggregateResponse:
        return await self.backend.aggregate(request)

    async def rollups(self, request: pb.ReadRequest) -> pb.RollupsResponse:
        return await self.backend.rollups(request)

    async def list_series(self, request: pb.ListSeriesRequest) -> pb.ListSeriesResponse:
        return await self.backend.list_series(request)

    async def label_values(self, request: pb.LabelValuesRequest) -> pb.LabelValuesResponse:
        return await self.backend.label_values(request)

    async def health(self) -> pb.HealthResponse:
        resp = await self.backend.health()
        out = pb.HealthResponse()
        out.CopyFrom(resp)
        out.read_port = self.read_port
        return out

    async def stats(self) -> pb.StatsResponse:
        return await self.backend.stats()

    def __getattr__(self, name: str) -> Any:  # what else the wrapped backend offers (catch-up, digests)
        return getattr(self.backend, name)
