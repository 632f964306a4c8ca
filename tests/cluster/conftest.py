"""Fixtures for the cluster tests: a real etcd on loopback and KV clients on it.

``etcd_server`` is shared by the whole session (tests isolate themselves by key prefix);
``private_etcd`` is a server of the test's own, which it may stop, pause or restart.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from metricsd.cluster.etcd_kv import EtcdKV, EtcdSettings
from metricsd.cluster.etcd_server import EtcdServer
from metricsd.cluster.kv import KV

# Implementations the contract suite runs against; add an in-memory one here and every test in
# test_kv_contract.py runs on it too.
KV_IMPLEMENTATIONS = ["etcd"]


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    server = EtcdServer(fsync=False)
    server.start()
    yield server
    server.close()


@pytest.fixture
def private_etcd() -> Iterator[EtcdServer]:
    server = EtcdServer(fsync=False)
    server.start()
    yield server
    server.close()


def etcd_settings(server: EtcdServer) -> EtcdSettings:
    """Short timeouts and backoff, so outage tests move quickly."""
    return EtcdSettings(
        endpoint=server.endpoint,
        request_timeout_s=1.0,
        watch_backoff_initial_s=0.05,
        watch_backoff_max_s=0.5,
    )


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses, so tests can share one etcd."""
    return f"/test/{uuid.uuid4().hex[:12]}/"


@pytest.fixture(params=KV_IMPLEMENTATIONS)
async def kv_factory(
    request: pytest.FixtureRequest, etcd_server: EtcdServer
) -> AsyncIterator[Callable[[], KV]]:
    """Makes clients of one shared store; closes them all at the end of the test."""
    assert request.param == "etcd"
    made: list[EtcdKV] = []

    def make() -> KV:
        client = EtcdKV(etcd_settings(etcd_server))
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()


@pytest.fixture
async def etcd_client() -> AsyncIterator[Callable[[EtcdServer], EtcdKV]]:
    """Makes EtcdKV clients of a given server (a private one, say); closes them at the end."""
    made: list[EtcdKV] = []

    def make(server: EtcdServer) -> EtcdKV:
        client = EtcdKV(etcd_settings(server))
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()


@pytest.fixture
def kv(kv_factory: Callable[[], KV]) -> KV:
    return kv_factory()
