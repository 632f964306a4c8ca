"""TLS and tokens for a cluster on one machine (``metricsd cluster up``, ``metricsd chaos``):
a throw-away CA, one certificate every component serves and presents (mutual TLS), and a token
per role, written under ``<data-dir>/security/``::

    ca.crt, metricsd.crt, metricsd.key    the CA and the components' certificate
    tokens                                the token file every server reads (hashes only)
    ops.token      admin                  for you: metricsd query / cluster status / curl
    store.token    admin                  stores, towards their peers (CatchUp, Digest)
    proxy.token    read,write             proxies, towards the stores
    agent.token    write                  the simulated agent, towards the proxies
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from metricsd.security.settings import ClientSecurity
from metricsd.security.tls import ClientTLS
from metricsd.security.tokens import hash_token, new_token

__all__ = ["ROLES", "LocalSecurity"]

ROLES = {"ops": "admin", "store": "admin", "proxy": "read,write", "agent": "write"}


@dataclass(frozen=True)
class LocalSecurity:
    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def cert(self) -> Path:
        return self.dir / "metricsd.crt"

    @property
    def key(self) -> Path:
        return self.dir / "metricsd.key"

    @property
    def tokens(self) -> Path:
        return self.dir / "tokens"

    def token_file(self, name: str) -> Path:
        return self.dir / f"{name}.token"

    def create(self) -> LocalSecurity:
        """Make the CA, the certificate and a token per role (files readable by the owner only)."""
        from metricsd.security.certs import create_local_pki  # cryptography: 8 MiB, only for this

        create_local_pki(self.dir)
        lines = []
        for name, roles in ROLES.items():
            token = new_token()
            path = self.token_file(name)
            path.write_text(token + "\n")
            os.chmod(path, 0o600)
            lines.append(f"{name} {roles} {hash_token(token)}\n")
        self.tokens.write_text("# metricsd cluster up: name roles sha256 of the token\n" + "".join(lines))
        return self

    def tls_args(self) -> tuple[str, ...]:
        return ("--tls-cert", str(self.cert), "--tls-key", str(self.key))

    def server_args(self) -> tuple[str, ...]:
        return (*self.tls_args(), "--tls-client-ca", str(self.ca), "--tokens-file", str(self.tokens))

    def client_args(self, name: str) -> tuple[str, ...]:
        return ("--tls-ca", str(self.ca), "--auth-token-file", str(self.token_file(name)))

    def client(self, name: str) -> ClientSecurity:
        """For clients inside this process (chaos' writers and checkers)."""
        return ClientSecurity(ClientTLS(self.ca, self.cert, self.key), self.token_file(name).read_text().strip())
