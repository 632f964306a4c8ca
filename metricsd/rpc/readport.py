"""The read port: a store's reads (Read, Aggregate, ListSeries, LabelValues, Rollups) served as
length-prefixed protobuf frames over one TLS connection per client, multiplexed by request id
(frames.py; layout in FORMAT.md). The same TLS as the store's gRPC port and the same tokens and
roles (metricsd/security/policy.py): the client's first frame carries its bearer token, checked
once per connection; each request is checked against the role its method needs.

:class:`ReadPortServer` serves a MetricsBackend (a store's, with its ownership checks);
:class:`ReadPortClient` is the proxy's end, and :class:`AdvertisedReadPort` puts the port in the
store's Health answer, where a proxy finds it (HealthResponse.read_port). A proxy's writes to a store
(WRITE_PARTS: a WritePartsRequest, answered by its WritePartsResponse) may come here too when the
store serves them (``write_parts``): a WriteStream message costs each end 100-250 us of grpc.aio,
a frame a fraction (perf/RESULTS.md issue 24 session 38); checked against the write role. Agents'
writes, Health and the rest stay on gRPC.

Limits: a body over 64 MiB (as gRPC's) or a header out of format closes the connection; a client
has ``max_in_flight`` requests served at once, past which its frames are not read (TCP pushes
back); a connection that sends no hello within ``hello_timeout_s`` is closed. Other connections
keep being served.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from metricsd.columns import SeriesColumns
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest, LimitExceeded, MetricsBackend, NotOwner, Unavailable
from metricsd.rpc.frames import HEADER, METHODS, FrameError, Kind, Method, decode_header, encode, status_code
from metricsd.rpc.servicer import _status_of
from metricsd.rpc.status import error_of
from metricsd.rpc.wholequery import NotSupported
from metricsd.rpc.wire import batch_bytes, length_delimited
from metricsd.security.auth import Identity, PermissionDenied, Unauthenticated
from metricsd.security.policy import grpc_role
from metricsd.security.settings import ClientSecurity, ServerSecurity

__all__ = ["AdvertisedReadPort", "ReadPortClient", "ReadPortServer"]

log = logging.getLogger("metricsd.rpc.readport")


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, Kind, int, bytes]:
    length, request_id, kind, code = decode_header(await reader.readexactly(HEADER.size))
    return request_id, kind, code, await reader.readexactly(length)


class _Corked:
    """Frames written to one connection within one turn of the event loop go out as one write
    (one send on the socket) at the end of that turn: at concurrency, several reads asked or
    answered in the same turn cost one system call and one wake-up of the peer, not one each. A
    lone frame waits no longer than the rest of the turn."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._parts: list[bytes] = []

    def write(self, frame: bytes) -> None:
        if not self._parts:
            asyncio.get_running_loop().call_soon(self.flush)
        self._parts.append(frame)

    def flush(self) -> None:
        if not self._parts:
            return
        parts, self._parts = self._parts, []
        if not self.writer.is_closing():
            self.writer.write(parts[0] if len(parts) == 1 else b"".join(parts))


