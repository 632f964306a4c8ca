"""What a process presents as a client and enforces as a server; built from flags in
metricsd/cmd/security.py and passed into every server and channel it opens."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from metricsd.security.auth import Authenticator
from metricsd.security.tls import ClientTLS, ServerTLS

__all__ = ["ClientSecurity", "ServerSecurity"]


class TokenSource:
    """A bearer token read from a file and read again when it changes (checked at most every
    ``check_every_s``): Kubernetes rotates projected ServiceAccount tokens in place. A file that
    cannot be read keeps the last token (and, before any, sends none: the server says 401)."""

    def __init__(self, path: Path, check_every_s: float = 10.0) -> None:
        self.path = Path(path)
        self.check_every_s = check_every_s
        self._token: str | None = None
        self._mtime = -1.0
        self._checked = -1e18

    def get(self) -> str | None:
        now = time.monotonic()
        if now - self._checked >= self.check_every_s:
            self._checked = now
            try:
                mtime = self.path.stat().st_mtime
                if mtime != self._mtime:
                    self._token, self._mtime = self.path.read_text().strip() or None, mtime
            except OSError:
                pass
        return self._token


@dataclass(frozen=True)
class ClientSecurity:
    """TLS to use towards other metricsd processes (None: plaintext) and the bearer token to send:
    ``token`` itself, or read from ``token_file`` when it changes (None for both: none)."""

    tls: ClientTLS | None = None
    token: str | None = None
    token_file: Path | None = None
    _source: TokenSource | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.token_file is not None:
            object.__setattr__(self, "_source", TokenSource(self.token_file))

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    @property
    def sends_token(self) -> bool:
        return self.token is not None or self.token_file is not None

    def bearer(self) -> str | None:
        """The token to send now."""
        return self._source.get() if self._source is not None else self.token

    def headers(self) -> dict[str, str]:
        token = self.bearer()
        return {"Authorization": f"Bearer {token}"} if token else {}


@dataclass(frozen=True)
class ServerSecurity:
    """TLS a listener serves (None: plaintext) and the authenticator it enforces (None: anyone)."""

    tls: ServerTLS | None = None
    auth: Authenticator | None = None

    @property
    def secure(self) -> bool:
        return self.tls is not None and self.auth is not None
