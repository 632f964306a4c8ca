"""A shorter simulated day: the HPA's replica curve follows the tidal load within its bounds."""

from __future__ import annotations

import pytest

from metricsd.cmd.daysim import DAY_HPA, DAY_START_MS, DayResult, DaySettings, run_day, run_days

HOUR = 3_600_000


async def test_the_replica_curve_follows_the_tide_from_evening_peak_to_night_trough() -> None:
    # 20:00 to 04:30, one sample and one sync a minute: the 21:00 peak and the 04:00 trough.
    start = DAY_START_MS + 20 * HOUR
    result = await run_day(DaySettings(start_ms=start, duration_ms=8 * HOUR + HOUR // 2, interval_ms=60_000,
                                       sync_ms=60_000))
    assert len(result.replicas) > 400
    for replicas, lo, hi in zip(result.replicas, result.min_replicas, result.max_replicas, strict=True):
        assert lo <= replicas <= hi
    evening, night = result.at(1.0, start), result.at(8.0, start)  # 21:00 and 04:00
    assert evening >= 2 * night, (evening, night)
    # Each replica count carries the load near the target: load / (replicas * request) within
    # the tolerance band once settled, except where the 19:00-23:00 floor holds more replicas.
    per_replica = result.request_cores * result.target_utilization / 100
    for i in (result.times_ms.index(t) for t in result.times_ms if t >= start + 5 * HOUR):
        needed = result.load_cores[i] / per_replica
        assert 0.75 * needed <= result.replicas[i] <= 1.35 * needed + 1, (i, needed, result.replicas[i])
    assert result.scales >= 5


def _spec(name: str, extra: str = "") -> str:
    return DAY_HPA.replace("name: frontend", f"name: {name}").split("  metricsd:")[0] + extra


async def test_pods_the_hpa_adds_serve_only_after_their_start_up() -> None:
    # 06:00-10:00, the morning ramp, one sample and one sync a minute, pods starting for 5 minutes.
    start = DAY_START_MS + 6 * HOUR
    result = await run_day(DaySettings(start_ms=start, duration_ms=4 * HOUR, interval_ms=60_000, sync_ms=60_000,
                                       startup_ms=5 * 60_000))
    ups = [i for i in range(1, len(result.replicas)) if result.replicas[i] > result.replicas[i - 1]]
    assert ups
    for i in ups:
        if i + 6 >= len(result.replicas) or result.replicas[i + 6] != result.replicas[i]:
            continue
        # `ready` is counted before each sync: the pods added at sync i serve from 5 minutes later on.
        assert result.ready[i + 1] <= result.replicas[i - 1] < result.replicas[i]
        assert result.ready[i + 6] == result.replicas[i]
    for ready, load, util in zip(result.ready, result.load_cores, result.utilization, strict=True):
        assert util == pytest.approx(100 * load / (ready * result.request_cores))


async def test_hpas_side_by_side_see_the_same_load_and_decide_alone() -> None:
    start = DAY_START_MS + 8 * HOUR
    settings = DaySettings(start_ms=start, duration_ms=2 * HOUR, interval_ms=60_000, sync_ms=60_000,
                           startup_ms=3 * 60_000)
    a, b = await run_days(settings, [_spec("left"), _spec("right")])
    assert (a.name, b.name) == ("left", "right")
    assert a.replicas == b.replicas and a.load_cores == b.load_cores and a.scales == b.scales > 0
    with pytest.raises(ValueError, match=r"its own scaleTargetRef\.name"):
        await run_days(settings, [_spec("left"), _spec("left")])


def test_minutes_above_target_and_replica_hours_count_sync_periods() -> None:
    r = DayResult(target_utilization=60.0, tolerance=0.1, sync_ms=60_000)
    t0 = DAY_START_MS + 3 * HOUR
    for k, util in enumerate([70.0, 65.0, 67.0] * 40):  # 03:00-05:00, one sync a minute
        r.times_ms.append(t0 + k * 60_000)
        r.utilization.append(util)
        r.replicas.append(10)
    assert r.minutes_above_target(t0) == 80.0  # 70% and 67% are above 66%
    assert r.minutes_above_target(t0, ramps_only=True) == 40.0  # only 04:00-05:00 is on the ramp
    assert r.minutes_above_target(t0 + HOUR, t0 + HOUR + 3 * 60_000) == 2.0
    assert r.replica_hours(t0) == pytest.approx(20.0)


@pytest.mark.slow
async def test_a_predictive_hpa_in_the_simulated_day_after_a_day_of_history() -> None:
    # 32 hours at one sync a minute: day 0 is history. Day 1 begins without a forecast (no past day
    # has today's last hours until 03:00, its error is known from 05:00); on the ramp after, it is in use.
    settings = DaySettings(duration_ms=32 * HOUR, interval_ms=60_000, sync_ms=60_000, startup_ms=5 * 60_000)
    reactive, predictive = await run_days(settings, [
        _spec("reactive"), _spec("predictive", "  metricsd:\n    predictive: {horizon: 30m}\n")])

    def reasons(lo: int, hi: int) -> set[str | None]:
        return {predictive.prediction_reason[i] for i, t in enumerate(predictive.times_ms)
                if DAY_START_MS + lo * HOUR <= t < DAY_START_MS + hi * HOUR}

    assert reasons(0, 24) == {"NoHistory"} and reasons(24, 27) == {"NoHistory"}
    assert reasons(28, 29) == {"ErrorUnknown"}
    day1 = [i for i, t in enumerate(predictive.times_ms) if t >= DAY_START_MS + 30 * HOUR]
    assert sum(predictive.prediction_active[i] for i in day1) > 0.9 * len(day1)
    assert all(predictive.forecast_peak[i] is not None for i in day1)
    assert not any(reactive.prediction_active) and all(v is None for v in reactive.forecast_peak)
    assert any(predictive.rules[i] == "PredictedScaleUp" for i in day1)
    start = DAY_START_MS + 24 * HOUR
    assert predictive.minutes_above_target(start, ramps_only=True) <= reactive.minutes_above_target(start,
                                                                                                   ramps_only=True)
