"""The dashboard over a whole simulated day: the HPA really scaling (not a dry run) with the tide.

`run_day` (metricsd/cmd/daysim.py, the engine of perf/hpa_day.py) drives the `frontend`
Deployment's HPA through the 23.5 hours that end now, its scale applied in memory, and publishes
each decision as `metricsd up` does; the store is then served over HTTP in this process and the
page read in Chromium over 24 hours: the replica count follows the tide, the 19:00-23:00 schedule
raises the floor to 44, and every scaling action is a numbered marker with its reason. This is the
story the replicas chart exists to tell; docs/dashboard-day.png is this test's dashboard-day-story.png
(METRICSD_SCREENSHOTS=DIR keeps the screenshots).
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator

import pytest
from dashboard_page import ACTION, USAGE, browser_missing, chromium_page, open_page, save, screenshot_dir, workload_view
from prometheus_client import CollectorRegistry

from metricsd.clock import SystemClock
from metricsd.cmd.daysim import DayResult, DaySettings, run_day
from metricsd.http import HttpSettings, build_app, start_http
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

pytestmark = pytest.mark.slow

DAY_MS = 86_400_000


class _Server(threading.Thread):
    """The HTTP API over a store, on its own event loop (Playwright's sync API blocks this thread)."""

    def __init__(self, api: StoreAPI) -> None:
        super().__init__(daemon=True)
        self.api = api
        self.ready = threading.Event()
        self.port = 0
        self.loop = asyncio.new_event_loop()

    def run(self) -> None:
        app = build_app(LocalBackend(self.api), settings=HttpSettings(access_log=False), registry=CollectorRegistry(),
                        clock=SystemClock())
        runner, self.port = self.loop.run_until_complete(start_http(app, "127.0.0.1", 0))
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(runner.cleanup())
        self.loop.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.join(timeout=30)


@pytest.fixture(scope="module")
def day() -> Iterator[tuple[str, DayResult]]:
    missing = browser_missing()
    if missing:
        pytest.fail(missing)
    api = StoreAPI(Store())
    # 23.5 hours that end at the last whole minute: the page's "24 hours" holds all of them while the
    # run takes its minute, so every scaling action is on the page. Samples every 30 s and a sync
    # every 30 s (half the CPU of 10 s and 15 s: about 15 s).
    end = int(time.time() * 1000) // 60_000 * 60_000
    settings = DaySettings(start_ms=end - DAY_MS + DAY_MS // 48, duration_ms=DAY_MS - DAY_MS // 48,
                           interval_ms=30_000, sync_ms=30_000)
    result = asyncio.run(run_day(settings, api=api, publish=True))
    server = _Server(api)
    server.start()
    assert server.ready.wait(30)
    try:
        yield f"http://127.0.0.1:{server.port}", result
    finally:
        server.stop()


def test_a_day_of_scaling_reads_as_a_story(day: tuple[str, DayResult], tmp_path_factory: pytest.TempPathFactory
                                           ) -> None:
    url, result = day
    problems: list[str] = []
    with chromium_page(problems) as page:
        open_page(page, url, range_s=86_400)
        view = workload_view(page, "default", "frontend", problems)
        markers = view.pixels(page, "chart-replicas", ACTION)
        line = view.pixels(page, "chart-replicas", USAGE)
        numbers = [int(n) for n in page.eval_on_selector_all("#actions tbody tr td:first-child",
                                                             "tds => tds.map((td) => td.textContent)")]
        listed = page.inner_text("#actions")
        shots = screenshot_dir(tmp_path_factory, "dashboard-day")
        save(page, shots, "dashboard-day.png")
        # The story alone, for the README (docs/dashboard-day.png): utilisation and replicas side by
        # side, and the newest scaling actions with their reasons.
        top = page.locator("#chart-utilisation").bounding_box()
        bottom = page.locator("#actions tbody tr:nth-child(8)").bounding_box()
        assert top is not None and bottom is not None
        save(page, shots, "dashboard-day-story.png",
             clip={"x": 0, "y": top["y"] - 8, "width": 1400, "height": bottom["y"] + bottom["height"] - top["y"] + 16})
    assert problems == []
    assert result.scales >= 10, result.scales  # the tide makes the HPA act; the seed fixes how often
    replicas = view.charts["chart-replicas"]
    assert replicas.state == "ready", replicas
    # Real actions ('scaled'), one marker each (two within one 5-minute step share one), numbered 1..N.
    assert 0 < replicas.points("scaling action") <= result.scales, (replicas, result.scales)
    assert replicas.points("dry run (would scale)") == 0
    assert max(numbers) == result.scales and len(numbers) == min(30, result.scales), numbers
    assert markers["colour"] > 100 and line["colour"] > 300, (markers, line)
    # The evening: the schedule raises the floor, and the action that follows says so.
    assert "schedule evening-floor raises the minimum from 4 to 44" in listed, listed
    assert not re.search(r"\b[A-Z][a-z]+[A-Z]\w*\b", listed), f"a machine reason in {listed!r}"
    util = view.charts["chart-utilisation"]
    assert util.points("utilisation") > 250 and util.points("HPA target") > 250, util
