"""A store member's state, as one pure transition function: events in, the next state out.

::

    (registers) --> active --BEHIND--> joining --LEVEL--> active
                       |                  |
                       +------DRAIN-------+-------------> leaving   (final: nothing leads out)

- ``joining``: its digests differ from a peer's, so it is still copying; proxies do not read from it.
- ``active``: level with its peers; read and written.
- ``leaving``: told to leave the cluster for good (``metricsd store --deregister-on-exit`` on a clean
  stop). The leader config server assigns its slots to the others; it keeps serving, so they can
  catch up from it, until :func:`drained` says they hold its data; then it deletes its record.

Every place that changes a member's state calls :func:`transition`: the replica sync loop
(metricsd/replica/replication.py) on BEHIND and LEVEL, the store process on DRAIN. No I/O here.
"""

from __future__ import annotations

import enum

from metricsd.cluster.shardmap import MemberState, ShardMap

__all__ = ["MemberEvent", "drained", "transition"]


class MemberEvent(enum.Enum):
    BEHIND = "behind"  # a digest differs from a peer's: copying
    LEVEL = "level"  # every held slot agrees with a peer
    DRAIN = "drain"  # a clean stop that leaves the cluster


def transition(state: MemberState, event: MemberEvent) -> MemberState:
    """The state after ``event``. ``leaving`` is final: a draining member that falls behind or
    catches up again stays ``leaving``, so no map ever gives it slots back."""
    if state is MemberState.LEAVING or event is MemberEvent.DRAIN:
        return MemberState.LEAVING
    return MemberState.JOINING if event is MemberEvent.BEHIND else MemberState.ACTIVE


def drained(shard_map: ShardMap | None, member_id: str) -> bool:
    """True once ``shard_map`` gives ``member_id`` no slot and no member of it is still joining
    (the ones that took its slots over have copied them). False without a map."""
    if shard_map is None or shard_map.slots_of(member_id):
        return False
    return all(m.state is not MemberState.JOINING for mid, m in shard_map.members.items() if mid != member_id)
