"""Authenticate a bearer token and authorise a role: the one decision the gRPC interceptor and
the HTTP middleware share, so both answer alike and log every denial the same way."""

from __future__ import annotations

import logging

from metricsd.security.tokenreview import TokenReview, TokenReviewError
from metricsd.security.tokens import Identity, Role, TokenFile, hash_token, new_token

__all__ = ["Authenticator", "PermissionDenied", "Unauthenticated"]

log = logging.getLogger("metricsd.security")


class Unauthenticated(Exception):
    """No token, a malformed header, or a token nobody holds (401 / UNAUTHENTICATED)."""


class PermissionDenied(Exception):
    """A known identity without the role the call needs (403 / PERMISSION_DENIED)."""


class Authenticator:
    """Tokens from a file and/or TokenReview; at least one must be given."""

    def __init__(self, tokens: TokenFile | None = None, review: TokenReview | None = None) -> None:
        if tokens is None and review is None:
            raise ValueError("an Authenticator needs a token file or TokenReview")
        self.tokens = tokens
        self.review = review
        self._internal: dict[str, Identity] = {}

    def issue_internal(self, name: str, roles: frozenset[Role]) -> str:
        """A token for this process's own clients (``metricsd up``'s simulated agent), held in
        memory only and gone with the process."""
        token = new_token()
        self._internal[hash_token(token)] = Identity(name, roles, source="internal")
        return token

    async def close(self) -> None:
        if self.review is not None:
            await self.review.close()

    async def identify(self, authorization: str | None) -> Identity:
        """The identity behind an ``Authorization: Bearer <token>`` header. Raises Unauthenticated."""
        if not authorization:
            raise Unauthenticated("no bearer token: send 'Authorization: Bearer <token>'")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("the Authorization header is not 'Bearer <token>'")
        identity = self._internal.get(hash_token(token)) if self._internal else None
        if identity is None and self.tokens is not None:
            identity = self.tokens.identify(token)
        if identity is None and self.review is not None:
            try:
                identity = await self.review.identify(token)
            except TokenReviewError as e:
                log.warning("TokenReview unavailable, refusing the request: %s", e)
                raise Unauthenticated("the token cannot be checked now (TokenReview unavailable)") from e
        if identity is None:
            raise Unauthenticated("unknown or expired token")
        return identity

    @staticmethod
    def authorize(identity: Identity, role: Role, what: str) -> None:
        """Raises PermissionDenied naming the identity, its roles and the role ``what`` needs."""
        if not identity.has(role):
            held = ", ".join(sorted(r.value for r in identity.roles)) or "none"
            raise PermissionDenied(f"{identity.name} (roles: {held}) may not call {what}: it needs role {role.value}")

    async def check(self, authorization: str | None, role: Role | None, what: str, peer: str) -> Identity | None:
        """identify + authorize, logging every denial and every admin call; None for open calls."""
        if role is None:
            return None
        try:
            identity = await self.identify(authorization)
            self.authorize(identity, role, what)
        except Unauthenticated as e:
            log.warning("denied %s from %s: unauthenticated: %s", what, peer, e)
            raise
        except PermissionDenied as e:
            log.warning("denied %s from %s: %s", what, peer, e)
            raise
        if role is Role.ADMIN:
            log.info("admin call %s by %s from %s", what, identity.name, peer)
        return identity
