"""Helpers for the HTTP API tests: a real store behind a real aiohttp server on loopback."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass

import aiohttp
from prometheus_client import CollectorRegistry
from writes import write_request

from metricsd.clock import ManualClock
from metricsd.http import HttpSettings, build_app, start_http, stop_http
from metricsd.model import Labels, make_labels
from metricsd.proto import metricsd_pb2 as pb
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings

__all__ = ["Env", "running_env", "start_env", "write_request"]  # write_request re-exported from tests/writes.py

# Which path remote write takes in the servers start_env makes (None: the settings' own): the
# ``write_path`` fixture (tests/http/conftest.py) runs the remote-write tests on both.
WRITE_PATH: list[str | None] = [None]


def with_write_path(settings: HttpSettings) -> HttpSettings:
    """``settings`` with the remote-write path the ``write_path`` fixture chose, if any."""
    if WRITE_PATH[0] is None:
        return settings
    return dataclasses.replace(settings, hot_write=WRITE_PATH[0] == "hot")


def pod_labels(name: str, pod: str, namespace: str = "default", **extra: str) -> Labels:
    return make_labels(name, {"namespace": namespace, "pod": pod, **extra})


@dataclass
class Env:
    url: str
    store: Store
    backend: LocalBackend
    clock: ManualClock
    registry: CollectorRegistry
    session: aiohttp.ClientSession
    runner: object

    async def write(self, series: Mapping[Labels, tuple[Sequence[int], Sequence[float]]]) -> pb.WriteResponse:
        return await self.backend.write(write_request(series))

    def stats(self) -> dict[str, int | float]:
        return self.store.stats()

    async def close(self) -> None:
        """The client session closed, then the server stopped."""
        await self.session.close()
        await stop_http(self.runner)  # type: ignore[arg-type]


async def start_env(settings: HttpSettings | None = None, store_settings: StoreSettings | None = None,
                    now_ms: int = 600_000) -> Env:
    store = Store(store_settings)
    backend = LocalBackend(StoreAPI(store))
    clock = ManualClock(now_ms)
    registry = CollectorRegistry()
    app = build_app(backend, settings=with_write_path(settings or HttpSettings(access_log=False)), registry=registry,
                    clock=clock)
    runner, port = await start_http(app, "127.0.0.1", 0)
    session = aiohttp.ClientSession()
    return Env(f"http://127.0.0.1:{port}", store, backend, clock, registry, session, runner)


@contextlib.asynccontextmanager
async def running_env(settings: HttpSettings | None = None,
                      store_settings: StoreSettings | None = None) -> AsyncIterator[Env]:
    """:func:`start_env` for the length of a ``with`` (a fixture's body): closed however it ends."""
    e = await start_env(settings, store_settings)
    try:
        yield e
    finally:
        await e.close()
