"""A shorter simulated day: the HPA's replica curve follows the tidal load within its bounds."""

from __future__ import annotations

from metricsd.cmd.daysim import DAY_START_MS, DaySettings, run_day

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
