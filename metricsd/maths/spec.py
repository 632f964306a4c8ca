"""An aggregate question and its answer, as plain data: what a store computes and a proxy merges.

``AggregateSpec`` is the decoded Aggregate request (metricsd/rpc/wire.py reads it off the wire);
``AggregateResult`` holds the mergeable partials per group and time (metricsd/maths/partials.py)
and, when asked for, the per-series values. Shared by the store that computes them, the proxy that
merges them and the wire conversions, so none of these has to import another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from metricsd.maths.partials import AcrossFn, Partials
from metricsd.maths.slotdigest import SlotDigestArrays
from metricsd.maths.slots import SlotFilter
from metricsd.maths.window import SeriesFn
from metricsd.model import Labels
from metricsd.selector import Matcher

__all__ = ["AggregateResult", "AggregateSpec", "InvalidAggregate", "SideQuery", "SideResult"]


class InvalidAggregate(ValueError):
    """An aggregate request that cannot be answered as asked."""


@dataclass(frozen=True)
class SideQuery:
    matchers: Sequence[Matcher]
    fn: SeriesFn
    window_ms: int


@dataclass(frozen=True)
class AggregateSpec:
    query: SideQuery
    across: AcrossFn
    start_ms: int
    end_ms: int
    step_ms: int = 0
    group_by: Sequence[str] = ()
    denominator: SideQuery | None = None
    quantile: float = 0.5
    per_series: bool = False
    slots: SlotFilter | None = None
    # A proxy's read: digests for every slot of ``slots``, data (groups, partials, values) for the
    # series of ``data_slots`` only (see metricsd/maths/slotdigest.py).
    slot_digests: bool = False
    data_slots: tuple[int, ...] = ()
    # PromQL's topk / bottomk pushed down: keep the groups among the k best at some time (0: all)
    top_k: int = 0
    bottom_k: int = 0


@dataclass
class SideResult:
    partials: Partials
    ids: np.ndarray  # uint64 per series
    group: np.ndarray  # group index per series
    values: np.ndarray  # series x times
    samples: np.ndarray  # series x times


@dataclass
class AggregateResult:
    times: np.ndarray
    groups: list[Labels]
    values: np.ndarray  # groups x times
    numerator: SideResult
    denominator: SideResult | None = None
    series_scanned: int = 0
    samples_scanned: int = 0
    notes: list[str] = field(default_factory=list)
    digests: SlotDigestArrays | None = None
