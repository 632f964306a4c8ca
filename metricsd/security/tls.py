"""TLS from PEM files, for servers and for the clients inside metricsd.

Certificates rotate (cert-manager renews them in place), so servers re-read their files when they
change: gRPC asks :meth:`ServerTLS.grpc_config` on every new connection (gRPC's dynamic
credentials); an HTTP server's SSLContext reloads from its SNI callback (every handshake of a
client that sends a server name) and from :meth:`ServerTLS.watch`, which checks every few seconds
(clients dialling an IP send no name). Both only ``stat`` the files unless their modification time
changed. Connections already open keep the certificate they started with.

Mutual TLS: a server given ``client_ca`` requires every client to present a certificate signed by
it; a client given ``cert`` and ``key`` presents them. An HTTP listener that checks a bearer token
on every data route may ask for the certificate without requiring it (``require_http_client_cert``
False): a browser or Grafana has no client certificate, and the token is what admits it there.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

__all__ = ["ClientTLS", "ServerTLS", "TLSError"]

log = logging.getLogger("metricsd.security")


class TLSError(ValueError):
    """A certificate or key file that cannot be read or does not load; the message names it."""


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise TLSError(f"cannot read the {what} {path}: {e.strerror or e}") from e


def _mtime(paths: tuple[Path, ...]) -> tuple[float, ...]:
    out = []
    for p in paths:
        try:
            out.append(p.stat().st_mtime)
        except OSError:
            out.append(-1.0)
    return tuple(out)


@dataclass(frozen=True)
class _Files:
    cert: bytes
    key: bytes
    ca: bytes | None


class ServerTLS:
    """A server's certificate and key, optionally a CA that client certificates must chain to.

    Raises TLSError at construction when a file is missing or does not load, so a process refuses
    to start rather than serve without the TLS it was asked for.

    ``require_http_client_cert`` False (HTTP only; gRPC always requires one with ``client_ca``): an
    HTTP client may connect without a certificate; one that presents a certificate must still chain
    to ``client_ca``, or the handshake fails.
    """

    def __init__(self, cert: Path, key: Path, client_ca: Path | None = None, *,
                 require_http_client_cert: bool = True) -> None:
        self.cert, self.key, self.client_ca = Path(cert), Path(key), Path(client_ca) if client_ca else None
        self.require_http_client_cert = require_http_client_cert
        self._paths = tuple(p for p in (self.cert, self.key, self.client_ca) if p is not None)
        self._lock = threading.Lock()
        self._files = self._load()
        self._stamp = _mtime(self._paths)
        self._contexts: list[ssl.SSLContext] = []
        self.reloads = 0
        self._check_with_ssl(self._files)

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None

    def _load(self) -> _Files:
        return _Files(_read(self.cert, "TLS certificate"), _read(self.key, "TLS key"),
                      _read(self.client_ca, "client CA") if self.client_ca else None)

    def _check_with_ssl(self, files: _Files) -> None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            ctx.load_cert_chain(self.cert, self.key)
            if self.client_ca is not None:
                ctx.load_verify_locations(cafile=str(self.client_ca))
        except (ssl.SSLError, OSError) as e:
            raise TLSError(f"TLS certificate {self.cert} / key {self.key} do not load: {e}") from e

    def _changed(self) -> _Files | None:
        """The files' new contents when their modification times moved and they load; else None."""
        stamp = _mtime(self._paths)
        if stamp == self._stamp:
            return None
        with self._lock:
            if stamp == self._stamp:
                return None
            try:
                files = self._load()
                self._check_with_ssl(files)
            except TLSError as e:
                log.warning("TLS files changed but do not load (keeping the old ones): %s", e)
                self._stamp = stamp
                return None
            self._files, self._stamp = files, stamp
            self.reloads += 1
            log.info("TLS certificate %s reloaded", self.cert)
            return files

    # --- gRPC -------------------------------------------------------------------------------

    def _grpc_config(self, files: _Files) -> Any:
        return grpc.ssl_server_certificate_configuration([(files.key, files.cert)], root_certificates=files.ca)

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Dynamic credentials: gRPC calls back on each new connection, and gets the files anew
        when they changed."""

        def fetch() -> Any:
            files = self._changed()
            return None if files is None else self._grpc_config(files)

        return grpc.dynamic_ssl_server_credentials(self._grpc_config(self._files), fetch,
                                                   require_client_authentication=self.mutual)

    # --- HTTP -------------------------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        """An SSLContext for an HTTP server (TLS 1.2 at least) that reloads on change."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        if self.client_ca is not None:
            ctx.load_verify_locations(cafile=str(self.client_ca))
            ctx.verify_mode = ssl.CERT_REQUIRED if self.require_http_client_cert else ssl.CERT_OPTIONAL
        self._contexts.append(ctx)

        def on_handshake(sock: ssl.SSLObject, name: str | None, context: ssl.SSLContext) -> None:
            if self._changed() is not None:
                self._reload_contexts()

        ctx.sni_callback = on_handshake
        return ctx

    def _reload_contexts(self) -> None:
        for c in self._contexts:
            c.load_cert_chain(self.cert, self.key)
            if self.client_ca is not None:
                c.load_verify_locations(cafile=str(self.client_ca))

    async def watch(self, every_s: float = 5.0) -> None:
        """Reload the HTTP contexts when the files change; until cancelled."""
        while True:
            await asyncio.sleep(every_s)
            if self._changed() is not None:
                self._reload_contexts()


@dataclass(frozen=True)
class ClientTLS:
    """What a client inside metricsd trusts (``ca``; None: the system's roots) and, for mutual
    TLS, the certificate it presents. ``server_name`` overrides the name checked against the
    server's certificate (for addresses that are IPs not in it)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise TLSError("a client certificate needs its key, and a key its certificate")

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, "TLS CA") if self.ca else None,
            private_key=_read(self.key, "TLS client key") if self.key else None,
            certificate_chain=_read(self.cert, "TLS client certificate") if self.cert else None,
        )

    def grpc_options(self) -> list[tuple[str, Any]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca) if self.ca else None)
        if self.cert is not None and self.key is not None:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx
