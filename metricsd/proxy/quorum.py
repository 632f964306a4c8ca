"""Quorum logic for the proxy, without I/O or clocks: which replicas to ask, and when it is enough.

Two of the three layers Cortex and Mimir use (the third, the concurrent fan-out, lives with the
proxy's gRPC client and only executes what these say):

1. **Replica choice** (:func:`plan_write`, :func:`plan_read`): from a slot's replicas in shard-map
   order and the members the caller believes healthy, the replicas to ask, the spares to ask if
   one fails, the unhealthy ones skipped, and how many answers are required. Health is passed
   in; nothing here reads a clock or a socket.
2. **Tracking** (:class:`QuorumTracker`): a synchronous counter of successes and failures per slot
   that says whether each slot is done, failed or pending, names the spare to ask next, and
   writes the error that names the slots lacking a quorum.

Quorum sizes. With RF replicas per slot, a write needs W acknowledgements and a read R replies,
R + W > RF, so every read overlaps the last acknowledged write. A slot that has fewer replicas
than RF (a cluster smaller than RF) needs ``min(W, n)`` and ``min(R, n)`` of its ``n``; the
overlap still holds, since ``min(W, n) + min(R, n) > n`` whenever ``W + R > RF >= n``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "Op",
    "QuorumError",
    "QuorumSettings",
    "QuorumTracker",
    "ReplicaPlan",
    "SlotState",
    "plan_one",
    "plan_read",
    "plan_write",
    "spread_data",
]

MAX_SLOTS_IN_ERROR = 10


class Op(enum.Enum):
    WRITE = "write"
    READ = "read"


@dataclass(frozen=True, slots=True)
class QuorumSettings:
    """RF, W and R; raises ValueError unless 1 <= W, R <= RF and R + W > RF."""

    rf: int = 3
    w: int = 2
    r: int = 2

    def __post_init__(self) -> None:
        if self.rf < 1:
            raise ValueError(f"RF must be at least 1, got {self.rf}")
        for name, value in (("W", self.w), ("R", self.r)):
            if not 1 <= value <= self.rf:
                raise ValueError(f"{name} must be between 1 and RF={self.rf}, got {value}")
        if self.r + self.w <= self.rf:
            raise ValueError(
                f"R + W must exceed RF so that every read overlaps the last acknowledged write: "
                f"R={self.r} + W={self.w} <= RF={self.rf}"
            )

    def required(self, op: Op, replicas: int) -> int:
        """Answers needed from a slot with ``replicas`` replicas; at least 1, so an empty slot fails."""
        wanted = self.w if op is Op.WRITE else self.r
        return max(1, min(wanted, replicas))


@dataclass(frozen=True, slots=True)
class ReplicaPlan:
    """Whom to ask for one slot. ``replicas`` keeps the shard map's order for messages."""

    op: Op
    slot: int
    replicas: tuple[str, ...]
    targets: tuple[str, ...]
    spares: tuple[str, ...]
    unhealthy: tuple[str, ...]
    required: int

    @property
    def tolerable_failures(self) -> int:
        """How many of the asked and spare replicas may fail with the slot still succeeding;
        negative when the slot cannot reach its quorum at all."""
        return len(self.targets) + len(self.spares) - self.required


def plan_write(slot: int, replicas: Sequence[str], healthy: Container[str], settings: QuorumSettings) -> ReplicaPlan:
    """A write goes to every healthy replica at once; the unhealthy ones are hinted hand-off work.

    Example: replicas (a, b, c), healthy {a, c}, W=2 -> targets (a, c), unhealthy (b), required
    2, tolerable_failures 0.
    """
    targets = tuple(m for m in replicas if m in healthy)
    unhealthy = tuple(m for m in replicas if m not in healthy)
    return ReplicaPlan(
        Op.WRITE, slot, tuple(replicas), targets, (), unhealthy, settings.required(Op.WRITE, len(replicas))
    )


