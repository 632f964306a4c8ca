"""A real `metricsd store` process with TLS and tokens: its data port refuses plaintext and
anonymous calls, its --health-port answers Kubernetes-style plaintext probes and nothing else,
and it stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from metricsd.cluster.etcd_server import free_port
from metricsd.rpc.client import MetricsClient
from metricsd.rpc.health import HEALTH_SERVICE, SERVING, encode_check_response
from metricsd.security.certs import LocalPKI
from metricsd.security.settings import ClientSecurity
from metricsd.security.tls import ClientTLS
from metricsd.security.tokens import hash_token

pytestmark = pytest.mark.slow



async def test_a_secure_store_serves_probes_in_plaintext_and_data_only_over_tls_with_a_token(
        pki: LocalPKI, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"graf read {hash_token('r')}\n")
    port, health = free_port(), free_port()
    log = open(tmp_path / "store.log", "w")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "metricsd", "store", "--grpc-port", str(port),
                             "--health-port", str(health), "--tls-cert", str(pki.cert), "--tls-key", str(pki.key),
                             "--tokens-file", str(tokens)], stdout=subprocess.PIPE,
                            stderr=log, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the banner, after both ports listen (or "" if it exited)
        assert "serving gRPC" in line, (tmp_path / "store.log").read_text()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{health}") as ch:
            check = ch.unary_unary(f"/{HEALTH_SERVICE}/Check", None, None)
            assert await check(b"\x0a\x08liveness", timeout=5) == encode_check_response(SERVING)
            with pytest.raises(grpc.aio.AioRpcError) as e:  # the probe port serves nothing else
                await ch.unary_unary("/metricsd.v1.Metrics/Stats", None, None)(b"", timeout=5)
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        tls = ClientTLS(pki.ca)
        async with MetricsClient(f"127.0.0.1:{port}", 5.0, ClientSecurity(tls, None)) as anonymous:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await anonymous.stats()
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        async with MetricsClient(f"127.0.0.1:{port}", 5.0, ClientSecurity(tls, "r")) as graf:
            assert (await graf.stats()).series == 0
        async with MetricsClient(f"127.0.0.1:{port}", 3.0, ClientSecurity(None, "r")) as plain:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await plain.health()
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        log.close()
