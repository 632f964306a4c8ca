"""Fixtures for the HTTP API tests: a store, the app on a free loopback port, a client session."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from http_fixtures import Env, start_env

from metricsd.http import stop_http


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    e = await start_env()
    try:
        yield e
    finally:
        await e.session.close()
        await stop_http(e.runner)  # type: ignore[arg-type]
