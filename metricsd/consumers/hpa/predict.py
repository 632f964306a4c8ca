"""Predictive scale-up: a workload's demand over the next minutes, forecast from its hourly history.

Demand is the workload's total use of a metric (cores of CPU summed over its pods, bytes, or the
sum of a Pods metric), one mean per closed UTC hour, as the hourly rollups keep it for eight days.
It does not depend on how many replicas served it, so a forecast of it turns into replicas at any
count. Pure: the history, the time and the settings come in, a `Forecast` goes out.

Method `sameHour` (the default) reads the history as an operator reads last week's graphs:

1. Each of the last `days` days is a candidate: its demand at the same time of day, scaled by how
   today compares with it so far (the median, over the last LEVEL_HOURS closed hours, of today's
   demand over that day's at the same hour). The scale carries the weekly level: a Saturday 15%
   busier than the Tuesday before it is scaled down to a Tuesday's level, and the other way round.
2. A candidate without the hours it needs (a missing day, a gap in the rollups) is skipped, never
   read as zero.
3. The candidates whose shape fits today's last hours best are kept (fit: the largest relative error
   of the scaled day over the last MATCH_HOURS closed hours; kept: within twice the best fit or 5
   points of it), and the forecast at each instant is their median. The median drops a day that
   had a flash crowd; the fit keeps the days that look like today, so a peak that moved yesterday
   is followed today (yesterday fits, the days before drift away from it hour by hour), and a
   weekday shaped unlike the others is followed through the same weekday a week ago.
4. Hourly means sit at the middle of their hour and are joined by straight lines.

Method `holtWinters`: Holt-Winters exponential smoothing with a multiplicative daily season over the
same hourly means (level, trend and 24 seasonal factors, updated hour by hour; a missing hour is
replaced by its own forecast, and an hour further than HW_CLIP from its forecast is clipped to it,
so one flash crowd moves the model little).

Either way the forecast's recent error is measured by forecasting each of the last ERROR_HOURS
closed hours from what was known before it (the mean relative error of those hindcasts), and the
forecast is usable only when that error is known and at most `max_error`. Nothing here reads the
current, unclosed hour: a flash crowd now changes the reactive rule's input, never the forecast.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from statistics import median

from metricsd.consumers.hpa.spec import Predictive

__all__ = [
    "ERROR_HOURS",
    "HOUR_MS",
    "MATCH_HOURS",
    "Forecast",
    "forecast",
    "predicted_replicas",
]

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
MATCH_HOURS = 6  # today's closed hours a past day's shape is compared on
LEVEL_HOURS = 3  # the most recent of them, which set its level
MIN_PAIRS = 3  # how many of the MATCH_HOURS a day must have to be a candidate
ERROR_HOURS = 3  # closed hours the recent error is measured on
MIN_ERROR_HOURS = 2
GRID_MS = 5 * 60_000  # the horizon is searched for its peak at this step
KEEP_FACTOR = 2.0
KEEP_SLACK = 0.05
# Holt-Winters' smoothing (level, trend, season) and the clip on an hour's deviation from its forecast.
HW_ALPHA, HW_BETA, HW_GAMMA = 0.3, 0.02, 0.4
HW_CLIP = 0.3


@dataclass(frozen=True)
class Forecast:
    """What the history says about the next `horizon`: demand now and at its largest, and when.

    usable: whether the HPA may act on it; reason: `Forecast` when usable, else why not (NoHistory,
    ErrorUnknown, LargeError); error: the recent relative error (0.12 = 12%), None when unknown;
    days: the past days combined (1 = yesterday), empty for holtWinters.
    """

    usable: bool
    reason: str
    message: str
    now: float | None = None
    peak: float | None = None
    peak_at_ms: int | None = None
    error: float | None = None
    days: tuple[int, ...] = ()


def _closed(history: Mapping[int, float], before_ms: int) -> dict[int, float]:
    """The hours that closed before `before_ms`, with a finite, non-negative mean."""
    return {h: v for h, v in history.items()
            if h < before_ms and h % HOUR_MS == 0 and math.isfinite(v) and v >= 0.0}


@dataclass(frozen=True)
class _Day:
    back: int
    level: float
    fit: float


def _relative(actual: float, predicted: float) -> float:
    scale = max(actual, predicted)
    return abs(actual - predicted) / scale if scale > 0 else 0.0


def _candidates(hist: Mapping[int, float], as_of: int, days: int) -> list[_Day]:
    """The past days that fit today's last MATCH_HOURS closed hours before `as_of`, best kept."""
    found = []
    for back in range(1, days + 1):
        pairs = []
        for k in range(1, MATCH_HOURS + 1):
            hour = as_of - k * HOUR_MS
            today, past = hist.get(hour), hist.get(hour - back * DAY_MS)
            if today is not None and past is not None and past > 0:
                pairs.append((today, past))
        if len(pairs) < MIN_PAIRS:
            continue
        level = median(t / p for t, p in pairs[:LEVEL_HOURS])
        fit = max(_relative(t, level * p) for t, p in pairs)
        found.append(_Day(back, level, fit))
    if not found:
        return []
    best = min(d.fit for d in found)
    limit = max(KEEP_FACTOR * best, best + KEEP_SLACK)
    return [d for d in found if d.fit <= limit]


