"""Overcommit advice with hand-worked numbers on simulated hourly series with a known weekly peak."""

from __future__ import annotations

import pytest

from metricsd.consumers.overcommit.advisor import (
    HOUR_MS,
    ContainerSeries,
    HourlyPoint,
    NodeUsage,
    PodUsage,
    borrowable,
    recommend_requests,
    tidal_table,
)

NOW_MS = 1_704_067_200_000 + 8 * 24 * HOUR_MS  # eight days after 2024-01-01 00:00 UTC
GI = 2.0**30


def week(base: float, peak_at_hour: int | None = None, peak: float = 0.0, days: int = 8) -> list[HourlyPoint]:
    """Hourly peaks for the last `days` days: `base`, with `peak` at `peak_at_hour` hours before now."""
    points = []
    for i in range(1, days * 24 + 1):
        start = NOW_MS - i * HOUR_MS
        points.append(HourlyPoint(start, peak if i == peak_at_hour else base + (i % 24) / 100))
    return points


def series(ns: str, wl: str, pod: str, request: float, points: list[HourlyPoint]) -> ContainerSeries:
    return ContainerSeries(ns, wl, pod, "app", "cpu", request, points)


def test_service_recommendation_from_the_weekly_peak() -> None:
    shop = [
        # The weekly peak of 3.0 cores comes from one pod, 50 hours ago; 9.0 eight days ago is too old.
        series("shop", "web", "web-0", 5.0, week(1.0, peak_at_hour=50, peak=3.0)),
        series("shop", "web", "web-1", 5.0, week(1.0, peak_at_hour=7 * 24 + 5, peak=9.0)),
        series("shop", "cart", "cart-0", 1.0, week(0.5, peak_at_hour=3, peak=1.0)),
    ]
    other = [series("ads", "bidder", "bidder-0", 2.0, week(0.2, peak_at_hour=10, peak=1.0))]
    recs, summary = recommend_requests([*shop, *other], NOW_MS, buffer=0.2)
    by_name = {r.workload: r for r in recs}
    web = by_name["web"]
    # 3.0 * 1.2 = 3.6 per pod; two pods request 10.0 -> 10.0 - 7.2 = 2.8 reclaimable.
    assert (web.pods, web.weekly_peak) == (2, 3.0)
    assert web.recommended == pytest.approx(3.6) and web.reclaimable == pytest.approx(2.8)
    # cart peaks at 1.0 -> 1.2 recommended above its 1.0 request: -0.2, it needs more.
    assert by_name["cart"].reclaimable == pytest.approx(-0.2)
    assert summary.by_workload[("shop", "web", "cpu")] == pytest.approx(2.8)
    assert summary.by_namespace[("shop", "cpu")] == pytest.approx(2.6)
    # bidder: 2.0 - 1.2 = 0.8; the cluster frees 2.6 + 0.8 = 3.4 cores.
    assert summary.cluster["cpu"] == pytest.approx(3.4)


def test_a_container_with_no_recent_points_gets_no_recommendation() -> None:
    stale = [HourlyPoint(NOW_MS - 9 * 24 * HOUR_MS, 4.0)]
    recs, summary = recommend_requests([series("shop", "old", "old-0", 2.0, stale)], NOW_MS)
    assert recs == () and summary.cluster == {}


@pytest.mark.parametrize(
    ("pods", "system", "want_cpu", "want_memory"),
    [
        pytest.param([PodUsage("web", {"cpu": 10.0, "memory": 60 * GI}),
                      PodUsage("batch", {"cpu": 5.0, "memory": 10 * GI}, best_effort=True)],
                     {"cpu": 2.0, "memory": 4 * GI}, 7.2, 19.2 * GI,
                     id="lends 32 x 60% - 10 - 2 = 7.2 cores and 128Gi x 65% - 60Gi - 4Gi = 19.2Gi, "
                        "not counting best-effort usage"),
        pytest.param([PodUsage("web", {"cpu": 25.0, "memory": 100 * GI})], {}, 0.0, 0.0,
                     id="lends nothing when online usage is above the threshold"),
    ],
)
def test_node_borrowable(pods: list[PodUsage], system: dict[str, float], want_cpu: float, want_memory: float) -> None:
    node = NodeUsage("n1", {"cpu": 32.0, "memory": 128 * GI}, pods, system)
    got = borrowable(node)
    assert got["cpu"] == pytest.approx(want_cpu) and got["memory"] == pytest.approx(want_memory)


def daily(evening: float, night: float, spike_day: int | None = None, spike: float = 0.0) -> list[HourlyPoint]:
    """Online CPU for eight days: `evening` at 20:00 UTC, `night` otherwise (peaks 04:00 at night)."""
    start = NOW_MS - 8 * 24 * HOUR_MS
    points = []
    for i in range(8 * 24):
        hour = i % 24
        value = evening if hour == 20 else night - abs(hour - 4)
        if spike_day is not None and i // 24 == spike_day and hour == 20:
            value = spike
        points.append(HourlyPoint(start + i * HOUR_MS, value))
    return points


def test_tidal_table_lends_what_the_weekly_peak_leaves() -> None:
    # Capacity 100 cores, 10% margin. Evenings peak at 80 (one day at 85); 04:00 peaks at 30.
    # Day 0 is more than a week old, so its 99-core spike does not count.
    points = daily(80.0, 30.0, spike_day=3, spike=85.0)
    points = [p if p.hour_start_ms != NOW_MS - 8 * 24 * HOUR_MS + 20 * HOUR_MS else HourlyPoint(p.hour_start_ms, 99.0)
              for p in points]
    rows = tidal_table({"cpu": 100.0}, {"cpu": points}, NOW_MS, margin=0.1)
    assert len(rows) == 24
    assert rows[20].peak_usage["cpu"] == 85.0 and rows[20].lendable["cpu"] == pytest.approx(5.0)
    assert rows[4].lendable["cpu"] == pytest.approx(60.0)
    assert rows[5].lendable["cpu"] == pytest.approx(61.0)


def test_tidal_table_uses_local_hours_and_marks_unknown_hours() -> None:
    one_point = [HourlyPoint(NOW_MS - 4 * HOUR_MS, 50.0)]  # 20:00 UTC is 04:00 at UTC+08:00
    rows = tidal_table({"cpu": 100.0, "memory": 1.0}, {"cpu": one_point}, NOW_MS, margin=0.0,
                       utc_offset_minutes=480)
    assert rows[4].lendable["cpu"] == 50.0
    assert rows[20].lendable["cpu"] is None and rows[4].lendable["memory"] is None
