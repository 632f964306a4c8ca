"""A store as a cluster member: its record in etcd under a lease, and the shard map it follows.

The record (``<root>/<cluster>/members/<id>``, see shardmap.py) lives under a lease the store
keeps alive, so a store that dies drops out of the map one lease TTL later. A store that loses its
lease (etcd unreachable for a whole TTL) registers again with a new lease as soon as etcd answers:
to the config server that looks like a short absence, and the assignment, which keeps every
replica that can stay, gives the member back the slots it still holds when the debounce absorbs it.

The store learns which slots it holds from the shard map (:class:`EtcdMapSource`), and logs the
slots it gains and loses at each map change.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging

from metricsd.cluster.kv import KV, KVError, Lease, cancel_and_wait
from metricsd.cluster.mapwatch import EtcdMapSource
from metricsd.cluster.membership import MemberEvent, drained, transition
from metricsd.cluster.shardmap import KeyLayout, Member, MemberState, ShardMap

__all__ = ["ClusterMember", "MemberRegistration", "describe_slots"]

_log = logging.getLogger(__name__)


def describe_slots(slots: list[int] | set[int] | frozenset[int], limit: int = 16) -> str:
    """``"0, 3, 7"``, shortened to the first ``limit`` with a count of the rest."""
    ordered = sorted(slots)
    text = ", ".join(str(s) for s in ordered[:limit])
    return text + (f" and {len(ordered) - limit} more" if len(ordered) > limit else "")


class MemberRegistration:
    """Keeps ``member``'s record in the KV under a live lease, re-registering when the lease is lost.

    ``registered`` is set while the record is believed to be in place. Use from one event loop.
    """

    def __init__(self, kv: KV, layout: KeyLayout, member: Member, *, ttl: int = 5, retry_s: float = 0.5) -> None:
        member.validate()
        self.kv = kv
        self.layout = layout
        self.member = member
        self.ttl = ttl
        self.retry_s = retry_s
        self.registered = asyncio.Event()
        self.registrations = 0  # how many times the record was (re)written, for tests and logs
        self.lease: Lease | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"register-{self.member.id}")

    async def close(self, deregister: bool = False) -> None:
        """Stop keeping the record alive. ``deregister`` deletes it now (its slots move at once);
        otherwise it expires with the lease, so a quick restart under the same id moves nothing."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        self.registered.clear()
        lease, self.lease = self.lease, None
        if lease is not None and deregister:
            with contextlib.suppress(KVError):
                await lease.revoke()
                _log.info("member %s deregistered", self.member.id)

    async def set_state(self, state: MemberState) -> None:
        """Rewrite the record with ``state`` under the current lease (a store catching up from its
        peers says ``joining``, then ``active``). Raises KVError; a later registration writes the
        new state anyway."""
        if state is self.member.state:
            return
        self.member = dataclasses.replace(self.member, state=state)
        if self.lease is not None and self.registered.is_set():
            await self.kv.put(self.layout.member_key(self.member.id), self.member.to_json(), lease=self.lease)
            _log.info("member %s: state %s", self.member.id, state.value)

    async def _run(self) -> None:
        key = self.layout.member_key(self.member.id)
        while True:
            lease: Lease | None = None
            try:
                previous = await self.kv.get(key)
                if previous is not None and previous.value != self.member.to_json():
                    _log.warning("member %s: replacing the record %s left by an earlier process", self.member.id,
                                 previous.value.decode(errors="replace"))
                lease = await self.kv.grant(self.ttl)
                await self.kv.put(key, self.member.to_json(), lease=lease)
            except KVError as e:
                _log.warning("member %s: cannot register at %s, retrying in %.1fs: %s", self.member.id, key,
                             self.retry_s, e)
                if lease is not None:
                    with contextlib.suppress(KVError):
                        await lease.revoke()
                await asyncio.sleep(self.retry_s)
                continue
            self.lease = lease
            self.registrations += 1
            self.registered.set()
            _log.info("member %s registered at %s (%s, lease %#x, ttl %ds)", self.member.id, key,
                      self.member.address, lease.id, lease.ttl)
            await lease.lost.wait()
            self.registered.clear()
            _log.warning("member %s: lease %#x lost (%s); registering again", self.member.id, lease.id,
                         lease.lost_reason)


class ClusterMember:
    """A store's view of the cluster: its registration and the shard map it follows.

    :meth:`held_slots` is what the store may serve; None until the first map arrives.
    """

    def __init__(self, kv: KV, layout: KeyLayout, member: Member, *, ttl: int = 5, retry_s: float = 0.5) -> None:
        self.member = member
        self.registration = MemberRegistration(kv, layout, member, ttl=ttl, retry_s=retry_s)
        self.maps = EtcdMapSource(kv, layout, name=f"member {member.id}", on_change=self._map_changed,
                                  retry_s=retry_s)

    @property
    def id(self) -> str:
        return self.member.id

    def start(self) -> None:
        self.registration.start()
        self.maps.start()

    async def set_state(self, state: MemberState) -> None:
        await self.registration.set_state(state)

    async def leave(self, timeout_s: float, settle_s: float = 2.0, poll_s: float = 0.2) -> bool:
        """Drain before a stop that leaves the cluster: publish ``leaving`` (the leader moves this
        member's slots to the others), keep serving while they copy from it, and return True once
        :func:`~metricsd.cluster.membership.drained` has held for ``settle_s`` (long enough for a
        member that gained a slot to report ``joining`` while it copies); False after ``timeout_s``
        (no config server, or no other member to take the slots). Raises nothing: a drain that
        cannot publish its state logs it and times out."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            await self.set_state(transition(self.registration.member.state, MemberEvent.DRAIN))
        except KVError as e:
            _log.warning("member %s: cannot publish state leaving: %s", self.member.id, e)
        since: float | None = None
        while loop.time() < deadline:
            if drained(self.maps.current(), self.member.id):
                since = loop.time() if since is None else since
                if loop.time() - since >= settle_s:
                    _log.info("member %s drained: its slots are held by the other members", self.member.id)
                    return True
            else:
                since = None
            await asyncio.sleep(poll_s)
        current = self.maps.current()
        _log.warning("member %s: not drained after %.0f s (still holds %d slots); leaving anyway, its peers and "
                     "hinted hand-off keep the data", self.member.id, timeout_s,
                     len(current.slots_of(self.member.id)) if current else -1)
        return False

    def held_slots(self) -> frozenset[int] | None:
        current = self.maps.current()
        return None if current is None else frozenset(current.slots_of(self.member.id))

    async def close(self, deregister: bool = False) -> None:
        await self.maps.close()
        await self.registration.close(deregister)

    def _map_changed(self, old: ShardMap | None, new: ShardMap) -> None:
        before = set() if old is None else set(old.slots_of(self.member.id))
        after = set(new.slots_of(self.member.id))
        gained, lost = after - before, before - after
        if gained or lost or old is None:
            _log.info("member %s holds %d of %d slots in map v%d%s%s", self.member.id, len(after), new.num_slots,
                      new.version, f"; gained {describe_slots(gained)}" if gained else "",
                      f"; lost {describe_slots(lost)}" if lost else "")
