"""TokenReview against a local stand-in for the API server's HTTP endpoint (only the HTTP call is
stood in for; metricsd's own code runs for real): request shape, role bindings, the cache, and
that an unreachable API server refuses rather than lets through."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from metricsd.ports import free_port
from metricsd.security.auth import Authenticator, Unauthenticated
from metricsd.security.tokenreview import TokenReview, TokenReviewError, parse_role_bindings
from metricsd.security.tokens import Role


class ApiServer:
    """Answers POST /apis/authentication.k8s.io/v1/tokenreviews as Kubernetes does, from a table."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.users = {"agent-token": ("system:serviceaccount:metricsd:agent", ["system:serviceaccounts"]),
                      "graf-token": ("grafana", ["dashboards"])}

    async def review(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append((request.headers.get("Authorization", ""), body))
        user = self.users.get(body["spec"]["token"])
        status: dict[str, Any] = {"authenticated": False}
        if user is not None:
            status = {"authenticated": True, "user": {"username": user[0], "groups": user[1]}}
        return web.json_response({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                                  "status": status}, status=201)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[ApiServer, str]]:
    server = ApiServer()
    app = web.Application()
    app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", server.review)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield server, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_a_review_maps_users_and_groups_to_roles_and_is_cached(api: tuple[ApiServer, str],
                                                                     tmp_path: Path) -> None:
    server, url = api
    own = tmp_path / "sa-token"
    own.write_text("metricsd-own-token\n")
    bindings = parse_role_bindings(["system:serviceaccount:metricsd:agent=write", "dashboards=read"])
    now = [0.0]
    review = TokenReview(url, bindings, own_token=own, monotonic=lambda: now[0], cache_ttl_s=60)
    try:
        agent = await review.identify("agent-token")
        assert agent is not None and agent.roles == {Role.WRITE} and agent.source == "tokenreview"
        graf = await review.identify("graf-token")
        assert graf is not None and graf.name == "grafana" and graf.roles == {Role.READ}
        assert await review.identify("stolen") is None
        header, body = server.requests[0]
        assert header == "Bearer metricsd-own-token"
        assert body == {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                        "spec": {"token": "agent-token"}}
        await review.identify("agent-token")
        assert len(server.requests) == 3  # cached
        now[0] = 61.0
        await review.identify("agent-token")
        assert len(server.requests) == 4  # expired, asked again
    finally:
        await review.close()


async def test_an_unreachable_api_server_refuses_the_request(tmp_path: Path) -> None:
    own = tmp_path / "sa-token"
    own.write_text("x")
    review = TokenReview(f"http://127.0.0.1:{free_port()}", {}, own_token=own, timeout_s=2.0)
    try:
        with pytest.raises(TokenReviewError):
            await review.identify("anything")
        with pytest.raises(Unauthenticated, match="TokenReview unavailable"):
            await Authenticator(review=review).identify("Bearer anything")
    finally:
        await review.close()


def test_role_bindings_parse_or_say_why() -> None:
    assert parse_role_bindings(["g=read,write"]) == {"g": frozenset({Role.READ, Role.WRITE})}
    with pytest.raises(ValueError, match="expected USER_OR_GROUP=ROLE"):
        parse_role_bindings(["justaname"])
