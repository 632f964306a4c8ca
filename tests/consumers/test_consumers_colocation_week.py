"""Two simulated days of the colocation plan (the week of perf/colocation_week.py, shortened), with
the flash sale on the second night: the real controller on a real Store, the cluster following."""

from __future__ import annotations

import pytest

from metricsd.cmd.colocationsim import WEEK_START_MS, WeekSettings, run_week

DAY = 86_400_000


@pytest.mark.slow
async def test_two_days_lend_at_night_take_back_for_the_sale_and_never_fall_short() -> None:
    s = WeekSettings(days=2.0, flash_day=1, flash_hour=2.0)
    result = await run_week(s)
    summary = result.summary(60_000, s.node_cores)
    assert summary["shortfall_core_minutes"] == 0.0
    assert all(r <= o for r, o in zip(result.requested_cores, result.online_cores, strict=True))
    # The first day has no yesterday: nothing moves. The second lends at night.
    assert summary["transitions_per_day"][0] == 0
    assert summary["node_hours_lent"] > 24
    night = [p["Offline"] for t, p in zip(result.times_ms, result.phases, strict=True)
             if WEEK_START_MS + DAY + 1 * 3_600_000 <= t < WEEK_START_MS + DAY + 2 * 3_600_000]
    assert min(night) >= 4
    # The sale: the rule's four nodes come back in one period, once for the whole episode.
    surge = [t for t in result.transitions if t["reason"] == "Surge"]
    assert len(surge) == 4 and len({t["timeMs"] for t in surge}) == 1
    assert surge[0]["timeMs"] >= WEEK_START_MS + DAY + 2 * 3_600_000
    # Every lend was followed by a drain (or an alerted abandon), every return by its end.
    reasons = summary["transitions_by_reason"]
    assert reasons["Lend"] == reasons["Drained"] + reasons.get("DrainTimeout", 0) + sum(
        1 for t in result.transitions if t["reason"] in ("Surge", "Forecast") and t["from"] == "OnlineToOffline")
    assert summary["alerts"] == reasons.get("DrainTimeout", 0) + reasons.get("ReturnTimeout", 0)
