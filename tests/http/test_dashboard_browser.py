"""The dashboard in a real browser: `metricsd up` in its own process, the page in headless Chromium.

Needs Debian's `chromium` (/usr/bin/chromium) and the PyPI `playwright` package; Playwright drives
the system browser, so no browser download is involved. The screenshot is left in
test-output/dashboard-browser/ at the repository root (git-ignored).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "test-output" / "dashboard-browser"
METRICSD = Path(sys.executable).parent / "metricsd"
NAMESPACE, WORKLOAD = "video", "comment"  # an HPA in deploy/examples/hpa.yaml targets it
USAGE_RGB = (0x1F, 0x77, 0xB4)  # COLOR.usage in static/app.js

pytestmark = pytest.mark.slow

# Counts, per chart's canvas, the pixels drawn in the usage series' colour and those drawn at all.
COUNT_PIXELS = """([r, g, b]) => [...document.querySelectorAll("figure.chart")].map((fig) => {
  const c = fig.querySelector("canvas");
  if (!c) return { id: fig.id, canvas: false };
  const px = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
  let usage = 0, inked = 0;
  for (let i = 0; i < px.length; i += 4) {
    if (px[i + 3] < 128) continue;
    inked++;
    if (Math.abs(px[i] - r) < 40 && Math.abs(px[i + 1] - g) < 40 && Math.abs(px[i + 2] - b) < 40) usage++;
  }
  return { id: fig.id, canvas: true, width: c.width, height: c.height, usage, inked };
})"""


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def _wait_for(what: str, probe: Callable[[], bool], proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """Poll a real process's HTTP API until ``probe`` holds (the process does the work meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"metricsd up exited with {proc.returncode} while waiting for {what}")
        try:
            if probe():
                return
        except (OSError, urllib.error.URLError, ValueError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


@pytest.fixture
def metricsd_up(free_ports: Callable[[], int], tmp_path: Path) -> Iterator[str]:
    grpc_port, http_port = free_ports(), free_ports()
    log = (tmp_path / "up.log").open("wb")
    proc = subprocess.Popen([str(METRICSD), "up", "--grpc-port", str(grpc_port), "--http-port", str(http_port)],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{http_port}"
    try:
        _wait_for("the HTTP API", lambda: _get_json(url + "/api/v1/metricsd/stats")["data"]["samples"] > 0, proc)

        def hpa_decided() -> bool:
            doc = _get_json(url + "/api/v1/metricsd/hpa")
            return any(h.get("hpa") == f"{NAMESPACE}/{WORKLOAD}" for h in doc.get("history", []))

        _wait_for("the HPA's first decision", hpa_decided, proc)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _browser_missing() -> str | None:
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing: apt-get install chromium (or `make browser-deps` as root)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is missing: .venv/bin/pip install playwright (or `make browser-deps`)"
    return None


def test_dashboard_draws_a_workloads_charts_in_chromium(metricsd_up: str) -> None:
    missing = _browser_missing()
    if missing:
        pytest.fail(missing)
    from playwright.sync_api import sync_playwright

    OUTPUT.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            page.goto(metricsd_up + "/")
            # The page picks a first workload on its own; then choose another, as a user would.
            page.wait_for_function("() => document.body.dataset.loaded !== ''", timeout=30_000)
            page.select_option("#namespace", NAMESPACE)
            page.wait_for_function(
                f"() => [...document.querySelectorAll('#workload option')].some(o => o.value === '{WORKLOAD}')")
            page.select_option("#workload", WORKLOAD)
            page.wait_for_function(f"() => document.body.dataset.loaded === '{NAMESPACE}/{WORKLOAD}'",
                                   timeout=30_000)
            charts = {
                fig.get_attribute("id"): (fig.get_attribute("data-state"), json.loads(fig.get_attribute("data-series")
                                                                                      or "{}"))
                for fig in page.query_selector_all("figure.chart")
            }
            pixels = page.evaluate(COUNT_PIXELS, list(USAGE_RGB))
            rows = int(page.get_attribute("#pods", "data-rows") or 0)
            summary = page.inner_text("#summary")
            page.screenshot(path=str(OUTPUT / "dashboard.png"), full_page=True)
        finally:
            browser.close()

    assert problems == []
    assert set(charts) == {"chart-cpu", "chart-memory", "chart-utilisation", "chart-hours"}
    for chart_id, (chart_state, _) in charts.items():
        assert chart_state == "ready", (chart_id, chart_state)
    cpu, memory, util, hours = (charts[k][1] for k in ("chart-cpu", "chart-memory", "chart-utilisation",
                                                       "chart-hours"))
    for label in ("usage (mean)", "usage (busiest pod)", "request", "limit"):
        assert cpu[label] > 0, ("cpu", label, cpu)
    for label in ("working set (mean)", "request", "limit", "HPA target"):  # comment's HPA targets 400Mi a pod
        assert memory[label] > 0, ("memory", label, memory)
    assert util["utilisation"] > 0 and util["HPA target"] > 0, util
    assert sum(hours.values()) > 0, hours
    # The colocation plan (dry run) knows the hour `metricsd up` backfilled, a day on: one point at least.
    assert hours.get("lent by the colocation plan", 0) >= 1, hours
    for p in pixels:
        assert p["canvas"] and p["width"] > 0 and p["height"] > 0, p
        assert p["usage"] > 50, f"{p['id']}: the usage series is not drawn ({p})"
    assert 0 < rows <= 10
    assert f"{NAMESPACE}/{WORKLOAD}" in summary and "HPA" in summary
    assert (OUTPUT / "dashboard.png").stat().st_size > 20_000