def _at(hist: Mapping[int, float], t_ms: int) -> float | None:
    """Demand at an instant: hourly means at mid-hour, joined by straight lines; None in a gap."""
    mid = t_ms - HOUR_MS // 2
    h0 = mid // HOUR_MS * HOUR_MS
    a, b = hist.get(h0), hist.get(h0 + HOUR_MS)
    if a is None or b is None:
        return None
    f = (mid - h0) / HOUR_MS
    return a + (b - a) * f


def _same_hour(hist: Mapping[int, float], now_ms: int, times: Sequence[int], days: int
               ) -> tuple[list[float], tuple[int, ...]] | None:
    """The median of the kept days' scaled demand at each time; None when no day has them all."""
    series = []
    used = []
    for day in _candidates(hist, now_ms // HOUR_MS * HOUR_MS, days):
        values = [_at(hist, t - day.back * DAY_MS) for t in times]
        if any(v is None for v in values):
            continue  # a day without the hours the horizon needs is skipped
        series.append([day.level * v for v in values if v is not None])
        used.append(day.back)
    if not series:
        return None
    return [median(col) for col in zip(*series, strict=True)], tuple(used)


def _same_hour_hindcast(hist: Mapping[int, float], hour: int, days: int) -> float | None:
    """sameHour's forecast of one closed hour's mean from the hours before it."""
    values = []
    for day in _candidates(hist, hour, days):
        past = hist.get(hour - day.back * DAY_MS)
        if past is not None:
            values.append(day.level * past)
    return median(values) if values else None


@dataclass
class _HoltWinters:
    """Level, trend and 24 hourly season factors, fitted over the hours up to the last one fed."""

    level: float
    trend: float
    season: list[float]
    hour: int  # the next hour to feed

    def predict(self, hour: int) -> float:
        steps = (hour - self.hour) // HOUR_MS + 1
        return max(0.0, (self.level + steps * self.trend) * self.season[(hour // HOUR_MS) % 24])

    def feed(self, value: float | None) -> None:
        slot = (self.hour // HOUR_MS) % 24
        expected = self.predict(self.hour)
        if value is None:
            value = expected
        elif expected > 0:
            value = min(max(value, expected * (1.0 - HW_CLIP)), expected * (1.0 + HW_CLIP))
        factor = self.season[slot]
        prev_level = self.level
        if factor > 0:
            self.level = HW_ALPHA * value / factor + (1 - HW_ALPHA) * (self.level + self.trend)
        self.trend = HW_BETA * (self.level - prev_level) + (1 - HW_BETA) * self.trend
        if self.level > 0:
            self.season[slot] = HW_GAMMA * value / self.level + (1 - HW_GAMMA) * factor
        self.hour += HOUR_MS


def _holt_winters(hist: Mapping[int, float], until: int, days: int) -> _HoltWinters | None:
    """Fit over the last `days` days of hours before `until`; the first full day seeds the season.

    None without a first day that has at least 20 of its 24 hours and a positive mean.
    """
    start = until - days * DAY_MS
    hours = sorted(h for h in hist if start <= h < until)
    if not hours:
        return None
    first = hours[0] // DAY_MS * DAY_MS
    if first < start:
        first += DAY_MS
    seed = [hist.get(first + k * HOUR_MS) for k in range(24)]
    known = [v for v in seed if v is not None]
    if len(known) < 20 or first + DAY_MS > until:
        return None
    mean = sum(known) / len(known)
    if mean <= 0:
        return None
    season = [1.0] * 24
    for k, v in enumerate(seed):
        season[(first // HOUR_MS + k) % 24] = v / mean if v is not None else 1.0
    model = _HoltWinters(mean, 0.0, season, first + DAY_MS)
    while model.hour < until:
        model.feed(hist.get(model.hour))
    return model


def _hw_at(model: _HoltWinters, t_ms: int) -> float:
    """The model's hourly means at mid-hour, joined by straight lines."""
    mid = t_ms - HOUR_MS // 2
    h0 = mid // HOUR_MS * HOUR_MS
    a, b = model.predict(h0), model.predict(h0 + HOUR_MS)
    return a + (b - a) * (mid - h0) / HOUR_MS


def _holt_winters_hindcast(hist: Mapping[int, float], hour: int, days: int) -> float | None:
    model = _holt_winters(hist, hour, days)
    return model.predict(hour) if model is not None else None


def _holt_winters_curve(hist: Mapping[int, float], now_ms: int, times: Sequence[int], days: int
                        ) -> tuple[list[float], tuple[int, ...]] | None:
    model = _holt_winters(hist, now_ms // HOUR_MS * HOUR_MS, days)
    if model is None:
        return None
    return [_hw_at(model, t) for t in times], ()


_Curve = Callable[[Mapping[int, float], int, Sequence[int], int], "tuple[list[float], tuple[int, ...]] | None"]
_Hindcast = Callable[[Mapping[int, float], int, int], "float | None"]
_METHODS: dict[str, tuple[_Curve, _Hindcast]] = {
    "sameHour": (_same_hour, _same_hour_hindcast),
    "holtWinters": (_holt_winters_curve, _holt_winters_hindcast),
}


def recent_error(history: Mapping[int, float], now_ms: int, settings: Predictive) -> float | None:
    """The mean relative error of the method's forecast of each of the last ERROR_HOURS closed hours,
    each made from the hours before it; None when fewer than MIN_ERROR_HOURS could be measured."""
    hour0 = now_ms // HOUR_MS * HOUR_MS
    hist = _closed(history, hour0)
    hindcast = _METHODS[settings.method][1]
    errors = []
    for k in range(1, ERROR_HOURS + 1):
        hour = hour0 - k * HOUR_MS
        actual = hist.get(hour)
        if actual is None:
            continue
        predicted = hindcast(hist, hour, settings.days)
        if predicted is not None:
            errors.append(_relative(actual, predicted))
    return sum(errors) / len(errors) if len(errors) >= MIN_ERROR_HOURS else None


def forecast(history: Mapping[int, float], now_ms: int, settings: Predictive) -> Forecast:
    """Forecast demand over [now, now + horizon] from `history` (hour start ms -> mean demand).

    Hours at or after the current hour's start are ignored. The peak is searched every GRID_MS.
    """
    hour0 = now_ms // HOUR_MS * HOUR_MS
    hist = _closed(history, hour0)
    horizon_ms = int(settings.horizon_seconds * 1000)
    times = [*range(now_ms, now_ms + horizon_ms, GRID_MS), now_ms + horizon_ms]
    curve = _METHODS[settings.method][0](hist, now_ms, times, settings.days)
    if curve is None:
        return Forecast(False, "NoHistory", f"no past day has the hours a {settings.method} forecast needs "
                        f"({len(hist)} closed hours of history)")
    values, days = curve
    peak_i = max(range(len(values)), key=values.__getitem__)
    error = recent_error(history, now_ms, settings)

    def result(usable: bool, reason: str, message: str) -> Forecast:
        return Forecast(usable, reason, message, values[0], values[peak_i], times[peak_i], error, days)

    if error is None:
        return result(False, "ErrorUnknown",
                      f"fewer than {MIN_ERROR_HOURS} of the last {ERROR_HOURS} hours could be forecast to measure "
                      "the error")
    if error > settings.max_error:
        return result(False, "LargeError", f"the forecast was off by {100 * error:.0f}% over the last "
                      f"{ERROR_HOURS} hours (limit {100 * settings.max_error:.0f}%)")
    return result(True, "Forecast", f"{settings.method} forecast, {100 * error:.0f}% recent error")


def predicted_replicas(demand: float, capacity: float, current: int, max_replicas: int, tolerance: float
                       ) -> int:
    """The replicas a forecast demand asks for, as a floor under the reactive recommendation.

    capacity is what one replica carries at the target (its request times the target utilisation,
    or the AverageValue). Above the scale-up tolerance at the current count, the count that carries
    the demand at the target; otherwise no more than the current count (a forecast that fits the
    replicas there are only holds them), never above max_replicas.
    """
    needed = math.ceil(round(demand / capacity, 9)) if capacity > 0 else current
    ratio = demand / (capacity * current) if capacity > 0 and current > 0 else math.inf
    wanted = needed if ratio > 1.0 + tolerance else min(needed, current)
    return max(0, min(wanted, max_replicas))
