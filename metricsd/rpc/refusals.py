"""Refused samples counted per sender, so an operator can tell whose clock is wrong.

A receiver (the gRPC servicer of a store or proxy, the HTTP remote-write handler) records each
write answer that refused samples (rpc/admission.py, the engine's too_old) against the sender it
came from: the peer's address, or the authenticated name where there is one. Counts are kept per
(sender, reason), with at most ``max_senders`` senders (the rest count as ``other``, so a flood of
addresses cannot grow it without bound), and a warning naming the sender, the counts and the
reason is logged at most once per ``log_every_s`` per sender: a skewed clock is visible in the log
of whatever received its samples, and in ``/metrics`` where the receiver serves HTTP.

Not thread-safe: the event loop's thread only. The clock is passed in.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

from metricsd.proto import metricsd_pb2 as pb

__all__ = ["REASONS", "SenderRefusals", "peer_host", "refused_counts"]

log = logging.getLogger("metricsd.refusals")

REASONS = ("too_old", "too_far_ahead")
OTHER = "other"


def refused_counts(resp: pb.WriteResponse) -> dict[str, int]:
    """Samples of a write answer that were not stored, by reason (duplicates are held, so not here)."""
    out = {"too_old": int(resp.rejected_too_old), "too_far_ahead": int(resp.rejected_too_far_ahead)}
    return {k: v for k, v in out.items() if v}


def peer_host(peer: str) -> str:
    """gRPC's ``ipv4:127.0.0.1:5432`` / ``ipv6:[::1]:5432`` as the host alone (ports change per connection)."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6" and rest.startswith("["):
        return rest[1 : rest.find("]")] if "]" in rest else rest
    if kind == "ipv4":
        return rest.rpartition(":")[0] or rest
    return peer or "unknown"


class SenderRefusals:
    def __init__(self, what: str, *, clock: Callable[[], float] = time.monotonic, max_senders: int = 1000,
                 log_every_s: float = 60.0) -> None:
        self.what = what
        self.clock = clock
        self.max_senders = max_senders
        self.log_every_s = log_every_s
        self.counts: Counter[tuple[str, str]] = Counter()  # (sender, reason) -> samples since start
        self._senders: set[str] = set()
        self._pending: dict[str, Counter[str]] = {}  # since the sender's last warning
        self._last_log: dict[str, float] = {}

    def record(self, sender: str, resp: pb.WriteResponse) -> tuple[str, dict[str, int]]:
        """Count what ``resp`` refused against ``sender``; returns the sender as counted (``other``
        past max_senders) and the counts by reason (empty: nothing refused)."""
        refused = refused_counts(resp)
        if not refused:
            return sender, refused
        if sender not in self._senders:
            if len(self._senders) >= self.max_senders:
                sender = OTHER
            self._senders.add(sender)
        pending = self._pending.setdefault(sender, Counter())
        for reason, n in refused.items():
            self.counts[(sender, reason)] += n
            pending[reason] += n
        now = self.clock()
        last = self._last_log.get(sender)
        if last is None or now - last >= self.log_every_s:
            self._last_log[sender] = now
            total = sum(n for (s, _), n in self.counts.items() if s == sender)
            shown = ", ".join(f"{n} {reason}" for reason, n in sorted(pending.items()))
            log.warning("%s from %s: %s samples not stored (%s; %d since start): %s", self.what, sender,
                        sum(pending.values()), shown, total, resp.refused or "no reason given")
            pending.clear()
        return sender, refused
