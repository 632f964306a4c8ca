"""Fixtures of the proxy tests: a running in-process cluster of 3 or 4 stores (proxy_cluster.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from proxy_cluster import LocalCluster, start_cluster
from whole_query_harness import Harness, start_harness


@pytest.fixture
async def cluster3() -> AsyncIterator[LocalCluster]:
    c = await start_cluster(3)
    yield c
    await c.close()


@pytest.fixture
async def cluster4() -> AsyncIterator[LocalCluster]:
    c = await start_cluster(4)
    yield c
    await c.close()


@pytest.fixture
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    """Three stores answering whole queries behind a proxy's HTTP API (whole_query_harness.py);
    an indirect parameter passes its settings."""
    async with start_harness(getattr(request, "param", {})) as h:
        yield h
