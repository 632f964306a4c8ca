"""The dashboard's static files: served at / and /static/ with the right types, and self-contained."""

from __future__ import annotations

import logging
import re
from html.parser import HTMLParser
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from http_fixtures import Env

from metricsd.http.dashboard import STATIC_DIR, VENDOR_FILES, add_dashboard_routes

EXPECTED_TYPES = {".js": ("application/javascript", "text/javascript"), ".css": ("text/css",)}


class _Refs(HTMLParser):
    """Every URL the page would load: src/href attributes of any tag."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value is not None:
                self.refs.append((tag, name, value))


def _refs(html: str) -> list[tuple[str, str, str]]:
    p = _Refs()
    p.feed(html)
    return p.refs


async def test_index_is_served_at_root_as_html_with_a_same_origin_policy(env: Env) -> None:
    async with env.session.get(env.url + "/") as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == "text/html; charset=utf-8"
        csp = r.headers["Content-Security-Policy"]
        html = await r.text()
    assert "default-src 'self'" in csp and "script-src 'self'" in csp
    assert "<title>metricsd</title>" in html
    for chart in ("chart-cpu", "chart-memory", "chart-utilisation", "chart-replicas", "chart-vpa-cpu",
                  "chart-vpa-memory", "chart-nodes", "chart-hours", "chart-cores", "chart-bytes"):
        assert f'id="{chart}"' in html


async def test_index_references_only_local_assets_and_each_is_served_with_its_type(env: Env) -> None:
    async with env.session.get(env.url + "/") as r:
        refs = _refs(await r.text())
    scripts = [v for tag, _, v in refs if tag == "script"]
    styles = [v for tag, name, v in refs if tag == "link" and v.endswith(".css")]
    assert "static/vendor/uPlot.iife.min.js" in scripts and "static/app.js" in scripts
    assert "static/vendor/uPlot.min.css" in styles and "static/style.css" in styles
    for _, _, value in refs:
        assert not re.match(r"^(https?:)?//", value, re.IGNORECASE), f"{value} is not a local asset"
    # the page's own modules, imported by app.js rather than named in the page
    modules = [f"static/{p.name}" for p in sorted(STATIC_DIR.glob("*.js"))]
    assert {"static/app.js", "static/words.js", "static/charts.js", "static/data.js"} <= set(modules)
    for value in scripts + styles + modules:
        async with env.session.get(f"{env.url}/{value}") as r:
            assert r.status == 200, value
            suffix = Path(value).suffix
            assert r.content_type in EXPECTED_TYPES[suffix], (value, r.content_type)
            assert len(await r.read()) > 0


@pytest.mark.parametrize("name", sorted(p.name for p in STATIC_DIR.iterdir() if p.is_file()))
def test_static_sources_name_no_other_origin(name: str) -> None:
    text = (STATIC_DIR / name).read_text(encoding="utf-8")
    assert not re.search(r"""["'(]\s*(https?:)?//""", text, re.IGNORECASE), f"{name} loads from another origin"


def test_vendor_files_are_in_the_package() -> None:
    for f in VENDOR_FILES:
        path = STATIC_DIR / f
        assert path.is_file() and path.stat().st_size > 1000, f"{path} missing: run `make dashboard-assets`"
    assert "uPlot" in (STATIC_DIR / "vendor" / "uPlot.iife.min.js").read_text(encoding="utf-8")[:4000]


async def test_unknown_static_paths_and_traversal_are_refused(env: Env) -> None:
    async with env.session.get(env.url + "/static/nothing-here.js") as r:
        assert r.status == 404
    raw = env.url + "/static/%2e%2e/server.py"
    async with env.session.get(aiohttp.client.URL(raw, encoded=True)) as r:
        assert r.status in (403, 404)
        assert "build_app" not in await r.text()


async def test_missing_vendor_files_are_logged_and_the_page_still_served(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, aiohttp_free_app: web.Application) -> None:
    (tmp_path / "index.html").write_text("<!doctype html><title>x</title>", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="metricsd.http.dashboard"):
        add_dashboard_routes(aiohttp_free_app, tmp_path)
    assert "vendor/uPlot.iife.min.js" in caplog.text and "make dashboard-assets" in caplog.text
    assert any(r.resource is not None and r.resource.canonical == "/" for r in aiohttp_free_app.router.routes())


@pytest.fixture
def aiohttp_free_app() -> web.Application:
    return web.Application()