class ReadPortServer:
    """Serves ``backend``'s reads on a port of its own. Start with :meth:`start`, stop with :meth:`stop`."""

    def __init__(self, backend: MetricsBackend, security: ServerSecurity | None = None, *, max_in_flight: int = 64,
                 hello_timeout_s: float = 10.0, query: Callable[[bytes], Awaitable[bytes]] | None = None,
                 write_parts: Callable[[bytes, str], Awaitable[bytes]] | None = None) -> None:
        self.backend = backend
        self.query = query  # answers a QUERY frame's body (http/wholequery.py); None: UNIMPLEMENTED
        # answers a WRITE_PARTS frame's body, given the sender's host (rpc/servicer.py
        # MetricsServicer.write_parts_body); None: UNIMPLEMENTED, the proxy writes over gRPC
        self.write_parts = write_parts
        self.security = security
        self.max_in_flight = max_in_flight
        self.hello_timeout_s = hello_timeout_s
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        direct = getattr(backend, "read_columns", None)  # a store's (OwnershipBackend: its checks first)
        self._read_columns: Callable[[pb.ReadRequest], Awaitable[SeriesColumns]] | None = (
            direct if callable(direct) else None)

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: any free port); returns the bound port. Raises OSError."""
        tls = self.security.tls if self.security is not None else None
        ctx = tls.ssl_context() if tls is not None else None
        self._server = await asyncio.start_server(self._serve, host, port, ssl=ctx)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        peername = writer.get_extra_info("peername")
        peer = str(peername)
        host = str(peername[0]) if isinstance(peername, tuple) and peername else ""
        tasks: set[asyncio.Task[None]] = set()
        corked: _Corked | None = None
        try:
            ok, identity = await self._hello(reader, writer, peer)
            if not ok:
                return
            slots = asyncio.Semaphore(self.max_in_flight)
            corked = _Corked(writer)
            while True:
                request_id, kind, method, body = await _read_frame(reader)
                if kind is not Kind.REQUEST:
                    raise FrameError(f"a {kind.name} frame after the hello")
                await slots.acquire()
                t = asyncio.create_task(self._answer(corked, request_id, method, body, identity, host))
                tasks.add(t)
                t.add_done_callback(functools.partial(_finished, tasks, slots))
        except FrameError as e:
            log.warning("read port: closing the connection from %s: %s", peer, e)
            if corked is not None:
                corked.flush()
            writer.write(encode(Kind.ERROR, 0, grpc.StatusCode.INVALID_ARGUMENT.value[0], str(e).encode()))
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, TimeoutError):
            pass  # the client went away, or never said hello
        finally:
            for t in tasks:
                t.cancel()
            if corked is not None:
                corked.flush()
            writer.close()
            self._conns.discard(task)

    async def _hello(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
                     ) -> tuple[bool, Identity | None]:
        """(True, the identity the hello's token stands for: None without an authenticator), or
        (False, None) after answering a refusal."""
        request_id, kind, _, body = await asyncio.wait_for(_read_frame(reader), self.hello_timeout_s)
        if kind is not Kind.HELLO:
            raise FrameError(f"the first frame is {kind.name}, not HELLO")
        auth = self.security.auth if self.security is not None else None
        identity = None
        if auth is not None:
            token = body.decode(errors="replace").strip()
            try:
                identity = await auth.identify(f"Bearer {token}" if token else None)
            except Unauthenticated as e:
                log.warning("read port: denied a connection from %s: unauthenticated: %s", peer, e)
                writer.write(encode(Kind.ERROR, request_id, grpc.StatusCode.UNAUTHENTICATED.value[0], str(e).encode()))
                await writer.drain()
                return False, None
        writer.write(encode(Kind.RESPONSE, request_id, 0, b""))
        return True, identity

    async def _answer(self, corked: _Corked, request_id: int, method: int, body: bytes,
                      identity: Identity | None, host: str = "") -> None:
        try:
            frame = encode(Kind.RESPONSE, request_id, method, await self._call(method, body, identity, host))
        except _Refused as e:
            frame = encode(Kind.ERROR, request_id, e.code.value[0], e.message.encode())
        except FrameError as e:  # an answer over the size limit
            frame = encode(Kind.ERROR, request_id, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], str(e).encode())
        except Exception as e:  # a bug: answered, so that the client does not wait for its timeout
            log.exception("read port: method %d failed", method)
            frame = encode(Kind.ERROR, request_id, grpc.StatusCode.INTERNAL.value[0],
                           f"internal error: {type(e).__name__}".encode())
        corked.write(frame)
        with contextlib.suppress(ConnectionError):
            await corked.writer.drain()  # the transport's buffer past its high-water mark: wait (TCP pushes back)

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


def _finished(tasks: set[asyncio.Task[None]], slots: asyncio.Semaphore, task: asyncio.Task[None]) -> None:
    tasks.discard(task)
    slots.release()


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ReadPortClient:
    """One connection to a store's read port, opened on first use and never again once it has
    ended (the store may listen elsewhere now: ask its Health), many requests in flight on it. A
    request cancelled by its caller (a timeout) leaves its late
    answer to be dropped. Raises Unavailable when the connection cannot be had or breaks, and the
    store's errors as GrpcBackend does (BadRequest, NotOwner, LimitExceeded, Unavailable)."""

    def __init__(self, host: str, port: int, security: ClientSecurity | None = None,
                 connect_timeout_s: float = 5.0) -> None:
        self.host, self.port = host, port
        self.security = security
        self.connect_timeout_s = connect_timeout_s
        self._writer: asyncio.StreamWriter | None = None
        self._corked: _Corked | None = None
        self._reading: asyncio.Task[None] | None = None
        self._connecting = asyncio.Lock()
        self._waiting: dict[int, asyncio.Future[tuple[Kind, int, bytes]]] = {}
        self._next_id = 0
        self._broken: str | None = None  # why the connection ended, once it has

    async def call(self, method: Method, request: Message) -> Any:
        name, _, response_type, _ = METHODS[method]
        body = await self.call_raw(method, request.SerializeToString(), name)
        try:
            return response_type.FromString(body)
        except DecodeError as e:
            raise Unavailable(f"{name}: a malformed answer from the read port: {e}") from None

    async def call_raw(self, method: Method, body: bytes, name: str = "Query") -> bytes:
        """One request of ``method`` with ``body`` as it is; the answer's body. Raises as call(),
        and NotSupported when the store does not know the method (ERROR 12)."""
        corked = await self._connection()
        self._next_id += 1
        request_id = self._next_id
        answer: asyncio.Future[tuple[Kind, int, bytes]] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = answer
        try:
            corked.write(encode(Kind.REQUEST, request_id, method, body))
            kind, code, out = await answer
        finally:
            self._waiting.pop(request_id, None)
        if kind is Kind.ERROR:
            status, text = status_code(code), out.decode(errors="replace")
            if status == grpc.StatusCode.UNIMPLEMENTED:
                raise NotSupported(f"{name}: {status.name}: {text}")
            raise error_of(name, status, text)
        return out

    async def _connection(self) -> _Corked:
        if self._corked is not None and not self._corked.writer.is_closing():
            return self._corked  # the usual case: no lock to take
        async with self._connecting:
            if self._corked is not None and not self._corked.writer.is_closing():
                return self._corked
            if self._broken is not None:
                # Not dialled again: a restarted store listens on another port (0 picks one), and
                # another process may have this one now. The owner asks the store's Health again.
                raise Unavailable(f"read port {self.host}:{self.port}: the connection broke ({self._broken})")
            tls = self.security.tls if self.security is not None else None
            ctx = tls.ssl_context() if tls is not None else None
            server_name = (tls.server_name or self.host) if tls is not None else None
            where = f"read port {self.host}:{self.port}"
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port, ssl=ctx, server_hostname=server_name),
                    self.connect_timeout_s)
                token = (self.security.bearer() if self.security is not None else None) or ""
                writer.write(encode(Kind.HELLO, 0, 0, token.encode()))
                _, kind, code, body = await asyncio.wait_for(_read_frame(reader), self.connect_timeout_s)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, FrameError) as e:
                raise Unavailable(f"{where}: cannot connect: {type(e).__name__}: {e}") from None
            if kind is Kind.ERROR:
                writer.close()
                raise error_of("read port", status_code(code), body.decode(errors="replace"))
            self._writer = writer
            self._corked = _Corked(writer)
            self._reading = asyncio.get_running_loop().create_task(self._read(reader, writer))
            return self._corked

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        why = "closed"
        try:
            while True:
                request_id, kind, code, body = await _read_frame(reader)
                fut = self._waiting.get(request_id)
                if fut is not None and not fut.done():
                    fut.set_result((kind, code, body))
                elif request_id == 0 and kind is Kind.ERROR:
                    why = body.decode(errors="replace")
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, FrameError) as e:
            why = f"{type(e).__name__}: {e}"
        finally:
            writer.close()
            if self._writer is writer:
                self._writer = self._corked = None
            self._broken = why
            err = Unavailable(f"read port {self.host}:{self.port}: the connection broke ({why})")
            for fut in list(self._waiting.values()):
                if not fut.done():
                    fut.set_exception(err)

    async def close(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            await asyncio.gather(self._reading, return_exceptions=True)
        if self._writer is not None:
            self._writer.close()
            self._writer = self._corked = None


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
