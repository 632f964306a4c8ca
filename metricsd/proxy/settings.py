"""The proxy's settings: every default in one documented place, passed into ProxyBackend.

RF is not a setting: it comes from the shard map, so the quorum sizes are recomputed whenever the
map changes (:meth:`ProxySettings.quorum`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from metricsd.proxy.coalesce import CoalesceSettings
from metricsd.proxy.latency import HedgeSettings
from metricsd.proxy.quorum import QuorumSettings
from metricsd.rpc.limits import RequestLimits

__all__ = ["HandoffSettings", "HealthSettings", "ProxySettings", "RepairSettings"]


@dataclass(frozen=True)
class HandoffSettings:
    """Hinted hand-off: sub-requests a replica missed, kept per member and retried.

    max_bytes: per member; a hint that would exceed it is dropped (counted and logged).
    max_age_s: a hint older than this is dropped instead of delivered. A store merges a sample
        older than its series' newest one only within its out-of-order window (1 h by default,
        metricsd/store/settings.py), and counts older ones as too_old, so this must stay well
        below that window; anything a replica misses for longer is left to read repair and to the
        store's catch-up from its peers.
    retry_initial_s / retry_max_s: delivery backoff, doubling from initial up to max.
    """

    max_bytes: int = 64 * 1024 * 1024
    max_age_s: float = 600.0
    retry_initial_s: float = 0.2
    retry_max_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_bytes < 0 or self.max_age_s <= 0 or not 0 < self.retry_initial_s <= self.retry_max_s:
            raise ValueError("hand-off bounds must be positive and retry_initial_s <= retry_max_s")


@dataclass(frozen=True)
class RepairSettings:
    """Read repair: when replicas' replies differ, copy what the lagging one misses.

    enabled: off leaves repair to hinted hand-off and the stores' catch-up.
    rate_per_s / burst: repair jobs started per second (a token bucket), so a badly lagging
        replica does not turn every query into a copy.
    max_concurrent: repair jobs in flight at once; more are dropped (counted), not queued.
    max_series: series copied per job at most.
    """

    enabled: bool = True
    rate_per_s: float = 5.0
    burst: int = 10
    max_concurrent: int = 2
    max_series: int = 20_000


@dataclass(frozen=True)
class HealthSettings:
    """A member that fails a call is skipped for ``down_initial_s``, doubling per further failure
    up to ``down_max_s``; then one request probes it. A success makes it healthy at once."""

    down_initial_s: float = 0.5
    down_max_s: float = 5.0


@dataclass(frozen=True)
class ProxySettings:
    """How the proxy talks to stores.

    w / r: write acknowledgements and read replies per slot (RF comes from the map; see
        :meth:`quorum`).
    call_timeout_s: per call to one store.
    retries / retry_backoff_s: a call that fails with UNAVAILABLE is retried this many times,
        waiting backoff * 2**attempt, before it counts as failed (reads then ask a spare replica;
        writes hand the data off).
    series_cache: series whose route (pod hash) and labels the proxy remembers, about 300 bytes
        each; a client writing an id the proxy has forgotten is asked for its labels again
        (WriteResponse.unknown_ids), exactly as a restarted store would.
    known_ids_per_member: ids remembered per member as acknowledged with labels; past it the set is
        cleared, and labels are resent as a member reports them unknown.
    request_limits: series and samples per Write request, checked before a batch is split (the
        stores check their parts again, and their series limits).
    digest_reads: aggregates read data from one replica per slot and digests from the others,
        falling back to the per-series merge when they differ (proxy/reads.py); off: always the
        per-series merge (R times the values on the wire; for comparison and as an escape hatch).
    coalesce: client batches bound for one member that queue while a call to it is under way
        leave together in one message on its WriteStream (proxy/coalesce.py).
    hedge: reads of consistency one (metricsd/rpc/consistency.py) ask one replica per slot and,
        after a delay from that member's recent latency, the next (proxy/latency.py, hedge.py).
    whole_queries: a PromQL query over HTTP of consistency one goes whole to one store that holds
        every slot (proxy/wholequery.py); on by default (perf/RESULTS.md, "Issue 23 through the
        cluster: the hop's fixed cost": lower CPU and p50 on every question that reads data);
        off: the proxy evaluates every query itself.
    whole_first: the place, among the stores holding every slot in member-id order, that this
        proxy asks first for its whole queries while that store has none of them under way
        (proxy/wholequery.py ``whole_order``); None: picked at random when the proxy starts, so that
        the sequential queries of many proxies spread over the stores instead of all landing on one.
    whole_spill: the first store's count of this proxy's whole queries under way at which the
        next goes to the least busy store instead (proxy/wholequery.py ``whole_order``): 1 spreads
        concurrent queries over every store at once; more keeps them on one store, which then
        answers more of them a loop turn for less CPU each, the others idle. 1 by measurement
        (perf/RESULTS.md, "Session 40, s40-23", loaded, interleaved): at 8, the cluster's CPU per
        rate() of one pod at concurrency 8 fell from 1.5-2.1x one store's to 1.25-1.44x, but its
        p50 rose 6-24%, and heavier queries queued behind each other on the one store: p50 of the
        top 10 pods, the HPA's question and the workloads' average memory +41-68% at concurrency 8.
    whole_spill_work_s: besides ``whole_spill``'s count, the first store keeps a whole query while
        the expected times of this proxy's queries under way there and this one's sum to at most
        this many seconds (proxy/wholeorder.py: the least of each query shape's recent costs, the
        store's own time for the query as it reports it, or a lone answer time from a store that
        predates that), when the query is cheap: expected to take at most ``whole_spill_cheap_s``
        (a heavy one joins no queue); 0: the count alone. 10 ms and 0.8 ms by measurement
        (perf/RESULTS.md, "Session 42, s42-23", loaded, interleaved): concurrent rate()s of one pod
        share one store as at a spill of 8 and the cluster's CPU per question at concurrency 8
        falls to about that spill's, while the top 10 pods, the HPA's question and the workloads'
        average memory spread as at 1. The store's own time (session 43, s43-23, loaded): a rate()
        of one pod 0.39-0.70 ms a question on average (its least lower), the heavy questions 1.9-2.8
        ms, so 0.8 stays between them with room either way; learnt from answer times, a rate()'s
        quickest lone answer was 0.36-0.75 ms under load and the split moved with the machine.
    writes_on_read_port: write parts go to a store over its read port (WRITE_PARTS frames,
        metricsd/rpc/readport.py) instead of its WriteStream: a frame costs each end a fraction of
        a grpc.aio stream message (perf/RESULTS.md issue 24 sessions 38 and 39). Each message
        carries the call's timeout, past which the store writes none of it (a timed-out frame
        cannot be cancelled as a cut stream is); off (``--no-writes-on-read-port``): the
        WriteStream.
    """

    w: int = 2
    r: int = 2
    call_timeout_s: float = 5.0
    retries: int = 1
    retry_backoff_s: float = 0.05
    series_cache: int = 1_000_000
    known_ids_per_member: int = 2_000_000
    handoff: HandoffSettings = field(default_factory=HandoffSettings)
    request_limits: RequestLimits = field(default_factory=RequestLimits)
    repair: RepairSettings = field(default_factory=RepairSettings)
    health: HealthSettings = field(default_factory=HealthSettings)
    digest_reads: bool = True
    coalesce: CoalesceSettings = field(default_factory=CoalesceSettings)
    hedge: HedgeSettings = field(default_factory=HedgeSettings)
    whole_queries: bool = True
    whole_first: int | None = None
    whole_spill: int = 1
    whole_spill_work_s: float = 0.010
    whole_spill_cheap_s: float = 0.0008
    writes_on_read_port: bool = True

    def __post_init__(self) -> None:
        if self.w < 1 or self.r < 1:
            raise ValueError(f"W and R must be at least 1, got W={self.w} R={self.r}")
        if self.call_timeout_s <= 0 or self.retries < 0 or self.retry_backoff_s < 0:
            raise ValueError("call_timeout_s must be positive, retries and retry_backoff_s non-negative")
        if self.series_cache < 1 or self.known_ids_per_member < 1:
            raise ValueError("series_cache and known_ids_per_member must be at least 1")
        if self.whole_first is not None and self.whole_first < 0:
            raise ValueError(f"whole_first must be at least 0, got {self.whole_first}")
        if self.whole_spill < 1:
            raise ValueError(f"whole_spill must be at least 1, got {self.whole_spill}")
        if not 0.0 <= self.whole_spill_work_s <= 60.0:  # also refuses NaN
            raise ValueError(f"whole_spill_work_s must be in [0, 60] seconds, got {self.whole_spill_work_s}")
        if not 0.0 <= self.whole_spill_cheap_s <= 60.0:
            raise ValueError(f"whole_spill_cheap_s must be in [0, 60] seconds, got {self.whole_spill_cheap_s}")

    def quorum(self, rf: int) -> QuorumSettings:
        """W and R capped at the map's RF. Raises ValueError when R + W <= RF (reads would not
        overlap the last acknowledged write): a configuration error, reported on every request."""
        return QuorumSettings(rf=rf, w=min(self.w, rf), r=min(self.r, rf))
