"""What a process presents as a client and enforces as a server; built from flags in
metricsd/cmd/security.py and passed into every server and channel it opens."""

from __future__ import annotations

from dataclasses import dataclass

from metricsd.security.auth import Authenticator
from metricsd.security.tls import ClientTLS, ServerTLS

__all__ = ["ClientSecurity", "ServerSecurity"]


@dataclass(frozen=True)
class ClientSecurity:
    """TLS to use towards other metricsd processes (None: plaintext) and the bearer token to send
    (None: none)."""

    tls: ClientTLS | None = None
    token: str | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


@dataclass(frozen=True)
class ServerSecurity:
    """TLS a listener serves (None: plaintext) and the authenticator it enforces (None: anyone)."""

    tls: ServerTLS | None = None
    auth: Authenticator | None = None

    @property
    def secure(self) -> bool:
        return self.tls is not None and self.auth is not None
