"""A node's lending state machine, pure: states, the allowed moves, and what the passing of time and
the pods seen on a node do to a node in a transition.

    Online -> OnlineToOffline -> Offline -> OfflineToOnline -> Online
                    |                                            ^
                    +-------- aborted (deadline, surge, need) ---+

Every move carries a reason, the time it was made and, for the two transitions, a deadline. A node
still in a transition at its deadline raises an alert and goes back to online service: a drain
that does not finish is abandoned (the node was never lent), and offline work that has not left by
the end of its notice is evicted. Both stuck cases end Online because the online services own the
nodes and lend them; a stuck node must never leave them short.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

__all__ = ["ALLOWED", "NodeObservation", "NodeState", "Phase", "Timing", "Transition", "advance"]


class Phase(StrEnum):
    ONLINE = "Online"
    ONLINE_TO_OFFLINE = "OnlineToOffline"
    OFFLINE = "Offline"
    OFFLINE_TO_ONLINE = "OfflineToOnline"


ALLOWED: dict[Phase, frozenset[Phase]] = {
    Phase.ONLINE: frozenset({Phase.ONLINE_TO_OFFLINE}),
    Phase.ONLINE_TO_OFFLINE: frozenset({Phase.OFFLINE, Phase.ONLINE}),
    Phase.OFFLINE: frozenset({Phase.OFFLINE_TO_ONLINE}),
    Phase.OFFLINE_TO_ONLINE: frozenset({Phase.ONLINE}),
}
TRANSITIONAL = frozenset({Phase.ONLINE_TO_OFFLINE, Phase.OFFLINE_TO_ONLINE})


@dataclass(frozen=True)
class Timing:
    """Durations in ms that shape the plan.

    drain: how long online pods get to leave a node being lent (OnlineToOffline's deadline);
    notice: how early offline schedulers are told that a node goes back; return_grace: how long
    after the notice their pods may still take before they are evicted (OfflineToOnline's deadline
    is notice + return_grace); min_lend: a lend shorter than this is not worth the drain;
    min_online: a node back online stays so at least this long before it is lent again, so a node
    whose drain timed out is not drained again at once; interval: the controller's period, the
    slack every look-ahead adds because the next decision comes one period later.
    """

    drain_ms: int = 10 * 60_000
    notice_ms: int = 15 * 60_000
    return_grace_ms: int = 5 * 60_000
    min_lend_ms: int = 2 * 3_600_000
    min_online_ms: int = 30 * 60_000
    interval_ms: int = 60_000

    @property
    def return_ms(self) -> int:
        """The longest a return can take: the notice plus its grace (then the node is online)."""
        return self.notice_ms + self.return_grace_ms


@dataclass(frozen=True)
class Transition:
    """One move of one node; alert is set when the move is the way out of a stuck transition."""

    node: str
    pool: str
    src: Phase
    dst: Phase
    at_ms: int
    reason: str
    message: str
    deadline_ms: int | None = None
    alert: bool = False


@dataclass(frozen=True)
class NodeState:
    """Where a node is now: since when, why, by when the current transition must end, and since
    when it has been lent (when it last became Offline; None until then and once back online)."""

    name: str
    pool: str
    phase: Phase = Phase.ONLINE
    since_ms: int = 0
    reason: str = "Initial"
    deadline_ms: int | None = None
    lent_since_ms: int | None = None

    def move(self, dst: Phase, at_ms: int, reason: str, message: str, deadline_ms: int | None = None,
             alert: bool = False) -> tuple[NodeState, Transition]:
        """The node after the move and the record of it. Raises ValueError for a move the machine has not."""
        if dst not in ALLOWED[self.phase]:
            raise ValueError(f"node {self.name}: no move from {self.phase} to {dst}")
        if (dst in TRANSITIONAL) != (deadline_ms is not None):
            raise ValueError(f"node {self.name}: a deadline belongs to the transitions only ({dst})")
        lent = at_ms if dst is Phase.OFFLINE else None if dst is Phase.ONLINE else self.lent_since_ms
        new = replace(self, phase=dst, since_ms=at_ms, reason=reason, deadline_ms=deadline_ms, lent_since_ms=lent)
        return new, Transition(self.name, self.pool, self.phase, dst, at_ms, reason, message, deadline_ms, alert)


@dataclass(frozen=True)
class NodeObservation:
    """What the metrics say about a node now: its CPU capacity (cores) and how many online pods
    (pods with requests) and offline pods (best-effort pods, the borrowers) run on it."""

    name: str
    capacity_cores: float
    online_pods: int = 0
    offline_pods: int = 0


def advance(state: NodeState, seen: NodeObservation | None, now_ms: int) -> tuple[NodeState, Transition | None]:
    """Finish or abandon a transition. A node not seen (no metrics now) finishes nothing, but its
    deadline still holds: an unobservable drain is no reason to keep a node away from its owners."""
    if state.phase is Phase.ONLINE_TO_OFFLINE:
        if seen is not None and seen.online_pods == 0:
            return state.move(Phase.OFFLINE, now_ms, "Drained", "no online pods left: lent to offline work")
        if state.deadline_ms is not None and now_ms >= state.deadline_ms:
            left = "unknown (no metrics)" if seen is None else str(seen.online_pods)
            return state.move(Phase.ONLINE, now_ms, "DrainTimeout",
                              f"online pods still on the node at the drain deadline: {left}; lend abandoned",
                              alert=True)
    elif state.phase is Phase.OFFLINE_TO_ONLINE:
        if seen is not None and seen.offline_pods == 0:
            return state.move(Phase.ONLINE, now_ms, "Returned", "offline work has left: back in online service")
        if state.deadline_ms is not None and now_ms >= state.deadline_ms:
            left = "unknown (no metrics)" if seen is None else str(seen.offline_pods)
            return state.move(Phase.ONLINE, now_ms, "ReturnTimeout",
                              f"offline pods still on the node at the end of the notice: {left}; evicting them",
                              alert=True)
    return state, None
