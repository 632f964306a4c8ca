"""The dashboard page at ``/``: static files that read the JSON APIs from the browser.

Everything the page needs ships in the package under ``static/``: the page, its script and style,
and the charting library (uPlot) in ``static/vendor/``, copied there from npm by
``make dashboard-assets`` (web/dashboard.mk). Nothing is fetched from another origin, and the
Content-Security-Policy header tells the browser to keep it that way.
"""

from __future__ import annotations

import logging
from pathlib import Path

from aiohttp import web

__all__ = ["STATIC_DIR", "VENDOR_FILES", "add_dashboard_routes"]

log = logging.getLogger("metricsd.http.dashboard")

STATIC_DIR = Path(__file__).resolve().parent / "static"
VENDOR_FILES = ("vendor/uPlot.iife.min.js", "vendor/uPlot.min.css")

# uPlot sizes its elements through style attributes, hence 'unsafe-inline' for styles only;
# scripts, data and fonts must come from this server.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'self'; frame-ancestors 'none'"
)


def add_dashboard_routes(app: web.Application, static_dir: Path = STATIC_DIR) -> None:
    """Serve ``index.html`` at ``/`` and the rest of ``static_dir`` under ``/static/``.

    A missing vendor file is logged, not raised: the JSON APIs are still worth serving when a
    source checkout has not run ``make dashboard-assets`` yet.
    """
    missing = [f for f in VENDOR_FILES if not (static_dir / f).is_file()]
    if missing:
        log.warning("dashboard: %s missing under %s; run `make dashboard-assets`", ", ".join(missing), static_dir)
    index = static_dir / "index.html"

    async def page(request: web.Request) -> web.StreamResponse:
        resp = web.FileResponse(index, headers={
            "Content-Type": "text/html; charset=utf-8",
            "Cache-Control": "no-cache",
            "Content-Security-Policy": CONTENT_SECURITY_POLICY,
            "X-Content-Type-Options": "nosniff",
        })
        return resp

    app.router.add_get("/", page)
    app.router.add_static("/static/", static_dir, name="static", append_version=False)
