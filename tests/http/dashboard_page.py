"""Driving the dashboard in headless Chromium, for the browser tests on `metricsd up` and on a cluster.

Playwright drives Debian's /usr/bin/chromium (executable_path), so no browser is downloaded. Each
view is reached as a user reaches it (the tabs, the namespace and workload lists), waited for
until the page says it is drawn (<body data-loaded>), read back (every chart's state, points per
series, the pixels its canvas holds) and photographed: the screenshots go to a directory under
pytest's tmp dir and, when METRICSD_SCREENSHOTS names a directory, are copied there to keep.

On a server with TLS and tokens, the tests read its API with `Auth` (its CA and a token), and
Chromium trusts the server's own certificate by its public key (`trust`), nothing else; the page
asks for the token as it asks a user (`enter_token`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
KEEP_ENV = "METRICSD_SCREENSHOTS"
WORDING_CASES = Path(__file__).resolve().parents[1] / "consumers" / "data" / "wording_cases.json"

# Colours of static/charts.js (COLOR): the series each chart must have drawn.
USAGE = (0x1F, 0x77, 0xB4)
VPA_TARGET = (0x7B, 0x3F, 0xBF)
ACTION = (0xE6, 0x55, 0x0D)
WORKLOAD_CHARTS = ("chart-cpu", "chart-memory", "chart-utilisation", "chart-replicas", "chart-vpa-cpu",
                   "chart-vpa-memory")
CLUSTER_CHARTS = ("chart-nodes", "chart-hours", "chart-cores", "chart-bytes")

# Per chart's canvas: pixels drawn at all, and those within 40 of a given colour in each channel.
_COUNT_PIXELS = """([id, [r, g, b]]) => {
  const c = document.querySelector(`#${id} canvas`);
  if (!c) return { canvas: false, colour: 0, inked: 0 };
  const px = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
  let colour = 0, inked = 0;
  for (let i = 0; i < px.length; i += 4) {
    if (px[i + 3] < 128) continue;
    inked++;
    if (Math.abs(px[i] - r) < 40 && Math.abs(px[i + 1] - g) < 40 && Math.abs(px[i + 2] - b) < 40) colour++;
  }
  return { canvas: true, width: c.width, height: c.height, colour, inked };
}"""




def browser_missing() -> str | None:
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing: apt-get install chromium (or `make browser-deps` as root)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is missing: .venv/bin/pip install playwright (or `make browser-deps`)"
    return None


@dataclass(frozen=True)
class Auth:
    """How to reach a server with TLS and tokens: trust ``ca``, send ``token``."""

    ca: Path
    token: str


def get_json(url: str, auth: Auth | None = None) -> Any:
    headers = {"Authorization": f"Bearer {auth.token}"} if auth else {}
    context = ssl.create_default_context(cafile=str(auth.ca)) if auth else None
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10, context=context) as r:
        return json.load(r)


def instant(base: str, query: str, auth: Auth | None = None) -> list[dict[str, Any]]:
    """An instant PromQL query's result list."""
    return list(get_json(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': query})}", auth)["data"]["result"])


def wait_for(what: str, probe: Callable[[], bool], alive: Callable[[], str | None], timeout_s: float = 90.0) -> None:
    """Poll until ``probe`` holds, while ``alive`` says nothing died (it returns why otherwise)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        dead = alive()
        if dead:
            raise AssertionError(f"{dead} while waiting for {what}")
        try:
            if probe():
                return
        except (OSError, urllib.error.URLError, ValueError, KeyError):
            pass
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def published(base: str, metric: str, age_s: int = 12, auth: Auth | None = None) -> bool:
    """Whether ``metric`` has had samples for ``age_s`` seconds: the page's 15-minute grid has 10 s
    steps and ends on a whole step, so a sample from the last seconds is not drawn yet, and a few
    steps of decisions make a line one can see in the screenshot."""
    return bool(instant(base, f"{metric} offset {age_s}s", auth))


def screenshot_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    return tmp_path_factory.mktemp(name)


def save(page: Any, directory: Path, name: str, clip: dict[str, float] | None = None) -> Path:
    """A full-page screenshot (or the ``clip`` of it) in ``directory``, copied to
    $METRICSD_SCREENSHOTS when it is set."""
    path = directory / name
    page.screenshot(path=str(path), full_page=True, clip=clip)
    keep = os.environ.get(KEEP_ENV)
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / name)
    print(f"dashboard screenshot: {path}" + (f" (kept in {keep})" if keep else ""))
    return path


@dataclass
class Chart:
    state: str
    hidden: bool
    series: dict[str, int]
    note: str

    def points(self, label: str) -> int:
        return self.series.get(label, 0)


@dataclass
class View:
    charts: dict[str, Chart]
    summary: str
    problems: list[str]

    def pixels(self, page: Any, chart_id: str, rgb: tuple[int, int, int]) -> dict[str, Any]:
        return dict(page.evaluate(_COUNT_PIXELS, [chart_id, list(rgb)]))


def spki_sha256(cert: Path) -> str:
    """base64 of the SHA-256 of a certificate's public key, as Chromium's
    --ignore-certificate-errors-spki-list takes it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    key = x509.load_pem_x509_certificate(cert.read_bytes()).public_key()
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


@contextmanager
def chromium_page(problems: list[str], trust: Path | None = None) -> Iterator[Any]:
    """A 1400x1000 page in headless Chromium that records page errors, console errors and failed
    requests into ``problems``. ``trust``: a server certificate (a throw-away CA's) that Chromium
    accepts by its public key; any other certificate error still fails."""
    from playwright.sync_api import sync_playwright

    args = CHROMIUM_ARGS + ([f"--ignore-certificate-errors-spki-list={spki_sha256(trust)}"] if trust else [])
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=args)
        try:
            # (a context of its own, so that a test may open a second tab in it: page.context.new_page())
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            yield page
        finally:
            browser.close()


def _read(page: Any, ids: tuple[str, ...], problems: list[str]) -> View:
    charts = {}
    for chart_id in ids:
        fig = page.query_selector(f"#{chart_id}")
        assert fig is not None, chart_id
        charts[chart_id] = Chart(fig.get_attribute("data-state") or "", fig.get_attribute("hidden") is not None,
                                 json.loads(fig.get_attribute("data-series") or "{}"),
                                 page.inner_text(f"#{chart_id} .note") if page.query_selector(f"#{chart_id} .note")
                                 else "")
    return View(charts, page.inner_text("#summary"), list(problems))


# What Chromium logs for each API call a server refuses before the page has a token.
REFUSED = re.compile(r"^console error: Failed to load resource: the server responded with a status of 40[13]\b")


def wait_for_token_form(page: Any, auth: str) -> str:
    """Wait until the page asks for a token with <body data-auth> ``auth``; its message."""
    page.wait_for_function(f"() => document.body.dataset.auth === '{auth}'", timeout=60_000)
    assert page.is_visible("#auth") and page.is_hidden("#content")
    return str(page.inner_text("#auth-message"))


def enter_token(page: Any, token: str, problems: list[str]) -> None:
    """Type a token into the page's form and send it, as a user does; the refusals the page met
    while it had no good token (Chromium logs each as a console error) are checked and dropped."""
    assert all(REFUSED.match(p) for p in problems), problems
    problems.clear()
    page.fill("#token", token)
    page.click("#auth-form button[type=submit]")


def open_page(page: Any, base: str, range_s: int = 900, token: str | None = None,
              problems: list[str] | None = None) -> None:
    """The page as a user opens it (with ``token``: asked for one, entering it); then the shortest
    range, where minutes of decisions are visible."""
    page.goto(base + "/")
    if token is not None:
        wait_for_token_form(page, "needed")
        enter_token(page, token, problems if problems is not None else [])
    page.wait_for_function("() => document.body.dataset.loaded !== ''", timeout=60_000)
    page.select_option("#range", str(range_s))
    page.wait_for_function("() => document.body.dataset.loaded !== ''", timeout=60_000)


def _wait_loaded(page: Any, loaded: str, problems: list[str], timeout_ms: int = 90_000) -> None:
    """Wait for <body data-loaded> to say ``loaded``; on a timeout, say what the page showed."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(f"() => document.body.dataset.loaded === '{loaded}'", timeout=timeout_ms)
    except PlaywrightTimeout:
        states = page.evaluate(
            "() => [...document.querySelectorAll('figure.chart')].map(f => `${f.id}: ${f.dataset.state}`)")
        shown = page.evaluate("document.body.dataset.loaded")
        raise AssertionError(f"the page never showed {loaded!r}: data-loaded={shown!r}, status "
                             f"{page.inner_text('#status')!r}, charts {states}, problems {problems}") from None


def workload_view(page: Any, namespace: str, workload: str, problems: list[str]) -> View:
    """Pick a namespace and workload as a user would and wait until everything is drawn."""
    page.click("#tab-workload")
    page.select_option("#namespace", namespace)
    page.wait_for_function(
        f"() => [...document.querySelectorAll('#workload option')].some(o => o.value === '{workload}')")
    page.select_option("#workload", workload)
    _wait_loaded(page, f"{namespace}/{workload}", problems)
    return _read(page, WORKLOAD_CHARTS, problems)


def cluster_view(page: Any, problems: list[str]) -> View:
    page.click("#tab-cluster")
    _wait_loaded(page, "cluster", problems)
    return _read(page, CLUSTER_CHARTS, problems)


def words_in_the_page(page: Any) -> dict[str, list[str]]:
    """The page's words.js run on the shared cases (tests/consumers/data/wording_cases.json)."""
    cases = json.loads(WORDING_CASES.read_text())
    return dict(page.evaluate("""async (cases) => {
      const w = await import(new URL("static/words.js", document.baseURI).href);
      return {
        amount: cases.amount.map((c) => w.amountWords(c.value, c.resource)),
        line: cases.status_line.map((c) => w.statusLine(c.current, c.desired, c.min, c.max, c.why)),
        reclaim: cases.amount.map((c) => w.reclaimableWords({ [c.resource]: c.value })),
      };
    }""", cases))


def expected_words() -> dict[str, list[str]]:
    from metricsd.consumers.wording import amount_words, hpa_status_line, reclaimable_words

    cases = json.loads(WORDING_CASES.read_text())
    return {
        "amount": [amount_words(c["value"], c["resource"]) for c in cases["amount"]],
        "line": [hpa_status_line(c["current"], c["desired"], c["min"], c["max"], c["why"])
                 for c in cases["status_line"]],
        "reclaim": [reclaimable_words({c["resource"]: c["value"]}) for c in cases["amount"]],
    }


def assert_cluster_view_drawn(view: View, pixels: dict[str, dict[str, Any]]) -> None:
    """Every chart of the cluster view ready and coloured; nodes online; capacity, requested, used and
    reclaimable drawn for cores and bytes (on `metricsd up` and on a cluster alike)."""
    for chart_id, chart in view.charts.items():
        assert chart.state == "ready" and not chart.hidden, (chart_id, chart)
        assert pixels[chart_id]["colour"] > 50, (chart_id, pixels[chart_id])
    assert view.charts["chart-nodes"].points("online") > 0
    for chart_id in ("chart-cores", "chart-bytes"):
        for label in ("capacity", "requested", "used", "reclaimable"):
            assert view.charts[chart_id].points(label) > 0, (chart_id, label, view.charts[chart_id])
