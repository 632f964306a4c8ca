"""Simulated pod metrics for a cluster, deterministic by seed, generated for all series at once.

``metricsd up``, the tests and the benchmarks need realistic pod metrics without a cluster. The
simulator builds N pods of M Deployments over K nodes and emits, at each tick, one value for every
series, using the names and labels that cAdvisor and kube-state-metrics use:

- per container (labels namespace, pod, container, node, workload, cluster):
  ``container_cpu_usage_seconds_total`` (a counter kept as integer microseconds, as cgroup v2's
  ``cpu.stat`` usage_usec is, and emitted as usec / 1e6), ``container_memory_working_set_bytes`` and
  ``container_memory_rss`` (whole 4096-byte pages), ``container_oom_events_total``, and
  ``kube_pod_container_resource_requests`` / ``_limits`` with ``resource="cpu",unit="core"`` and
  ``resource="memory",unit="byte"``, constant per pod;
- per node: ``kube_node_status_capacity`` and ``kube_node_status_allocatable`` (cpu and memory).
  Node series carry ``node`` and, by our convention, ``namespace="kube-system"`` and
  ``pod="node-<node>"``, because the store requires namespace and pod on every series; they have no
  container or workload label.

Series are ordered metric-major (all CPU counters, then working sets, ... as in ``METRICS``), and
within a metric by pod key then container, so ``columns(name)`` is a contiguous slice.

Usage shape, in UTC from the sample timestamp: a daily tide with its trough at 04:00, its peak at
21:00 and a lunchtime shoulder (a short-video app); weekends about 15% busier; a per-workload level
relative to the request (some run hot, some sit idle) and depth of tide; a per-pod skew; slow
per-container noise; occasional bursts of 1.5-3x lasting minutes. Some workloads leak memory: when a
container's working set passes its memory limit it is OOM-killed and restarted. A restart is modelled
as Kubernetes does it: ``container_oom_events_total`` goes up by one and keeps counting across
restarts, the leak is gone, and the CPU counter *resets* (a new cgroup starts from zero), which is
the only time a counter decreases.

Determinism: each tick draws its randomness from a counter-based generator keyed by the seed and the
tick's number since the epoch, and advances the state with the same vectorised step whether called
through ``next_tick`` or ``block``, so a tick's values are bit-for-bit the same however generation
is split. No Python loop runs per series per tick.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from metricsd.model import Labels, series_id

__all__ = ["METRICS", "ContainerInfo", "PodInfo", "SimConfig", "Simulator"]

CPU_USAGE = "container_cpu_usage_seconds_total"
WORKING_SET = "container_memory_working_set_bytes"
RSS = "container_memory_rss"
OOM_EVENTS = "container_oom_events_total"
REQUESTS = "kube_pod_container_resource_requests"
LIMITS = "kube_pod_container_resource_limits"
NODE_CAPACITY = "kube_node_status_capacity"
NODE_ALLOCATABLE = "kube_node_status_allocatable"
# The order of metrics in ``Simulator.series``; the last four carry cpu then memory rows.
METRICS = (CPU_USAGE, WORKING_SET, RSS, OOM_EVENTS, REQUESTS, LIMITS, NODE_CAPACITY, NODE_ALLOCATABLE)

_PAGE = 4096
_MI = 1 << 20
_GI = 1 << 30
_DAY_MS = 86_400_000
_HOUR_MS = 3_600_000
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # Kubernetes' rand.SafeEncodeString alphabet
_NAMESPACES = ("default", "video", "social", "ads", "search", "live", "infra", "payments")
_WORKLOADS = (
    "feed-api", "video-transcode", "recommend", "user-profile", "comment", "live-push",
    "search-api", "ad-server", "upload", "message", "like-counter", "cdn-origin",
)  # fmt: skip
_CONTAINERS = ("app", "istio-proxy", "log-agent")
_MAIN_CPU = (0.25, 0.5, 1.0, 2.0)
_MAIN_MEM_MI = (256, 512, 1024, 2048, 4096)
_SIDECAR_CPU = (0.05, 0.1, 0.2)
_SIDECAR_MEM_MI = (64, 128, 256)
_LIMIT_FACTORS = (1.5, 1.75, 2.0)
# GKE's reservation tiers: (size of tier, fraction reserved); the last tier is unbounded.
_CPU_RESERVED = ((1.0, 0.06), (1.0, 0.01), (2.0, 0.005), (math.inf, 0.0025))
_MEM_RESERVED = ((4 * _GI, 0.25), (4 * _GI, 0.2), (8 * _GI, 0.1), (112 * _GI, 0.06), (math.inf, 0.02))
_EVICTION_BYTES = 100 * _MI

_CPU_NOISE = 0.12  # stationary std-dev of log CPU noise
_CPU_NOISE_TAU_S = 300.0
_MEM_NOISE = 0.02
_MEM_NOISE_TAU_S = 900.0
_BURST_EVERY_S = 6 * 3600.0  # a container bursts about this often
_BURST_LASTS_S = 150.0
_MIN_CPU_CORES = 0.001
_MEM_CAP = 0.95  # working set without leak stays below this share of the limit: no OOM loops


@dataclass(frozen=True)
class SimConfig:
    """The simulated cluster. ``big_workload_pods`` > 0 puts that many of the pods in one
    Deployment named ``big`` in namespace ``default`` (the 5,000-pod benchmark case); the rest are
    spread over the other workloads. ``jitter_ms`` delays each tick by 0..jitter_ms, the same for
    every series of the tick, as a scrape that starts late."""

    pods: int = 200
    workloads: int = 10
    nodes: int = 5
    namespaces: int = 3
    containers: int = 1
    seed: int = 0
    interval_ms: int = 10_000
    cluster: str = "sim"
    big_workload_pods: int = 0
    jitter_ms: int = 0

    def __post_init__(self) -> None:
        for name in ("pods", "workloads", "nodes", "namespaces", "containers", "interval_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"SimConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.seed < 0:
            raise ValueError(f"SimConfig.seed must be non-negative, got {self.seed}")
        if not 0 <= self.jitter_ms < self.interval_ms:
            raise ValueError(f"SimConfig.jitter_ms must be in [0, interval_ms), got {self.jitter_ms}")
        if not 0 <= self.big_workload_pods <= self.pods:
            raise ValueError(f"SimConfig.big_workload_pods must be in [0, pods], got {self.big_workload_pods}")
        if 0 < self.big_workload_pods < self.pods and self.workloads < 2:
            raise ValueError("SimConfig: pods outside the big workload need at least a second workload")
        if not self.cluster:
            raise ValueError("SimConfig.cluster must not be empty")


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    name: str
    cpu_request_cores: float
    cpu_limit_cores: float
    memory_request_bytes: int
    memory_limit_bytes: int


@dataclass(frozen=True, slots=True)
class PodInfo:
    namespace: str
    pod: str
    workload: str
    node: str
    containers: tuple[ContainerInfo, ...]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.pod}"

    @property
    def cpu_request_cores(self) -> float:
        return sum(c.cpu_request_cores for c in self.containers)

    @property
    def memory_request_bytes(self) -> int:
        return sum(c.memory_request_bytes for c in self.containers)


def _split(total: int, weights: np.ndarray) -> np.ndarray:
    """Split ``total`` in proportion to ``weights`` (largest remainder), at least 1 each if it can."""
    n = len(weights)
    base = np.zeros(n, dtype=np.int64) if total < n else np.ones(n, dtype=np.int64)
    if total < n:
        base[:total] = 1
        return base
    share = weights / weights.sum() * (total - n)
    whole = np.floor(share).astype(np.int64)
    rest = total - n - int(whole.sum())
    whole[np.argsort(-(share - whole), kind="stable")[:rest]] += 1
    return base + whole


def _tiered(amount: float, tiers: tuple[tuple[float, float], ...]) -> float:
    reserved, left = 0.0, amount
    for size, rate in tiers:
        take = min(left, size)
        reserved += take * rate
        left -= take
    return reserved


def _daily(ts_ms: int) -> float:
    """The tide in [0, ~1]: 0 at 04:00 UTC, 1 at 21:00, rising slowly all day and falling fast at night."""
    h = (ts_ms % _DAY_MS) / _HOUR_MS
    phase = math.pi * (h - 4.0) / 17.0 if 4.0 <= h < 21.0 else math.pi * (1.0 + ((h - 21.0) % 24.0) / 7.0)
    return 0.5 - 0.5 * math.cos(phase) + 0.12 * math.exp(-(((h - 12.5) / 1.5) ** 2))


def _weekly(ts_ms: int) -> float:
    """1.0 on weekdays, 1.15 at weekends, ramping over Friday and Sunday evenings."""
    how = (ts_ms / _HOUR_MS + 72.0) % 168.0  # hours since Monday 00:00; 1970-01-01 was a Thursday
    if how < 114.0:
        w = 0.0
    elif how < 120.0:
        w = (how - 114.0) / 6.0
    elif how < 162.0:
        w = 1.0
    else:
        w = (168.0 - how) / 6.0
    return 1.0 + 0.15 * w


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


class Simulator:
    """Generates every series' value tick after tick. Not safe to call from several threads."""

    def __init__(self, config: SimConfig, start_ms: int) -> None:
        if start_ms < 0:
            raise ValueError(f"start_ms must be non-negative, got {start_ms}")
        self.config = cfg = config
        key = np.random.SeedSequence(cfg.seed).generate_state(2, np.uint64)
        self._key = int(key[0]) | (int(key[1]) << 64)
        rng = np.random.default_rng([cfg.seed, 0x5E7])
        self._build(rng)
        self._init_state(rng)
        self._tick = start_ms // cfg.interval_ms
        self._prev_ts = self._tick * cfg.interval_ms - cfg.interval_ms
        dt = cfg.interval_ms / 1000.0
        self._rho_cpu = math.exp(-dt / _CPU_NOISE_TAU_S)
        self._rho_mem = math.exp(-dt / _MEM_NOISE_TAU_S)
        self._p_burst = -math.expm1(-dt / _BURST_EVERY_S)
        self._p_burst_end = -math.expm1(-dt / _BURST_LASTS_S)

    def _build(self, rng: np.random.Generator) -> None:
        """The topology and every per-container constant, from the setup generator."""
        cfg = self.config
        big = cfg.big_workload_pods > 0
        n_other = cfg.workloads - 1 if big else cfg.workloads
        names = [_WORKLOADS[j % len(_WORKLOADS)] + (f"-{j // len(_WORKLOADS)}" if j >= len(_WORKLOADS) else "")
                 for j in range(n_other)]  # fmt: skip
        ns_names = [_NAMESPACES[i] if i < len(_NAMESPACES) else f"team-{i}" for i in range(cfg.namespaces)]
        wl_ns = [ns_names[j % cfg.namespaces] for j in range(n_other)]
        counts = _split(cfg.pods - cfg.big_workload_pods, rng.lognormal(0.0, 0.6, n_other))
        if big:
            names, wl_ns = ["big", *names], ["default", *wl_ns]
            counts = np.concatenate([[cfg.big_workload_pods], counts]).astype(np.int64)
        w, nc = len(names), cfg.containers
        # Per workload and container slot: requests and limits.
        cpu_req = rng.choice(_SIDECAR_CPU, (w, nc))
        mem_req = rng.choice(_SIDECAR_MEM_MI, (w, nc)).astype(np.int64) * _MI
        cpu_req[:, 0] = rng.choice(_MAIN_CPU, w)
        mem_req[:, 0] = rng.choice(_MAIN_MEM_MI, w).astype(np.int64) * _MI
        cpu_lim = np.round(cpu_req * rng.choice(_LIMIT_FACTORS, (w, 1)), 3)  # whole millicores
        mem_lim = (mem_req * rng.choice(_LIMIT_FACTORS, (w, 1))).astype(np.int64)
        # Per workload: how it uses what it asked for.
        kind = rng.choice(3, w, p=[0.2, 0.5, 0.3])  # hot, normal, idle
        level = np.choose(kind, [rng.uniform(0.8, 1.2, w), rng.uniform(0.35, 0.7, w), rng.uniform(0.03, 0.15, w)])
        depth = rng.uniform(0.55, 0.85, w)
        mem_level = rng.uniform(0.35, 0.85, w)
        rss_frac = rng.uniform(0.65, 0.9, w)
        fill_s = rng.uniform(1.5, 5.0, w) * 86_400.0
        leaky = np.zeros(w, dtype=bool)
        leaky[rng.permutation(w)[: max(1, round(0.2 * w))]] = True
        # Pods: names as a ReplicaSet makes them, spread round-robin over nodes in a random order.
        pod_wl = np.repeat(np.arange(w), counts)
        n = len(pod_wl)
        pod_names: list[str] = []
        for j in range(w):
            template = "".join(_ALPHABET[i] for i in rng.integers(0, len(_ALPHABET), 10))
            seen: set[str] = set()
            while len(seen) < counts[j]:
                for row in rng.integers(0, len(_ALPHABET), (int(counts[j]) - len(seen), 5)):
                    seen.add("".join(_ALPHABET[i] for i in row))
            pod_names.extend(f"{names[j]}-{template}-{s}" for s in sorted(seen))
        pod_node = np.empty(n, dtype=np.int64)
        pod_node[rng.permutation(n)] = np.arange(n) % cfg.nodes
        cpu_skew = rng.lognormal(0.0, 0.15, n)
        mem_skew = rng.lognormal(0.0, 0.08, n)
        order = sorted(range(n), key=lambda p: f"{wl_ns[pod_wl[p]]}/{pod_names[p]}")  # the store's pod key
        pod_wl, pod_node, cpu_skew, mem_skew = pod_wl[order], pod_node[order], cpu_skew[order], mem_skew[order]
        pod_names = [pod_names[p] for p in order]
        self.node_names = [f"{cfg.cluster}-worker-{k}" for k in range(cfg.nodes)]
        self._pods = [
            PodInfo(wl_ns[pod_wl[p]], pod_names[p], names[pod_wl[p]], self.node_names[pod_node[p]],
                    tuple(ContainerInfo(_CONTAINERS[s] if s < len(_CONTAINERS) else f"sidecar-{s}",
                                        float(cpu_req[pod_wl[p], s]), float(cpu_lim[pod_wl[p], s]),
                                        int(mem_req[pod_wl[p], s]), int(mem_lim[pod_wl[p], s]))
                          for s in range(nc)))
            for p in range(n)
        ]  # fmt: skip
        # Per container (pod-major): the vectors the tick step works on.
        wl_c, slot = np.repeat(pod_wl, nc), np.tile(np.arange(nc), n)
        self._cpu_req, self._cpu_lim = cpu_req[wl_c, slot], cpu_lim[wl_c, slot]
        self._mem_req, self._mem_lim = mem_req[wl_c, slot], mem_lim[wl_c, slot].astype(np.float64)
        self._cpu_scale = self._cpu_req * level[wl_c] * np.repeat(cpu_skew, nc)
        self._depth = depth[wl_c]
        self._mem_scale = self._mem_req * mem_level[wl_c] * np.repeat(mem_skew, nc)
        self._rss_frac = rss_frac[wl_c]
        headroom = np.maximum(self._mem_lim - self._mem_scale * 1.15, 0.05 * self._mem_lim)
        self._leak_rate = np.where(leaky[wl_c], headroom / fill_s[wl_c], 0.0)
        self._headroom = headroom
        # Nodes: big enough for what is scheduled on them; allocatable after GKE's reservations.
        node_c = np.repeat(pod_node, nc)
        cpu_sum = np.bincount(node_c, weights=self._cpu_req, minlength=cfg.nodes)
        mem_sum = np.bincount(node_c, weights=self._mem_req.astype(np.float64), minlength=cfg.nodes)
        cap_cpu = np.maximum(16.0, np.ceil(cpu_sum / 0.7 / 8.0) * 8.0)
        cap_mem = np.maximum(64.0, np.ceil(mem_sum / _GI / 0.7 / 16.0) * 16.0) * _GI
        alloc_cpu = np.array([c - _tiered(c, _CPU_RESERVED) for c in cap_cpu])
        alloc_mem = np.array([m - int(_tiered(m, _MEM_RESERVED)) - _EVICTION_BYTES for m in cap_mem])
        self._containers = n * nc
        self._constants = np.concatenate([
            self._cpu_req, self._mem_req.astype(np.float64), self._cpu_lim, self._mem_lim,
            cap_cpu, cap_mem, np.round(alloc_cpu, 3), alloc_mem,
        ])  # fmt: skip

    def _init_state(self, rng: np.random.Generator) -> None:
        """Containers that have been running a while: counters part-way, noise and leaks in mid-course."""
        c = self._containers
        uptime_s = rng.uniform(1800.0, 14 * 86_400.0, c)
        self._cpu_usec = np.rint(uptime_s * self._cpu_scale * 0.6 * 1e6).astype(np.int64)
        self._oom = np.zeros(c, dtype=np.int64)
        self._noise_cpu = rng.normal(0.0, _CPU_NOISE, c)
        self._noise_mem = rng.normal(0.0, _MEM_NOISE, c)
        self._burst = np.ones(c)
        self._leak = np.where(self._leak_rate > 0, rng.uniform(0.0, 1.0, c) * self._headroom, 0.0)

    @cached_property
    def series(self) -> list[Labels]:
        """Every series' labels, index i = column i of the values; do not mutate."""
        cl = self.config.cluster
        out: list[Labels] = []
        per_container = [(p, c) for p in self._pods for c in p.containers]
        for name in (CPU_USAGE, WORKING_SET, RSS, OOM_EVENTS):
            out.extend((("__name__", name), ("cluster", cl), ("container", c.name), ("namespace", p.namespace),
                        ("node", p.node), ("pod", p.pod), ("workload", p.workload))
                       for p, c in per_container)  # fmt: skip
        for name in (REQUESTS, LIMITS):
            for res, unit in (("cpu", "core"), ("memory", "byte")):
                out.extend((("__name__", name), ("cluster", cl), ("container", c.name),
                            ("namespace", p.namespace), ("node", p.node), ("pod", p.pod), ("resource", res),
                            ("unit", unit), ("workload", p.workload)) for p, c in per_container)  # fmt: skip
        for name in (NODE_CAPACITY, NODE_ALLOCATABLE):
            for res, unit in (("cpu", "core"), ("memory", "byte")):
                out.extend((("__name__", name), ("cluster", cl), ("namespace", "kube-system"), ("node", node),
                            ("pod", f"node-{node}"), ("resource", res), ("unit", unit))
                           for node in self.node_names)  # fmt: skip
        return out

    @cached_property
    def series_ids(self) -> np.ndarray:
        """``model.series_id`` of every series, as uint64, computed once."""
        return np.array([series_id(labels) for labels in self.series], dtype=np.uint64)

    def columns(self, metric: str) -> slice:
        """The columns of one metric; for requests, limits and node metrics cpu rows come first."""
        i = METRICS.index(metric)
        c, k = self._containers, len(self.node_names)
        bounds = [0, c, 2 * c, 3 * c, 4 * c, 6 * c, 8 * c, 8 * c + 2 * k, 8 * c + 4 * k]
        return slice(bounds[i], bounds[i + 1])

    def pods(self) -> list[PodInfo]:
        """The pods, sorted by pod key, in the order their containers' series appear."""
        return list(self._pods)

    @property
    def next_timestamp_ms(self) -> int:
        """The timestamp the next tick will carry."""
        return self._timestamp(self._tick)

    def _timestamp(self, k: int) -> int:
        jitter = self.config.jitter_ms
        extra = _splitmix64(self._key ^ (k & 0xFFFFFFFFFFFFFFFF)) % (jitter + 1) if jitter else 0
        return k * self.config.interval_ms + extra

    def next_tick(self) -> tuple[int, np.ndarray]:
        """(timestamp_ms, a float64 value for every series), advancing the state by one tick."""
        out = np.empty(len(self._constants) + 4 * self._containers)
        out[4 * self._containers :] = self._constants
        return self._step(out), out

    def ticks_until(self, end_ms: int) -> Iterator[tuple[int, np.ndarray]]:
        """Every tick whose timestamp is at or before ``end_ms``, generated lazily."""
        while self.next_timestamp_ms <= end_ms:
            yield self.next_tick()

    def block(self, ticks: int) -> tuple[np.ndarray, np.ndarray]:
        """(int64 timestamps[T], float64 values[T, S]) of the next ``ticks`` ticks, e.g. a backfill.

        Memory is T x S x 8 bytes: split a long backfill into several blocks (the values do not
        depend on the split)."""
        if ticks < 0:
            raise ValueError(f"ticks must be non-negative, got {ticks}")
        values = np.empty((ticks, len(self._constants) + 4 * self._containers))
        values[:, 4 * self._containers :] = self._constants
        stamps = np.array([self._step(values[t]) for t in range(ticks)], dtype=np.int64)
        return stamps, values

    def _step(self, out: np.ndarray) -> int:
        """Advance one tick and write the per-container usage into ``out[: 4 * containers]``.

        The hot path: a fixed number of NumPy operations over all containers, none per series."""
        k, c = self._tick, self._containers
        ts = self._timestamp(k)
        dt_s = (ts - self._prev_ts) / 1000.0
        gen = np.random.Generator(np.random.Philox(key=self._key, counter=k << 128))
        z = gen.standard_normal((2, c))
        u = gen.random((3, c))
        # Traffic relative to the daily peak, per container (its workload's depth of tide).
        traffic = self._depth * (1.0 - _daily(ts))
        np.subtract(1.0, traffic, out=traffic)
        traffic *= _weekly(ts)
        # Slow noise: AR(1) with a stationary std-dev independent of the interval.
        self._noise_cpu *= self._rho_cpu
        self._noise_cpu += z[0] * (_CPU_NOISE * math.sqrt(1.0 - self._rho_cpu**2))
        self._noise_mem *= self._rho_mem
        self._noise_mem += z[1] * (_MEM_NOISE * math.sqrt(1.0 - self._rho_mem**2))
        # Bursts: start with a small probability, end with a fixed one (geometric length).
        bursting = self._burst > 1.0
        self._burst[bursting & (u[0] < self._p_burst_end)] = 1.0
        starts = ~bursting & (u[0] < self._p_burst)
        self._burst[starts] = 1.5 + 1.5 * u[1][starts]
        # CPU: a rate in cores, throttled at the limit, integrated over the tick in microseconds.
        rate = np.exp(self._noise_cpu)
        rate *= self._cpu_scale
        rate *= traffic
        rate *= self._burst
        np.clip(rate, _MIN_CPU_CORES, self._cpu_lim, out=rate)
        self._cpu_usec += np.rint(rate * (dt_s * 1e6)).astype(np.int64)
        # Memory: a base that follows traffic a little, plus the leak; past the limit, OOM-kill.
        ws = np.exp(self._noise_mem)
        ws *= self._mem_scale
        ws *= 0.85 + 0.15 * traffic
        ws *= 0.9 + 0.1 * self._burst
        np.minimum(ws, _MEM_CAP * self._mem_lim, out=ws)
        self._leak += self._leak_rate * dt_s
        killed = ws + self._leak > self._mem_lim
        if killed.any():
            self._oom[killed] += 1
            self._leak[killed] = 0.0
            self._cpu_usec[killed] = np.rint(rate[killed] * (dt_s * 1e6) * u[2][killed]).astype(np.int64)
        rss = ws * self._rss_frac
        rss += self._leak
        ws += self._leak
        np.divide(self._cpu_usec, 1e6, out=out[:c])
        np.floor(ws / _PAGE, out=out[c : 2 * c])
        out[c : 2 * c] *= _PAGE
        np.floor(rss / _PAGE, out=out[2 * c : 3 * c])
        out[2 * c : 3 * c] *= _PAGE
        out[3 * c : 4 * c] = self._oom
        self._prev_ts = ts
        self._tick = k + 1
        return ts
