"""Connections to store members: one backend per member address, reused, closed when the map drops it.

A store's "I do not hold this slot" answer arrives as :class:`metricsd.rpc.backend.NotOwner` (gRPC
FAILED_PRECONDITION), so the fan-out can tell a stale map from a dead store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError

from metricsd.cluster.shardmap import ShardMap
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest, MetricsBackend, NotOwner, Unavailable
from metricsd.rpc.channel import open_channel
from metricsd.rpc.client import StreamingBackend, parts_body, parts_results
from metricsd.rpc.frames import Method
from metricsd.rpc.readport_client import ReadPortClient
from metricsd.rpc.server import GRPC_OPTIONS
from metricsd.rpc.wholequery import NoReadPort, NotSupported
from metricsd.security.settings import ClientSecurity

__all__ = [
    "RECONNECT_OPTIONS",
    "Connect",
    "MemberClient",
    "MemberPool",
    "SlotNotHeld",
    "call_with_retries",
    "grpc_connect",
    "is_slot_not_held",
]

log = logging.getLogger("metricsd.proxy")

T = TypeVar("T")
Connect = Callable[[str], MetricsBackend]


# A store answered that it does not hold a slot it was asked for: the proxy's map is stale. One
# error for it everywhere: GrpcBackend maps FAILED_PRECONDITION to it, and a store's ownership
# check in this process raises it directly.
SlotNotHeld = NotOwner


def is_slot_not_held(exc: BaseException) -> bool:
    return isinstance(exc, NotOwner)


class MemberClient(StreamingBackend):
    """A store over gRPC on a channel of its own; writes go over one WriteStream to it, and reads
    over its read port (metricsd/rpc/readport.py) when its Health names one: a read there costs
    both ends a tenth of a unary gRPC call. The port is asked for with the first read; until then,
    for a store without one, and after the read port failed, reads go over gRPC. A read port that
    cannot be reached (a firewall that drops its packets, say) is given up within a second, well
    inside the call's timeout, and asked for again after ``REPROBE_S``, doubling while it stays
    unreachable up to ``REPROBE_MAX_S``; one whose connection broke (a store restarted, on
    another port) after ``REPROBE_S``."""

    REPROBE_S = 5.0
    REPROBE_MAX_S = 320.0
    CONNECT_TIMEOUT_S = 1.0

    def __init__(self, channel: grpc.aio.Channel, timeout_s: float, address: str = "",
                 security: ClientSecurity | None = None, use_read_port: bool = True,
                 writes_on_read_port: bool = False) -> None:
        super().__init__(channel, timeout_s)
        self.address = address
        self.security = security
        self.use_read_port = use_read_port and bool(address)
        self._port_client: ReadPortClient | None = None
        self._probed_at: float | None = None
        self._probe: asyncio.Task[ReadPortClient | None] | None = None  # asking the store's Health for the port
        self._retry_after = self.REPROBE_S
        self._unreachable = 0  # read ports in a row that could not be connected to
        # until the store answers WRITE_PARTS with UNIMPLEMENTED (ProxySettings.writes_on_read_port)
        self.writes_over_port = self.use_read_port and writes_on_read_port

    async def _read_port(self) -> ReadPortClient | None:
        if not self.use_read_port:
            return None
        if self._port_client is not None:
            return self._port_client
        probe = self._probe
        if probe is None or probe.done():
            if self._probed_at is not None and time.monotonic() - self._probed_at < self._retry_after:
                return None
            probe = self._probe = asyncio.get_running_loop().create_task(self._ask_port())
            probe.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved, even with no one left
        # A task of its own, shielded: a read that arrives while another's probe is under way waits
        # for its outcome, and a read cancelled meanwhile (a hedge won, a timeout) does not cancel
        # the probe. Both ended it with no port, and every read for REPROBE_S went without one:
        # concurrency 8's first burst sent two of three stores' whole queries away for a minute.
        return await asyncio.shield(probe)

    async def _ask_port(self) -> ReadPortClient | None:
        self._probed_at = time.monotonic()
        try:
            port = (await super().health()).read_port
        except Unavailable:
            return None
        if port:
            host = self.address.rpartition(":")[0].strip("[]")
            self._port_client = ReadPortClient(host, port, self.security,
                                               min(self.CONNECT_TIMEOUT_S, self.timeout_s / 4))
        return self._port_client

    async def _over_port(self, method: Method, request: Any, grpc_call: Callable[[Any], Awaitable[T]]) -> T:
        client = await self._read_port()
        if client is not None:
            try:
                result: T = await client.call(method, request)
                return result
            except Unavailable as e:
                if "read port" not in str(e):
                    raise  # the store's own answer
                await self._port_failed(client, e)
        return await grpc_call(request)

    async def _port_failed(self, client: ReadPortClient, e: Unavailable) -> None:
        """Reads and writes go over gRPC until the port is asked for again."""
        self._unreachable = self._unreachable + 1 if "cannot connect" in str(e) else 0
        self._retry_after = min(self.REPROBE_MAX_S, self.REPROBE_S * 2 ** max(0, self._unreachable - 1))
        log.info("%s: the read port failed (%s); reads and writes go over gRPC for %g s", self.address, e,
                 self._retry_after)
        if self._port_client is client:
            self._port_client = None
            self._probed_at = time.monotonic()
        await client.close()

    async def write_parts(self, parts: Sequence[bytes]) -> list[pb.WriteResponse | Exception]:
        """Over the read port when the store has one and serves writes there (a frame costs each end
        a fraction of a WriteStream message: perf/RESULTS.md issue 24 session 38), else over the
        WriteStream. A connection that breaks under the message fails it as unavailable (its outcome
        unknown, as a stream that breaks: the write path hands it off); the next goes over gRPC until
        the port is asked for again."""
        client = await self._read_port() if self.writes_over_port else None
        if client is None:
            return await super().write_parts(parts)
        body = parts_body(parts, self.timeout_s)
        try:
            answer = await client.call_raw(Method.WRITE_PARTS, body, "WriteParts")
        except NotSupported:  # a store that predates writes on its read port
            self.writes_over_port = False
            return await super().write_parts(parts)
        except Unavailable as e:
            if "read port" in str(e):
                await self._port_failed(client, e)
            raise
        try:
            resp = pb.WritePartsResponse.FromString(answer)
        except DecodeError as e:
            raise Unavailable(f"WriteParts: a malformed answer from the read port: {e}") from None
        return parts_results(resp, len(parts))

    async def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        return await self._over_port(Method.READ, request, super().read)

    async def aggregate(self, request: pb.AggregateRequest) -> pb.AggregateResponse:
        return await self._over_port(Method.AGGREGATE, request, super().aggregate)

    async def list_series(self, request: pb.ListSeriesRequest) -> pb.ListSeriesResponse:
        return await self._over_port(Method.LIST_SERIES, request, super().list_series)

    async def label_values(self, request: pb.LabelValuesRequest) -> pb.LabelValuesResponse:
        return await self._over_port(Method.LABEL_VALUES, request, super().label_values)

    async def rollups(self, request: pb.ReadRequest) -> pb.RollupsResponse:
        return await self._over_port(Method.ROLLUPS, request, super().rollups)

    async def query(self, body: bytes) -> bytes:
        """A whole PromQL query (a QUERY frame's body, metricsd/rpc/wholequery.py) over the read
        port; raises NoReadPort when the store has no read port (now), NotSupported when it does not know
        the frame."""
        client = await self._read_port()
        if client is None:
            raise NoReadPort(f"{self.address}: no read port (yet) for a whole query")
        return await client.call_raw(Method.QUERY, body)

    def query_now(self, body: bytes, deliver: Callable[[bytes | Exception], None]) -> Callable[[], object] | None:
        """query() sent now, its outcome handed to ``deliver``, when the read port's connection is
        up (ReadPortClient.send_now); returns what forgets it. None: await query() instead."""
        client = self._port_client
        return client.send_now(Method.QUERY, body, deliver) if client is not None else None

    async def close(self) -> None:
        if self._probe is not None and not self._probe.done():
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        if self._port_client is not None:
            await self._port_client.close()
        await super().close()


async def call_with_retries(call: Callable[[], Awaitable[T]], timeout_s: float, retries: int, backoff_s: float) -> T:
    """Run ``call`` with a timeout; retry an Unavailable (not SlotNotHeld, not BadRequest) up to
    ``retries`` times, waiting ``backoff_s * 2**attempt``. A timeout raises Unavailable."""
    attempt = 0
    while True:
        try:
            async with asyncio.timeout(timeout_s):
                return await call()
        except TimeoutError:
            err: Unavailable = Unavailable(f"no answer within {timeout_s:g} s")
        except (BadRequest, SlotNotHeld):
            raise
        except Unavailable as e:
            err = e
        if attempt >= retries:
            raise err
        await asyncio.sleep(backoff_s * 2**attempt)
        attempt += 1


class MemberPool:
    """Member id -> backend, built by ``connect(address)`` on first use and kept while the map
    names the member at that address. Not thread-safe (one event loop)."""

    def __init__(self, connect: Connect) -> None:
        self._connect = connect
        self._backends: dict[str, tuple[str, MetricsBackend]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def get(self, shard_map: ShardMap, member: str) -> MetricsBackend:
        """Raises Unavailable when the map does not know the member."""
        m = shard_map.members.get(member)
        if m is None:
            raise Unavailable(f"member {member} is not in shard map v{shard_map.version}")
        have = self._backends.get(member)
        if have is not None and have[0] == m.address:
            return have[1]
        if have is not None:
            self._close_later(have[1])
        backend = self._connect(m.address)
        self._backends[member] = (m.address, backend)
        return backend

    def prune(self, shard_map: ShardMap) -> list[str]:
        """Close the connections of members the map no longer names (or names elsewhere);
        returns their ids."""
        gone = [mid for mid, (addr, _) in self._backends.items()
                if mid not in shard_map.members or shard_map.members[mid].address != addr]
        for mid in gone:
            self._close_later(self._backends.pop(mid)[1])
        return gone

    def _close_later(self, backend: MetricsBackend) -> None:
        close = getattr(backend, "close", None)
        if close is None:
            return
        task = asyncio.get_running_loop().create_task(_close(backend))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        for _, backend in self._backends.values():
            self._close_later(backend)
        self._backends.clear()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


async def _close(backend: MetricsBackend) -> None:
    try:
        await backend.close()  # type: ignore[attr-defined]
    except Exception as e:  # closing a dead connection must not fail the caller
        log.debug("closing a member connection failed: %s", e)


# gRPC's default reconnect back-off grows to 2 minutes; a store back after a restart must be
# reachable again within a couple of seconds, for hinted hand-off and for quorum.
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def grpc_connect(timeout_s: float, security: ClientSecurity | None = None,
                 writes_on_read_port: bool = False) -> Connect:
    """The default ``connect``: a gRPC channel per address with the stores' message limits, TLS
    and token as ``security`` says; write parts over the stores' read ports when asked."""

    def connect(address: str) -> MetricsBackend:
        channel = open_channel(address, security, GRPC_OPTIONS + RECONNECT_OPTIONS)
        return MemberClient(channel, timeout_s, address, security, writes_on_read_port=writes_on_read_port)

    return connect
