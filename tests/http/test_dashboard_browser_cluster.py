"""The dashboard in a real browser on a cluster: `metricsd cluster up`, the page served by its proxy.

On a cluster the consumers are processes of their own (`metricsd hpa|vpa|overcommit|colocation`
against a proxy), so the proxy knows nothing of their status documents: the page must draw their
decisions from the series they publish through the proxy. The agent is started here rather than by
`cluster up`, to backfill an hour as `metricsd up` does (the overcommit advisor needs rollups to
advise). The HPA spec holds feed-api's floor at 40 all day (start = end: the whole day), above its
34 pods, so the dry run would scale at every sync whatever the hour: the markers and their words
are certain. Needs Chromium and playwright as test_dashboard_browser.py does; the screenshots go
under pytest's tmp dir and $METRICSD_SCREENSHOTS.
"""

from __future__ import annotations

import random
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from dashboard_page import (
    ACTION,
    USAGE,
    VPA_TARGET,
    browser_missing,
    chromium_page,
    cluster_view,
    free_port,
    get_json,
    instant,
    open_page,
    published,
    save,
    screenshot_dir,
    wait_for,
    workload_view,
)
from processes import stop_process

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "deploy" / "examples"
HPA_SPEC = """
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: feed-api, namespace: default}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: feed-api}
  minReplicas: 10
  maxReplicas: 60
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 50}}
  metricsd:
    schedules:
    - {name: all-day-floor, start: "00:00", end: "00:00", minReplicas: 40}
"""
WHY = "schedule all-day-floor raises the minimum from 10 to 40"

pytestmark = pytest.mark.slow


def _free_base() -> int:
    """A base port whose layout (cmd/cluster.py: B, B+1, B+79, B+80, B+101, B+102, B+51) is free."""
    for _ in range(50):
        base = random.randrange(20_000, 40_000, 10)
        try:
            for p in (base, base + 1, base + 2, base + 51, base + 79, base + 80, base + 101, base + 102):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return base
    raise AssertionError("no free port range")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    missing = browser_missing()
    if missing:
        pytest.fail(missing)
    work = tmp_path_factory.mktemp("cluster")
    (work / "hpa.yaml").write_text(HPA_SPEC, encoding="utf-8")
    base = _free_base()
    proxy = f"127.0.0.1:{base + 1}"
    url = f"http://127.0.0.1:{base}"
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str, *argv: str) -> None:
        with (work / f"{name}.log").open("wb") as log:
            procs[name] = subprocess.Popen([sys.executable, "-m", "metricsd", *argv], stdout=log,
                                           stderr=subprocess.STDOUT, cwd=ROOT)

    def alive() -> str | None:
        for name, p in procs.items():
            if p.poll() is not None:
                return f"{name} exited with {p.returncode}: {(work / f'{name}.log').read_text()[-3000:]}"
        return None

    try:
        start("cluster", "cluster", "up", "--plaintext", "--no-simulate", "--base-port", str(base), "--stores", "2",
              "--rf", "2", "--config-servers", "1", "--proxies", "1", "--slots", "8", "--data-dir", str(work / "data"))
        wait_for("the proxy's HTTP API", lambda: get_json(url + "/api/v1/query?query=1")["status"] == "success", alive)
        start("agent", "agent", "--simulate", "--targets", proxy, "--backfill", "1h",
              "--metrics-port", str(free_port()))
        wait_for("the backfilled hour", lambda: bool(instant(url, "kube_node_status_capacity offset 50m")), alive)
        start("hpa", "hpa", "--spec", str(work / "hpa.yaml"), "--addr", proxy)
        start("vpa", "vpa", "--spec", str(EXAMPLES / "vpa.yaml"), "--addr", proxy)
        start("overcommit", "overcommit", "--spec", str(EXAMPLES / "overcommit.yaml"), "--addr", proxy)
        start("colocation", "colocation", "--spec", str(EXAMPLES / "colocation.yaml"), "--hpa-spec",
              str(work / "hpa.yaml"), "--addr", proxy)
        for metric in ("metricsd_hpa_desired_replicas", "metricsd_vpa_recommendation_cores",
                       "metricsd_colocation_nodes", "metricsd_overcommit_cluster_reclaimable_bytes"):
            wait_for(f"{metric} through the proxy", lambda m=metric: published(url, m, 40), alive,  # type: ignore[misc]
                     timeout_s=150)
        yield url
    finally:
        for name in ("colocation", "overcommit", "vpa", "hpa", "agent"):
            if name in procs:
                stop_process(procs[name])
        if "cluster" in procs:  # Ctrl-C: cluster up stops its processes in reverse order, etcd last
            procs["cluster"].send_signal(signal.SIGINT)
            try:
                procs["cluster"].wait(timeout=60)
            except subprocess.TimeoutExpired:
                stop_process(procs["cluster"])


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return screenshot_dir(tmp_path_factory, "dashboard-cluster")


