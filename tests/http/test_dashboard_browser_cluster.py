"""The dashboard in a real browser on a cluster: `metricsd cluster up`, the page served by its proxy,
with the TLS and tokens `cluster up` uses by default (its throw-away CA in <data-dir>/security).

On a cluster the consumers are processes of their own (`metricsd hpa|vpa|overcommit|colocation`
against a proxy), so the proxy knows nothing of their status documents: the page must draw their
decisions from the series they publish through the proxy. The agent is started here rather than by
`cluster up`, to backfill an hour as `metricsd up` does (the overcommit advisor needs rollups to
advise). The HPA spec holds feed-api's floor at 40 all day (start = end: the whole day), above its
34 pods, so the dry run would scale at every sync whatever the hour: the markers and their words
are certain. Needs Chromium and playwright as test_dashboard_browser.py does; the screenshots go
under pytest's tmp dir and $METRICSD_SCREENSHOTS.

Tokens: the agent sends cluster up's agent.token; the test adds to the proxies' tokens file (re-read
when it changes) a read,write token for the consumers and, for the page, a read token ("viewer")
and a write-only one ("writer", refused with 403). Chromium has no client certificate and trusts
the cluster's certificate by its public key; each test enters the viewer's token into the page's
form, as a user would.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dashboard_page import (
    ACTION,
    REFUSED,
    USAGE,
    VPA_TARGET,
    Auth,
    assert_cluster_view_drawn,
    browser_missing,
    chromium_page,
    cluster_view,
    enter_token,
    get_json,
    instant,
    open_page,
    published,
    save,
    screenshot_dir,
    wait_for,
    wait_for_token_form,
    workload_view,
)
from processes import stop_process

from metricsd.cmd.localsecurity import LocalSecurity
from metricsd.ports import free_port, free_range
from metricsd.security.tokens import hash_token, new_token

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
    """A base port whose cluster layout (base .. base + 199) is free and outside the ephemeral range."""
    return free_range("127.0.0.1", 200)


@dataclass(frozen=True)
class Cluster:
    url: str  # the proxy's HTTP port: https://127.0.0.1:<base>
    viewer: Auth  # the CA and a token with the read role
    writer: str  # a token with the write role only
    cert: Path  # the certificate every component serves


def _add_token(security: LocalSecurity, name: str, roles: str) -> str:
    """A new token in the file the proxies and stores read (re-read when it changes), also written
    to <name>.token for the processes that send it."""
    token = new_token()
    with security.tokens.open("a") as f:
        f.write(f"{name} {roles} {hash_token(token)}\n")
    security.token_file(name).write_text(token + "\n")
    return token


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    missing = browser_missing()
    if missing:
        pytest.fail(missing)
    work = tmp_path_factory.mktemp("cluster")
    (work / "hpa.yaml").write_text(HPA_SPEC, encoding="utf-8")
    base = _free_base()
    proxy = f"127.0.0.1:{base + 1}"
    url = f"https://127.0.0.1:{base}"
    security = LocalSecurity(work / "data" / "security")
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
        start("cluster", "cluster", "up", "--no-simulate", "--base-port", str(base), "--stores", "2", "--rf", "2",
              "--config-servers", "1", "--proxies", "1", "--slots", "8", "--data-dir", str(work / "data"))
        # (the tokens file is written last, in one go, after every <name>.token)
        wait_for("cluster up's tokens", lambda: "agent" in security.tokens.read_text(), alive)
        ops = Auth(security.ca, security.token_file("ops").read_text().strip())
        wait_for("the proxy's HTTP API", lambda: get_json(url + "/api/v1/query?query=1", ops)["status"] == "success",
                 alive)
        viewer = Auth(security.ca, _add_token(security, "viewer", "read"))
        writer = _add_token(security, "writer", "write")
        _add_token(security, "consumers", "read,write")
        wait_for("the viewer's token", lambda: get_json(url + "/api/v1/query?query=1", viewer)["status"] == "success",
                 alive)
        start("agent", "agent", "--simulate", "--targets", proxy, "--backfill", "1h",
              "--metrics-port", str(free_port()), *security.tls_args(), *security.client_args("agent"))
        wait_for("the backfilled hour", lambda: bool(instant(url, "kube_node_status_capacity offset 50m", viewer)),
                 alive)
        consumer = ("--addr", proxy, *security.tls_args(), *security.client_args("consumers"))
        start("hpa", "hpa", "--spec", str(work / "hpa.yaml"), *consumer)
        start("vpa", "vpa", "--spec", str(EXAMPLES / "vpa.yaml"), *consumer)
        start("overcommit", "overcommit", "--spec", str(EXAMPLES / "overcommit.yaml"), *consumer)
        start("colocation", "colocation", "--spec", str(EXAMPLES / "colocation.yaml"), "--hpa-spec",
              str(work / "hpa.yaml"), *consumer)
        # 60 s of the colocation plan: its nodes are one flat line, 40 s of it 50 pixels on the 15-minute
        # grid, the least the cluster view's test asks for when it runs first (pytest -k).
        for metric, age_s in (("metricsd_hpa_desired_replicas", 40), ("metricsd_vpa_recommendation_cores", 40),
                              ("metricsd_colocation_nodes", 60), ("metricsd_overcommit_cluster_reclaimable_bytes", 40)):
            wait_for(f"{metric} through the proxy",
                     lambda m=metric, a=age_s: published(url, m, a, viewer),  # type: ignore[misc]
                     alive, timeout_s=150)
        yield Cluster(url, viewer, writer, security.cert)
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


def test_the_proxy_has_no_consumer_documents_so_the_page_reads_series(cluster: Cluster) -> None:
    with pytest.raises(Exception, match="404"):
        get_json(cluster.url + "/api/v1/metricsd/hpa", cluster.viewer)


def test_on_a_cluster_the_replicas_chart_marks_each_scaling_action_with_its_reason(cluster: Cluster,
                                                                                   shots: Path) -> None:
    problems: list[str] = []
    with chromium_page(problems, trust=cluster.cert) as page:
        open_page(page, cluster.url, token=cluster.viewer.token, problems=problems)
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


def test_on_a_cluster_the_vpa_chart_draws_its_bounds_against_the_request(cluster: Cluster, shots: Path) -> None:
    problems: list[str] = []
    with chromium_page(problems, trust=cluster.cert) as page:
        open_page(page, cluster.url, token=cluster.viewer.token, problems=problems)
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


def test_on_a_cluster_the_cluster_view_draws_every_chart(cluster: Cluster, shots: Path) -> None:
    problems: list[str] = []
    with chromium_page(problems, trust=cluster.cert) as page:
        open_page(page, cluster.url, token=cluster.viewer.token, problems=problems)
        view = cluster_view(page, problems)
        pixels = {c: view.pixels(page, c, USAGE) for c in view.charts}
        save(page, shots, "cluster.png")
    assert problems == []
    assert_cluster_view_drawn(view, pixels)
    assert view.charts["chart-hours"].points("peak usage") > 0
    assert "reclaimable now" in view.summary and "colocation plan: " in view.summary, view.summary
    assert not re.search(r"-\d", view.summary), view.summary


def test_on_a_cluster_the_page_asks_for_a_token_says_why_one_is_refused_and_keeps_a_good_one_for_the_tab(
        cluster: Cluster, shots: Path) -> None:
    problems: list[str] = []
    requests: list[tuple[str, str | None]] = []
    stored = "() => sessionStorage.getItem('metricsd.token')"
    with chromium_page(problems, trust=cluster.cert) as page:
        page.on("request", lambda r: requests.append((r.url, r.headers.get("authorization"))))
        page.goto(cluster.url + "/")  # the page and its scripts load without a token
        asked = wait_for_token_form(page, "needed")
        enter_token(page, "not-a-token", problems)
        refused = wait_for_token_form(page, "refused")
        kept_after_refusal = page.evaluate(stored)
        save(page, shots, "token-refused.png")
        enter_token(page, cluster.writer, problems)
        forbidden = wait_for_token_form(page, "forbidden")
        save(page, shots, "token-forbidden.png")
        sent_from = len(requests)
        enter_token(page, cluster.viewer.token, problems)
        page.wait_for_function("() => document.body.dataset.loaded !== ''", timeout=60_000)
        kept = page.evaluate(stored)
        held = (page.get_attribute("body", "data-auth"), page.is_visible("#token-forget"), page.is_hidden("#auth"))
        page.reload()  # the tab keeps its token: nothing asked
        page.wait_for_function("() => document.body.dataset.loaded !== ''", timeout=60_000)
        after_reload = page.get_attribute("body", "data-auth")
        sent_to = len(requests)
        other_tab = page.context.new_page()  # another tab has its own sessionStorage: it asks
        other_tab.goto(cluster.url + "/")
        asked_in_other_tab = wait_for_token_form(other_tab, "needed")
        page.click("#token-forget")
        asked_again = wait_for_token_form(page, "needed")
        forgotten = page.evaluate(stored)
        addresses = [page.url, other_tab.url] + [url for url, _ in requests]
    assert all(REFUSED.match(p) for p in problems), problems
    assert "needs a bearer token with the read role (401 unauthorized)" in asked, asked
    assert refused == "The token was refused (401 unauthorized): unknown or expired token.", refused
    assert kept_after_refusal is None
    assert forbidden == ("The token was accepted but lacks the role this page needs (403 forbidden): writer (roles: "
                         "write) may not call GET /api/v1/label/namespace/values: it needs role read."), forbidden
    assert kept == cluster.viewer.token
    assert held == ("held", True, True) and after_reload == "held"
    api_calls = [auth for url, auth in requests[sent_from:sent_to] if "/api/" in url]
    assert len(api_calls) > 20 and set(api_calls) == {f"Bearer {cluster.viewer.token}"}, set(api_calls)
    assert asked_in_other_tab == asked and asked_again == asked and forgotten is None
    leaked = [a for a in addresses if any(t in a for t in ("not-a-token", cluster.writer, cluster.viewer.token))]
    assert not leaked, f"{len(leaked)} addresses with a token, e.g. {leaked[:2]}"
