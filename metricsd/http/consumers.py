"""GET /api/v1/metricsd/{hpa,vpa,overcommit,colocation}: the consumers' status and decision history.

The HTTP layer knows nothing of the controllers: it is handed a function from a consumer's kind
to its JSON document, and answers 404 for a consumer that is not running.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

__all__ = ["CONSUMER_KINDS", "add_consumer_routes"]

CONSUMER_KINDS = ("hpa", "vpa", "overcommit", "colocation")

DocumentProvider = Callable[[str], dict[str, Any]]


def add_consumer_routes(app: web.Application, documents: DocumentProvider) -> None:
    async def handle(request: web.Request) -> web.Response:
        kind = request.match_info["kind"]
        try:
            doc = documents(kind)
        except KeyError:
            return web.json_response({"status": "error", "error": f"consumer {kind!r} is not running here"},
                                     status=404)
        return web.json_response(doc)

    for kind in CONSUMER_KINDS:
        app.router.add_get(f"/api/v1/metricsd/{{kind:{kind}}}", handle)
