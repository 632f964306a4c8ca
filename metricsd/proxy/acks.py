"""Counting a request's answers (a write's acknowledgements, a read's replies): the common case as
arrays, anything else by QuorumTracker.

Almost every request has every replica healthy and every member answering. Then a slot is done
when the required number of its targets answered (W for a write, R for a read), and no per-slot
bookkeeping is needed: :class:`Acks` counts answers per slot in a NumPy array, one vectorised add
per member. At the first failure it replays what it saw into a :class:`QuorumTracker` and hands
every later question to it, so spares, errors and messages are exactly the tracker's. Pure: no
I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from metricsd.proxy.quorum import QuorumError, QuorumTracker, ReplicaPlan

__all__ = ["Acks", "acks_for"]


@dataclass(frozen=True, slots=True)
class _Shape:
    """What an Acks derives from its plans alone, shared by every request under the same plans
    (read only): the plans, the answers each slot requires, each member's rows and slots."""

    plans: tuple[ReplicaPlan, ...]
    required: np.ndarray
    rows: dict[str, np.ndarray]
    asks: dict[str, list[int]]

    @classmethod
    def of(cls, plans: Sequence[ReplicaPlan]) -> _Shape:
        rows: dict[str, list[int]] = {}
        for i, p in enumerate(plans):
            for m in p.targets:
                rows.setdefault(m, []).append(i)
        required = np.array([p.required for p in plans], dtype=np.int64)
        required.flags.writeable = False
        return cls(tuple(plans), required, {m: np.array(ix, dtype=np.int64) for m, ix in rows.items()},
                   {m: [plans[i].slot for i in ix] for m, ix in rows.items()})


class Acks:
    """QuorumTracker's interface for requests whose plans all ask enough replicas (see
    :func:`acks_for`)."""

    def __init__(self, plans: Sequence[ReplicaPlan], shape: _Shape | None = None) -> None:
        shape = shape or _Shape.of(plans)
        self._plans = shape.plans
        self._required = shape.required
        self._rows = shape.rows
        self._asks = shape.asks
        self._ok = np.zeros(len(self._plans), dtype=np.int64)
        self._answered: list[str] = []
        self._full: QuorumTracker | None = None

    def _tracker(self) -> QuorumTracker:
        if self._full is None:
            self._full = QuorumTracker(self._plans)
            for m in self._answered:
                self._full.record_success(m)
        return self._full

    def asks(self) -> dict[str, list[int]]:
        return {m: list(slots) for m, slots in self._asks.items()}

    def record_success(self, member: str, slots: Sequence[int] | None = None) -> None:
        """As QuorumTracker's. Before any failure every answer is to a first ask (spares are only
        asked after one), so ``slots``, when given, is that ask's or the tracker says why not."""
        if self._full is not None or (slots is not None and list(slots) != self._asks.get(member)):
            self._tracker().record_success(member, slots)
            return
        if member not in self._rows or member in self._answered:
            raise ValueError(f"{member} was not asked or already answered")
        self._ok[self._rows[member]] += 1
        self._answered.append(member)

    def record_failure(self, member: str, error: str, slots: Sequence[int] | None = None) -> dict[str, list[int]]:
        return self._tracker().record_failure(member, error, slots)

    @property
    def done(self) -> bool:
        if self._full is not None:
            return self._full.done
        return bool(np.all(self._ok >= self._required))

    @property
    def failed(self) -> bool:
        return self._full.failed if self._full is not None else False  # no failure seen yet

    def error(self) -> QuorumError | None:
        return self._tracker().error()


SHAPES = 256  # plan lists remembered by acks_for: a proxy's writes use one, its reads a few per turn

# id of each plan -> (the plans, kept so that their ids name them while here; their Acks shape, or
# None: a QuorumTracker). Proxies plan from caches (WritePath._plans, ReadPlans), so a live batch
# asks with the plan objects of the one before: building an Acks then costs one dict look-up, not a
# pass over every slot and replica (~100 us a 64-slot batch, ~0.05 CPU s a million live samples).
_shapes: dict[tuple[int, ...], tuple[tuple[ReplicaPlan, ...], _Shape | None]] = {}


def acks_for(plans: Sequence[ReplicaPlan]) -> Acks | QuorumTracker:
    """The counter for a request under ``plans`` (all of one op): Acks when every slot asks at
    least the replicas it requires (nothing can have failed before an answer arrives), else a
    QuorumTracker."""
    key = tuple(map(id, plans))
    hit = _shapes.get(key)
    if hit is None:
        eligible = len({p.op for p in plans}) <= 1 and all(len(p.targets) >= p.required for p in plans)
        if len(_shapes) >= SHAPES:
            _shapes.clear()
        hit = _shapes[key] = (tuple(plans), _Shape.of(plans) if eligible else None)
    return Acks(hit[0], hit[1]) if hit[1] is not None else QuorumTracker(plans)
