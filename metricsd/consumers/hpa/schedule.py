"""Time-of-day windows that override an HPA's bounds and targets (a higher floor 19:00-23:00, say).

Tidal services know their peak hours; raising the floor before the peak avoids the minutes of
lag a reactive rule needs. Pure: `now` is Unix seconds passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from metricsd.consumers.hpa.spec import HPASpec, MetricTarget, Schedule

__all__ = ["Limits", "active_schedule", "effective_limits", "in_window"]

_MINUTES_PER_DAY = 1440
# 1970-01-01 was a Thursday: weekday 3 when Monday is 0.
_EPOCH_WEEKDAY = 3


def in_window(schedule: Schedule, now: float) -> bool:
    """Whether `now` falls inside the schedule's daily window, in the schedule's UTC offset.

    A window with end <= start wraps past midnight and belongs to the day it starts on; equal start
    and end mean the whole day.
    """
    local_minutes = int(now // 60) + schedule.utc_offset_minutes
    minute = local_minutes % _MINUTES_PER_DAY
    weekday = (local_minutes // _MINUTES_PER_DAY + _EPOCH_WEEKDAY) % 7
    start, end = schedule.start_minute, schedule.end_minute
    if start < end:
        inside, start_day = start <= minute < end, weekday
    elif minute >= start:
        inside, start_day = True, weekday
    else:
        inside, start_day = minute < end, (weekday - 1) % 7
    return inside and (schedule.days is None or start_day in schedule.days)


def active_schedule(schedules: tuple[Schedule, ...], now: float) -> Schedule | None:
    """The first schedule whose window holds `now`: list order is the operator's priority."""
    for schedule in schedules:
        if in_window(schedule, now):
            return schedule
    return None


@dataclass(frozen=True)
class Limits:
    """The bounds and targets in force at one moment, after any schedule."""

    min_replicas: int
    max_replicas: int
    targets: Mapping[str, MetricTarget] = field(default_factory=dict)
    schedule: str | None = None


def effective_limits(spec: HPASpec, now: float) -> Limits:
    """The spec's bounds and targets with the active schedule's overrides applied.

    When a schedule raises the floor above the spec's ceiling, the ceiling rises with it: the
    schedule is the more specific statement of what the operator wants in that hour.
    """
    targets = {m.key: m.target for m in spec.metrics}
    schedule = active_schedule(spec.metricsd.schedules, now)
    if schedule is None:
        return Limits(spec.min_replicas, spec.max_replicas, targets)
    lo = schedule.min_replicas if schedule.min_replicas is not None else spec.min_replicas
    hi = schedule.max_replicas if schedule.max_replicas is not None else spec.max_replicas
    targets.update(schedule.targets)
    return Limits(lo, max(hi, lo), targets, schedule.name)
