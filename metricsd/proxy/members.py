"""Connections to store members: one backend per member address, reused, closed when the map drops it.

A store's "I do not hold this slot" answer arrives as :class:`metricsd.rpc.backend.NotOwner` (gRPC
FAILED_PRECONDITION), so the fan-out can tell a stale map from a dead store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from metricsd.cluster.shardmap import ShardMap
from metricsd.rpc.backend import BadRequest, MetricsBackend, NotOwner, Unavailable
from metricsd.rpc.channel import open_channel
from metricsd.rpc.client import StreamingBackend
from metricsd.rpc.server import GRPC_OPTIONS
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
    """A store over gRPC on a channel of its own; writes go over one WriteStream to it."""


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


def grpc_connect(timeout_s: float, security: ClientSecurity | None = None) -> Connect:
    """The default ``connect``: a gRPC channel per address with the stores' message limits, TLS
    and token as ``security`` says."""

    def connect(address: str) -> MetricsBackend:
        channel = open_channel(address, security, GRPC_OPTIONS + RECONNECT_OPTIONS)
        return MemberClient(channel, timeout_s)

    return connect
