"""The key-value store the cluster's coordination lives in, as a small interface of our own.

The shard map, member records and the config server's leader key live in etcd, but nothing above
this module talks to etcd directly: the config server, the proxies' map watcher and the leader
election use :class:`KV`, so a contract test suite can hold every implementation to the same
semantics (Cortex keeps its ring behind the same kind of interface).

The semantics are etcd's, kept deliberately narrow:

- Every change bumps one store-wide *revision*; a key remembers the revision of its last change
  (``mod_revision``). ``0`` means "absent" wherever a revision is expected.
- :meth:`KV.compare_and_swap` writes a key only if its ``mod_revision`` still equals what the caller
  read, which is how the config server writes the map without losing a concurrent update.
- :meth:`KV.watch` replays every change under a prefix from a revision on, then follows live
  changes, surviving lost connections; it raises :class:`WatchCompacted` when the history it needs
  has been compacted away, because the caller must then re-read the whole prefix.
- A :class:`Lease` is kept alive in the background until revoked; keys written with it vanish when
  it expires. Its owner learns of a loss through :attr:`Lease.lost` or the ``on_lost`` callback.

Keys are ``str`` (UTF-8 on the wire), values ``bytes``.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, NamedTuple, Protocol, runtime_checkable

__all__ = [
    "KV",
    "EventType",
    "KVError",
    "KVUnavailable",
    "KeyValue",
    "Lease",
    "LeaseLostCallback",
    "RangeResult",
    "Versioned",
    "WatchCompacted",
    "WatchEvent",
    "cancel_and_wait",
]


class KVError(Exception):
    """Any failure of the key-value store that the caller may want to handle as one."""


class KVUnavailable(KVError):
    """The store could not be reached or did not answer in time; retrying later may succeed."""


class WatchCompacted(KVError):
    """The revision a watch asked for was compacted; the watcher must re-read the prefix.

    ``compact_revision`` is the oldest revision still available: re-read with :meth:`KV.range`,
    then watch from the range's revision + 1.
    """

    def __init__(self, prefix: str, start_revision: int, compact_revision: int) -> None:
        self.prefix = prefix
        self.start_revision = start_revision
        self.compact_revision = compact_revision
        super().__init__(
            f"watch of {prefix!r} from revision {start_revision} cannot resume: history before "
            f"revision {compact_revision} was compacted; re-read the prefix and watch from its revision"
        )


class Versioned(NamedTuple):
    """A value and the revision of its last change, as :meth:`KV.get` returns it."""

    value: bytes
    mod_revision: int


class KeyValue(NamedTuple):
    key: str
    value: bytes
    mod_revision: int


class RangeResult(NamedTuple):
    """Keys under a prefix, sorted by key, and the store revision the read saw.

    Watching from ``revision + 1`` continues exactly where the read left off.
    """

    items: list[KeyValue]
    revision: int


class EventType(enum.Enum):
    PUT = "put"
    DELETE = "delete"


class WatchEvent(NamedTuple):
    """One change. For a delete, ``value`` is empty and ``mod_revision`` is the deletion's revision."""

    type: EventType
    key: str
    value: bytes
    mod_revision: int


LeaseLostCallback = Callable[["Lease"], None]


class Lease:
    """A lease granted by :meth:`KV.grant` and kept alive in the background until revoked.

    ``lost`` is set once the lease is known to be gone (expired on the server, or no keep-alive got
    through for a whole TTL, after which the server has certainly dropped it). A lost lease is
    never revived: grant a new one. Implementations subclass this and fill in :meth:`revoke`.
    """

    def __init__(self, lease_id: int, ttl: int, on_lost: LeaseLostCallback | None = None) -> None:
        self.id = lease_id
        self.ttl = ttl
        self.lost = asyncio.Event()
        self._on_lost = on_lost
        self.lost_reason = ""
        self.revoked = False

    @property
    def alive(self) -> bool:
        """False once lost or revoked: keys written with it are gone or about to go."""
        return not (self.revoked or self.lost.is_set())

    def mark_lost(self, reason: str) -> None:
        """Record the loss once and tell the owner; later calls are no-ops."""
        if self.lost.is_set():
            return
        self.lost_reason = reason
        self.lost.set()
        if self._on_lost is not None:
            self._on_lost(self)

    async def revoke(self) -> None:
        """Stop the keep-alive and delete the lease and its keys now. Idempotent.

        A revoke is the owner's choice, not a loss: it sets ``revoked`` and does not call
        ``on_lost``.
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        state = "revoked" if self.revoked else "alive" if self.alive else f"lost ({self.lost_reason})"
        return f"Lease(id={self.id:#x}, ttl={self.ttl}s, {state})"


@runtime_checkable
class KV(Protocol):
    """The coordination store. Methods may raise :class:`KVUnavailable`; none retries forever."""

    async def get(self, key: str) -> Versioned | None:
        """The key's value and mod_revision, or None when it is absent."""
        ...

    async def range(self, prefix: str) -> RangeResult:
        """Every key starting with ``prefix``, sorted by key, with the revision of the read."""
        ...

    async def put(self, key: str, value: bytes, lease: Lease | None = None) -> int:
        """Write unconditionally; returns the new revision. A leased key dies with its lease."""
        ...

    async def delete(self, key: str) -> bool:
        """Delete the key; True if it existed."""
        ...

    async def compare_and_swap(
        self,
        key: str,
        expected_mod_revision: int,
        value: bytes,
        lease: Lease | None = None,
        guards: Mapping[str, int] | None = None,
    ) -> bool:
        """Write ``key`` only if its mod_revision equals ``expected_mod_revision`` (0: absent).

        ``guards`` adds more keys whose mod_revision must match in the same atomic step; a leader
        passes its leader key so that a deposed leader cannot overwrite its successor's work.
        Returns whether the write happened.
        """
        ...

    async def compare_and_delete(self, key: str, expected_mod_revision: int) -> bool:
        """Delete ``key`` only if its mod_revision equals ``expected_mod_revision``."""
        ...

    def watch(self, prefix: str, start_revision: int) -> AsyncIterator[WatchEvent]:
        """Every change under ``prefix`` with revision >= ``start_revision``, then live changes.

        Events arrive in revision order, none twice and none missing, across lost connections
        (the implementation re-subscribes from the last revision it delivered + 1). Raises
        :class:`WatchCompacted` if that history is gone. Stop by leaving the ``async for`` (or
        ``aclose()``).
        """
        ...

    async def grant(self, ttl: int, on_lost: LeaseLostCallback | None = None) -> Lease:
        """A new lease of ``ttl`` seconds, kept alive in the background until revoked."""
        ...

    async def close(self) -> None:
        """Stop keep-alives and watches and release connections; leases are left to expire."""
        ...


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` until it ends, then return (its exception, if any, is dropped).

    Python 3.11's ``asyncio.wait_for`` (used inside aetcd and gRPC) can swallow a cancellation
    that races with its result, so one ``cancel()`` followed by ``await task`` may wait forever
    for a task that consumes a watch or keeps a lease alive.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=0.1)
    if not task.cancelled():
        task.exception()  # mark it retrieved
