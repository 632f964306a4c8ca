"""Fixtures for the HTTP API tests: a store, the app on a free loopback port, a client session."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import http_fixtures
import pytest
from http_fixtures import Env, running_env


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async with running_env() as e:
        yield e


@pytest.fixture(params=["hot", "aiohttp"])
def write_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Remote write through the hot path (metricsd/http/hotwrite.py) or aiohttp's route: a module
    that uses it (``pytestmark = pytest.mark.usefixtures("write_path")``) runs every test on both,
    in every server start_env makes."""
    http_fixtures.WRITE_PATH[0] = request.param
    try:
        yield request.param
    finally:
        http_fixtures.WRITE_PATH[0] = None