def plan_read(
    slot: int, replicas: Sequence[str], healthy: Container[str], settings: QuorumSettings, offset: int = 0
) -> ReplicaPlan:
    """A read asks R healthy replicas, keeping the others as spares for when one fails: the
    healthy ones first, then the unhealthy ones. A replica marked down may well be back (the
    caller's health back-off lasts seconds; a restarted store answers within one or two), and
    asking it costs one quick refusal, while not asking it fails the read; likewise a slot with
    fewer than R healthy replicas asks unhealthy ones at once.

    Replicas are preferred in shard-map order, rotated by ``offset`` (a caller spreading load
    passes a counter). Example: replicas (a, b, c), all healthy, R=2, offset 1 -> targets (b, c),
    spares (a,); healthy {b, c}, offset 0 -> targets (b, c), spares (a,), unhealthy (a,).
    """
    usable = [m for m in replicas if m in healthy]
    if usable:
        k = offset % len(usable)
        usable = usable[k:] + usable[:k]
    required = settings.required(Op.READ, len(replicas))
    unhealthy = tuple(m for m in replicas if m not in healthy)
    ordered = usable + list(unhealthy)
    return ReplicaPlan(
        Op.READ, slot, tuple(replicas), tuple(ordered[:required]), tuple(ordered[required:]), unhealthy, required
    )


def spread_data(plans: Iterable[ReplicaPlan]) -> dict[int, str]:
    """Slot -> the one replica asked for it that answers with data, when the others asked only
    vouch for it with a digest (the proxy's digest read, proxy/reads.py): per slot in the order
    given, the target with the fewest data slots so far (ties: the plan's order, which rotates),
    so that every member asked computes about the same share of the answer. Slots without
    targets are left out.

    Example: slots 0, 1, 2 each asking (a, b) -> {0: a, 1: b, 2: a}.
    """
    load: dict[str, int] = {}
    out: dict[int, str] = {}
    for p in plans:
        if p.targets:
            member = min(p.targets, key=lambda m: load.get(m, 0))
            out[p.slot] = member
            load[member] = load.get(member, 0) + 1
    return out


def plan_one(slots: Iterable[int], replicas_of: Callable[[int], Sequence[str]], healthy: Container[str],
             exclude: Container[str] = (), offset: int = 0) -> tuple[dict[str, list[int]], list[int]]:
    """A read of consistency one (metricsd/rpc/consistency.py): each slot to exactly ONE of its
    replicas not in ``exclude``, on as few members as can cover them (greedy set cover: a member
    asked costs a call; a member holding every slot asked answers alone), healthy ones first,
    members of equal reach in a rotated order (``offset``) so that reads spread over them. A
    slot whose remaining replicas are all unhealthy goes to one of them anyway (it may be back;
    failing for sure is no better). Returns (member -> its slots, ascending; the slots with no
    replica left).

    Example: slots 0, 1 with replicas (a, b) and (b, c), all healthy -> ({b: [0, 1]}, []);
    with exclude {b} -> ({a: [0], c: [1]}, []).
    """
    left: dict[int, list[str]] = {}
    none: list[int] = []
    for slot in slots:
        cands = [m for m in replicas_of(slot) if m not in exclude]
        if cands:
            left[slot] = cands
        else:
            none.append(slot)
    members = sorted({m for cands in left.values() for m in cands})
    if members:
        k = offset % len(members)
        members = members[k:] + members[:k]
    rank = {m: i for i, m in enumerate(members)}
    out: dict[str, list[int]] = {}
    for only_healthy in (True, False):
        while True:
            reach: dict[str, int] = {}
            for cands in left.values():
                for m in cands:
                    if not only_healthy or m in healthy:
                        reach[m] = reach.get(m, 0) + 1
            if not reach:
                break
            best = min(reach, key=lambda m: (-reach[m], rank[m]))
            mine = [slot for slot, cands in left.items() if best in cands]
            out[best] = sorted(mine)
            for slot in mine:
                del left[slot]
    return out, sorted(none)


