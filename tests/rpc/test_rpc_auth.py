"""gRPC with TLS (mutual) and bearer tokens on a real server over a real store on 127.0.0.1:
UNAUTHENTICATED and PERMISSION_DENIED with the reason, open health checks, refused plaintext and
refused clients without a certificate, and a log line for every denial."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.client import MetricsClient
from metricsd.rpc.server import start_grpc_server
from metricsd.rpc.wire import labels_to_pb
from metricsd.security.auth import Authenticator
from metricsd.security.certs import LocalPKI
from metricsd.security.settings import ClientSecurity, ServerSecurity
from metricsd.security.tls import ClientTLS, ServerTLS
from metricsd.security.tokens import TokenFile, hash_token
from metricsd.store.api import StoreServicer
from metricsd.store.engine import Store

TOKENS = {"agent": ("write", "w-token"), "graf": ("read", "r-token")}


@pytest.fixture
async def server(pki: LocalPKI, tmp_path: Path) -> AsyncIterator[tuple[str, Store]]:
    tokens = tmp_path / "tokens"
    tokens.write_text("".join(f"{n} {role} {hash_token(t)}\n" for n, (role, t) in TOKENS.items()))
    store = Store()
    security = ServerSecurity(ServerTLS(pki.cert, pki.key, client_ca=pki.ca), Authenticator(TokenFile(tokens)))
    srv, port = await start_grpc_server(StoreServicer(store), "127.0.0.1", 0, security)
    yield f"127.0.0.1:{port}", store
    await srv.stop(None)


def client(addr: str, pki: LocalPKI, token: str | None, cert: bool = True) -> MetricsClient:
    tls = ClientTLS(pki.ca, pki.cert if cert else None, pki.key if cert else None)
    return MetricsClient(addr, timeout_s=5.0, security=ClientSecurity(tls, token))


def one_write() -> pb.WriteRequest:
    labels = make_labels("cpu", {"namespace": "ns", "pod": "p"})
    req = pb.WriteRequest(ids=[series_id(labels)], counts=[1], timestamps=[1000], values=[1.0])
    req.series.add(id=series_id(labels)).labels.extend(labels_to_pb(labels))
    return req


async def test_each_role_may_do_what_it_holds_and_nothing_else(server: tuple[str, Store], pki: LocalPKI,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    addr, store = server
    caplog.set_level(logging.INFO, "metricsd.security")
    async with client(addr, pki, None) as anonymous, client(addr, pki, "w-token") as agent, \
            client(addr, pki, "r-token") as graf:
        assert (await anonymous.health()).status == pb.HealthResponse.SERVING  # probes need no token
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await anonymous.write(one_write())
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert e.value.details() == "no bearer token: send 'Authorization: Bearer <token>'"
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await graf.write(one_write())
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert e.value.details() == ("graf (roles: read) may not call /metricsd.v1.Metrics/Write: "
                                     "it needs role write")
        assert store.stats()["samples"] == 0  # nothing stored by refused calls
        assert (await agent.write(one_write())).samples_written == 1
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await agent.stats()
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert (await graf.stats()).samples == 1
    denials = [r.getMessage() for r in caplog.records if r.name == "metricsd.security" and "denied" in r.getMessage()]
    assert len(denials) == 3 and all("ipv4:127.0.0.1" in d for d in denials)


async def test_plaintext_and_certificate_less_clients_cannot_connect(server: tuple[str, Store],
                                                                     pki: LocalPKI) -> None:
    addr, _ = server
    async with MetricsClient(addr, timeout_s=3.0, security=ClientSecurity(None, "r-token")) as plain:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await plain.stats()
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    async with client(addr, pki, "r-token", cert=False) as no_cert:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await no_cert.stats()
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
