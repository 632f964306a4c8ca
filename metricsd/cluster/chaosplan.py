"""The pure half of ``metricsd chaos``: the seeded fault schedule, the workload, and the checks.

Everything here is a function of the seed and the inputs (no clock, no processes), so a run's
schedule can be printed and tested, and the same seed gives the same faults in the same order.
The runner (chaos.py) executes the events one after another, each not before its ``at_s``: a
store is killed only once the one before it is level again, so at most one store is down or
catching up at a time, which is RF - W for the default RF 3, W 2.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from metricsd.model import Labels, make_labels, series_id

__all__ = ["AckLog", "ChaosReport", "Event", "Workload", "lost_samples", "plan_events"]


@dataclass(frozen=True)
class Event:
    """``kill_store``: SIGKILL ``target``, restart it ``down_s`` later (same data dir), wait until it
    is level. ``wipe_store``: the same, but its data directory is deleted before the restart (a
    replacement machine: it rejoins empty and copies everything from its peers). ``corrupt_store``:
    the same, but a byte of its newest snapshot and one of a WAL segment it replays are flipped
    before the restart (a torn or rotten file: it must find them, fall back, and copy what it lost
    from its peers before it serves reads). ``fill_disk``: fill ``target``'s filesystem to the last
    byte for ``down_s`` (it refuses writes, the others take them and hand them off), then free it
    and wait for the hand-off. ``kill_launcher``: SIGKILL ``target``, start it again under a
    launcher of its own, SIGKILL that launcher (the store must end with it: no orphan), and start
    the store again ``down_s`` later. ``stop_etcd``: stop etcd for ``down_s``. ``kill_proxy``:
    SIGKILL proxy ``target``, restart it ``down_s`` later."""

    at_s: float
    kind: str
    target: str
    down_s: float

    def describe(self) -> str:
        if self.kind == "stop_etcd":
            return f"t+{self.at_s:.0f}s stop etcd for {self.down_s:.1f}s"
        if self.kind == "fill_disk":
            return f"t+{self.at_s:.0f}s fill the disk of {self.target} for {self.down_s:.1f}s"
        return f"t+{self.at_s:.0f}s {self.kind.replace('_', ' ')} {self.target} for {self.down_s:.1f}s"


def plan_events(seed: int, duration_s: float, stores: int, proxies: int, *, max_store_down_s: float = 8.0,
                etcd_down_s: float = 20.0, disk_store: str | None = "store-1", disk_full_s: float = 15.0
                ) -> list[Event]:
    """The fault schedule: store kills from 10% to 90% of the run (random store, random down time
    of 0.5 .. ``max_store_down_s``, some longer than a member lease so that slots move), one etcd
    outage at 40% (``etcd_down_s``, at most a tenth of the run), one proxy kill at 65% of the run;
    ``disk_store``'s disk full at 20% (``disk_full_s``, at most a tenth of the run; none without a
    disk store) and a store's launcher killed at 30%; one more of each per further 5 minutes. The
    middle store kill (and every fifth after it) wipes the store's data; the second (and every
    fifth after it) corrupts its files. Sorted by time."""
    rng = random.Random(seed)
    events: list[Event] = []
    t = 0.1 * duration_s
    while t < 0.9 * duration_s:
        down = round(rng.uniform(0.5, max_store_down_s), 1)
        events.append(Event(round(t, 1), "kill_store", f"store-{rng.randint(1, stores)}", down))
        t += down + rng.uniform(6.0, 15.0)
    middle = len(events) // 2
    wiped = set(range(middle, len(events), 5))
    for i in wiped:
        events[i] = Event(events[i].at_s, "wipe_store", events[i].target, events[i].down_s)
    for i in set(range(1, len(events), 5)) - wiped:
        events[i] = Event(events[i].at_s, "corrupt_store", events[i].target, events[i].down_s)
    extra = int(duration_s // 300)
    block = duration_s / (extra + 1)
    for k in range(extra + 1):
        base = duration_s * (0.4 + k) / (extra + 1)
        events.append(Event(round(base, 1), "stop_etcd", "etcd", round(min(etcd_down_s, duration_s / 10), 1)))
        events.append(Event(round(base + 0.25 * block, 1), "kill_proxy",
                            f"proxy-{rng.randint(1, proxies)}", round(rng.uniform(2.0, 6.0), 1)))
        if disk_store is not None:
            events.append(Event(round(block * (k + 0.2), 1), "fill_disk", disk_store,
                                round(min(disk_full_s, duration_s / 10), 1)))
        events.append(Event(round(block * (k + 0.3), 1), "kill_launcher", f"store-{rng.randint(1, stores)}",
                            round(rng.uniform(1.0, 4.0), 1)))
    return sorted(events, key=lambda e: e.at_s)


@dataclass(frozen=True)
class Workload:
    """``pods`` pods with ``metrics`` gauges each, split among ``writers`` writers (one per proxy)."""

    pods: int = 60
    metrics: int = 2
    writers: int = 2
    seed: int = 1

    def labels(self, pod: int, metric: int) -> Labels:
        return make_labels(f"chaos_metric_{metric}", {"namespace": "chaos", "pod": f"pod-{pod}",
                                                      "workload": f"w{pod % 5}"})

    def series(self, writer: int) -> list[tuple[int, Labels]]:
        """(series index, labels) of one writer's series: pods writer, writer + writers, ..."""
        return [(pod * self.metrics + m, self.labels(pod, m))
                for pod in range(writer, self.pods, self.writers) for m in range(self.metrics)]

    def ids(self, writer: int) -> np.ndarray:
        return np.array([series_id(lab) for _, lab in self.series(writer)], dtype=np.uint64)

    def values(self, index: np.ndarray, ts_ms: int) -> np.ndarray:
        """The value of each series at ``ts_ms``: a function of seed, series and time, so the
        checker needs only the acknowledged timestamps to know every acknowledged sample."""
        x = (index.astype(np.int64) * 7919 + ts_ms // 250 + self.seed * 104729) % 100_003
        return x.astype(np.float64) / 8.0


@dataclass
class AckLog:
    """Acknowledged samples: per writer, the timestamps of its acknowledged batches (each batch is
    one sample of every series of the writer), in order; optionally also appended to a file."""

    acked: dict[int, list[int]] = field(default_factory=dict)
    path: str | None = None

    def ack(self, writer: int, ts_ms: int, samples: int) -> None:
        self.acked.setdefault(writer, []).append(ts_ms)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(f"{writer}\t{ts_ms}\t{samples}\n")

    def count(self, workload: Workload) -> int:
        return sum(len(ts) * len(workload.series(w)) for w, ts in self.acked.items())


def lost_samples(workload: Workload, log: AckLog, found: dict[int, dict[int, float]]) -> list[tuple[int, int]]:
    """(series index, timestamp) of acknowledged samples missing from ``found`` (series index ->
    timestamp -> value) or found with another value."""
    lost = []
    for writer, stamps in log.acked.items():
        index = np.array([i for i, _ in workload.series(writer)], dtype=np.int64)
        for ts in stamps:
            want = workload.values(index, ts)
            for i, v in zip(index.tolist(), want.tolist(), strict=True):
                got = found.get(i, {}).get(ts)
                if got is None or got != v:
                    lost.append((i, ts))
    return lost


@dataclass
class ChaosReport:
    events: list[str] = field(default_factory=list)
    acknowledged: int = 0
    lost: int = 0
    write_batches: int = 0
    write_retries: int = 0
    batches_given_up: int = 0
    reads: int = 0
    reads_failed: int = 0
    reads_failed_with_quorum: int = 0
    reads_missing_acked: int = 0
    level_s: list[tuple[str, float, float]] = field(default_factory=list)  # store, down s, level after restart s
    digests_agree: bool = False
    digest_slots_differing: int = 0
    converge_s: float = 0.0
    disks_filled: int = 0
    disk_full_refusals: int = 0  # writes the full store refused ("No space left on device" in its log)
    corrupted_restarts: int = 0
    corruptions_found: int = 0  # restarts whose store reported the damaged files it was given
    launcher_kills: int = 0
    orphans: int = 0  # children still running after their launcher was SIGKILLed
    skipped: list[str] = field(default_factory=list)  # faults not run, and why

    @property
    def ok(self) -> bool:
        return (self.lost == 0 and self.reads_failed_with_quorum == 0 and self.reads_missing_acked == 0
                and self.digests_agree and self.orphans == 0 and self.corruptions_found == self.corrupted_restarts)

    def lines(self, opts: Any) -> list[str]:
        """The printed summary; ``opts`` is the run's ChaosOptions."""
        levels = [t for _, _, t in self.level_s]
        wiped = sum("wipe" in e for e in self.events)
        out = [f"metricsd chaos: seed {opts.seed}, {opts.duration_s:.0f} s, {opts.stores} stores, 2 proxies, "
               f"rf 3 w 2 r 2, {opts.slots} slots, {opts.pods} pods",
               f"faults: {len(self.level_s)} store kills (SIGKILL; {wiped} of them wiped the store's data, "
               f"{self.corrupted_restarts} restarted it on damaged files, {self.launcher_kills} killed its launcher), "
               f"{sum('etcd' in e for e in self.events)} etcd outages, {sum('proxy' in e for e in self.events)} "
               f"proxy kills, {self.disks_filled} full disks",
               f"damaged files found at restart: {self.corruptions_found} of {self.corrupted_restarts}; children "
               f"left running by a killed launcher: {self.orphans}; writes refused by a full disk: "
               f"{self.disk_full_refusals}",
               *[f"skipped: {why}" for why in self.skipped],
               f"samples acknowledged: {self.acknowledged}",
               f"samples lost: {self.lost}",
               f"write batches: {self.write_batches} acknowledged, {self.write_retries} retried on another proxy "
               f"or later, {self.batches_given_up} given up",
               f"reads: {self.reads}, failed: {self.reads_failed}, failed while a quorum was up: "
               f"{self.reads_failed_with_quorum}, missing an acknowledged sample: {self.reads_missing_acked}"]
        if levels:
            out.append(f"restarted stores level again after (s): median {float(np.median(levels)):.1f}, max "
                       f"{max(levels):.1f}; " + ", ".join(f"{n} {t:.1f}" for n, _, t in self.level_s))
        out.append(f"replica digests agree: {'yes' if self.digests_agree else 'NO'}"
                   + (f" (after {self.converge_s:.1f} s)" if self.digests_agree
                      else f" ({self.digest_slots_differing} slots differ)"))
        out.append("result: " + ("PASS" if self.ok else "FAIL"))
        return out