class SlotState(enum.Enum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


@dataclass(slots=True)
class _Slot:
    plan: ReplicaPlan
    asked: list[str]
    spares: list[str]
    ok: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    waiting: int = 0  # asked and not answered: len(outstanding()), kept as a count

    def outstanding(self) -> list[str]:
        return [m for m in self.asked if m not in self.errors and m not in self.ok]

    def state(self) -> SlotState:
        if len(self.ok) >= self.plan.required:
            return SlotState.DONE
        if len(self.ok) + self.waiting + len(self.spares) < self.plan.required:
            return SlotState.FAILED
        return SlotState.PENDING


class QuorumError(Exception):
    """Some slots lacked a quorum. ``slots`` lists them; the message says why for each."""

    def __init__(self, op: Op, slots: Sequence[int], message: str) -> None:
        super().__init__(message)
        self.op = op
        self.slots = tuple(slots)


class QuorumTracker:
    """Counts answers for one request across its slots. Not thread-safe; no I/O, no clock.

    The fan-out asks each plan's targets, then reports each member's answer with
    :meth:`record_success` or :meth:`record_failure` (a timeout is a failure the fan-out
    reports). It stops when :attr:`done` or :attr:`failed`, or keeps going past ``done`` to
    learn which replicas need hinted hand-off (:meth:`lagging_replicas`).
    """

    def __init__(self, plans: Iterable[ReplicaPlan]) -> None:
        # Counts kept as answers arrive, so that done / failed and a member's answer cost what
        # changed, not a pass over every slot: a write asks this once per batch per member.
        self._slots: dict[int, _Slot] = {}
        self._waiting: dict[str, set[int]] = {}  # member -> slots asked of it and not answered
        self._state: dict[int, SlotState] = {}
        self._n_done = self._n_failed = 0
        ops = set()
        for plan in plans:
            if plan.slot in self._slots:
                raise ValueError(f"slot {plan.slot} planned twice")
            s = self._slots[plan.slot] = _Slot(plan, list(plan.targets), list(plan.spares), waiting=len(plan.targets))
            for m in s.asked:
                self._waiting.setdefault(m, set()).add(plan.slot)
            state = self._state[plan.slot] = s.state()
            self._n_done += state is SlotState.DONE
            self._n_failed += state is SlotState.FAILED
            ops.add(plan.op)
        if len(ops) > 1:
            raise ValueError("one tracker counts either writes or reads, not both")
        self.op = ops.pop() if ops else Op.WRITE

    def _restate(self, s: _Slot) -> None:
        new = s.state()
        old = self._state[s.plan.slot]
        if new is not old:
            self._state[s.plan.slot] = new
            self._n_done += (new is SlotState.DONE) - (old is SlotState.DONE)
            self._n_failed += (new is SlotState.FAILED) - (old is SlotState.FAILED)

    def asks(self) -> dict[str, list[int]]:
        """Member -> slots to send it now: the initial requests, one per member."""
        return {m: sorted(slots) for m, slots in self._waiting.items() if slots}

    def record_success(self, member: str, slots: Iterable[int] | None = None) -> None:
        """``member`` answered for ``slots`` (default: every slot it was asked for and has not
        answered). Raises ValueError for a slot it was not asked for or already answered."""
        waiting = self._waiting.get(member, set())
        for s in self._answering(member, slots):
            s.ok.append(member)
            s.waiting -= 1
            waiting.discard(s.plan.slot)
            self._restate(s)

    def record_failure(self, member: str, error: str, slots: Iterable[int] | None = None) -> dict[str, list[int]]:
        """``member`` failed for ``slots`` (same default and errors as :meth:`record_success`).

        Returns the spares to ask now, member -> slots: for each affected slot still pending, the
        next spare replica, if it has one.
        """
        more: dict[str, list[int]] = {}
        waiting = self._waiting.get(member, set())
        for s in self._answering(member, slots):
            s.errors[member] = error
            s.waiting -= 1
            waiting.discard(s.plan.slot)
            if s.state() is SlotState.PENDING and len(s.ok) + s.waiting < s.plan.required:
                spare = s.spares.pop(0)
                s.asked.append(spare)
                s.waiting += 1
                self._waiting.setdefault(spare, set()).add(s.plan.slot)
                more.setdefault(spare, []).append(s.plan.slot)
            self._restate(s)
        return more

    def _answering(self, member: str, slots: Iterable[int] | None) -> list[_Slot]:
        waiting = self._waiting.get(member, set())
        if slots is None:
            return [self._slots[slot] for slot in sorted(waiting)]
        out = []
        for slot in slots:
            s = self._slots.get(slot)
            if s is None or member not in s.asked:
                raise ValueError(f"{member} was not asked for slot {slot}")
            if slot not in waiting:
                raise ValueError(f"{member} already answered for slot {slot}")
            out.append(s)
        return out

    def state(self, slot: int) -> SlotState:
        return self._state[slot]

    @property
    def done(self) -> bool:
        """Every slot has its quorum: the request can be answered with success."""
        return self._n_done == len(self._slots)

    @property
    def failed(self) -> bool:
        """Some slot can no longer reach its quorum: the request fails with :meth:`error`."""
        return self._n_failed > 0

    def failed_slots(self) -> list[int]:
        return sorted(slot for slot, state in self._state.items() if state is SlotState.FAILED)

    def pending(self) -> dict[str, list[int]]:
        """Member -> slots it has been asked for and not answered (to time out, say)."""
        return {m: sorted(slots) for m, slots in self._waiting.items() if slots}

    def _check(self) -> None:
        """The kept counts agree with the slots (tests)."""
        for slot, s in self._slots.items():
            assert s.waiting == len(s.outstanding()), slot
            assert self._state[slot] is s.state(), slot
            for m in s.outstanding():
                assert slot in self._waiting[m], (slot, m)
        assert sum(len(v) for v in self._waiting.values()) == sum(s.waiting for s in self._slots.values())
        assert self._n_done == sum(st is SlotState.DONE for st in self._state.values())
        assert self._n_failed == sum(st is SlotState.FAILED for st in self._state.values())

    def lagging_replicas(self) -> dict[int, list[str]]:
        """Slot -> replicas that failed or were skipped as unhealthy, in map order: for a write,
        the hinted hand-off work; for a read, the replicas a repair may need to visit."""
        out: dict[int, list[str]] = {}
        for slot, s in sorted(self._slots.items()):
            behind = [m for m in s.plan.replicas if m in s.errors or m in s.plan.unhealthy]
            if behind:
                out[slot] = behind
        return out

    def error(self) -> QuorumError | None:
        """The error naming every slot without a quorum (failed, or still pending when called
        after the deadline), or None when all slots are done."""
        short = [slot for slot, s in sorted(self._slots.items()) if s.state() is not SlotState.DONE]
        if not short:
            return None
        unit = "acks" if self.op is Op.WRITE else "replies"
        parts = [self._describe(self._slots[slot], unit) for slot in short[:MAX_SLOTS_IN_ERROR]]
        if len(short) > MAX_SLOTS_IN_ERROR:
            parts.append(f"and {len(short) - MAX_SLOTS_IN_ERROR} more")
        message = (
            f"{self.op.value} quorum not reached for {len(short)} of {len(self._slots)} slots: " + "; ".join(parts)
        )
        return QuorumError(self.op, short, message)

    @staticmethod
    def _describe(s: _Slot, unit: str) -> str:
        why = []
        for m in s.plan.replicas:
            if m in s.errors:
                why.append(f"{m}: {s.errors[m]}")
            elif m in s.plan.unhealthy:
                why.append(f"{m}: unhealthy, not asked")
            elif m in s.outstanding():
                why.append(f"{m}: no answer")
        if not s.plan.replicas:
            why.append("no replicas in the shard map")
        return f"slot {s.plan.slot} got {len(s.ok)} of {s.plan.required} required {unit} ({', '.join(why)})"