def test_the_proxy_has_no_consumer_documents_so_the_page_reads_series(cluster: str) -> None:
    with pytest.raises(Exception, match="404"):
        get_json(cluster + "/api/v1/metricsd/hpa")


def test_on_a_cluster_the_replicas_chart_marks_each_scaling_action_with_its_reason(cluster: str, shots: Path) -> None:
    problems: list[str] = []
    with chromium_page(problems) as page:
        open_page(page, cluster)
        view = workload_view(page, "default", "feed-api", problems)
        pixels = {c: view.pixels(page, c, USAGE) for c in ("chart-cpu", "chart-memory", "chart-utilisation",
                                                           "chart-replicas")}
        markers = view.pixels(page, "chart-replicas", ACTION)
        listed = page.inner_text("#actions")
        save(page, shots, "workload-hpa.png")
    assert problems == []
    c = view.charts
    for chart_id in ("chart-cpu", "chart-memory", "chart-utilisation", "chart-replicas"):
        assert c[chart_id].state == "ready" and not c[chart_id].hidden, (chart_id, c[chart_id])
        least = 20 if chart_id == "chart-replicas" else 200
        assert pixels[chart_id]["colour"] > least, (chart_id, pixels[chart_id])
    assert c["chart-utilisation"].points("HPA target") > 0 and c["chart-utilisation"].points("HPA's reading") > 0
    for label in ("replicas", "desired", "min", "max"):
        assert c["chart-replicas"].points(label) > 0, (label, c["chart-replicas"])
    # A dry run repeats its 'would scale 34 -> 40' every sync: one action, one marker.
    assert c["chart-replicas"].points("dry run (would scale)") == 1, c["chart-replicas"]
    assert markers["colour"] > 10, markers
    assert re.search(rf"1\s+\S.*\s+34 → 40\s+dry-run\s+{WHY}", listed), listed
    assert f"HPA feed-api: 34 -> 40 replicas (bounds 40..60): {WHY}" in view.summary, view.summary


def test_on_a_cluster_the_vpa_chart_draws_its_bounds_against_the_request(cluster: str, shots: Path) -> None:
    problems: list[str] = []
    with chromium_page(problems) as page:
        open_page(page, cluster)
        view = workload_view(page, "video", "video-transcode", problems)  # vpa.yaml's second VPA
        pixels = {c: view.pixels(page, c, VPA_TARGET) for c in ("chart-vpa-cpu", "chart-vpa-memory")}
        save(page, shots, "workload-vpa.png")
    assert problems == []
    for chart_id in ("chart-vpa-cpu", "chart-vpa-memory"):
        chart = view.charts[chart_id]
        assert chart.state == "ready" and not chart.hidden, (chart_id, chart)
        for label in ("target", "lower bound", "upper bound", "request"):
            assert chart.points(label) > 0, (chart_id, label, chart)
        assert pixels[chart_id]["colour"] > 20, (chart_id, pixels[chart_id])


def test_on_a_cluster_the_cluster_view_draws_every_chart(cluster: str, shots: Path) -> None:
    problems: list[str] = []
    with chromium_page(problems) as page:
        open_page(page, cluster)
        view = cluster_view(page, problems)
        pixels = {c: view.pixels(page, c, USAGE) for c in view.charts}
        save(page, shots, "cluster.png")
    assert problems == []
    for chart_id, chart in view.charts.items():
        assert chart.state == "ready" and not chart.hidden, (chart_id, chart)
        assert pixels[chart_id]["colour"] > 50, (chart_id, pixels[chart_id])
    assert view.charts["chart-nodes"].points("online") > 0
    for chart_id in ("chart-cores", "chart-bytes"):
        for label in ("capacity", "requested", "used", "reclaimable"):
            assert view.charts[chart_id].points(label) > 0, (chart_id, label, view.charts[chart_id])
    assert view.charts["chart-hours"].points("peak usage") > 0
    assert "reclaimable now" in view.summary and "colocation plan: " in view.summary, view.summary
    assert not re.search(r"-\d", view.summary), view.summary
