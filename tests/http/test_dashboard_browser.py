"""The dashboard in a real browser on `metricsd up`: its simulated cluster and the consumers' dry run.

Needs Debian's `chromium` (/usr/bin/chromium) and the PyPI `playwright` package (see
dashboard_page.py). One `metricsd up` serves every test here; each view's screenshot is written
under pytest's tmp dir (printed) and, with METRICSD_SCREENSHOTS=DIR, kept in DIR. The same views
on a cluster: test_dashboard_browser_cluster.py.
"""

from __future__ import annotations

import math
import re
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from dashboard_page import (
    ACTION,
    USAGE,
    VPA_TARGET,
    assert_cluster_view_drawn,
    browser_missing,
    chromium_page,
    cluster_view,
    expected_words,
    get_json,
    instant,
    open_page,
    published,
    save,
    screenshot_dir,
    wait_for,
    words_in_the_page,
    workload_view,
)

from metricsd.consumers.wording import reclaimable_words
from metricsd.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
METRICSD = Path(sys.executable).parent / "metricsd"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def metricsd_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    missing = browser_missing()
    if missing:
        pytest.fail(missing)
    log_path = tmp_path_factory.mktemp("up") / "up.log"
    grpc_port, http_port = free_port(), free_port()
    with log_path.open("wb") as log:
        proc = subprocess.Popen([str(METRICSD), "up", "--grpc-port", str(grpc_port), "--http-port", str(http_port)],
                                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{http_port}"

    def alive() -> str | None:
        return None if proc.poll() is None else f"metricsd up exited with {proc.returncode}: {log_path.read_text()}"

    try:
        wait_for("the HTTP API", lambda: get_json(url + "/api/v1/metricsd/stats")["data"]["samples"] > 0, alive)
        # Every consumer's decisions published for long enough to be on the page's grid (40 s: the
        # HPA's third sync, so its lines are a few steps long; 60 s of the colocation plan, whose
        # nodes are one flat line: 40 s of it is 50 pixels, the least the cluster view's test asks
        # for when it runs first).
        for metric, age_s in (("metricsd_hpa_desired_replicas", 40), ("metricsd_vpa_recommendation_cores", 40),
                              ("metricsd_colocation_nodes", 60), ("metricsd_overcommit_cluster_reclaimable_bytes", 40)):
            wait_for(metric, lambda m=metric, a=age_s: published(url, m, a), alive)  # type: ignore[misc]
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return screenshot_dir(tmp_path_factory, "dashboard-up")


def test_the_pages_words_are_the_consumers_words(metricsd_up: str) -> None:
    problems: list[str] = []
    with chromium_page(problems) as page:
        page.goto(metricsd_up + "/")
        got = words_in_the_page(page)
    assert problems == []
    assert got == expected_words()


def test_a_workload_with_an_hpa_shows_its_replicas_next_to_its_utilisation(metricsd_up: str, shots: Path) -> None:
    problems: list[str] = []
    with chromium_page(problems) as page:
        open_page(page, metricsd_up)
        view = workload_view(page, "video", "comment", problems)  # the HPA comment targets it (hpa.yaml)
        pixels = {c: view.pixels(page, c, USAGE) for c in ("chart-cpu", "chart-memory", "chart-utilisation",
                                                           "chart-replicas")}
        rows = int(page.get_attribute("#pods", "data-rows") or 0)
        asked = (page.get_attribute("body", "data-auth"), page.is_visible("#auth"), page.is_visible("#token-forget"))
        save(page, shots, "workload-hpa.png")
    assert problems == []
    assert asked == ("", False, False)  # a server without tokens: no token asked for, none held
    c = view.charts
    for chart_id in ("chart-cpu", "chart-memory", "chart-utilisation", "chart-replicas"):
        assert c[chart_id].state == "ready" and not c[chart_id].hidden, (chart_id, c[chart_id])
        # (the replica count spans the minute since the consumers started, the others the backfilled hour)
        least = 20 if chart_id == "chart-replicas" else 200
        assert pixels[chart_id]["colour"] > least, f"{chart_id}: too little in the usage colour ({pixels[chart_id]})"
    for label in ("usage (mean)", "usage (busiest pod)", "request", "limit"):
        assert c["chart-cpu"].points(label) > 0, ("cpu", label, c["chart-cpu"])
    for label in ("working set (mean)", "request", "limit", "HPA target"):  # comment's HPA targets 400Mi a pod
        assert c["chart-memory"].points(label) > 0, ("memory", label, c["chart-memory"])
    assert c["chart-utilisation"].points("utilisation") > 0 and c["chart-utilisation"].points("HPA target") > 0
    assert c["chart-utilisation"].points("HPA's reading") > 0
    for label in ("replicas", "desired", "min", "max"):
        assert c["chart-replicas"].points(label) > 0, ("replicas", label, c["chart-replicas"])
    # No VPA recommends for comment: those charts are hidden, not drawn empty.
    assert c["chart-vpa-cpu"].state == c["chart-vpa-memory"].state == "absent"
    assert c["chart-vpa-cpu"].hidden and c["chart-vpa-memory"].hidden
    assert 0 < rows <= 10
    # The HPA's line in words: counts, the bounds in force, and why, without a machine reason.
    line = re.search(r"HPA comment: (.*?)(?: · |$)", view.summary)
    assert line, view.summary
    assert re.match(r"(\d+ -> \d+|stays at \d+) replicas \(bounds \d+\.\.\d+\): \w+ \w+", line.group(1)), line.group(1)
    assert not re.search(r"[a-z][A-Z]", line.group(1)), f"a CamelCase reason in {line.group(1)!r}"


def test_the_scaling_actions_the_server_has_are_marked_and_listed(metricsd_up: str, shots: Path) -> None:
    """feed-api: in 19:00-23:00 UTC its evening-peak schedule raises the minimum above its 34 pods, so
    the dry run 'would scale' each sync; at other hours it may not act at all. The page must show
    exactly what the server has."""
    problems: list[str] = []
    with chromium_page(problems) as page:
        open_page(page, metricsd_up)
        view = workload_view(page, "default", "feed-api", problems)
        actions = instant(metricsd_up, 'metricsd_hpa_decision{namespace="default",workload="feed-api",'
                                       'action!="none"}[15m]')
        marker_pixels = view.pixels(page, "chart-replicas", ACTION)
        rows = int(page.get_attribute("#actions", "data-rows") or 0)
        listed = page.inner_text("#actions") if rows else ""
        save(page, shots, "workload-scaling-actions.png")
    assert problems == []
    replicas = view.charts["chart-replicas"]
    assert replicas.state == "ready" and replicas.points("replicas") > 0, replicas
    if not actions:
        assert rows == 0 and replicas.points("dry run (would scale)") == 0
        return
    assert replicas.points("dry run (would scale)") >= 1 and marker_pixels["colour"] > 10, (replicas, marker_pixels)
    whys = {a["metric"]["why"] for a in actions}
    assert rows >= 1 and any(why in listed for why in whys), (listed, whys)
    if any(a["metric"].get("schedule") == "evening-peak" and a["metric"]["reason"] == "BelowMinReplicas"
           for a in actions):
        assert "schedule evening-peak raises the minimum from 10 to 36" in listed + view.summary


def test_a_workload_with_a_vpa_shows_its_recommendation_against_its_request(metricsd_up: str, shots: Path) -> None:
    problems: list[str] = []
    with chromium_page(problems) as page:
        open_page(page, metricsd_up)
        view = workload_view(page, "social", "recommend", problems)  # the VPA recommend targets it (vpa.yaml)
        pixels = {c: view.pixels(page, c, VPA_TARGET) for c in ("chart-vpa-cpu", "chart-vpa-memory")}
        save(page, shots, "workload-vpa.png")
    assert problems == []
    for chart_id in ("chart-vpa-cpu", "chart-vpa-memory"):
        chart = view.charts[chart_id]
        assert chart.state == "ready" and not chart.hidden, (chart_id, chart)
        for label in ("target", "lower bound", "upper bound", "request"):
            assert chart.points(label) > 0, (chart_id, label, chart)
        assert pixels[chart_id]["colour"] > 20, (chart_id, pixels[chart_id])
    assert view.charts["chart-replicas"].state == "absent"  # no HPA scales recommend
    assert "VPA target CPU" in view.summary and "no HPA" in view.summary


def test_the_cluster_view_draws_nodes_capacity_and_hours_and_says_under_requested(metricsd_up: str,
                                                                                  shots: Path) -> None:
    problems: list[str] = []
    with chromium_page(problems) as page:
        open_page(page, metricsd_up)
        started = time.time()
        view = cluster_view(page, problems)
        said = _cluster_words(metricsd_up, started - 10, time.time())
        pixels = {c: view.pixels(page, c, USAGE) for c in view.charts}
        save(page, shots, "cluster.png")
    assert problems == []
    assert_cluster_view_drawn(view, pixels)
    hours = view.charts["chart-hours"]
    assert hours.points("peak usage") > 0 and hours.points("lendable") > 0, hours
    # The colocation plan (dry run) knows the hour `metricsd up` backfilled, a day on: one point at least.
    assert hours.points("lent by the colocation plan") >= 1, hours
    # The summary says what the advisor's log says, in the same words: at the end of the page's
    # 10-second grid, which lies in the 10 s before the view started loading or since.
    assert any(words in view.summary for words in said), (view.summary, said)
    assert not re.search(r"-\d", view.summary), view.summary


def _cluster_words(base: str, start: float, end: float) -> set[str]:
    """The overcommit advisor's words for the cluster at each second from ``start`` to ``end``."""
    amounts: dict[str, dict[float, float]] = {}
    for resource, unit in (("cpu", "cores"), ("memory", "bytes")):
        query = urllib.parse.urlencode({"query": f"sum(metricsd_overcommit_cluster_reclaimable_{unit})",
                                        "start": math.floor(start), "end": math.ceil(end), "step": 1})
        rows = get_json(f"{base}/api/v1/query_range?{query}")["data"]["result"]
        amounts[resource] = {t: float(v) for t, v in rows[0]["values"]} if rows else {}
    seconds = sorted(set(amounts["cpu"]) | set(amounts["memory"]))
    return {reclaimable_words({r: amounts[r].get(t) for r in amounts}) for t in seconds}
