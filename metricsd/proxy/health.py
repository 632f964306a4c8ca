"""Which members the proxy believes healthy, learned from the outcomes of its own calls.

No probing loop and no I/O: every call the proxy makes reports its outcome here, and the replica
choice (quorum.plan_*) is handed :meth:`MemberHealth.healthy`. A member that failed is skipped for
a while (backing off as it keeps failing), then let through once as a probe; any success makes it
healthy again. Time comes from the clock passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from metricsd.clock import Clock
from metricsd.proxy.settings import HealthSettings

__all__ = ["MemberHealth"]


@dataclass
class _State:
    failures: int = 0
    down_until: float = 0.0
    last_error: str = ""


class MemberHealth:
    """Not thread-safe (one event loop). O(1) per report."""

    def __init__(self, settings: HealthSettings, clock: Clock,
                 on_down: Callable[[str], None] | None = None) -> None:
        self._settings = settings
        self._clock = clock
        self._members: dict[str, _State] = {}
        self._on_down = on_down  # called when a healthy member fails (not on each further failure)

    def success(self, member: str) -> None:
        self._members.pop(member, None)

    def failure(self, member: str, error: str) -> None:
        s = self._members.get(member)
        if s is None:
            s = self._members[member] = _State()
            if self._on_down is not None:
                self._on_down(member)
        s.failures += 1
        s.last_error = error
        wait = min(self._settings.down_max_s, self._settings.down_initial_s * 2 ** (s.failures - 1))
        s.down_until = self._clock.monotonic() + wait

    def is_healthy(self, member: str) -> bool:
        """False while a failed member's back-off runs. When it has run out, the first caller
        gets True (the probe) and the back-off restarts, so one request probes at a time."""
        s = self._members.get(member)
        if s is None:
            return True
        now = self._clock.monotonic()
        if now < s.down_until:
            return False
        s.down_until = now + min(self._settings.down_max_s, self._settings.down_initial_s * 2 ** (s.failures - 1))
        return True

    def none_failed(self) -> bool:
        """True while no member has failed since its last success: every member is healthy and
        :meth:`is_healthy` has no probe to hand out (no side effect to skip by not asking it)."""
        return not self._members

    def failed(self, member: str) -> bool:
        """True from a failure until the next success (back-off running or not); no side effect."""
        return member in self._members

    def healthy(self, members: Iterable[str]) -> set[str]:
        return {m for m in members if self.is_healthy(m)}

    def down(self) -> dict[str, str]:
        """Members currently skipped -> their last error (for Health and logs)."""
        now = self._clock.monotonic()
        return {m: s.last_error for m, s in self._members.items() if now < s.down_until}

    def forget(self, members: Iterable[str]) -> None:
        """Members that left the map."""
        for m in members:
            self._members.pop(m, None)
