"""TLS from files: clear errors for bad files, and a rotated certificate served to new
connections without a restart (real HTTPS server on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from metricsd.ports import free_port
from metricsd.security.certs import LocalPKI, issue_certificate
from metricsd.security.tls import ClientTLS, ServerTLS, TLSError


def test_missing_and_mismatched_files_are_refused_naming_them(pki: LocalPKI, tmp_path: Path) -> None:
    with pytest.raises(TLSError, match=r"cannot read the TLS certificate .*nope.crt"):
        ServerTLS(tmp_path / "nope.crt", pki.key)
    with pytest.raises(TLSError, match="do not load"):
        ServerTLS(pki.cert, pki.ca_key)  # a key that is not the certificate's
    with pytest.raises(TLSError, match="a client certificate needs its key"):
        ClientTLS(ca=pki.ca, cert=pki.cert)


async def _serial_seen(port: int, ca: Path) -> int:
    ctx = ssl.create_default_context(cafile=str(ca))
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return x509.load_der_x509_certificate(der).serial_number


async def test_a_rotated_certificate_is_served_to_new_connections(pki: LocalPKI, tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(pki.cert, cert)
    shutil.copy(pki.key, key)
    tls = ServerTLS(cert, key)
    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=tls.ssl_context()).start()
    try:
        first = await _serial_seen(port, pki.ca)
        ca_cert = x509.load_pem_x509_certificate(pki.ca.read_bytes())
        ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), None)
        issue_certificate(ca_cert, ca_key, "metricsd", ["127.0.0.1"], cert, key)  # type: ignore[arg-type]
        os.utime(cert, (os.stat(cert).st_mtime + 5,) * 2)
        watcher = asyncio.create_task(tls.watch(every_s=0.05))
        for _ in range(100):
            if tls.reloads:
                break
            await asyncio.sleep(0.05)
        watcher.cancel()
        second = await _serial_seen(port, pki.ca)
        assert second != first and tls.reloads == 1
        assert await _serial_seen(port, pki.ca) == second  # no reload without a change
    finally:
        await runner.cleanup()
