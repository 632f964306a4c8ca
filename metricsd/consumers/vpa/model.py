"""What the recommender remembers about one container of one workload, fed sample by sample.

Mirrors vertical-pod-autoscaler/pkg/recommender/model: aggregate_container_state.go (CPU samples
weighted by the request, at least 0.1 core, so a larger request makes older history count for
less) and container.go (one memory peak per container instance per 24 h interval, replaced when
a higher sample arrives in the same interval; RecordOOM's bump to max(used + 100 MiB, used * 1.2)).

Upstream lets peaks older than the eight-interval window fade by decay alone; here each instance
remembers the peaks it contributed and `expire` takes back those older than the window, so the
memory recommendation is the stated "last eight days" and a checkpoint carries everything needed.
Times are Unix seconds, CPU in cores, memory in bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from metricsd.consumers.vpa.histogram import DecayingHistogram, HistogramOptions

__all__ = ["AggregationConfig", "ContainerAggregate", "InstanceWindow"]

_DAY = 86400.0


@dataclass(frozen=True)
class AggregationConfig:
    """Upstream's AggregationsConfig defaults, plus the issue's CPU bucket floor.

    The first CPU bucket is 1 millicore wide (upstream: 10 millicores), so containers that use a
    few millicores still get distinct buckets; everything else is upstream's.
    """

    memory_interval_seconds: float = _DAY
    memory_interval_count: int = 8
    bucket_growth: float = 0.05
    cpu_half_life_seconds: float = _DAY
    memory_half_life_seconds: float = _DAY
    cpu_first_bucket: float = 0.001
    cpu_max: float = 1000.0
    memory_first_bucket: float = 1e7
    memory_max: float = 1e12
    min_sample_weight: float = 0.1
    oom_min_bump_bytes: float = 100 * 2**20
    oom_bump_ratio: float = 1.2

    @property
    def epsilon(self) -> float:
        # Small enough that a minimum-weight sample at the far end of the window still counts.
        return 0.001 * self.min_sample_weight

    def cpu_options(self) -> HistogramOptions:
        return HistogramOptions(self.cpu_max, self.cpu_first_bucket, 1 + self.bucket_growth, self.epsilon)

    def memory_options(self) -> HistogramOptions:
        return HistogramOptions(self.memory_max, self.memory_first_bucket, 1 + self.bucket_growth, self.epsilon)

    @property
    def memory_window_seconds(self) -> float:
        return self.memory_interval_seconds * self.memory_interval_count


@dataclass
class InstanceWindow:
    """One container instance's (one pod's) current memory interval and the peaks it contributed."""

    window_end: float
    last_sample: float
    memory_peak: float = 0.0
    oom_peak: float = 0.0
    peaks: list[tuple[float, float]] = field(default_factory=list)  # (window_end, value) in the histogram

    def to_dict(self) -> dict[str, Any]:
        return {"windowEnd": self.window_end, "lastSample": self.last_sample, "memoryPeak": self.memory_peak,
                "oomPeak": self.oom_peak, "peaks": [list(p) for p in self.peaks]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> InstanceWindow:
        return cls(float(d["windowEnd"]), float(d["lastSample"]), float(d["memoryPeak"]), float(d["oomPeak"]),
                   [(float(t), float(v)) for t, v in d["peaks"]])


class ContainerAggregate:
    """The aggregate state of one (workload, container name). Not safe to share across threads."""

    def __init__(self, config: AggregationConfig | None = None) -> None:
        self.config = config or AggregationConfig()
        self.cpu = DecayingHistogram(self.config.cpu_options(), self.config.cpu_half_life_seconds)
        self.memory = DecayingHistogram(self.config.memory_options(), self.config.memory_half_life_seconds)
        self.first_sample: float | None = None
        self.last_sample: float | None = None
        self.total_samples = 0
        self.instances: dict[str, InstanceWindow] = {}

    def add_cpu_sample(self, usage_cores: float, request_cores: float, timestamp: float) -> None:
        """addCPUSample: weight = max(request, 0.1 core); feeds the confidence's sample count and lifespan."""
        self.cpu.add_decayed(usage_cores, max(request_cores, self.config.min_sample_weight), timestamp)
        if self.last_sample is None or timestamp > self.last_sample:
            self.last_sample = timestamp
        if self.first_sample is None or timestamp < self.first_sample:
            self.first_sample = timestamp
        self.total_samples += 1

    def add_memory_sample(self, instance: str, usage_bytes: float, timestamp: float) -> bool:
        """Feed one working-set sample of one container instance. False if it arrived out of order."""
        return self._add_memory(instance, usage_bytes, timestamp, oom=False)

    def record_oom(self, instance: str, timestamp: float, request_bytes: float) -> bool:
        """RecordOOM: an OOM kill says the container needed more than it had.

        The bump starts from max(request, this interval's usage peak), not from earlier OOM bumps,
        so repeated kills do not compound. False when the event is older than the current interval.
        """
        window = self.instances.get(instance)
        peak = 0.0
        if window is not None:
            if timestamp < window.window_end - self.config.memory_interval_seconds:
                return False
            peak = window.memory_peak
        used = max(request_bytes, peak)
        needed = max(used + self.config.oom_min_bump_bytes, used * self.config.oom_bump_ratio)
        return self._add_memory(instance, needed, timestamp, oom=True)

    def _add_memory(self, instance: str, usage: float, ts: float, oom: bool) -> bool:
        """container.addMemorySample: keep one peak per interval, ending at window_end."""
        window = self.instances.get(instance)
        if window is None:
            window = self.instances[instance] = InstanceWindow(window_end=ts, last_sample=ts)
        elif not oom and ts < window.last_sample:
            return False
        window.last_sample = ts
        add_peak = False
        if ts < window.window_end:
            old = max(window.memory_peak, window.oom_peak)
            if old != 0 and usage > old:
                self.memory.subtract_decayed(old, 1.0, window.window_end)
                window.peaks = [p for p in window.peaks if p != (window.window_end, old)]
                add_peak = True
        else:
            interval = self.config.memory_interval_seconds
            window.window_end += math.floor((ts - window.window_end) / interval) * interval + interval
            window.memory_peak = 0.0
            window.oom_peak = 0.0
            add_peak = True
            self.expire(ts)
        if add_peak:
            self.memory.add_decayed(usage, 1.0, window.window_end)
            window.peaks.append((window.window_end, usage))
            if oom:
                window.oom_peak = usage
            else:
                window.memory_peak = usage
        return True

    def expire(self, now: float) -> None:
        """Keep each instance's peaks of the current interval and the count - 1 before it (8 in all by
        default); take back older ones and forget instances left with none. The loop calls this each
        cycle so dead pods age out."""
        cutoff = now - self.config.memory_window_seconds + self.config.memory_interval_seconds
        for name in list(self.instances):
            window = self.instances[name]
            kept: list[tuple[float, float]] = []
            for end, value in window.peaks:
                if end <= cutoff:
                    self.memory.subtract_decayed(value, 1.0, end)
                else:
                    kept.append((end, value))
            window.peaks = kept
            if not kept and window.window_end <= cutoff:
                del self.instances[name]

    def confidence(self) -> float:
        """getConfidence: min(lifespan in days, samples / 1440), i.e. days of one-per-minute samples."""
        if self.first_sample is None or self.last_sample is None:
            return 0.0
        lifespan_days = (self.last_sample - self.first_sample) / _DAY
        return min(lifespan_days, self.total_samples / (60 * 24))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able checkpoint from which `from_dict` rebuilds an aggregate that recommends the same."""
        return {
            "version": 1,
            "cpu": self.cpu.to_dict(),
            "memory": self.memory.to_dict(),
            "firstSample": self.first_sample,
            "lastSample": self.last_sample,
            "totalSamples": self.total_samples,
            "instances": {k: v.to_dict() for k, v in self.instances.items()},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], config: AggregationConfig | None = None) -> ContainerAggregate:
        if d.get("version") != 1:
            raise ValueError(f"unsupported checkpoint version {d.get('version')!r}")
        agg = cls(config)
        agg.cpu = DecayingHistogram.from_dict(d["cpu"])
        agg.memory = DecayingHistogram.from_dict(d["memory"])
        agg.first_sample = None if d["firstSample"] is None else float(d["firstSample"])
        agg.last_sample = None if d["lastSample"] is None else float(d["lastSample"])
        agg.total_samples = int(d["totalSamples"])
        agg.instances = {k: InstanceWindow.from_dict(v) for k, v in d["instances"].items()}
        return agg
