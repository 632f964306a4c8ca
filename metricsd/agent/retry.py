"""When to retry a write and where to send it: exponential backoff with jitter, failover over targets.

Pure: time (monotonic seconds) and randomness (a float in [0, 1)) are passed in, so the schedule is
tested exactly without sleeping. The pusher's asyncio loop only asks ``Failover.next`` where and
when to send, sleeps, and reports the outcome.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BackoffPolicy", "Failover"]


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """Delay after the n-th consecutive failure of a target: ``min(max_s, base_s * factor**(n-1))``,
    shortened by up to ``jitter`` of itself at random so that a fleet of agents cut off by the same
    outage does not come back in lock-step."""

    base_s: float = 0.25
    factor: float = 2.0
    max_s: float = 10.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.max_s < self.base_s or self.factor < 1.0:
            raise ValueError("backoff needs 0 < base_s <= max_s and factor >= 1")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"backoff jitter must be in [0, 1], got {self.jitter}")

    def delay(self, failures: int, rand: float) -> float:
        """Seconds to wait after ``failures`` (>= 1) consecutive failures; ``rand`` in [0, 1).

        >>> BackoffPolicy().delay(3, 0.0)
        1.0
        """
        if failures < 1:
            raise ValueError(f"failures must be at least 1, got {failures}")
        # factor ** 64 is past any sane max_s; capping the exponent avoids float overflow.
        full = min(self.max_s, self.base_s * self.factor ** min(failures - 1, 64))
        return full * (1.0 - self.jitter * rand)


@dataclass(slots=True)
class _TargetState:
    failures: int = 0
    retry_at: float = 0.0


class Failover:
    """Picks the target for the next attempt among ``n`` equivalent targets (stores or proxies).

    Sticky: the target that last succeeded is used until it fails, then the next one that is not
    backing off is tried at once; when every target is backing off, the one that comes back
    first is chosen, with the wait. A target is not preferred again after it recovers, because
    proxies are interchangeable and moving back would only add a reconnect. Not thread-safe.
    """

    def __init__(self, n: int, policy: BackoffPolicy | None = None) -> None:
        if n < 1:
            raise ValueError("at least one target is needed")
        self.policy = policy or BackoffPolicy()
        self.current = 0
        self._targets = [_TargetState() for _ in range(n)]

    def next(self, now: float) -> tuple[int, float]:
        """(target index, seconds to wait before trying it; 0 when it may be tried now)."""
        n = len(self._targets)
        order = [(self.current + k) % n for k in range(n)]
        for i in order:
            if self._targets[i].retry_at <= now:
                return i, 0.0
        best = min(order, key=lambda i: self._targets[i].retry_at)  # min keeps the first of ties
        return best, self._targets[best].retry_at - now

    def failed(self, i: int, now: float, rand: float) -> float:
        """Record a failed attempt on target ``i``; returns its backoff delay in seconds."""
        t = self._targets[i]
        t.failures += 1
        delay = self.policy.delay(t.failures, rand)
        t.retry_at = now + delay
        return delay

    def succeeded(self, i: int) -> None:
        t = self._targets[i]
        t.failures, t.retry_at = 0, 0.0
        self.current = i

    def failures(self, i: int) -> int:
        """Consecutive failures of target ``i`` (0 when its last attempt succeeded)."""
        return self._targets[i].failures

    def up(self, i: int) -> bool:
        return self._targets[i].failures == 0
