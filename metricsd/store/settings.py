"""Store settings: every default in one documented place, passed into constructors."""

from __future__ import annotations

from dataclasses import dataclass, field

from metricsd.model import Limits
from metricsd.rpc.admission import DEFAULT_MAX_FUTURE_MS
from metricsd.rpc.limits import RequestLimits
from metricsd.store.limits import SeriesLimits


@dataclass(frozen=True)
class StoreSettings:
    """How a store keeps data.

    chunk_samples: samples per chunk: blocks are appended to a series' open chunk until it
        holds this many (720: 2 hours at 10 s), then it is closed. Larger chunks cost fewer
        bytes of header and index; retention drops whole chunks.
    head_keep: samples per block, and the newest samples kept raw in each series' ring (32:
        5 min 20 s at 10 s), so that short windows (a rate over a minute or over 5 minutes, the
        last value) are answered without decoding (metricsd/store/head.py). A window that reaches
        past the ring decodes the closed chunks it reaches from their start (up to
        ``chunk_samples`` a chunk), and the open chunk from a block near the window's start
        (metricsd/codec/tail.py): with 16, before that, a 5-minute rate over 2,500 series took
        1,983 ms instead of 38 (perf/RESULTS.md). At most 255.
    retention_ms: raw samples older than the newest sample in the store minus this are dropped
        (relative to the data, as Prometheus does, so replayed or historic data is not dropped
        by the wall clock).
    rollup_retention_ms: hourly rollups are kept this long.
    ooo_window_ms: a sample older than its series' newest sample is accepted (merged in order)
        when within this window, e.g. hinted hand-off or an agent's retry; older ones are
        rejected and counted as too_old. A sample at a timestamp the series already holds is
        dropped and counted as duplicate (first write wins, so retries are idempotent).
    require_pod_labels: reject series without ``namespace``/``pod`` (the default). Off only for
        stores that hold non-pod data on purpose, e.g. Prometheus' PromQL test scripts.
    limits: per series (labels per series, label name and value bytes, timestamps), every path.
    series_limits: series held and new series per minute per namespace; live writes only (a WAL
        replay or a catch-up from peers restores what was acknowledged, and is never refused).
    request_limits: series and samples per Write request, checked by StoreAPI before anything else.
    max_future_ms: a live write's samples more than this after the store's clock are refused before
        they reach a series (too_far_ahead; ``--max-future``); None: no limit. Samples older than the
        store keeps (its newest sample minus retention_ms and rollup_retention_ms) are refused too
        (too_old). metricsd/store/admission.py.
    chunks_on_disk: with a data directory, the compressed chunks' slabs are files under
        ``<data-dir>/chunks/`` whose pages leave the process's resident set once written
        (page cache, as VictoriaMetrics' and Prometheus' data are; metricsd/store/slabfiles.py).
        False (``--chunks-on-disk off``): anonymous memory, as without a data directory.
    """

    chunk_samples: int = 720
    head_keep: int = 32
    retention_ms: int = 24 * 3600 * 1000
    rollup_retention_ms: int = 8 * 24 * 3600 * 1000
    ooo_window_ms: int = 3600 * 1000
    max_eval_times: int = 11_000
    limits: Limits = field(default_factory=Limits)
    require_pod_labels: bool = True
    series_limits: SeriesLimits = field(default_factory=SeriesLimits)
    request_limits: RequestLimits = field(default_factory=RequestLimits)
    max_future_ms: int | None = DEFAULT_MAX_FUTURE_MS
    chunks_on_disk: bool = True

    def __post_init__(self) -> None:
        if self.chunk_samples < 1 or not 1 <= self.head_keep <= 255:
            raise ValueError("chunk_samples must be >= 1 and head_keep in 1..255")
        if self.retention_ms <= 0 or self.rollup_retention_ms <= 0 or self.ooo_window_ms < 0:
            raise ValueError("retention and windows must be positive")
        if self.max_future_ms is not None and self.max_future_ms < 0:
            raise ValueError("max_future_ms must be >= 0 (or None: no limit)")
