"""Kubernetes ServiceAccount tokens, checked by the API server's TokenReview.

Inside a cluster a pod's projected ServiceAccount token is its identity; metricsd asks the API
server whether a bearer token is valid (``POST /apis/authentication.k8s.io/v1/tokenreviews``, with
its own ServiceAccount token) and maps the user name or a group to roles, e.g.
``system:serviceaccount:metricsd:agent=write``. Answers are cached for ``cache_ttl_s`` (positive
and negative alike) so a request costs one review per token and minute, not per request; the
cache holds at most ``cache_size`` tokens (by hash).
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp

from metricsd.security.tls import ClientTLS
from metricsd.security.tokens import Identity, Role, hash_token, parse_roles

__all__ = ["SA_DIR", "TokenReview", "TokenReviewError", "parse_role_bindings"]

log = logging.getLogger("metricsd.security")

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
PATH = "/apis/authentication.k8s.io/v1/tokenreviews"


class TokenReviewError(RuntimeError):
    """The API server could not be asked (unreachable, an error status): the request is refused
    as unauthenticated, never let through."""


def parse_role_bindings(specs: list[str]) -> dict[str, frozenset[Role]]:
    """``NAME=ROLE[,ROLE]`` per entry (a user name or a group) -> roles. Raises ValueError."""
    out: dict[str, frozenset[Role]] = {}
    for spec in specs:
        name, sep, roles = spec.partition("=")
        if not sep or not name:
            raise ValueError(f"--tokenreview-role {spec!r}: expected USER_OR_GROUP=ROLE[,ROLE]")
        out[name] = out.get(name, frozenset()) | parse_roles(roles)
    return out


class TokenReview:
    def __init__(self, api_url: str, bindings: Mapping[str, frozenset[Role]], *, own_token: Path = SA_DIR / "token",
                 tls: ClientTLS | None = None, timeout_s: float = 5.0, cache_ttl_s: float = 60.0,
                 cache_size: int = 10_000, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.url = api_url.rstrip("/") + PATH
        self.bindings = dict(bindings)
        self.own_token = own_token
        self.tls = tls
        self.timeout_s = timeout_s
        self.cache_ttl_s = cache_ttl_s
        self.cache_size = cache_size
        self.monotonic = monotonic
        self._cache: OrderedDict[str, tuple[float, Identity | None]] = OrderedDict()
        self._session: aiohttp.ClientSession | None = None
        self.reviews = 0

    @classmethod
    def in_cluster(cls, bindings: Mapping[str, frozenset[Role]]) -> TokenReview:
        """The API server as a pod sees it (KUBERNETES_SERVICE_HOST / _PORT, the mounted CA)."""
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise ValueError("TokenReview needs KUBERNETES_SERVICE_HOST (run in a pod) or --tokenreview-url")
        return cls(f"https://{host}:{port}", bindings, tls=ClientTLS(ca=SA_DIR / "ca.crt"))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def identity_of(self, status: Mapping[str, Any]) -> Identity | None:
        """The identity a TokenReview status describes; None when not authenticated."""
        if not status.get("authenticated"):
            return None
        user = status.get("user") or {}
        name = str(user.get("username", ""))
        roles: frozenset[Role] = self.bindings.get(name, frozenset())
        for group in user.get("groups") or []:
            roles |= self.bindings.get(str(group), frozenset())
        return Identity(name or "?", roles, source="tokenreview")

    async def identify(self, token: str) -> Identity | None:
        key = hash_token(token)
        now = self.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        identity = self.identity_of(await self._review(token))
        self._cache[key] = (now + self.cache_ttl_s, identity)
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return identity

    async def _review(self, token: str) -> Mapping[str, Any]:
        if self._session is None:
            ssl = self.tls.ssl_context() if self.tls is not None else None
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                                  connector=aiohttp.TCPConnector(ssl=ssl) if ssl else None)
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        try:
            own = self.own_token.read_text().strip()
        except OSError as e:
            raise TokenReviewError(f"cannot read metricsd's own ServiceAccount token {self.own_token}: {e}") from e
        self.reviews += 1
        try:
            async with self._session.post(self.url, json=body, headers={"Authorization": f"Bearer {own}"}) as resp:
                if resp.status != 201 and resp.status != 200:
                    raise TokenReviewError(f"TokenReview answered HTTP {resp.status}: {(await resp.text())[:200]}")
                doc = await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise TokenReviewError(f"TokenReview at {self.url} failed: {e}") from e
        status = doc.get("status") if isinstance(doc, dict) else None
        if not isinstance(status, dict):
            raise TokenReviewError("TokenReview answer has no status")
        return status
