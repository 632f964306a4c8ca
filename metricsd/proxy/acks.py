"""Counting a write's acknowledgements: the common case as arrays, anything else by QuorumTracker.

Almost every write has every replica healthy and every member answering yes. Then a slot is done
when W of its targets acknowledged, and no per-slot bookkeeping is needed: :class:`WriteAcks`
counts acknowledgements per slot in a NumPy array, one vectorised add per member. At the first
failure it replays what it saw into a :class:`QuorumTracker` and hands every later question to it,
so spares, errors and messages are exactly the tracker's. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from metricsd.proxy.quorum import Op, QuorumError, QuorumTracker, ReplicaPlan

__all__ = ["WriteAcks", "write_acks"]


class WriteAcks:
    """QuorumTracker's interface for writes whose plans can all reach W (see :func:`write_acks`)."""

    def __init__(self, plans: Sequence[ReplicaPlan]) -> None:
        self._plans = list(plans)
        self._required = np.array([p.required for p in self._plans], dtype=np.int64)
        self._ok = np.zeros(len(self._plans), dtype=np.int64)
        rows: dict[str, list[int]] = {}
        for i, p in enumerate(self._plans):
            for m in p.targets:
                rows.setdefault(m, []).append(i)
        self._rows = {m: np.array(ix, dtype=np.int64) for m, ix in rows.items()}
        self._answered: list[str] = []
        self._full: QuorumTracker | None = None

    def _tracker(self) -> QuorumTracker:
        if self._full is None:
            self._full = QuorumTracker(self._plans)
            for m in self._answered:
                self._full.record_success(m)
        return self._full

    def asks(self) -> dict[str, list[int]]:
        return {m: [self._plans[i].slot for i in ix.tolist()] for m, ix in self._rows.items()}

    def record_success(self, member: str) -> None:
        if self._full is not None:
            self._full.record_success(member)
            return
        if member not in self._rows or member in self._answered:
            raise ValueError(f"{member} was not asked or already answered")
        self._ok[self._rows[member]] += 1
        self._answered.append(member)

    def record_failure(self, member: str, error: str) -> dict[str, list[int]]:
        return self._tracker().record_failure(member, error)

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


def write_acks(plans: Sequence[ReplicaPlan]) -> WriteAcks | QuorumTracker:
    """The counter for a write under ``plans``: WriteAcks when every slot asks at least W
    replicas (nothing can have failed before an answer arrives), else a QuorumTracker."""
    if all(p.op is Op.WRITE and len(p.targets) >= p.required for p in plans):
        return WriteAcks(plans)
    return QuorumTracker(plans)
