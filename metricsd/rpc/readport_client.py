"""The read port's client end (the proxy's): one connection to a store's read port
(rpc/readport.py serves it; frames in rpc/frames.py, layout in rpc/FORMAT.md), many requests in
flight on it, multiplexed by request id. The first frame carries the bearer token; a request's
answer or ERROR frame comes back under its id.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, Protocol, cast

import grpc
from google.protobuf.message import DecodeError, Message

from metricsd.rpc.backend import Unavailable
from metricsd.rpc.corked import Corked
from metricsd.rpc.frames import METHODS, FrameError, Kind, Method, encode, status_code, take_frames
from metricsd.rpc.status import error_of
from metricsd.rpc.wholequery import NotSupported
from metricsd.security.settings import ClientSecurity

__all__ = ["ReadPortClient", "answer_body"]

Frame = tuple[Kind, int, bytes]


class _Waiter(Protocol):
    """What an answer is handed to: an asyncio.Future (call_raw), or a _Sink (send_now)."""

    def done(self) -> bool: ...
    def set_result(self, result: Frame, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...


class _Sink:
    """send_now's waiter: hands the answer (or the connection's failure) to its callback at once,
    in the turn of the event loop that read it, rather than a turn later as a future's awaiter."""

    __slots__ = ("deliver", "landed", "name")

    def __init__(self, deliver: Callable[[bytes | Exception], None], name: str) -> None:
        self.deliver, self.name, self.landed = deliver, name, False

    def done(self) -> bool:
        return self.landed

    def set_result(self, result: Frame) -> None:
        self.landed = True
        try:
            out: bytes | Exception = answer_body(*result, self.name)
        except Exception as e:
            out = e
        self.deliver(out)

    def set_exception(self, exception: BaseException) -> None:
        self.landed = True
        self.deliver(exception if isinstance(exception, Exception) else Unavailable(str(exception)))


def answer_body(kind: Kind, code: int, out: bytes, name: str) -> bytes:
    """An answer frame's body; an ERROR frame raised as the store's error (NotSupported for
    UNIMPLEMENTED, else as GrpcBackend does)."""
    if kind is Kind.ERROR:
        status, text = status_code(code), out.decode(errors="replace")
        if status == grpc.StatusCode.UNIMPLEMENTED:
            raise NotSupported(f"{name}: {status.name}: {text}")
        raise error_of(name, status, text)
    return out


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
        self._conn: _ClientConnection | None = None
        self._corked: Corked | None = None
        self._connecting = asyncio.Lock()
        self._waiting: dict[int, _Waiter] = {}
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
        answer: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = answer
        try:
            corked.write(encode(Kind.REQUEST, request_id, method, body))
            kind, code, out = await answer
        finally:
            self._waiting.pop(request_id, None)
        return answer_body(kind, code, out, name)

    def send_now(self, method: Method, body: bytes, deliver: Callable[[bytes | Exception], None],
                 name: str = "Query") -> Callable[[], object] | None:
        """call_raw without its turns of the event loop, when the connection is up: the request is
        written now (not corked to the end of the turn), and ``deliver`` is called with the answer's
        body or the error call_raw would raise, from the turn that reads it (no task to wake).
        Returns what forgets the request (its late answer dropped), or None when the connection is
        not up (not yet opened, being opened, broken): call_raw then, which opens it or raises.
        Two of the proxy's turns of the loop a whole query (perf/RESULTS.md, session 40)."""
        corked = self._corked
        if corked is None or corked.transport.is_closing():
            return None
        self._next_id += 1
        request_id = self._next_id
        self._waiting[request_id] = _Sink(deliver, name)
        corked.transport.write(encode(Kind.REQUEST, request_id, method, body))
        return functools.partial(self._waiting.pop, request_id, None)

    async def _connection(self) -> Corked:
        corked = self._corked
        if corked is not None:
            if not corked.transport.is_closing():
                return corked  # the usual case: no lock to take
            if self._conn is not None:  # closing (the store's end went away), not yet reported lost
                self._ended(self._conn, self._conn.why or "closed")
        async with self._connecting:
            if self._corked is not None and not self._corked.transport.is_closing():
                return self._corked
            if self._broken is not None:
                # Not dialled again: a restarted store listens on another port (0 picks one), and
                # another process may have this one now. The owner asks the store's Health again.
                raise Unavailable(f"read port {self.host}:{self.port}: the connection broke ({self._broken})")
            tls = self.security.tls if self.security is not None else None
            ctx = tls.ssl_context() if tls is not None else None
            server_name = (tls.server_name or self.host) if tls is not None else None
            where = f"read port {self.host}:{self.port}"
            conn = _ClientConnection(self)
            try:
                await asyncio.wait_for(asyncio.get_running_loop().create_connection(
                    lambda: conn, self.host, self.port, ssl=ctx, server_hostname=server_name), self.connect_timeout_s)
                assert conn.transport is not None
                token = (self.security.bearer() if self.security is not None else None) or ""
                conn.transport.write(encode(Kind.HELLO, 0, 0, token.encode()))
                kind, code, body = await asyncio.wait_for(conn.hello, self.connect_timeout_s)
            except (OSError, TimeoutError, FrameError) as e:
                conn.close()
                raise Unavailable(f"{where}: cannot connect: {type(e).__name__}: {e}") from None
            if kind is Kind.ERROR:
                conn.close()
                raise error_of("read port", status_code(code), body.decode(errors="replace"))
            assert conn.transport is not None
            self._conn, self._corked = conn, Corked(conn.transport)
            return self._corked

    def _ended(self, conn: _ClientConnection, why: str) -> None:
        """The connection ``conn`` is over: every request waiting on it fails, and no new one is dialled."""
        if self._conn is not conn:
            return  # one that never finished its hello: the next call dials again
        self._conn = self._corked = None
        self._broken = why
        err = Unavailable(f"read port {self.host}:{self.port}: the connection broke ({why})")
        waiting, self._waiting = self._waiting, {}  # a request sent now has no finally of its own to go
        for fut in waiting.values():
            if not fut.done():
                fut.set_exception(err)

    async def close(self) -> None:
        conn = self._conn
        if conn is not None:
            self._ended(conn, "closed")
            conn.close()


class _ClientConnection(asyncio.Protocol):
    """A ReadPortClient's connection, as an asyncio Protocol: each answer is taken off the bytes as
    they arrive and handed to its request's future there, without a reader task woken per frame
    (StreamReader's way; perf/RESULTS.md, issue 23 session 38)."""

    def __init__(self, client: ReadPortClient) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.hello: asyncio.Future[tuple[Kind, int, bytes]] = asyncio.get_running_loop().create_future()
        self.why: str | None = None  # why it ended, the first reason given

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        waiting = self.client._waiting
        try:
            for request_id, kind, code, body in take_frames(self.buf):
                if not self.hello.done():
                    self.hello.set_result((kind, code, body))
                    continue
                fut = waiting.pop(request_id, None)  # gone once answered: a request sent now has no finally
                if fut is not None and not fut.done():
                    fut.set_result((kind, code, body))
                elif request_id == 0 and kind is Kind.ERROR:
                    self._end(body.decode(errors="replace"))
                    return
        except FrameError as e:
            self._end(f"FrameError: {e}")

    def _end(self, why: str) -> None:
        if self.why is None:
            self.why = why
        if not self.hello.done():
            self.hello.set_exception(ConnectionError(f"closed before the hello was answered ({why})"))
        self.client._ended(self, self.why)
        self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.buf.clear()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(f"{type(exc).__name__}: {exc}" if exc is not None else "closed")
        self.transport = None
