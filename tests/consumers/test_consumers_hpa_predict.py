"""The forecast behind predictive scale-up (consumers/hpa/predict.py): a demand history in, the
demand over the horizon out, with the properties the HPA relies on."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.consumers.hpa.predict import HOUR_MS, Forecast, forecast, predicted_replicas, recent_error
from metricsd.consumers.hpa.spec import Predictive

DAY = 24 * HOUR_MS
MIN = 60_000
# 2024-01-02 00:00 UTC, a Tuesday.
DAY0 = 1_704_153_600_000
TODAY = DAY0 + 7 * DAY  # the next Tuesday: seven days of history before it
SAME_HOUR = Predictive()
HOLT_WINTERS = Predictive(method="holtWinters")


def tide(t_ms: int, peak_hour: float = 21.0) -> float:
    """Demand in cores: 2 at night rising to 10 at `peak_hour`, falling faster after it."""
    h = (t_ms % DAY) / HOUR_MS
    rise = 17.0  # hours from the trough to the peak
    since_trough = (h - (peak_hour - rise)) % 24.0
    phase = math.pi * since_trough / rise if since_trough < rise else math.pi * (1 + (since_trough - rise) / 7.0)
    return 6.0 - 4.0 * math.cos(phase)


def hourly(start: int, end: int, f: Callable[[int], float] = tide) -> dict[int, float]:
    """Hour start -> the mean of f over the hour (one reading a minute), as a rollup gives it."""
    return {h: sum(f(h + k * MIN) for k in range(60)) / 60 for h in range(start, end, HOUR_MS)}


def truth_peak(now: int, f: Callable[[int], float] = tide, horizon_ms: int = 30 * MIN) -> float:
    return max(f(now + k * MIN) for k in range(horizon_ms // MIN + 1))


HISTORY = hourly(DAY0, TODAY + DAY)


@pytest.mark.parametrize("method", [SAME_HOUR, HOLT_WINTERS], ids=["sameHour", "holtWinters"])
def test_a_daily_tide_is_forecast_within_a_few_percent_through_the_day(method: Predictive) -> None:
    for minute in range(6 * 60, 12 * 60, 20):
        now = TODAY + minute * MIN
        fc = forecast(HISTORY, now, method)
        assert fc.usable, fc
        assert fc.peak is not None and fc.error is not None
        assert fc.peak == pytest.approx(truth_peak(now), rel=0.04), minute
        assert fc.error < 0.03
        assert now <= (fc.peak_at_ms or 0) <= now + 30 * MIN


def test_the_forecast_reads_only_closed_hours() -> None:
    now = TODAY + 10 * HOUR_MS + 20 * MIN
    closed = {h: v for h, v in HISTORY.items() if h < TODAY + 10 * HOUR_MS}
    assert forecast(closed, now, SAME_HOUR) == forecast(HISTORY, now, SAME_HOUR)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([SAME_HOUR, HOLT_WINTERS]), st.integers(0, 59), st.floats(1.5, 50.0),
       st.lists(st.integers(0, 5), min_size=1, max_size=6))
def test_a_flash_crowd_now_changes_nothing_in_the_forecast(method: Predictive, minute: int, factor: float,
                                                          hours_ahead: list[int]) -> None:
    # History never saw it: the crowd is in the open hour (and any hour after), which a rollup has not closed.
    now = TODAY + 10 * HOUR_MS + minute * MIN
    crowd = dict(HISTORY)
    for k in hours_ahead:
        hour = TODAY + (10 + k) * HOUR_MS
        crowd[hour] = crowd.get(hour, 5.0) * factor
    assert forecast(crowd, now, method) == forecast(HISTORY, now, method)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 7), st.integers(0, 3), st.floats(2.0, 20.0))
def test_a_flash_crowd_one_past_day_saw_leaves_the_same_hour_forecast_as_it_was(day: int, hour_offset: int,
                                                                                factor: float) -> None:
    now = TODAY + 10 * HOUR_MS + 10 * MIN
    spiked = dict(HISTORY)
    hour = TODAY + (10 + hour_offset - 1) * HOUR_MS - day * DAY  # around the horizon that day
    spiked[hour] *= factor
    base, fc = forecast(HISTORY, now, SAME_HOUR), forecast(spiked, now, SAME_HOUR)
    assert fc.usable and base.peak is not None and fc.peak is not None
    assert fc.peak == pytest.approx(base.peak, rel=1e-9)


def test_holt_winters_clips_a_flash_crowd_in_history() -> None:
    now = TODAY + 10 * HOUR_MS + 10 * MIN
    spiked = dict(HISTORY)
    spiked[TODAY - DAY + 10 * HOUR_MS] *= 5.0
    base, fc = forecast(HISTORY, now, HOLT_WINTERS), forecast(spiked, now, HOLT_WINTERS)
    assert base.peak is not None and fc.peak is not None
    assert fc.peak / base.peak - 1 < 0.15  # unclipped, one 5x hour would lift it by more than 100%


@settings(max_examples=60, deadline=None)
@given(st.sets(st.integers(1, 7), min_size=1, max_size=6), st.integers(6 * 60, 20 * 60))
def test_a_missing_day_is_skipped_not_read_as_zero(missing: set[int], minute: int) -> None:
    now = TODAY + minute * MIN
    full = hourly(DAY0, now)
    gappy = {h: v for h, v in full.items() if not any(TODAY - d * DAY <= h < TODAY - (d - 1) * DAY for d in missing)}
    base, fc = forecast(full, now, SAME_HOUR), forecast(gappy, now, SAME_HOUR)
    assert fc.usable and fc.peak is not None and base.peak is not None
    assert not set(fc.days) & missing
    assert fc.peak == pytest.approx(base.peak, rel=1e-9)  # the remaining days have the same shape


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 7), st.integers(6 * 60, 20 * 60), st.integers(-1, 1))
def test_a_day_with_a_gap_where_the_horizon_falls_is_skipped(day: int, minute: int, shift: int) -> None:
    # The rollups lack two hours of that day around the time the forecast looks at (a store was down).
    now = TODAY + minute * MIN
    full = hourly(DAY0, now)
    gap_start = (now - day * DAY) // HOUR_MS * HOUR_MS + shift * HOUR_MS
    gappy = {h: v for h, v in full.items() if not gap_start <= h < gap_start + 2 * HOUR_MS}
    base, fc = forecast(full, now, SAME_HOUR), forecast(gappy, now, SAME_HOUR)
    assert fc.peak is not None and base.peak is not None
    assert day not in fc.days
    assert fc.peak == pytest.approx(base.peak, rel=1e-9)


def test_holt_winters_bridges_a_missing_day() -> None:
    now = TODAY + 10 * HOUR_MS
    gappy = {h: v for h, v in HISTORY.items() if not TODAY - 2 * DAY <= h < TODAY - DAY}
    fc = forecast(gappy, now, HOLT_WINTERS)
    assert fc.usable and fc.peak == pytest.approx(truth_peak(now), rel=0.04)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.5, 2.0), min_size=7, max_size=7), st.floats(0.5, 2.0), st.integers(6 * 60, 20 * 60))
def test_each_past_day_is_scaled_to_todays_level(levels: list[float], today: float, minute: int) -> None:
    # A Saturday 15% busier, a quiet holiday: whatever each day's level, the shape is scaled to today's.
    def demand(t: int) -> float:
        back = (TODAY - t + DAY - 1) // DAY
        return tide(t) * (today if back <= 0 else levels[back - 1])

    now = TODAY + minute * MIN
    fc = forecast(hourly(DAY0, now, demand), now, SAME_HOUR)
    expected = forecast(hourly(DAY0, now), now, SAME_HOUR)
    assert fc.usable and fc.peak is not None and expected.peak is not None
    assert fc.peak == pytest.approx(today * expected.peak, rel=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([-4.0, -3.0, -2.0, 2.0, 3.0]), st.integers(0, 150))
def test_a_shifted_peak_is_followed_within_a_day(shift: float, minutes_before: int) -> None:
    # Six days peak at 21:00; from yesterday on it peaks `shift` hours away. Today, on the new
    # ramp, the forecast follows the new peak (yesterday fits today's hours, the days before do not).
    new_peak = 21.0 + shift

    def demand(t: int) -> float:
        return tide(t, new_peak if t >= TODAY - DAY else 21.0)

    now = TODAY + int((new_peak - 2.5) * HOUR_MS) - minutes_before * MIN
    fc = forecast(hourly(DAY0, now, demand), now, SAME_HOUR)
    assert fc.usable, fc
    assert fc.days == (1,)
    assert fc.peak == pytest.approx(truth_peak(now, demand), rel=0.05)


def test_on_the_day_a_peak_moves_the_forecast_falls_back_once_its_error_passes_the_limit() -> None:
    # Seven days peak at 21:00, today at 17:00: the scaled old days miss today's evening fall.
    def demand(t: int) -> float:
        return tide(t, 17.0 if t >= TODAY else 21.0)

    history = hourly(DAY0, TODAY + DAY, demand)
    for hour in (21, 22, 23):
        fc = forecast(history, TODAY + hour * HOUR_MS, SAME_HOUR)
        assert not fc.usable and fc.reason == "LargeError"
        assert fc.error is not None and fc.error > SAME_HOUR.max_error
        assert f"off by {100 * fc.error:.0f}%" in fc.message
    # A stricter limit lets the afternoon's 11% error fall back too; by the limit in force, it is used.
    afternoon = TODAY + 14 * HOUR_MS
    assert not forecast(history, afternoon, Predictive(max_error=0.1)).usable
    assert forecast(history, afternoon, SAME_HOUR).usable


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([SAME_HOUR, HOLT_WINTERS]), st.floats(0.01, 1000.0), st.integers(5 * 60, 20 * 60))
def test_the_forecast_scales_with_the_demand(method: Predictive, c: float, minute: int) -> None:
    now = TODAY + minute * MIN
    base = forecast(HISTORY, now, method)
    scaled = forecast({h: c * v for h, v in HISTORY.items()}, now, method)
    assert (scaled.usable, scaled.reason, scaled.days) == (base.usable, base.reason, base.days)
    assert base.peak is not None and scaled.peak is not None and base.error is not None
    assert scaled.peak == pytest.approx(c * base.peak, rel=1e-9)
    assert scaled.error == pytest.approx(base.error, rel=1e-6, abs=1e-12)


def test_without_history_there_is_no_forecast() -> None:
    fc = forecast({}, TODAY, SAME_HOUR)
    assert fc == Forecast(False, "NoHistory", fc.message)
    assert "0 closed hours" in fc.message
    assert not forecast(hourly(TODAY - 20 * HOUR_MS, TODAY), TODAY, HOLT_WINTERS).usable


def test_a_forecast_whose_error_cannot_be_measured_is_not_used() -> None:
    # One day of history and three hours of today: the level can be matched, the error not yet.
    now = DAY0 + DAY + 3 * HOUR_MS
    fc = forecast(hourly(DAY0, now), now, SAME_HOUR)
    assert fc.reason == "ErrorUnknown" and not fc.usable and fc.peak is not None
    assert recent_error(hourly(DAY0, now), now, SAME_HOUR) is None
    later = DAY0 + DAY + 6 * HOUR_MS
    assert forecast(hourly(DAY0, later), later, SAME_HOUR).usable


def test_the_days_setting_limits_how_far_back_the_forecast_reads() -> None:
    now = TODAY + 10 * HOUR_MS
    assert set(forecast(HISTORY, now, Predictive(days=3)).days) <= {1, 2, 3}
    assert max(forecast(HISTORY, now, SAME_HOUR).days) > 3


@settings(max_examples=300)
@given(st.floats(0.0, 3.0), st.floats(0.01, 100.0), st.integers(1, 500), st.integers(1, 500), st.floats(0.0, 0.5))
def test_predicted_replicas_carry_the_demand_never_beyond_max_and_only_hold_within_tolerance(
        ratio: float, capacity: float, current: int, max_replicas: int, tolerance: float) -> None:
    demand = ratio * capacity * current  # the forecast's demand, as a multiple of what the replicas carry
    replicas = predicted_replicas(demand, capacity, current, max_replicas, tolerance)
    assert 0 <= replicas <= max_replicas
    if ratio <= 1.0 + tolerance:
        assert replicas <= current  # within tolerance a forecast holds at most what there is
    else:
        assert replicas == max_replicas or replicas * capacity >= demand * (1 - 1e-9)
        assert replicas == max_replicas or (replicas - 1) * capacity < demand


def test_within_tolerance_a_forecast_above_the_replicas_holds_them_and_above_it_scales() -> None:
    assert predicted_replicas(3.15, 0.5, 6, 100, 0.1) == 6  # 5% above what 6 carry: like the metrics, wait
    assert predicted_replicas(3.45, 0.5, 6, 100, 0.1) == 7  # 15% above: the count that carries it
    assert predicted_replicas(2.2, 0.5, 6, 100, 0.1) == 5  # below: a floor of 5 under the reactive rule
