"""The side-by-side benchmark's workload: one seeded simulation, cut into the same batches for every
system (perf/compare.py).

Four series per pod (CPU and memory usage, the CPU request and the memory limit), so the default
10,000 pods make 40,000 series, 28.8 M samples over 2 hours at 10 s. A block of ticks is sent as
requests of ``series_per_request`` series x all ticks of the block; request i of every block holds
the same series, so each series always comes from the same sender, oldest sample first.

metricsd gets columnar gRPC Write requests (labels with a series' first request, ids after that);
Prometheus and VictoriaMetrics get the same samples as Prometheus remote write 1.0 bodies
(``prometheus.WriteRequest``, snappy block format), labels with every series as that protocol has it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import cramjam
import numpy as np

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import CPU_USAGE, LIMITS, REQUESTS, WORKING_SET, SimConfig, Simulator
from metricsd.model import Labels
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import prometheus_remote_pb2 as prom

__all__ = ["Batch", "Workload", "WorkloadConfig", "prom_body"]


@dataclass(frozen=True)
class WorkloadConfig:
    """``big_pods`` in the Deployment ``big`` (namespace default) plus ``other_pods`` over
    ``other_workloads`` Deployments; ``ticks`` at ``interval_ms``, ending at ``end_ms``; the last
    ``live_ticks`` go in the agents' shape (``live_series`` series x 1 sample a request), the rest
    in the backfill shape (``backfill_series`` series x ``backfill_ticks`` samples a request)."""

    big_pods: int = 5000
    other_pods: int = 5000
    other_workloads: int = 100
    nodes: int = 100
    seed: int = 8
    interval_ms: int = 10_000
    ticks: int = 720
    live_ticks: int = 60
    backfill_ticks: int = 60
    backfill_series: int = 1000
    live_series: int = 2000
    end_ms: int = 1_700_000_000_000

    def scaled(self, scale: float) -> WorkloadConfig:
        """The same shape with ``scale`` times the pods (at least one workload of each kind)."""
        return WorkloadConfig(
            big_pods=max(1, round(self.big_pods * scale)), other_pods=max(1, round(self.other_pods * scale)),
            other_workloads=max(1, round(self.other_workloads * min(scale, 1.0))),
            nodes=max(1, round(self.nodes * scale)), seed=self.seed, interval_ms=self.interval_ms,
            ticks=self.ticks, live_ticks=self.live_ticks, backfill_ticks=self.backfill_ticks,
            backfill_series=self.backfill_series, live_series=self.live_series, end_ms=self.end_ms,
        )  # fmt: skip


@dataclass
class Batch:
    """One request's worth of samples, encoded for each kind of receiver."""

    samples: int
    grpc: pb.WriteRequest
    remote_write: bytes  # snappy block of a prometheus.WriteRequest


def prom_body(series: Sequence[Labels], stamps: Sequence[int], values: np.ndarray) -> bytes:
    """A remote write 1.0 body: ``values[i, t]`` is series i at ``stamps[t]``."""
    req = prom.WriteRequest()
    for labels, row in zip(series, values.tolist(), strict=True):
        ts = req.timeseries.add()
        ts.labels.extend(prom.Label(name=k, value=v) for k, v in labels)
        ts.samples.extend(prom.Sample(value=v, timestamp=t) for v, t in zip(row, stamps, strict=True))
    return bytes(cramjam.snappy.compress_raw(req.SerializeToString()))


class _Columns:
    """The chosen columns of a Simulator, as a SeriesSource for ``write_requests``."""

    def __init__(self, sim: Simulator, cols: np.ndarray) -> None:
        self.cols = cols
        self.series: list[Labels] = [sim.series[i] for i in cols.tolist()]
        self.series_ids: np.ndarray = sim.series_ids[cols]


class Workload:
    """Generates the blocks in time order; not safe to use from several threads."""

    def __init__(self, config: WorkloadConfig) -> None:
        self.config = cfg = config
        pods = cfg.big_pods + cfg.other_pods
        start = cfg.end_ms - (cfg.ticks - 1) * cfg.interval_ms
        self.sim = Simulator(SimConfig(pods=pods, workloads=cfg.other_workloads + 1, nodes=cfg.nodes, seed=cfg.seed,
                                       interval_ms=cfg.interval_ms, big_workload_pods=cfg.big_pods), start)
        c = pods  # one container per pod
        req, lim = self.sim.columns(REQUESTS), self.sim.columns(LIMITS)
        cols = np.concatenate([
            np.arange(self.sim.columns(CPU_USAGE).start, self.sim.columns(CPU_USAGE).stop),
            np.arange(self.sim.columns(WORKING_SET).start, self.sim.columns(WORKING_SET).stop),
            np.arange(req.start, req.start + c),  # resource="cpu" rows come first
            np.arange(lim.start + c, lim.stop),  # resource="memory"
        ])  # fmt: skip
        self.source = _Columns(self.sim, cols)
        self.ticks_sent = 0
        self._labels_sent = False

    @property
    def series(self) -> list[Labels]:
        return self.source.series

    @property
    def samples(self) -> int:
        return len(self.series) * self.config.ticks

    @cached_property
    def start_ms(self) -> int:
        return self.config.end_ms - (self.config.ticks - 1) * self.config.interval_ms

    def blocks(self, live: bool) -> list[int]:
        """The tick counts of the blocks of one shape, in order."""
        cfg = self.config
        if live:
            return [1] * cfg.live_ticks
        n = cfg.ticks - cfg.live_ticks
        return [min(cfg.backfill_ticks, n - i) for i in range(0, n, cfg.backfill_ticks)]

    def next_block(self, ticks: int, series_per_request: int, extra_tick: bool = False) -> list[Batch]:
        """The next ``ticks`` ticks as batches of ``series_per_request`` series each. Ticks past the
        configured end are allowed only with ``extra_tick`` (the freshness probe)."""
        if not extra_tick and self.ticks_sent + ticks > self.config.ticks:
            raise ValueError("the workload has no more ticks")
        stamps, values = self.sim.block(ticks)
        self.ticks_sent += ticks
        block = values[:, self.source.cols]
        grpc = write_requests(self.source, stamps, block, max_samples=series_per_request * ticks,
                              send_labels_for=set() if self._labels_sent else None)
        self._labels_sent = True
        stamp_list = stamps.tolist()
        out = []
        for i, req in enumerate(grpc):
            s0 = i * series_per_request
            s1 = min(s0 + series_per_request, len(self.series))
            body = prom_body(self.series[s0:s1], stamp_list, block[:, s0:s1].T)
            out.append(Batch(samples=(s1 - s0) * ticks, grpc=req, remote_write=body))
        return out

    @property
    def last_ms(self) -> int:
        """The timestamp of the newest tick sent."""
        return self.sim.next_timestamp_ms - self.config.interval_ms

    def question_targets(self) -> tuple[str, str]:
        """(b)'s pod and (c)'s namespace, as every benchmark of issue 23's questions picks them: the
        first pod of workload ``big``, and the namespace other than default with the most pods."""
        pod = next(p.pod for p in self.sim.pods() if p.workload == "big")
        counts = Counter(p.namespace for p in self.sim.pods() if p.namespace != "default")
        return pod, max(sorted(counts), key=counts.__getitem__)
